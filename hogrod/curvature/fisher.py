"""Fisher information of a Keras model under a Keras loss, and curvature diagonals.

- `FisherOperator`: the type-2 (exact), Monte Carlo or empirical Fisher as a
  `tf.linalg.LinearOperator` on the flat vector of `model.trainable_variables` (the order of
  `hogrod.hessian` and the other operators), over one `(x, y)` batch or a tf.data set of them.
- `gauss_newton_diagonal`: the exact diagonal of the Gauss-Newton matrix (C backprops of the
  loss Hessian's square-root columns per example, one vectorized Jacobian per batch).
- `mc_fisher_diagonal`: squared sampled gradients, with a standard error.
- `hutchinson_diagonal`: diag(A) ~ mean of z * (A z) for any operator, with a standard error.

Normalization follows the loss: a loss that averages over the batch ("sum_over_batch_size",
Keras's default) gives the mean over every example of `data`; reduction "sum" gives the sum.
The likelihoods and their scales are in `likelihood.py`.
"""

from typing import Optional, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

from hogrod import autodiff, checks
from hogrod.autodiff import densify, fill_unconnected, unwrap
from hogrod.curvature.eigen import as_matvec
from hogrod.curvature.data import (batch_key, check_loss_dtype, compile_closure, data_batches,
                                   indexed, model_params, normalize, params_dtype)
from hogrod.curvature.likelihood import likelihood_of
from hogrod.curvature.operators import CurvatureOperator
from hogrod.curvature.per_example import batch_gradients
from hogrod.types import Batch, DType, Params, TensorLike

__all__ = ["FisherOperator", "FISHER_TYPES", "gauss_newton_diagonal", "mc_fisher_diagonal",
           "hutchinson_diagonal"]

FISHER_TYPES = ("type2", "mc", "empirical")


def _outputs(model, lik, x, where):
    z = tf.convert_to_tensor(model(x, training=False))
    lik.check_output(z, where)
    return z


def _labels(lik, fisher, z, y, num, key):
    """[S, N, ...] labels: sampled from the predictive distribution, or the true ones."""
    if fisher == "empirical":
        return tf.convert_to_tensor(y)[None]
    return tf.stop_gradient(lik.sample(tf.stop_gradient(z), num, key))


class FisherOperator(CurvatureOperator):
    """The Fisher information of `model` under the Keras loss `loss`.

    The operator acts on the flat vector of `model.trainable_variables` (or of `params`).
    The three kinds, chosen by `fisher`:

    - "type2": F = J^T E_{y~p(y|z)}[H_loss(y, z)] J, the exact Fisher; for MSE and
      cross-entropy from logits it equals the Gauss-Newton matrix (`GaussNewtonOperator`),
      computed by the same Gauss-Newton-vector product (`hogrod.gnvp`) on the loss at the
      labels' mean (the loss Hessian's expectation: cross-entropy is linear in the label).
    - "mc": J^T (1/S sum_s g_s g_s^T / alpha) J with g_s the loss gradient in z at a label
      sampled from the model (Gaussian with variance C/2 for MSE, categorical / Bernoulli
      for cross-entropy), S = `mc_samples` per example; E[mc] = type2. Labels are drawn by
      a stateless key of (`seed`, batch index), so every product uses the same samples
      (one fixed matrix). Under a `strategy` the replica id is folded in too: a different,
      equally distributed draw than on one device.
    - "empirical": sum_i g_i g_i^T with g_i the gradient of example i's loss at its true label
      (for any supported loss; no alpha).

    Each is divided by the number of examples in `data` when the loss is a batch mean
    (Keras's default reduction), and not when its reduction is "sum".

    Args:
      model: a built Keras 3 model, called as `model(x, training=False)`; its output is
        [batch, C] (logits or probabilities as the loss's `from_logits` says).
      loss: a Keras loss object: MeanSquaredError, SparseCategoricalCrossentropy,
        CategoricalCrossentropy, BinaryCrossentropy (`from_logits` either way).
        A reduction "sum_over_batch_size" averages over `data`, "sum" sums.
      data: one `(x, y)` batch or a tf.data.Dataset of them.
      fisher: one of FISHER_TYPES: "type2" (default), "mc" or "empirical".
      mc_samples: labels sampled per example for "mc" (an int >= 1; ignored otherwise).
      seed: an int >= 0, the sampling key of "mc".
      dtype: the operator's dtype; default None: the model variables' dtype. The loss is
        computed at the model output's dtype, whatever Keras's floatx.
      strategy: a tf.distribute.Strategy to split each batch of `data` (then a Dataset)
        over; default None, one device.
      params: the variables the operator acts on (default None: `model.trainable_variables`);
        a subset gives that diagonal block (e.g. `layer_params(model, name)`).

    Raises:
      ValueError: `fisher` is not one of FISHER_TYPES, or the loss is not supported (another
        class, label smoothing, another reduction).
      TypeError: `loss` is not a Keras loss object.
      ArgumentError: `mc_samples`, `seed`, `params`, `data` or `strategy` invalid, or the
        loss computes at another dtype than the model's.
    """

    def __init__(self, model: keras.Model, loss: keras.losses.Loss, data: Batch,
                 fisher: str = "type2", mc_samples: int = 1, seed: int = 0,
                 dtype: Optional[DType] = None,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 params: Optional[Params] = None) -> None:
        where = "FisherOperator"
        if fisher not in FISHER_TYPES:
            raise ValueError(f"{where}: fisher must be one of {FISHER_TYPES}, got {fisher!r}")
        num = checks.integer(mc_samples, "mc_samples", where, least=1) if fisher == "mc" else 1
        seed = checks.seed(seed, "seed", where)
        lik, mean = likelihood_of(loss, where)
        params = model_params(model, params, where)
        check_loss_dtype(loss, params_dtype(params, where), where)
        dtype = tf.as_dtype(dtype) if dtype is not None else params_dtype(params, where)
        self.fisher, self.mc_samples, self.seed, self.likelihood = fisher, num, seed, lik

        def product(batch, v):  # the batch's mean (or sum) of the per-example Fisher times v
            (x, y), index = batch
            size = tf.maximum(tf.cast(tf.shape(index)[0], v[0].dtype), 1) if mean else 1
            if fisher == "type2":
                return autodiff.gnvp(lambda: _outputs(model, lik, x, where),
                                     lambda z: tf.reduce_sum(lik.soft_loss(z)) / size, params, v)
            return _outer_product(model, lik, fisher, x, y, params, v, num,
                                  batch_key(seed, index), where, size)

        super().__init__(product, params, indexed(data, where), dtype, where, strategy,
                         mean, is_non_singular=None, is_positive_definite=None)


