"""Laplace approximations of a Keras model's posterior, in laplace-torch's shape
(Daxberger et al. 2021, `laplace.Laplace`).

The model's current weights theta* are taken as the MAP of the summed log-likelihood plus an
isotropic Gaussian prior N(prior_mean, 1 / prior_precision). `fit(data)` computes the
Gauss-Newton matrix H (= the type-2 Fisher) of the SUMMED negative log-likelihood over the
data set, without the noise scale, exactly as laplace-torch does:

- "regression": the Gaussian likelihood N(y; f(x), sigma_noise^2 I); H = sum_i J_i^T J_i
  (the Gauss-Newton matrix of 0.5 * sum of squared errors) and the posterior precision is
  P = H / sigma_noise^2 + prior_precision * I;
- "classification": the categorical likelihood of softmax(f(x)) (the model outputs LOGITS);
  H = sum_i J_i^T (diag(p_i) - p_i p_i^T) J_i, P = H + prior_precision * I.

hessian: "full" (dense H, n x n, kept as its eigendecomposition), "diag" (the exact
diagonal of H, `gauss_newton_diagonal`'s computation) or "kfac" (`KFACOperator`: one
Kronecker factor pair per Dense / Conv2D layer, the exact diagonal for other layers).
subset: "all" (every trainable variable) or "last_layer" (the variables of the model's last
layer, which must produce the model's output; the layers before it give fixed features).

`log_marginal_likelihood(prior_precision, sigma_noise)` is laplace-torch's
    log p(y | theta*) - 0.5 * (log det P - log det P_0 + delta * ||theta* - mu_0||^2),
computed in float64 from H's eigenvalues (so it is cheap and differentiable in both
hyperparameters, tf tensors or variables included). For a model linear in its weights with
the regression likelihood, theta* the exact MAP and hessian="full" it is the exact log
evidence log N(y; 0, sigma^2 I + X X^T / delta) (tests/test_curvature_laplace.py).

`optimize_prior_precision` tunes the prior precision (and the noise) by the evidence (Adam on
the logs as laplace-torch, or L-BFGS), or by a grid search on a validation set's NLL.

`predictive(x)` is the linearized (GLM) predictive: f ~ N(f(x; theta*), J(x) P^-1 J(x)^T).
Regression returns (mean [N, C], variance [N, C, C]) of f, WITHOUT the observation noise
(as laplace-torch; `observation_noise=True` adds sigma_noise^2 I). Classification returns
class probabilities [N, C]: the probit approximation softmax(mu / sqrt(1 + pi/8 var)) or
the Monte Carlo mean of softmax over samples of f.

`Laplace(..., strategy=)` (a tf.distribute.Strategy) splits each batch of `fit`'s data (a
Dataset) over the replicas: the summed loss, example count and H (or its diagonal) are
per-replica sums all-reduced (`data.replica_sums`), K-FAC is `KFACOperator(strategy=)`
(for subset="last_layer" on features computed on the replicas); the result equals one
device's. The first batch is also checked eagerly (output, labels, last layer).

Differences from laplace-torch, on purpose: the prior precision is one scalar (laplace-torch
also has per-layer and per-parameter priors); passing `prior_precision` / `sigma_noise` to
`log_marginal_likelihood` evaluates at them without changing the stored values;
`temperature` is not supported.
"""

import math
import numbers

import keras
import numpy as np
import tensorflow as tf

from hogrod.curvature.data import (check_strategy, data_batches, distribute_batches,
                                   replica_sums)
from hogrod.curvature.kfac import KFACOperator
from hogrod.curvature.per_example import batch_gradients

__all__ = ["Laplace", "LIKELIHOODS", "SUBSETS", "HESSIANS"]

LIKELIHOODS = ("regression", "classification")
SUBSETS = ("all", "last_layer")
HESSIANS = ("full", "diag", "kfac")
LINK_APPROXES = ("probit", "mc")
OPTIMIZERS = ("adam", "lbfgs")
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _choice(value, allowed, arg, where):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{where}: {arg} must be one of {allowed}, got {value!r}")
    return value


