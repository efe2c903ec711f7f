"""The likelihoods behind Keras losses: per-example values, sampled labels and the loss
Hessian's square root, for the Fisher operators and diagonals (`fisher.py`).

A supported loss is the negative log-likelihood of a distribution over labels given the
model output z (shape [N, C]), times a constant `alpha` per example:

- `MeanSquaredError`: mean_c (y - z)^2 = alpha * (-log N(y; z, (C/2) I)) + const, alpha = 1;
  labels are sampled from N(z, (C/2) I), so E[g g^T] of the sampled gradient is the Hessian
  (2/C) I (the "right scale": sigma^2 = C/2, not 1).
- `SparseCategoricalCrossentropy`, `CategoricalCrossentropy`: -log p_y with p = softmax(z)
  (`from_logits=True`) or p = z / sum(z) (probabilities, as Keras normalizes them), alpha = 1.
- `BinaryCrossentropy`: the mean over the C outputs of Bernoulli NLLs, p = sigmoid(z) or z,
  alpha = 1/C.

Values are computed here at the model output's dtype (Keras losses compute in floatx unless
given a dtype), without Keras's clipping of probabilities to [eps, 1 - eps].
"""

from typing import Callable, Tuple

import keras
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import MEAN_REDUCTIONS
from hogrod.types import Loss

__all__ = ["Likelihood", "likelihood_of", "per_example_loss"]



def _like_output(y, z):
    """Labels at z's dtype, [N] taken as [N, 1] (Keras's rule), never broadcast to [N, N]."""
    y = tf.cast(y, z.dtype)
    if y.shape.rank is not None and y.shape.rank == z.shape.rank - 1:
        y = y[..., None]
    return y


class Likelihood:
    """The likelihood behind a Keras loss (made by `likelihood_of`).

    Attributes and methods, on model outputs z of shape [N, C] at z's dtype:
      from_logits, name (the loss's class), classification (bool);
      check_output(z, where): refuses an output the loss cannot read;
      alpha(C, dtype): the loss per example is alpha times the negative log-likelihood;
      per_example(y, z) -> [N]: the loss of each example at labels y;
      sample(z, num, key) -> [num, N, ...]: labels drawn from the model's predictive
        distribution with the stateless key `key` (Monte Carlo Fisher);
      soft_loss(z) -> [N]: the loss at the labels' mean, whose Hessian in z is E_y[H];
      sqrt_hessian(z) -> [N, C, K]: S with S S^T = E_y[H] per example.
    """

    classification = True
    min_width = 1

    def __init__(self, from_logits, name):
        self.from_logits = bool(from_logits)
        self.name = name

    def check_output(self, z, where):
        """z must be [N, C] with C >= min_width (a class score needs two classes)."""
        if z.shape.rank != 2:
            raise ValueError(f"{where}: the model output must have shape [batch, outputs] for "
                             f"{self.name}, got shape {z.shape}")
        width = z.shape[-1]
        if width is not None and width < self.min_width:
            raise ValueError(f"{where}: {self.name} needs class scores (at least "
                             f"{self.min_width} outputs), but the model output has width "
                             f"{width}; use BinaryCrossentropy for one output or a regression "
                             "loss")

    def alpha(self, width, dtype):
        return tf.constant(1.0, dtype)


class _Gaussian(Likelihood):
    classification = False

    def per_example(self, y, z):
        return tf.reduce_mean(tf.square(_like_output(y, z) - z), axis=-1)

    def soft_loss(self, z):  # the Hessian (2/C) I does not depend on the label
        return self.per_example(tf.stop_gradient(z), z)

    def sample(self, z, num, key):
        width = z.shape[-1]
        scale = tf.sqrt(tf.constant(width / 2, z.dtype))  # sigma^2 = C/2: E[g g^T] = (2/C) I
        noise = tf.random.stateless_normal(tf.concat([[num], tf.shape(z)], 0), key, dtype=z.dtype)
        return z[None] + scale * noise

    def sqrt_hessian(self, z):
        width = z.shape[-1]
        eye = tf.eye(width, dtype=z.dtype) * tf.sqrt(tf.constant(2 / width, z.dtype))
        return tf.broadcast_to(eye, tf.concat([tf.shape(z)[:1], [width, width]], 0))


class _Categorical(Likelihood):
    min_width = 2

    def __init__(self, from_logits, name, sparse):
        super().__init__(from_logits, name)
        self.sparse = sparse

    def log_probs(self, z):
        if self.from_logits:
            return tf.nn.log_softmax(z, axis=-1)
        return tf.math.log(z) - tf.math.log(tf.reduce_sum(z, axis=-1, keepdims=True))

    def _dense(self, y, z):
        return -tf.reduce_sum(y * self.log_probs(z), axis=-1)

    def per_example(self, y, z):
        if not self.sparse:
            return self._dense(tf.cast(y, z.dtype), z)
        y = tf.convert_to_tensor(y)
        if y.shape.rank is not None and y.shape.rank == z.shape.rank and y.shape[-1] == 1:
            y = tf.squeeze(y, -1)  # Keras takes labels of shape [N] or [N, 1]
        return self._dense(tf.one_hot(tf.cast(y, tf.int32), z.shape[-1], dtype=z.dtype), z)

    def soft_loss(self, z):  # cross-entropy is linear in the label: E_y[H(y)] = H(E[y])
        return self._dense(tf.stop_gradient(tf.exp(self.log_probs(z))), z)

    def sample(self, z, num, key):
        draws = tf.transpose(tf.random.stateless_categorical(self.log_probs(z), num, key))
        return draws if self.sparse else tf.one_hot(draws, z.shape[-1], dtype=z.dtype)

    def sqrt_hessian(self, z):
        """Columns sqrt(p_k) * grad_z loss(k, z): sum_k p_k g_k g_k^T is the Fisher E_y[H]."""
        width = z.shape[-1]
        p = tf.exp(self.log_probs(z))
        eye = tf.eye(width, dtype=z.dtype)
        if self.from_logits:  # grad of -log softmax(z)_k is p - e_k
            grads = p[:, :, None] - eye[None]
        else:  # grad of -log(z_k / sum z) is 1 / sum z - e_k / z_k
            grads = (1 / tf.reduce_sum(z, -1))[:, None, None] - eye[None] / z[:, None, :]
        return grads * tf.sqrt(p)[:, None, :]  # [N, C, K]: column k = grads[:, :, k]