def _outer_product(model, lik, fisher, x, y, params, v, num, key, where, size):
    """sum_{i,s} g_is (g_is . v) / (S alpha size): one forward-mode pass for the [S, N]
    directional derivatives, one reverse pass weighted by them."""
    flat_v = tf.nest.flatten(v)
    with tf.GradientTape() as tape:
        with tf.autodiff.ForwardAccumulator([unwrap(p) for p in params], flat_v) as acc:
            z = _outputs(model, lik, x, where)
            losses = lik.per_example(_labels(lik, fisher, z, y, num, key), z[None])
        directional = acc.jvp(losses, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    out = tape.gradient(losses, params, output_gradients=tf.stop_gradient(directional))
    out = fill_unconnected([densify(g) for g in out], params, "zero")
    scale = size * num * (1 if fisher == "empirical" else lik.alpha(z.shape[-1], z.dtype))
    return [g / scale for g in out]


def gauss_newton_diagonal(model: keras.Model, loss: keras.losses.Loss, data: Batch,
                          params: Optional[Params] = None) -> np.ndarray:
    """The exact diagonal of the type-2 Fisher / Gauss-Newton matrix.

    The diagonal of J^T E[H_loss] J, the matrix of `FisherOperator(model, loss, data,
    "type2")`. Per example, H = S S^T with C columns (`likelihood.py`); diag = sum_k
    (J^T s_k)^2, the C backprops of every example done by one vectorized Jacobian of the
    [N, C] matrix (s_k . z). Memory N * C * n per batch: for small output dimensions C.

    Args:
      model: a built Keras 3 model, called as `model(x, training=False)`, output [batch, C].
      loss: a supported Keras loss object, as for `FisherOperator`; its reduction says
        whether the diagonal is of the mean ("sum_over_batch_size") or the sum ("sum").
      data: one `(x, y)` batch or a tf.data.Dataset of them.
      params: the variables (default None: `model.trainable_variables`); a subset gives its
        block's diagonal.

    Returns:
      float64 numpy [n], n the number of parameters, in the flat order of `params`.
    """
    where = "gauss_newton_diagonal"
    lik, mean = likelihood_of(loss, where)
    params = model_params(model, params, where)
    check_loss_dtype(loss, params_dtype(params, where), where)

    def batch_sum(x):
        with tf.GradientTape() as tape:
            z = _outputs(model, lik, x, where)
            roots = tf.einsum("nc,nck->nk", z, tf.stop_gradient(lik.sqrt_hessian(z)))
            flat = tf.reshape(roots, [-1])
        rows = batch_gradients(flat, params, tape)
        return tf.reduce_sum(tf.square(rows), 0), tf.shape(z)[0]
    batch_sum = compile_closure(batch_sum)

    total, count = 0.0, 0
    for x, _ in data_batches(data, where, pair=True):
        part, size = batch_sum(x)
        total, count = total + part.numpy().astype(np.float64), count + int(size)
    return normalize(total, count, mean)


def mc_fisher_diagonal(model: keras.Model, loss: keras.losses.Loss, data: Batch,
                       mc_samples: int = 10, seed: int = 0,
                       params: Optional[Params] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The diagonal of the Monte Carlo Fisher from squared sampled per-example gradients.

    sum_i g_is^2 / alpha averaged over the `mc_samples` draws s; the standard error is over
    the draws. With the same `seed` and data the draws are those of
    `FisherOperator(..., "mc", mc_samples, seed)`, so the estimate is exactly that
    operator's diagonal. The sampled gradients are the per-example output Jacobian (C
    backprops per example) times the loss gradients in z: memory S * N * n per batch.

    Args:
      model: a built Keras 3 model, called as `model(x, training=False)`, output [batch, C].
      loss: a supported Keras loss object, as for `FisherOperator`; its reduction says
        whether the diagonal is of the mean ("sum_over_batch_size") or the sum ("sum").
      data: one `(x, y)` batch or a tf.data.Dataset of them.
      mc_samples: labels sampled per example, S (an int >= 2: the standard error needs two).
      seed: an int >= 0, the sampling key.
      params: the variables (default None: `model.trainable_variables`); a subset gives its
        block's diagonal.

    Returns:
      `(estimate, standard_error)`, float64 numpy [n] each.
    """
    where = "mc_fisher_diagonal"
    num = checks.integer(mc_samples, "mc_samples", where, least=2)
    seed = checks.seed(seed, "seed", where)
    lik, mean = likelihood_of(loss, where)
    params = model_params(model, params, where)
    check_loss_dtype(loss, params_dtype(params, where), where)

    def batch_sums(x, index):
        with tf.GradientTape() as tape:
            z = _outputs(model, lik, x, where)
            flat_z = tf.reshape(z, [-1])
        jac = tf.reshape(batch_gradients(flat_z, params, tape), tf.concat(
            [tf.shape(z), [-1]], 0))  # [N, C, n]: C backprops per example, not S
        labels = _labels(lik, "mc", z, None, num, batch_key(seed, index))
        zs = tf.broadcast_to(tf.stop_gradient(z)[None], tf.concat([[num], tf.shape(z)], 0))
        with tf.GradientTape() as out_tape:
            out_tape.watch(zs)
            losses = lik.per_example(labels, zs)  # [S, N], each from its own slice of zs
        grads = tf.einsum("snc,ncp->snp", out_tape.gradient(losses, zs), jac)
        return (tf.reduce_sum(tf.square(grads), 1) / lik.alpha(z.shape[-1], z.dtype),
                tf.shape(z)[0])
    batch_sums = compile_closure(batch_sums)

    total, count = 0.0, 0
    for i, (x, _) in enumerate(data_batches(data, where, pair=True)):
        part, size = batch_sums(x, tf.fill([1], tf.constant(i, tf.int64)))
        total, count = total + part.numpy().astype(np.float64), count + int(size)
    draws = normalize(total, count, mean)  # [S, n]: one unbiased diagonal per draw
    return draws.mean(0), draws.std(0, ddof=1) / np.sqrt(num)


class _FlatProducts:
    """A tf.linalg.LinearOperator without `matvec_flat` (e.g. a Kronecker-factored one) as
    `as_matvec` takes it."""

    def __init__(self, op: tf.linalg.LinearOperator) -> None:
        self.dtype, self.name, self.shape = op.dtype, op.name, op.shape
        self.matvec_flat = op.matvec


def _with_matvec_flat(op):
    if isinstance(op, tf.linalg.LinearOperator) and not hasattr(op, "matvec_flat"):
        if op.shape.rank != 2 or op.shape[0] != op.shape[1]:
            raise ValueError(f"hutchinson_diagonal: op must be square, got shape {op.shape}")
        return _FlatProducts(op)
    return op


def hutchinson_diagonal(op: Union[tf.linalg.LinearOperator, TensorLike], num_samples: int = 100,
                        seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The diagonal of an operator by Hutchinson's estimator (Bekas et al. 2007).

    diag(A) ~ mean of z * (A z) over Rademacher z, for any operator of this package (or a
    dense matrix). The variance of one sample's entry i is sum over j != i of A_ij^2.

    Args:
      op: a curvature operator (anything with `matvec_flat`), any square
        `tf.linalg.LinearOperator` (e.g. `KFACOperator`) or a dense square matrix.
      num_samples: products (an int >= 2: the standard error needs two).
      seed: the probes' numpy seed.

    Returns:
      `(estimate, standard_error)`, float64 numpy [n] each.

    Raises:
      ArgumentError: `num_samples` below 2.
      ValueError: `op` is not square.
      FloatingPointError: a product is not finite.
    """
    num = checks.integer(num_samples, "num_samples", "hutchinson_diagonal", least=2)
    matvec, n = as_matvec(_with_matvec_flat(op))
    z = np.random.default_rng(seed).choice([-1.0, 1.0], size=(num, n))
    samples = np.stack([z[i] * matvec(z[i]) for i in range(num)])
    return samples.mean(0), samples.std(0, ddof=1) / np.sqrt(num)