def _positive(value, arg, where):
    """A positive finite Python/numpy number, as a Python float."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating)):
        raise TypeError(f"{where}: {arg} must be a positive number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {arg} must be positive and finite, got {value}")
    return float(value)


def _count(value, least, arg, where):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
        raise ValueError(f"{where}: {arg} must be an integer >= {least}, got {value!r}")
    return int(value)


def _hyper(value, stored, arg, where):
    """A hyperparameter as a float64 scalar tensor: a Python number (checked > 0, converted
    exactly) or a tensor / variable of any float dtype (cast; differentiable through)."""
    if value is None:
        return tf.constant(stored, tf.float64)
    if isinstance(value, (numbers.Real, np.floating)) and not isinstance(value, bool):
        return tf.constant(_positive(value, arg, where), tf.float64)
    t = tf.convert_to_tensor(value)
    if not t.dtype.is_floating or t.shape.num_elements() != 1:
        raise ValueError(f"{where}: {arg} must be a positive scalar (number or float tensor), "
                         f"got {t.dtype.name} of shape {t.shape}")
    t = tf.cast(tf.reshape(t, []), tf.float64)
    if tf.executing_eagerly() and not t.numpy() > 0:
        raise ValueError(f"{where}: {arg} must be positive, got {t.numpy()}")
    return t


def _last_layer(model, where):
    """The last layer (it must carry trainable variables) and a feature model for its input."""
    layers = getattr(model, "layers", None)
    if not layers:
        raise ValueError(f"{where}: subset='last_layer' needs a Sequential or functional model "
                         "whose last layer produces the output")
    last = layers[-1]
    if not last.trainable_variables:
        raise ValueError(f"{where}: subset='last_layer': the model's last layer "
                         f"'{last.name}' has no trainable variables (a trailing activation "
                         "or reshape?); put the trainable layer last or use subset='all'")
    try:
        features = keras.Model(model.inputs, last.input)
    except (AttributeError, ValueError, TypeError) as e:
        raise ValueError(f"{where}: subset='last_layer' cannot read the input of layer "
                         f"'{last.name}' ({e}); build the model with keras.Input") from None
    return last, features


class Laplace:
    """The Laplace approximation of a Keras model at its current weights (see the module
    docstring for the formulas).

    Args:
      model: a built Keras 3 model; `model(x, training=False)` is [batch, C]: regression
        outputs, or class logits (C >= 2) for classification.
      likelihood: "regression" (Gaussian, noise `sigma_noise`) or "classification"
        (categorical on softmax of the logits).
      subset: "all" or "last_layer".
      hessian: "full", "diag" or "kfac".
      prior_precision: delta > 0, the isotropic prior's precision.
      sigma_noise: the regression noise's standard deviation (> 0); must stay 1.0 for
        classification.
      prior_mean: mu_0, a number (every parameter) or a flat vector of the subset's size.
      strategy: a tf.distribute.Strategy: `fit` splits each batch of its data (a Dataset)
        over the replicas, sums the log-likelihood and H (or K-FAC's statistics, by
        `KFACOperator(strategy=)`) over them; the result equals one device's.
    """

    def __init__(self, model, likelihood="regression", subset="all", hessian="full",
                 prior_precision=1.0, sigma_noise=1.0, prior_mean=0.0, strategy=None):
        where = "Laplace"
        check_strategy(strategy, where)
        self.strategy = strategy
        if not isinstance(model, keras.Model) or not model.built:
            raise ValueError(f"{where}: model must be a built keras.Model (e.g. with "
                             f"keras.Input), got {type(model).__name__}")
        self.likelihood = _choice(likelihood, LIKELIHOODS, "likelihood", where)
        self.subset = _choice(subset, SUBSETS, "subset", where)
        self.hessian = _choice(hessian, HESSIANS, "hessian", where)
        self.model = model
        if subset == "last_layer":
            self._layer, self._features = _last_layer(model, where)
            self.params = list(self._layer.trainable_variables)
        else:
            self._layer, self._features = None, None
            self.params = list(model.trainable_variables)
        if not self.params:
            raise ValueError(f"{where}: the model has no trainable variables")
        dtypes = {tf.as_dtype(p.dtype) for p in self.params}
        if len(dtypes) != 1:
            raise TypeError(f"{where}: the parameters mix dtypes {sorted(d.name for d in dtypes)}")
        self.dtype = dtypes.pop()
        self.n_params = sum(int(np.prod(p.shape)) for p in self.params)
        self.prior_precision = prior_precision
        self.sigma_noise = sigma_noise
        self.prior_mean = prior_mean
        if self.likelihood == "classification":
            self._check_logits_head(where)
        self._fitted = False
        self._jacobian = None

    # ------------------------------------------------------------------ hyperparameters

    @property
    def prior_precision(self):
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value):
        self._prior_precision = _positive(value, "prior_precision", "Laplace")

    @property
    def sigma_noise(self):
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value):
        value = _positive(value, "sigma_noise", "Laplace")
        if self.likelihood == "classification" and value != 1.0:
            raise ValueError(f"Laplace: sigma_noise is the regression noise; with "
                             f"likelihood='classification' it must be 1.0, got {value}")
        self._sigma_noise = value

    @property
    def prior_mean(self):
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value):
        mean = np.asarray(value, np.float64)
        if mean.ndim == 0:
            mean = np.full([self.n_params], float(mean))
        if mean.shape != (self.n_params,) or not np.all(np.isfinite(mean)):
            raise ValueError(f"Laplace: prior_mean must be a finite number or a flat vector of "
                             f"the {self.n_params} parameters, got shape {mean.shape}")
        self._prior_mean = mean

    # ---------------------------------------------------------------------------- model

    def _check_logits_head(self, where):
        """Classification needs logits; a softmax / sigmoid output layer gives probabilities
        whose softmax would silently be a different model."""
        last = self.model.layers[-1] if getattr(self.model, "layers", None) else None
        act = getattr(last, "activation", None)
        if act is not None and getattr(act, "__name__", "") in ("softmax", "sigmoid"):
            raise ValueError(f"{where}: likelihood='classification' takes LOGITS, but the last "
                             f"layer '{last.name}' has activation '{act.__name__}'; remove it "
                             "(the softmax is the likelihood's)")

    def _inputs(self, x):
        """The Jacobian's function's inputs: the last layer's features, or x itself."""
        return x if self._features is None else self._features(x, training=False)

    def _head_fn(self, inputs):
        if self._features is None:
            return self.model(inputs, training=False)
        return self._layer(inputs, training=False)

    def _jacobian_fn(self, inputs):
        """(z [N, C], J [N, C, n]) of the head at its inputs."""
        with tf.GradientTape() as tape:
            z = tf.convert_to_tensor(self._head_fn(inputs))
            flat = tf.reshape(z, [-1])
        rows = batch_gradients(flat, self.params, tape)
        return z, tf.reshape(rows, tf.concat([tf.shape(z), [self.n_params]], 0))

    def _outputs_and_jacobian(self, x, where):
        inputs = self._inputs(x)
        if isinstance(inputs, np.ndarray):
            inputs = tf.convert_to_tensor(inputs)
        if self._jacobian is None:  # one trace for every batch size (a tensor input)
            spec = None
            if tf.is_tensor(inputs) and inputs.shape.rank:
                spec = [tf.TensorSpec([None, *inputs.shape[1:]], inputs.dtype)]
            self._jacobian = tf.function(self._jacobian_fn, input_signature=spec,
                                         reduce_retracing=spec is None)
        z, jac = self._jacobian(inputs)
        self._check_output(z, where)
        return z, jac

    def _check_output(self, z, where):
        if z.shape.rank != 2:
            raise ValueError(f"{where}: the model output must be [batch, outputs], got shape "
                             f"{z.shape}")
        if self.likelihood == "classification" and z.shape[-1] < 2:
            raise ValueError(f"{where}: likelihood='classification' needs class logits (at "
                             f"least 2 outputs), but the model output has width {z.shape[-1]}; "
                             "give a binary problem 2 logits, or use likelihood='regression'")

    def _labels(self, y, z, where):
        """Regression targets [N, C] (or [N] when C == 1) at float64, or class indices."""
        y = tf.convert_to_tensor(y)
        n, c = z.shape
        if self.likelihood == "regression":
            if not y.dtype.is_floating:
                raise TypeError(f"{where}: likelihood='regression' needs floating targets, got "
                                f"{y.dtype.name}")
            if y.shape.rank == 1 and c == 1:
                y = y[:, None]
            if y.shape != z.shape:
                raise ValueError(f"{where}: regression targets have shape {y.shape} but the "
                                 f"model output has shape {z.shape}")
            return tf.cast(y, tf.float64)
        if y.shape.rank == 2 and y.shape[-1] == 1:
            y = y[:, 0]
        if not y.dtype.is_integer or y.shape.rank != 1 or y.shape[0] != n:
            raise ValueError(f"{where}: likelihood='classification' needs integer class labels "
                             f"of shape [{n}] (or [{n}, 1]), got {y.dtype.name} {y.shape}")
        bad = tf.logical_or(y < 0, y >= c)
        if not tf.executing_eagerly():  # a replica's shard, in fit under a strategy
            tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
                f"{where}: class labels must lie in [0, {c}) for {c} logits, got", y[bad][:5]])
        elif bool(tf.reduce_any(bad)):
            raise ValueError(f"{where}: class labels must lie in [0, {c}) for {c} logits, got "
                             f"{y[bad][:5].numpy().tolist()}")
        return y

    def _loss_and_roots(self, z, jac, y):
        """(summed negative log-likelihood without the noise scale, rows R with H = R^T R):
        regression 0.5 * sum (y - z)^2 and R = J; classification sum of cross-entropies and
        R = S^T J with S S^T = diag(p) - p p^T, S's columns sqrt(p_k) (p - e_k)."""
        z = tf.cast(z, tf.float64)
        if self.likelihood == "regression":
            loss = 0.5 * tf.reduce_sum(tf.square(y - z))
        else:
            logp = tf.nn.log_softmax(z)
            loss = -tf.reduce_sum(tf.gather(logp, y, batch_dims=1))
        if jac is None:
            return loss, None
        jac = tf.cast(jac, tf.float64)
        if self.likelihood == "regression":
            return loss, tf.reshape(jac, [-1, jac.shape[-1]])
        p = tf.exp(logp)
        roots = (p[:, :, None] - tf.eye(z.shape[-1], dtype=tf.float64)[None]) \
            * tf.sqrt(p)[:, None, :]
        rows = tf.einsum("nck,ncp->nkp", roots, jac)
        return loss, tf.reshape(rows, [-1, jac.shape[-1]])

    # ------------------------------------------------------------------------------ fit

    def fit(self, data):
        """Compute H over `data` (one (x, y) batch or a tf.data.Dataset of them) at the
        model's current weights, which become the posterior mean."""
        where = "Laplace.fit"
        if self.strategy is not None:
            return self._fit_distributed(data, where)
        total_loss, count, width = 0.0, 0, None
        gram, diag, kfac_batches = None, None, []
        for x, y in data_batches(data, where, pair=True):
            if self.hessian == "kfac":  # K-FAC needs no Jacobian here, only the loss
                inputs = self._inputs(x)
                z, jac = tf.convert_to_tensor(self._head_fn(inputs)), None
                self._check_output(z, where)
            else:
                z, jac = self._outputs_and_jacobian(x, where)
            if width is None and self._features is not None:
                self._check_head(x, z, where)
            width = int(z.shape[-1])
            labels = self._labels(y, z, where)
            loss, rows = self._loss_and_roots(z, jac, labels)
            total_loss += float(loss)
            count += int(z.shape[0])
            if self.hessian == "full":
                part = tf.matmul(rows, rows, transpose_a=True)
                gram = part if gram is None else gram + part
            elif self.hessian == "diag":
                part = tf.reduce_sum(tf.square(rows), 0)
                diag = part if diag is None else diag + part
            else:
                kfac_batches.append((inputs, y))
        if count == 0:
            raise ValueError(f"{where}: data holds no examples")
        return self._finish_fit(total_loss, count, width, gram if gram is not None else diag,
                                kfac_batches)

    def _finish_fit(self, total_loss, count, width, curvature, kfac_batches):
        self.n_data, self.n_outputs, self.loss = count, width, total_loss
        self.mean = np.concatenate([np.ravel(p.numpy()) for p in self.params]).astype(np.float64)
        gram = diag = curvature
        if self.hessian == "full":
            evals, evecs = tf.linalg.eigh(0.5 * (gram + tf.transpose(gram)))
            # H = R^T R is positive semi-definite: a negative eigenvalue is round-off
            self._evals, self._basis = tf.maximum(evals, 0.0), evecs
            self.H = gram.numpy()
        elif self.hessian == "diag":
            self._evals, self.H = diag, diag.numpy()
        else:
            self._fit_kfac(kfac_batches, count, width)
        self._fitted = True
        return self

    def _fit_distributed(self, data, where):
        """fit under `self.strategy`: the first batch checked eagerly (output, labels, last
        layer), then every batch split over the replicas, each replica's sums (loss, count,
        H or its diagonal) all-reduced; K-FAC gets the strategy."""
        data_batches(data, where, pair=True)  # the (x, y) check
        batches = distribute_batches(data, self.strategy, where)
        first = next(iter(data), None)
        if first is None:
            raise ValueError(f"{where}: data holds no examples")
        z = tf.convert_to_tensor(self._head_fn(self._inputs(first[0])))
        self._check_output(z, where)
        if self._features is not None:
            self._check_head(first[0], z, where)
        self._labels(first[1], z, where)
        sums = replica_sums(lambda batch: self._shard_sums(batch, where), self.strategy)
        totals = None
        for batch in batches:
            part = sums(batch)
            totals = part if totals is None else tf.nest.map_structure(tf.add, totals, part)
        count = int(totals["count"])
        if count == 0:
            raise ValueError(f"{where}: data holds no examples")
        kfac_batches = data
        if self.hessian == "kfac" and self._features is not None:
            kfac_batches = self._distributed_features(batches)
        return self._finish_fit(float(totals["loss"]), count, int(z.shape[-1]),
                                totals.get("curvature"), kfac_batches)

    def _shard_sums(self, batch, where):
        """{loss, count, curvature (H or its diagonal; not for K-FAC)} of one shard."""
        x, y = batch
        inputs = self._inputs(x)
        if self.hessian == "kfac":
            z, jac = tf.convert_to_tensor(self._head_fn(inputs)), None
        else:
            z, jac = self._jacobian_fn(inputs)
        self._check_output(z, where)
        loss, rows = self._loss_and_roots(z, jac, self._labels(y, z, where))
        out = {"loss": loss, "count": tf.cast(tf.shape(z)[0], tf.float64)}
        if self.hessian == "full":
            out["curvature"] = tf.matmul(rows, rows, transpose_a=True)
        elif self.hessian == "diag":
            out["curvature"] = tf.reduce_sum(tf.square(rows), 0)
        return out

    def _distributed_features(self, batches):
        """[(features, y)] per batch, the features computed on the replicas' shards."""
        strategy = self.strategy

        @tf.function
        def shard_features(batch):
            return strategy.run(lambda b: (self._features(b[0], training=False), b[1]),
                                args=(batch,))

        def joined(t):  # the shards in replica order: the batch's order
            return tf.concat(strategy.experimental_local_results(t), 0)
        return [tuple(joined(t) for t in shard_features(b)) for b in batches]

    def _check_head(self, x, z, where):
        """subset='last_layer': the last layer must produce the model's output."""
        full = tf.convert_to_tensor(self.model(x, training=False))
        # compiled and eager calls may round differently; a wrong head differs at O(1)
        rtol = 1e-10 if full.dtype == tf.float64 else 1e-4
        if full.shape != z.shape or not np.allclose(full.numpy(), z.numpy(), rtol=rtol,
                                                    atol=rtol * np.abs(full.numpy()).max()):
            raise ValueError(f"{where}: subset='last_layer': the output of the last layer "
                             f"'{self._layer.name}' is not the model's output (a skip "
                             "connection or a layer not in model.layers?); use subset='all'")

    def _fit_kfac(self, batches, count, width):
        """K-FAC of the mean per-example loss (KFACOperator) scaled to laplace-torch's H:
        MSE's per-example Gauss-Newton is (2 / C) J^T J, so H = N C / 2 * K; cross-entropy's
        is the per-example H itself, so H = N * K."""
        if self._features is None:
            model = self.model
        else:  # the last layer alone, on the features
            feats = batches[0][0]
            model = keras.Sequential([keras.Input(feats.shape[1:], dtype=feats.dtype),
                                      self._layer])
        if self.likelihood == "regression":
            loss = keras.losses.MeanSquaredError(dtype=self.dtype.name)
            self._kfac_scale = count * width / 2
        else:
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                              dtype=self.dtype.name)
            self._kfac_scale = float(count)
        if isinstance(batches, tf.data.Dataset):  # the data itself, under a strategy
            data = batches
        elif len(batches) == 1 and self.strategy is None:
            data = batches[0]
        else:
            data = tf.data.Dataset.from_tensor_slices(tuple(
                tf.concat([tf.convert_to_tensor(b[i]) for b in batches], 0) for i in range(2)))
            data = data.batch(int(tf.shape(batches[0][0])[0]))
        self._kfac = KFACOperator(model, loss, data, fisher="type2", approx="expand",
                                  other_layers="diagonal", strategy=self.strategy)
        values = [tf.reshape(ea[:, None] * eg[None, :], [-1])
                  for ea, _, eg, _ in self._kfac.eigendecompositions.values()]
        values += [tf.reshape(d, [-1]) for ds in self._kfac.diagonals.values() for d in ds]
        evals = tf.cast(tf.concat(values, 0), tf.float64) * self._kfac_scale
        if int(evals.shape[0]) != self.n_params:
            raise AssertionError(f"K-FAC eigenvalues cover {evals.shape[0]} of "
                                 f"{self.n_params} parameters")
        self._evals = evals

    def _require_fit(self, what):
        if not self._fitted:
            raise ValueError(f"Laplace.{what}: call fit(data) first")

    # ------------------------------------------------------------------------- evidence

    def log_likelihood(self, sigma_noise=None):
        """log p(y | theta*) summed over the fitted data (float64 tensor)."""
        self._require_fit("log_likelihood")
        if self.likelihood == "classification":
            if sigma_noise is not None:
                raise ValueError("Laplace.log_likelihood: sigma_noise is only for "
                                 "likelihood='regression'")
            return -tf.constant(self.loss, tf.float64)
        sigma = _hyper(sigma_noise, self.sigma_noise, "sigma_noise", "Laplace.log_likelihood")
        return (-tf.constant(self.loss, tf.float64) / tf.square(sigma)
                - self.n_data * self.n_outputs * (tf.math.log(sigma) + _HALF_LOG_2PI))

    def log_marginal_likelihood(self, prior_precision=None, sigma_noise=None):
        """The Laplace log evidence at (prior_precision, sigma_noise) (default: the stored
        values), a float64 scalar differentiable in both."""
        where = "Laplace.log_marginal_likelihood"
        self._require_fit("log_marginal_likelihood")
        if sigma_noise is not None and self.likelihood != "regression":
            raise ValueError(f"{where}: sigma_noise is only for likelihood='regression'")
        delta = _hyper(prior_precision, self.prior_precision, "prior_precision", where)
        sigma = _hyper(sigma_noise, self.sigma_noise, "sigma_noise", where)
        factor = 1 / tf.square(sigma)
        log_det_post = tf.reduce_sum(tf.math.log(factor * self._evals + delta))
        log_det_prior = self.n_params * tf.math.log(delta)
        scatter = delta * float(np.sum(np.square(self.mean - self.prior_mean)))
        loglik = self.log_likelihood(sigma if self.likelihood == "regression" else None)
        return loglik - 0.5 * (log_det_post - log_det_prior + scatter)

    def optimize_prior_precision(self, method="marglik", n_steps=100, lr=0.1,
                                 init_prior_prec=1.0, optimize_sigma_noise=False,
                                 init_sigma_noise=None, optimizer="adam", tol=1e-10,
                                 val_data=None, grid=None, link_approx="probit"):
        """Tune the prior precision; stores it and returns a dict {prior_precision,
        sigma_noise, log_marginal_likelihood} (+ val_nll for "gridsearch").

        method="marglik": maximize the log evidence over log(prior_precision) (and
        log(sigma_noise) with `optimize_sigma_noise`, regression only). optimizer: "adam"
        (laplace-torch's: `n_steps` Adam steps at `lr` on the logs, in float64) or "lbfgs"
        (scipy's L-BFGS-B to gradient tolerance `tol`, at most `n_steps` iterations).
        method="gridsearch": the value of `grid` (default laplace-torch's 10^linspace(-4, 4,
        100)) minimizing the mean negative log predictive density on `val_data` (one (x, y)
        batch or a tf.data.Dataset): the `link_approx` class probabilities, or the Gaussian
        N(y; mean, variance + sigma_noise^2 I) for regression.
        """
        where = "Laplace.optimize_prior_precision"
        self._require_fit("optimize_prior_precision")
        _choice(method, ("marglik", "gridsearch"), "method", where)
        if method == "gridsearch":
            return self._gridsearch(val_data, grid, link_approx, where)
        if val_data is not None:
            raise ValueError(f"{where}: val_data is for method='gridsearch'; the evidence "
                             "uses the fitted data")
        _choice(optimizer, OPTIMIZERS, "optimizer", where)
        n_steps = _count(n_steps, 1, "n_steps", where)
        lr = _positive(lr, "lr", where)
        if optimize_sigma_noise and self.likelihood != "regression":
            raise ValueError(f"{where}: optimize_sigma_noise=True is only for "
                             "likelihood='regression'")
        start = [math.log(_positive(init_prior_prec, "init_prior_prec", where))]
        if optimize_sigma_noise:
            sigma0 = self.sigma_noise if init_sigma_noise is None else init_sigma_noise
            start.append(math.log(_positive(sigma0, "init_sigma_noise", where)))

        @tf.function
        def value_and_grad(logs):
            with tf.GradientTape() as tape:
                tape.watch(logs)
                value = -self.log_marginal_likelihood(
                    tf.exp(logs[0]), tf.exp(logs[1]) if optimize_sigma_noise else None)
            return value, tape.gradient(value, logs)

        def f(logs):
            value, grad = value_and_grad(tf.constant(logs, tf.float64))
            return float(value), grad.numpy()

        logs = np.array(start, np.float64)
        if optimizer == "adam":
            m, v = np.zeros_like(logs), np.zeros_like(logs)
            b1, b2, eps = 0.9, 0.999, 1e-8
            for t in range(1, n_steps + 1):
                _, g = f(logs)
                m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                logs = logs - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        else:
            import scipy.optimize
            result = scipy.optimize.minimize(f, logs, jac=True, method="L-BFGS-B",
                                             options={"maxiter": n_steps, "gtol": tol,
                                                      "ftol": 0.0})
            logs = result.x
        if not np.all(np.isfinite(logs)):
            raise ValueError(f"{where}: the optimization diverged (log hyperparameters "
                             f"{logs}); lower lr")
        self.prior_precision = float(np.exp(logs[0]))
        if optimize_sigma_noise:
            self.sigma_noise = float(np.exp(logs[1]))
        return {"prior_precision": self.prior_precision, "sigma_noise": self.sigma_noise,
                "log_marginal_likelihood": float(self.log_marginal_likelihood())}

    def _gridsearch(self, val_data, grid, link_approx, where):
        if val_data is None:
            raise ValueError(f"{where}: method='gridsearch' needs val_data (one (x, y) batch "
                             "or a tf.data.Dataset)")
        _choice(link_approx, LINK_APPROXES, "link_approx", where)
        grid = 10.0 ** np.linspace(-4, 4, 100) if grid is None else np.asarray(grid, float)
        if grid.ndim != 1 or not grid.size or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ValueError(f"{where}: grid must be a non-empty 1-D array of positive prior "
                             f"precisions, got {grid!r}")
        batches = []
        for x, y in data_batches(val_data, where, pair=True):  # outputs and Jacobians once
            z, jac = self._outputs_and_jacobian(x, where)
            batches.append((tf.cast(z, tf.float64), jac, self._labels(y, z, where)))
        stored, scores = self.prior_precision, []
        try:
            for delta in grid:
                self.prior_precision = float(delta)
                total, count = 0.0, 0
                for z, jac, y in batches:
                    total += float(tf.reduce_sum(self._nll(z, jac, y, link_approx)))
                    count += int(z.shape[0])
                scores.append(total / count)
        finally:
            self.prior_precision = stored
        scores = np.asarray(scores)
        if not np.any(np.isfinite(scores)):
            raise ValueError(f"{where}: the validation NLL is not finite on the whole grid")
        self.prior_precision = float(grid[np.nanargmin(scores)])
        return {"prior_precision": self.prior_precision, "sigma_noise": self.sigma_noise,
                "log_marginal_likelihood": float(self.log_marginal_likelihood()),
                "val_nll": float(np.nanmin(scores))}

    def _nll(self, mu, jac, y, link_approx):
        """Per-example negative log predictive density (float64)."""
        var = self.functional_variance(jac)
        if self.likelihood == "regression":
            cov = var + self.sigma_noise ** 2 * tf.eye(mu.shape[-1], dtype=tf.float64)
            dist_chol = tf.linalg.cholesky(cov)
            r = tf.linalg.triangular_solve(dist_chol, (y - mu)[..., None])[..., 0]
            logdet = 2 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(dist_chol)), -1)
            return 0.5 * (tf.reduce_sum(tf.square(r), -1) + logdet) \
                + mu.shape[-1] * _HALF_LOG_2PI
        probs = self._class_probs(mu, var, link_approx, 100, 0)
        return -tf.math.log(tf.gather(probs, y, batch_dims=1))

    def _class_probs(self, mu, var, link_approx, n_samples, seed):
        if link_approx == "probit":
            kappa = 1 / tf.sqrt(1 + math.pi / 8 * tf.linalg.diag_part(var))
            return tf.nn.softmax(kappa * mu)
        samples = self.sample_functions(mu, var, n_samples, seed)
        return tf.reduce_mean(tf.nn.softmax(samples), 0)

    # ------------------------------------------------------------------------ posterior

    @property
    def posterior_precision(self):
        """P = H / sigma^2 + delta I: dense [n, n] float64 numpy for hessian='full', its
        diagonal [n] for 'diag', a tf.linalg.LinearOperator for 'kfac'."""
        self._require_fit("posterior_precision")
        factor = 1 / self.sigma_noise ** 2
        if self.hessian == "full":
            return factor * self.H + self.prior_precision * np.eye(self.n_params)
        if self.hessian == "diag":
            return factor * self.H + self.prior_precision
        scale = self._kfac_scale * factor
        return tf.linalg.LinearOperatorComposition([
            tf.linalg.LinearOperatorScaledIdentity(self.n_params, tf.constant(scale, self.dtype)),
            self._kfac.with_damping(self.prior_precision / scale)])

    @property
    def posterior_covariance(self):
        """P^-1: dense [n, n] float64 numpy ('full'), its diagonal [n] ('diag')."""
        self._require_fit("posterior_covariance")
        inverse = 1 / self._posterior_evals().numpy()
        if self.hessian == "full":
            basis = self._basis.numpy()
            return (basis * inverse) @ basis.T
        if self.hessian == "diag":
            return inverse
        raise ValueError("Laplace.posterior_covariance: dense only for hessian='full' or "
                         "'diag'; with hessian='kfac' use posterior_precision.solve")

    def _posterior_evals(self):
        return self._evals / self.sigma_noise ** 2 + self.prior_precision

    def functional_variance(self, jac):
        """J P^-1 J^T per example: jac [N, C, n] -> [N, C, C] float64."""
        jac = tf.cast(jac, tf.float64)
        inverse = 1 / self._posterior_evals()
        if self.hessian == "full":
            rotated = tf.einsum("ncp,pq->ncq", jac, self._basis)
            return tf.einsum("ncq,q,nkq->nck", rotated, inverse, rotated)
        if self.hessian == "diag":
            return tf.einsum("ncp,p,nkp->nck", jac, inverse, jac)
        shape = tf.shape(jac)
        scale = self._kfac_scale / self.sigma_noise ** 2
        op = self._kfac.with_damping(self.prior_precision / scale)
        rows = tf.transpose(tf.reshape(jac, [-1, self.n_params]))  # [n, N C]
        solved = tf.cast(op.solve(tf.cast(rows, self.dtype)), tf.float64) / scale
        solved = tf.reshape(tf.transpose(solved), shape)  # [N, C, n]: P^-1 J_i^T per example
        return tf.einsum("ncp,nkp->nck", jac, solved)

    def predictive(self, x, link_approx="probit", n_samples=100, seed=0,
                   observation_noise=False):
        """The linearized predictive at inputs `x`.

        Regression: (mean [N, C], variance [N, C, C]) of f(x) at the model's dtype; with
        `observation_noise` the variance includes sigma_noise^2 I (the predictive of y).
        Classification: class probabilities [N, C]: link_approx="probit"
        (softmax(mu * kappa), kappa = 1 / sqrt(1 + pi/8 diag(var))) or "mc" (the mean of
        softmax over `n_samples` draws of f, stateless with `seed`).
        """
        where = "Laplace.predictive"
        self._require_fit("predictive")
        z, jac = self._outputs_and_jacobian(x, where)
        var = self.functional_variance(jac)
        mu = tf.cast(z, tf.float64)
        if self.likelihood == "regression":
            if observation_noise:
                var = var + self.sigma_noise ** 2 * tf.eye(z.shape[-1], dtype=tf.float64)
            return tf.cast(mu, self.dtype), tf.cast(var, self.dtype)
        _choice(link_approx, LINK_APPROXES, "link_approx", where)
        n_samples = _count(n_samples, 1, "n_samples", where)
        return tf.cast(self._class_probs(mu, var, link_approx, n_samples, seed), self.dtype)

    @staticmethod
    def sample_functions(mu, var, n_samples, seed):
        """[S, N, C] draws of N(mu, var) per example (a symmetric square root of var, so a
        singular variance is fine)."""
        evals, evecs = tf.linalg.eigh(var)
        root = evecs * tf.sqrt(tf.maximum(evals, 0.0))[:, None, :]
        eps = tf.random.stateless_normal(tf.concat([[n_samples], tf.shape(mu)], 0),
                                         [int(seed), 0], dtype=mu.dtype)
        return mu[None] + tf.einsum("nck,snk->snc", root, eps)

    __call__ = predictive
