"""What every Laplace posterior shares (`laplace.py` documents the formulas): the subset (all
weights or the last layer on fixed features), the hyperparameters and their storage, the pass
over the data in `fit` (checks, the summed log-likelihood, the last layer's features), the log
evidence, the linearized predictive. A posterior class (`posteriors.py`) adds its curvature:
`_fit_curvature(data)`, `_log_det(delta, factor)`, `_variance(jac, delta, factor)`,
`_precision(delta, factor)` and `eigenvalues`, where `delta` is a float64 prior precision (a
scalar, or one per parameter) and `factor` is 1 / sigma_noise^2.
"""

import math
from typing import Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.laplace_predictive import LINK_APPROXES, LinearizedPredictive
from hogrod.curvature.laplace_tuning import PriorTuning
from hogrod.curvature.data import check_strategy, data_batches, distribute_batches
from hogrod.curvature.per_example import batch_gradients
from hogrod.types import Batch, Scalar, TensorLike, Tree

__all__ = ["BaseLaplace", "LIKELIHOODS", "SUBSETS", "LINK_APPROXES", "HALF_LOG_2PI"]

LIKELIHOODS = ("regression", "classification")
SUBSETS = ("all", "last_layer")
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _not_finite(t):
    """The number of NaN / inf entries of a floating tensor (0 for other dtypes)."""
    t = tf.convert_to_tensor(t)
    if not t.dtype.is_floating:
        return 0
    return int(tf.size(t)) - int(tf.reduce_sum(tf.cast(tf.math.is_finite(t), tf.int64)))


def _compiled(fn, example):
    """`fn` compiled once for every batch size of a tensor input like `example` (shape
    relaxed otherwise, e.g. for a dict of inputs)."""
    if tf.is_tensor(example) and example.shape.rank:
        spec = [tf.TensorSpec([None, *example.shape[1:]], example.dtype)]
        return tf.function(fn, input_signature=spec)
    return tf.function(fn, reduce_retracing=True)


def _last_layer(model, where):
    """The last layer (it must carry trainable variables), a feature model for its input and
    the layer alone as a model of the features."""
    layers = getattr(model, "layers", None)
    if not layers:
        raise checks.ArgumentError(f"{where}: subset='last_layer' needs a Sequential or "
                                   "functional model whose last layer produces the output")
    last = layers[-1]
    if not last.trainable_variables:
        raise checks.ArgumentError(
            f"{where}: subset='last_layer': the model's last layer '{last.name}' has no "
            "trainable variables (a trailing activation or reshape?); put the trainable layer "
            "last or use subset='all'")
    try:  # the structure the model is called with: a tensor, not a list of one
        try:
            structure = model.input
        except (AttributeError, ValueError):  # a Sequential built but never called
            structure = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        features = keras.Model(structure, last.input)
        spec = last.input
        head = keras.Sequential([keras.Input(spec.shape[1:], dtype=spec.dtype), last])
    except (AttributeError, ValueError, TypeError) as e:
        raise checks.ArgumentError(
            f"{where}: subset='last_layer' cannot read the input of layer '{last.name}' ({e});"
            " build the model with keras.Input") from None
    return last, features, head


