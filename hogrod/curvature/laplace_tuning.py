"""The prior precision of a Laplace posterior tuned by the evidence or by a validation set
(laplace-torch's `optimize_prior_precision`), shared by every posterior class."""

import math
import warnings
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import data_batches
from hogrod.types import Batch, TensorLike

__all__ = ["PriorTuning", "PRIOR_STRUCTURES", "OPTIMIZERS", "METHODS"]

PRIOR_STRUCTURES = ("scalar", "layerwise", "diag")
OPTIMIZERS = ("adam", "lbfgs")
METHODS = ("marglik", "gridsearch")


class PriorTuning:
    """`optimize_prior_precision` for `BaseLaplace` (which supplies `_evidence`, `_delta`,
    `_variance`, `output_jacobian`, `_labels`, `class_probs`)."""

    def _structure_size(self, prior_structure, where):
        """How many prior precisions `prior_structure` tunes; the posterior may refuse it."""
        checks.choice(prior_structure, PRIOR_STRUCTURES, "prior_structure", where)
        size = {"scalar": 1, "layerwise": self.n_layers, "diag": self.n_params}[prior_structure]
        if size > 1:
            self._check_prior_structure(self._expand(np.arange(1.0, size + 1)),
                                        f"prior_structure='{prior_structure}'", where)
        return size

    def optimize_prior_precision(self, method: str = "marglik", prior_structure: str = "scalar",
                                 steps: int = 100, maxiter: int = 100, lr: float = 0.1,
                                 init_prior_prec: float = 1.0,
                                 optimize_sigma_noise: bool = False,
                                 init_sigma_noise: Optional[float] = None,
                                 optimizer: str = "adam", tol: float = 1e-10,
                                 val_data: Optional[Batch] = None,
                                 grid: Optional[TensorLike] = None,
                                 link_approx: str = "probit") -> Dict[str, Any]:
        """Tunes the prior precision (and the noise) and stores them.

        method="marglik": maximize the log evidence over log(prior_precision) (and
        log(sigma_noise) with `optimize_sigma_noise`, regression only); method="gridsearch":
        the value of `grid` minimizing the mean negative log predictive density on
        `val_data` (the `link_approx` class probabilities, or the Gaussian N(y; mean,
        variance + sigma_noise^2 I) for regression); a warning says when it is an end of the
        grid (the optimum may lie outside it).

        Args:
          method: "marglik" or "gridsearch".
          prior_structure: "scalar", "layerwise" (one per variable of the subset) or "diag"
            (one per parameter), laplace-torch's; "marglik" only for the last two.
          steps: Adam's number of steps (optimizer="adam").
          maxiter: L-BFGS's iteration limit (optimizer="lbfgs").
          lr: Adam's learning rate on the logs.
          init_prior_prec: the starting prior precision (every entry).
          optimize_sigma_noise: tune the regression noise too.
          init_sigma_noise: its start (default the stored value).
          optimizer: "adam" (laplace-torch's, in float64) or "lbfgs" (scipy's L-BFGS-B).
          tol: L-BFGS's gradient tolerance.
          val_data: "gridsearch": one (x, y) batch or a tf.data.Dataset.
          grid: "gridsearch": positive values (default laplace-torch's 10^linspace(-4, 4,
            100)).
          link_approx: "gridsearch", classification: "probit" or "mc".

        Returns:
          A dict with "prior_precision", "sigma_noise", "log_marginal_likelihood" (floats,
          a prior vector as numpy) and, for "gridsearch", "val_nll".

        Raises:
          ValueError: not fitted, or the optimization diverged.
          ArgumentError: an argument out of its choices or range, or one given to the
            method that does not use it.
        """
        where = "Laplace.optimize_prior_precision"
        self._require_fit("optimize_prior_precision")
        checks.choice(method, METHODS, "method", where)
        size = self._structure_size(prior_structure, where)
        if method == "gridsearch":
            if size != 1:
                raise checks.ArgumentError(f"{where}: method='gridsearch' tunes one scalar; "
                                           "use prior_structure='scalar' or method='marglik'")
            return self._gridsearch(val_data, grid, link_approx, where)
        if val_data is not None:
            raise checks.ArgumentError(f"{where}: val_data is for method='gridsearch'; the "
                                       "evidence uses the fitted data")
        checks.choice(optimizer, OPTIMIZERS, "optimizer", where)
        steps = checks.integer(steps, "steps", where, least=1)
        maxiter = checks.integer(maxiter, "maxiter", where, least=1)
        lr = checks.positive(lr, "lr", where)
        tol = checks.nonnegative(tol, "tol", where)
        if optimize_sigma_noise and self.likelihood != "regression":
            raise checks.ArgumentError(f"{where}: optimize_sigma_noise=True is only for "
                                       "likelihood='regression'")
        start = [math.log(checks.positive(init_prior_prec, "init_prior_prec", where))] * size
        if optimize_sigma_noise:
            sigma0 = self.sigma_noise if init_sigma_noise is None else init_sigma_noise
            start.append(math.log(checks.positive(sigma0, "init_sigma_noise", where)))

        @tf.function
        def value_and_grad(logs):
            with tf.GradientTape() as tape:
                tape.watch(logs)
                delta = tf.exp(logs[0] if size == 1 else self._expand(logs[:size]))
                sigma = tf.exp(logs[size]) if optimize_sigma_noise else \
                    tf.constant(self.sigma_noise, tf.float64)
                value = -self._evidence(delta, sigma)
            return value, tape.gradient(value, logs)

        def f(logs):
            value, grad = value_and_grad(tf.constant(logs, tf.float64))
            return float(value), grad.numpy()

        logs = np.array(start, np.float64)
        if optimizer == "adam":
            m, v = np.zeros_like(logs), np.zeros_like(logs)
            b1, b2, eps = 0.9, 0.999, 1e-8
            for t in range(1, steps + 1):
                _, g = f(logs)
                m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                logs = logs - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        else:
            import scipy.optimize
            result = scipy.optimize.minimize(f, logs, jac=True, method="L-BFGS-B",
                                             options={"maxiter": maxiter, "gtol": tol,
                                                      "ftol": 0.0})
            logs = result.x
        if not np.all(np.isfinite(logs)):
            raise ValueError(f"{where}: the optimization diverged (log hyperparameters "
                             f"{logs}); lower lr")
        self.prior_precision = float(np.exp(logs[0])) if size == 1 else np.exp(logs[:size])
        if optimize_sigma_noise:
            self.sigma_noise = float(np.exp(logs[size]))
        return {"prior_precision": self.prior_precision, "sigma_noise": self.sigma_noise,
                "log_marginal_likelihood": float(self.log_marginal_likelihood())}

    def _gridsearch(self, val_data, grid, link_approx, where):
        if val_data is None:
            raise checks.ArgumentError(f"{where}: method='gridsearch' needs val_data (one "
                                       "(x, y) batch or a tf.data.Dataset)")
        checks.choice(link_approx, ("probit", "mc"), "link_approx", where)
        grid = 10.0 ** np.linspace(-4, 4, 100) if grid is None else np.asarray(grid, float)
        if grid.ndim != 1 or not grid.size or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise checks.ArgumentError(f"{where}: grid must be a non-empty 1-D array of "
                                       f"positive prior precisions, got {grid!r}")
        batches = []
        for x, y in data_batches(val_data, where, pair=True):  # outputs and Jacobians once
            z, jac = self.output_jacobian(x)
            batches.append((tf.cast(z, tf.float64), tf.cast(jac, tf.float64),
                            self._labels(y, z, where)))
        factor = tf.constant(1 / self.sigma_noise ** 2, tf.float64)
        scores = []
        for delta in grid:
            total, count = 0.0, 0
            for z, jac, y in batches:
                var = self._variance(jac, tf.constant(float(delta), tf.float64), factor)
                total += float(tf.reduce_sum(self._nll(z, var, y, link_approx)))
                count += int(z.shape[0])
            scores.append(total / count)
        scores = np.asarray(scores)
        if not np.any(np.isfinite(scores)):
            raise ValueError(f"{where}: the validation NLL is not finite on the whole grid")
        best = int(np.nanargmin(scores))
        if grid.size > 1 and best in (int(np.argmin(grid)), int(np.argmax(grid))):
            warnings.warn(f"{where}: the best prior precision {grid[best]:.4g} is an end of the "
                          f"grid [{grid.min():.4g}, {grid.max():.4g}]; the optimum may lie "
                          "outside it: widen the grid", stacklevel=3)
        self.prior_precision = float(grid[best])
        return {"prior_precision": self.prior_precision, "sigma_noise": self.sigma_noise,
                "log_marginal_likelihood": float(self.log_marginal_likelihood()),
                "val_nll": float(scores[best])}

    def _nll(self, mu, var, y, link_approx):
        """Per-example negative log predictive density (float64)."""
        if self.likelihood == "regression":
            cov = var + self.sigma_noise ** 2 * tf.eye(mu.shape[-1], dtype=tf.float64)
            chol = tf.linalg.cholesky(cov)
            r = tf.linalg.triangular_solve(chol, (y - mu)[..., None])[..., 0]
            logdet = 2 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol)), -1)
            return 0.5 * (tf.reduce_sum(tf.square(r), -1) + logdet) \
                + mu.shape[-1] * 0.5 * math.log(2 * math.pi)
        probs = self.class_probs(mu, var, link_approx, 100, 0)
        return -tf.math.log(tf.gather(probs, y, batch_dims=1))