class _Bernoulli(Likelihood):
    def probs(self, z):
        return tf.sigmoid(z) if self.from_logits else z

    def per_example(self, y, z):
        y = _like_output(y, z)
        if self.from_logits:
            terms = tf.nn.softplus(z) - y * z
        else:
            terms = -(y * tf.math.log(z) + (1 - y) * tf.math.log(1 - z))
        return tf.reduce_mean(terms, axis=-1)

    def alpha(self, width, dtype):
        return tf.constant(1 / width, dtype)

    def soft_loss(self, z):
        return self.per_example(tf.stop_gradient(self.probs(z)), z)

    def sample(self, z, num, key):
        p = self.probs(z)
        u = tf.random.stateless_uniform(tf.concat([[num], tf.shape(z)], 0), key, dtype=z.dtype)
        return tf.cast(u < p[None], z.dtype)

    def sqrt_hessian(self, z):
        """E_y[H] is diagonal: p(1-p)/C on logits, 1/(C p(1-p)) on probabilities."""
        width = z.shape[-1]
        p = self.probs(z)
        var = p * (1 - p)
        h = (var if self.from_logits else 1 / var) / width
        return tf.linalg.diag(tf.sqrt(h))


def likelihood_of(loss: keras.losses.Loss, where: str) -> Tuple["Likelihood", bool]:
    """The likelihood of a supported Keras loss object and its batch reduction.

    Args:
      loss: MeanSquaredError, SparseCategoricalCrossentropy, CategoricalCrossentropy or
        BinaryCrossentropy (exactly these classes), without label smoothing.
      where: the public function checked.

    Returns:
      `(likelihood, mean)`: a `Likelihood`; `mean` is True when the loss averages over the
      batch ("sum_over_batch_size"), False when it sums ("sum").
    """
    if not isinstance(loss, keras.losses.Loss):
        raise TypeError(f"{where}: loss must be a Keras loss object (MeanSquaredError, "
                        "SparseCategoricalCrossentropy, CategoricalCrossentropy or "
                        f"BinaryCrossentropy), got {type(loss).__name__}")
    config = loss.get_config()
    name = type(loss).__name__  # exact types: a subclass may compute something else
    if type(loss) is keras.losses.MeanSquaredError:
        lik = _Gaussian(True, name)
    elif type(loss) is keras.losses.SparseCategoricalCrossentropy:
        lik = _Categorical(config.get("from_logits", False), name, sparse=True)
    elif type(loss) is keras.losses.CategoricalCrossentropy:
        lik = _Categorical(config.get("from_logits", False), name, sparse=False)
    elif type(loss) is keras.losses.BinaryCrossentropy:
        lik = _Bernoulli(config.get("from_logits", False), name)
    else:
        raise ValueError(f"{where}: cannot sample labels from or take the Fisher of loss "
                         f"{name}; supported: MeanSquaredError, SparseCategoricalCrossentropy, "
                         "CategoricalCrossentropy, BinaryCrossentropy")
    if config.get("label_smoothing", 0.0):
        raise ValueError(f"{where}: {name} has label_smoothing={config['label_smoothing']}; "
                         "a smoothed loss is not a likelihood of the model: set it to 0")
    if config.get("ignore_class") is not None:
        raise ValueError(f"{where}: {name} has ignore_class={config['ignore_class']}; "
                         "not supported: set it to None")
    if config.get("axis", -1) != -1:
        raise ValueError(f"{where}: {name} has axis={config['axis']}; only axis=-1 (classes "
                         "last) is supported")
    reduction = loss.reduction
    if reduction in MEAN_REDUCTIONS:
        return lik, True
    if reduction == "sum":
        return lik, False
    raise ValueError(f"{where}: {name} has reduction={reduction!r}; the curvature needs the "
                     "batch reduction: use 'sum_over_batch_size' (a mean) or 'sum'")


def per_example_loss(loss: Loss,
                     where: str) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """A per-example loss `(y_true, y_pred) -> [batch]`.

    Args:
      loss: a supported Keras loss object (its per-example value at the model output's
        dtype) or any callable taken as already per-example.
      where: the public function checked.

    Returns:
      The callable.
    """
    if isinstance(loss, keras.losses.Loss):
        lik, _ = likelihood_of(loss, where)
        return lik.per_example
    return checks.function(loss, "loss", where, "loss(y_true, y_pred) -> [batch]")