class BaseLaplace(PriorTuning, LinearizedPredictive):
    """The Laplace approximation of a Keras model at its current weights; made by
    `hogrod.curvature.Laplace` (see `laplace.py` for the arguments and the formulas)."""

    hessian = None

    def __init__(self, model: keras.Model, likelihood: str = "regression", subset: str = "all",
                 *, prior_precision: TensorLike = 1.0, sigma_noise: float = 1.0,
                 prior_mean: TensorLike = 0.0, strategy: Optional[tf.distribute.Strategy] = None
                 ) -> None:
        where = "Laplace"
        self.strategy = check_strategy(strategy, where)
        if not isinstance(model, keras.Model) or not model.built:
            raise checks.ArgumentError(f"{where}: model must be a built keras.Model (e.g. with "
                                       f"keras.Input), got {type(model).__name__}")
        self.likelihood = checks.choice(likelihood, LIKELIHOODS, "likelihood", where)
        self.subset = checks.choice(subset, SUBSETS, "subset", where)
        self.model = model
        if subset == "last_layer":
            self._layer, self._features, self._head = _last_layer(model, where)
        else:
            self._layer, self._features, self._head = None, None, model
        self.params = list(self._head.trainable_variables)
        if not self.params:
            raise checks.ArgumentError(f"{where}: the model has no trainable variables")
        dtypes = {tf.as_dtype(p.dtype) for p in self.params}
        if len(dtypes) != 1:
            raise checks.ArgumentError(
                f"{where}: the parameters mix dtypes {sorted(d.name for d in dtypes)}")
        self.dtype = dtypes.pop()
        self.sizes = [int(np.prod(p.shape)) for p in self.params]
        self.n_params, self.n_layers = sum(self.sizes), len(self.sizes)
        self.prior_precision = prior_precision
        self.sigma_noise = sigma_noise
        self.prior_mean = prior_mean
        if self.likelihood == "classification":
            self._check_logits_head(where)
        self._fitted = False
        self._jacobian = self._forward = self._feature_fn = None

    # ------------------------------------------------------------------ hyperparameters

    @property
    def prior_precision(self):
        """delta: a float (isotropic), or a float64 vector with one value per variable of the
        subset (`n_layers`, laplace-torch's layer-wise prior) or per parameter (`n_params`)."""
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value):
        self._prior_precision = self._check_prior(value, "prior_precision", "Laplace")

    def _check_prior(self, value, arg, where):
        """A positive number as a float, or a positive vector of n_layers or n_params values
        as float64 numpy; the posterior's structure may refuse some vectors."""
        if tf.is_tensor(value) or isinstance(value, tf.Variable):
            value = np.asarray(value)
        if isinstance(value, (np.ndarray, list, tuple)):
            values = np.asarray(value, np.float64)
            if values.size == 1:
                value = values.item()
            elif values.ndim != 1 or values.size not in (self.n_layers, self.n_params) \
                    or not np.all(np.isfinite(values)) or np.any(values <= 0):
                raise checks.ArgumentError(
                    f"{where}: {arg} must be a positive number, or a positive vector of "
                    f"{self.n_layers} values (one per variable) or {self.n_params} (one per "
                    f"parameter), got shape {values.shape}")
            else:
                self._check_prior_structure(self._expand(values), arg, where)
                return values.copy()
        return checks.positive(value, arg, where)

    def _check_prior_structure(self, delta, arg, where):
        """A hook: a posterior refuses per-parameter precisions its structure cannot keep."""

    def _expand(self, values):
        """A vector of n_layers or n_params values as one per parameter (numpy or tensor)."""
        if int(values.shape[0]) == self.n_params:
            return values
        if isinstance(values, np.ndarray):
            return np.repeat(values, self.sizes)
        return tf.repeat(values, self.sizes)

    def _delta(self, value, where):
        """The prior precision as a float64 tensor, [] or [n_params] (default: the stored
        one); a tensor or variable stays differentiable."""
        if value is None:
            value = self._prior_precision
        if not (tf.is_tensor(value) or isinstance(value, tf.Variable)):
            value = self._check_prior(value, "prior_precision", where)
            if isinstance(value, float):
                return tf.constant(value, tf.float64)
            return tf.constant(self._expand(value), tf.float64)
        t = tf.convert_to_tensor(value)
        size = t.shape.num_elements()
        if not t.dtype.is_floating or not (size == 1 or t.shape.rank == 1 and size in (
                self.n_layers, self.n_params)):
            raise checks.ArgumentError(
                f"{where}: prior_precision must be a float scalar or a vector of "
                f"{self.n_layers} or {self.n_params} values, got {t.dtype.name} {t.shape}")
        if tf.executing_eagerly():  # checked on its values; a traced one by its caller
            self._check_prior(t.numpy(), "prior_precision", where)
        t = tf.cast(t, tf.float64)
        return tf.reshape(t, []) if size == 1 else self._expand(t)

    def _sigma(self, value, where):
        """sigma_noise as a float64 scalar tensor (default: the stored one)."""
        if value is None:
            return tf.constant(self._sigma_noise, tf.float64)
        if not tf.is_tensor(value) and not isinstance(value, tf.Variable):
            return tf.constant(checks.positive(value, "sigma_noise", where), tf.float64)
        t = tf.convert_to_tensor(value)
        if not t.dtype.is_floating or t.shape.num_elements() != 1:
            raise checks.ArgumentError(f"{where}: sigma_noise must be a positive scalar, got "
                                       f"{t.dtype.name} of shape {t.shape}")
        t = tf.cast(tf.reshape(t, []), tf.float64)
        if tf.executing_eagerly() and not t.numpy() > 0:
            raise checks.ArgumentError(f"{where}: sigma_noise must be positive, got {t.numpy()}")
        return t

    @property
    def sigma_noise(self):
        """The regression noise's standard deviation (1.0 for classification)."""
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value):
        if tf.is_tensor(value) or isinstance(value, tf.Variable):
            value = np.asarray(value).item()
        value = checks.positive(value, "sigma_noise", "Laplace")
        if self.likelihood == "classification" and value != 1.0:
            raise checks.ArgumentError(
                f"Laplace: sigma_noise is the regression noise; with likelihood="
                f"'classification' it must be 1.0, got {value}")
        self._sigma_noise = value

    @property
    def prior_mean(self):
        """mu_0 as a float64 vector of the subset's n_params parameters."""
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value):
        mean = np.asarray(value, np.float64)
        if mean.ndim == 0:
            mean = np.full([self.n_params], float(mean))
        if mean.shape != (self.n_params,) or not np.all(np.isfinite(mean)):
            raise checks.ArgumentError(
                f"Laplace: prior_mean must be a finite number or a flat vector of the "
                f"{self.n_params} parameters, got shape {mean.shape}")
        self._prior_mean = mean

    # ---------------------------------------------------------------------------- model

    def _check_logits_head(self, where):
        """Classification needs logits; a softmax / sigmoid output layer gives probabilities
        whose softmax would silently be a different model."""
        last = self.model.layers[-1] if getattr(self.model, "layers", None) else None
        act = getattr(last, "activation", None)
        if act is not None and getattr(act, "__name__", "") in ("softmax", "sigmoid"):
            raise checks.ArgumentError(
                f"{where}: likelihood='classification' takes LOGITS, but the last layer "
                f"'{last.name}' has activation '{act.__name__}'; remove it (the softmax is the "
                "likelihood's)")

    def _inputs(self, x):
        """The head's inputs: the last layer's features, or x itself."""
        if self._features is None:
            return x
        if self._feature_fn is None:
            self._feature_fn = _compiled(lambda v: self._features(v, training=False), x)
        return self._feature_fn(x)

    def _outputs(self, inputs):
        if self._forward is None:
            self._forward = _compiled(lambda v: self._head(v, training=False), inputs)
        return tf.convert_to_tensor(self._forward(inputs))

    def _jacobian_fn(self, inputs):
        with tf.GradientTape() as tape:
            z = tf.convert_to_tensor(self._head(inputs, training=False))
            flat = tf.reshape(z, [-1])
        rows = batch_gradients(flat, self.params, tape)
        return z, tf.reshape(rows, tf.concat([tf.shape(z), [self.n_params]], 0))

    def output_jacobian(self, x: Tree) -> Tuple[tf.Tensor, tf.Tensor]:
        """The model output and its Jacobian in the subset's parameters at inputs `x`.

        Args:
          x: a batch of model inputs (N examples).
        Returns:
          `(z [N, C], J [N, C, n_params])` at the model's dtype.
        Raises:
          ArgumentError: the output is not [N, C] (C >= 2 logits for classification).
        """
        where = "Laplace.output_jacobian"
        inputs = self._inputs(x)
        if isinstance(inputs, np.ndarray):
            inputs = tf.convert_to_tensor(inputs)
        if self._jacobian is None:
            self._jacobian = _compiled(self._jacobian_fn, inputs)
        z, jac = self._jacobian(inputs)
        self._check_output(z, where)
        return z, jac

    def _check_output(self, z, where):
        if z.shape.rank != 2:
            raise checks.ArgumentError(f"{where}: the model output must be [batch, outputs], "
                                       f"got shape {z.shape}")
        if self.likelihood == "classification" and z.shape[-1] < 2:
            raise checks.ArgumentError(
                f"{where}: likelihood='classification' needs class logits (at least 2 "
                f"outputs), but the model output has width {z.shape[-1]}; give a binary "
                "problem 2 logits, or use likelihood='regression'")

    def _labels(self, y, z, where):
        """Regression targets [N, C] (or [N] when C == 1) at float64, or class indices."""
        y = tf.convert_to_tensor(y)
        n, c = z.shape
        if self.likelihood == "regression":
            if not y.dtype.is_floating:
                raise checks.ArgumentError(f"{where}: likelihood='regression' needs floating "
                                           f"targets, got {y.dtype.name}")
            if y.shape.rank == 1 and c == 1:
                y = y[:, None]
            if y.shape != z.shape:
                raise checks.ArgumentError(f"{where}: regression targets have shape {y.shape} "
                                           f"but the model output has shape {z.shape}")
            return tf.cast(y, tf.float64)
        if y.shape.rank == 2 and y.shape[-1] == 1:
            y = y[:, 0]
        if not y.dtype.is_integer or y.shape.rank != 1 or y.shape[0] != n:
            raise checks.ArgumentError(
                f"{where}: likelihood='classification' needs integer class labels of shape "
                f"[{n}] (or [{n}, 1]), got {y.dtype.name} {y.shape}")
        bad = tf.logical_or(y < 0, y >= c)
        if bool(tf.reduce_any(bad)):
            raise checks.ArgumentError(f"{where}: class labels must lie in [0, {c}) for {c} "
                                       f"logits, got {y[bad][:5].numpy().tolist()}")
        return y

    def _summed_loss(self, z, y):
        """The summed negative log-likelihood without the noise scale (float64): regression
        0.5 * sum (y - z)^2, classification the summed cross-entropy."""
        z = tf.cast(z, tf.float64)
        if self.likelihood == "regression":
            return float(0.5 * tf.reduce_sum(tf.square(y - z)))
        logp = tf.nn.log_softmax(z)
        return float(-tf.reduce_sum(tf.gather(logp, y, batch_dims=1)))

    def _check_head(self, x, z, where):
        """subset='last_layer': the last layer must produce the model's output."""
        full = tf.convert_to_tensor(self.model(x, training=False))
        # compiled and eager calls may round differently; a wrong head differs at O(1)
        rtol = 1e-10 if full.dtype == tf.float64 else 1e-4
        if full.shape != z.shape or not np.allclose(full.numpy(), z.numpy(), rtol=rtol,
                                                    atol=rtol * np.abs(full.numpy()).max()):
            raise checks.ArgumentError(
                f"{where}: subset='last_layer': the output of the last layer "
                f"'{self._layer.name}' is not the model's output (a skip connection or a layer "
                "not in model.layers?); use subset='all'")

    # ------------------------------------------------------------------------------ fit

    def fit(self, data: Batch) -> "BaseLaplace":
        """Compute the curvature H over `data` at the model's current weights, which become
        the posterior mean.

        Args:
          data: one (x, y) batch or a tf.data.Dataset of them (a Dataset under a strategy):
            regression targets [N, C] (or [N] when C == 1) or integer class labels [N].
        Returns:
          self, fitted.
        Raises:
          ArgumentError: data empty, not finite or of targets the likelihood cannot take; a
            model output not finite; a last layer not producing it (subset="last_layer").
        """
        where = "Laplace.fit"
        batches = data_batches(data, where, pair=True)
        if self.strategy is not None:
            distribute_batches(data, self.strategy, where)  # a Dataset, or its error
        total, count, width, head_batches = 0.0, 0, None, []
        for i, (x, y) in enumerate(batches):
            rows = int(tf.shape(tf.nest.flatten(x)[0])[0])
            if rows == 0:
                raise checks.ArgumentError(
                    f"{where}: data's batch {i} holds no examples (its inputs have 0 rows); "
                    "pass data with at least one example per batch")
            for part, value in (("inputs x", x), ("targets y", y)):
                bad = sum(_not_finite(t) for t in tf.nest.flatten(value))
                if bad:
                    raise checks.ArgumentError(
                        f"{where}: data's {part} hold {bad} NaN or infinite values (batch {i});"
                        " remove or impute them before fitting")
            inputs = self._inputs(x)
            z = self._outputs(inputs)
            self._check_output(z, where)
            if _not_finite(z):
                raise checks.ArgumentError(
                    f"{where}: the model's output on data batch {i} is not finite (NaN or inf "
                    "in its weights?); the Laplace approximation needs a finite MAP")
            if width is None and self._features is not None:
                self._check_head(x, z, where)
            width = int(z.shape[-1])
            total += self._summed_loss(z, self._labels(y, z, where))
            count += rows
            head_batches.append((inputs, y))
        if count == 0:
            raise checks.ArgumentError(f"{where}: data holds no examples")
        self.n_data, self.n_outputs, self.loss = count, width, total
        self.mean = np.concatenate([np.ravel(p.numpy()) for p in self.params]).astype(np.float64)
        self._fit_curvature(self._head_data(data, head_batches))
        self._fitted = True
        return self

    def _head_data(self, data, head_batches):
        """What the curvature operators take: `data` itself, or (last layer) its features with
        the labels, in the same batches (a Dataset when there are several or a strategy)."""
        if self._features is None:
            return data
        if len(head_batches) == 1 and self.strategy is None:
            return head_batches[0]
        joined = tuple(tf.concat([tf.convert_to_tensor(b[i]) for b in head_batches], 0)
                       for i in range(2))
        size = int(tf.shape(head_batches[0][0])[0])
        return tf.data.Dataset.from_tensor_slices(joined).batch(size)

    def _require_fit(self, what):
        if not self._fitted:
            raise ValueError(f"Laplace.{what}: call fit(data) first")

    @property
    def gauss_newton_scale(self):
        """H per unit of the summed Keras loss's Gauss-Newton matrix: MSE's per-example value
        is a mean over the C outputs, so laplace-torch's H = C / 2 times it; 1 for
        cross-entropy."""
        if not hasattr(self, "n_outputs"):
            raise ValueError("Laplace.gauss_newton_scale: call fit(data) first")
        return self.n_outputs / 2 if self.likelihood == "regression" else 1.0

    def _loss(self, reduction):
        """The Keras loss of the likelihood, at the model's dtype."""
        if self.likelihood == "regression":
            return keras.losses.MeanSquaredError(reduction=reduction, dtype=self.dtype.name)
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction,
                                                          dtype=self.dtype.name)

    # ------------------------------------------------------------------------- evidence

    def log_likelihood(self, sigma_noise: Optional[Scalar] = None) -> tf.Tensor:
        """log p(y | theta*) summed over the fitted data.

        Args:
          sigma_noise: the regression noise (> 0; a number or a scalar tensor; default None:
            the stored one); None for classification.
        Returns:
          A float64 scalar tensor.
        Raises:
          ValueError: not fitted.
          ArgumentError: `sigma_noise` given for classification, or not positive.
        """
        self._require_fit("log_likelihood")
        if self.likelihood == "classification":
            if sigma_noise is not None:
                raise checks.ArgumentError("Laplace.log_likelihood: sigma_noise is only for "
                                           "likelihood='regression'")
            return -tf.constant(self.loss, tf.float64)
        sigma = self._sigma(sigma_noise, "Laplace.log_likelihood")
        return (-tf.constant(self.loss, tf.float64) / tf.square(sigma)
                - self.n_data * self.n_outputs * (tf.math.log(sigma) + HALF_LOG_2PI))

    def _evidence(self, delta, sigma):
        factor = 1 / tf.square(sigma)
        if delta.shape.rank == 0:
            log_det_prior = self.n_params * tf.math.log(delta)
        else:
            log_det_prior = tf.reduce_sum(tf.math.log(delta))
        scatter = tf.reduce_sum(delta * tf.constant(np.square(self.mean - self.prior_mean)))
        loglik = self.log_likelihood(sigma if self.likelihood == "regression" else None)
        return loglik - 0.5 * (self._log_det(delta, factor) - log_det_prior + scatter)

    def log_marginal_likelihood(self, prior_precision: Optional[TensorLike] = None,
                                sigma_noise: Optional[Scalar] = None) -> tf.Tensor:
        """The Laplace log evidence; like laplace-torch, values given are STORED (so a later
        `predictive` uses them).

        Args:
          prior_precision: a number, a vector (n_layers or n_params values) or a float
            tensor / variable (differentiable through); default the stored value.
          sigma_noise: the regression noise, likewise; default the stored value.
        Returns:
          A float64 scalar tensor.
        Raises:
          ValueError: not fitted.
          ArgumentError: a value out of range, `sigma_noise` for classification, or values
            given inside a tf.function (they cannot be stored there).
        """
        where = "Laplace.log_marginal_likelihood"
        self._require_fit("log_marginal_likelihood")
        if sigma_noise is not None and self.likelihood != "regression":
            raise checks.ArgumentError(f"{where}: sigma_noise is only for "
                                       "likelihood='regression'")
        given = (prior_precision, sigma_noise)
        if not tf.executing_eagerly() and any(v is not None for v in given):
            raise checks.ArgumentError(
                f"{where}: the values given are stored (as laplace-torch), which a tf.function "
                "trace cannot do; call it eagerly, or set prior_precision / sigma_noise on the "
                "object and call it without arguments")
        value = self._evidence(self._delta(prior_precision, where), self._sigma(sigma_noise,
                                                                                 where))
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            self.sigma_noise = sigma_noise
        return value

    # ------------------------------------------------------------------------ posterior

    @property
    def posterior_precision(self):
        """P = H / sigma^2 + diag(delta): dense [n, n] float64 numpy ('full'), its diagonal
        [n] ('diag'), a tf.linalg.LinearOperator ('kron')."""
        self._require_fit("posterior_precision")
        return self._precision(self._delta(None, "Laplace.posterior_precision"),
                               1 / self.sigma_noise ** 2)
