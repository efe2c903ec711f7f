"""Sophia (Liu et al. 2023): momentum preconditioned by an EMA of a Hessian diagonal,
clipped coordinatewise.

Each step t = 1, 2, ... (g the step's gradient, w a variable):

    m_t = b1 m_{t-1} + (1 - b1) g
    if (t - 1) % hessian_every == 0:   h_t = b2 h_{t-1} + (1 - b2) h^_t    (else h_t = h_{t-1})
    w  <- w - lr * weight_decay * w
    w  <- w - lr * clip(m_t / max(rho * h_t, eps), -1, 1)

h^_t an estimate of the diagonal of the objective's Hessian (`estimator="hutchinson"`:
z ⊙ (H z), one Rademacher probe) or of its Gauss-Newton matrix
(`"gauss_newton_bartlett"`: B g^ ⊙ g^ at labels sampled from the model: `diagonal.py`).
This is the paper's Algorithm 3 (its first step refreshes h: t = 1 mod k), with no bias
correction. Conventions of the others:

- The authors' code (Liuhong99/Sophia, `SophiaG`) keeps h_code = EMA(g^ ⊙ g^) and steps
  sign(m) * min(abs(m) / (rho_code * bs * h_code + 1e-15), 1), bs the tokens per batch: with a
  fixed batch rho_code * bs * h_code = rho * h here (h^ = B g^ ⊙ g^, the paper's), so
  rho = rho_code; its + 1e-15 instead of max(., eps) differs only where rho * h <= eps
  (a negative Hutchinson h there steps against the momentum). Its training script
  refreshes h after steps k - 1, 2k - 1, ...: its first k - 1 steps have h = 0 (sign
  steps); here the first step refreshes.
- pytorch-optimizer's `SophiaH` steps lr_pt * clip(m / max(h, eps_pt), -p, p): the same as
  here with learning_rate = lr_pt * p, rho = p and eps = p * eps_pt; its probes are Gaussian
  by default.

The probes and sampled labels are drawn from (seed, t - 1) (`diagonal.probe_key`); the
refresh is a `tf.cond` on the step counter inside the compiled step (no retracing), and only
the replica-local half of the estimate runs in it: the all-reduce follows it, every step,
under a multi-replica strategy (a synchronization cannot sit in a conditional branch).
"""

from typing import Callable, Optional, Sequence

import gin
import keras
import tensorflow as tf

from hogrod import checks
from hogrod.second_order.diagonal import (DiagonalOptimizer, GaussNewtonBartlettEstimator,
                                          HutchinsonEstimator, probe_key)
from hogrod.train.protocol import assign, replica_mean
from hogrod.types import Batch, Loss, Tensor

__all__ = ["sophia", "Sophia", "ESTIMATORS"]

WHERE = "sophia"
ESTIMATORS = ("hutchinson", "gauss_newton_bartlett")


class Sophia(DiagonalOptimizer):
    """The Sophia step optimizer (made by `sophia`; the module docstring's update).

    Logs "hessian_refreshed" (1 if this step refreshed h, else 0), "hessian_diagonal_mean"
    (the mean over every coordinate of the latest estimate h^) and "clipped_fraction" (the
    fraction of coordinates whose abs(m / max(rho h, eps)) exceeded 1).

    Args:
      learning_rate: the step size.
      b1: the gradient moment's decay, in [0, 1).
      b2: the Hessian EMA's decay, in [0, 1).
      rho: the clipping scale (> 0).
      hessian_every: the refresh period in steps (>= 1).
      estimator: an estimator of `diagonal.py`.
      weight_decay: decoupled weight decay (>= 0).
      eps: the floor of rho * h (> 0).
      seed: the integer seed of the probes or labels.
    """

    def __init__(self, learning_rate: float, b1: float, b2: float, rho: float,
                 hessian_every: int, estimator, weight_decay: float, eps: float,
                 seed: int) -> None:
        super().__init__(learning_rate, weight_decay, seed, WHERE,
                         ["hessian_refreshed", "hessian_diagonal_mean", "clipped_fraction"])
        self.b1 = checks.number(b1, "b1", WHERE, 0.0, 1.0, high_open=True)
        self.b2 = checks.number(b2, "b2", WHERE, 0.0, 1.0, high_open=True)
        self.rho = checks.positive(rho, "rho", WHERE)
        self.every = checks.integer(hessian_every, "hessian_every", WHERE, least=1)
        self.eps = checks.positive(eps, "eps", WHERE)
        self.estimator = estimator

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """The counter, the moment m and the Hessian EMA h.

        Args:
          variables: the variables it will train.
        """
        super().build(variables)
        self.m = self.slots(variables, "m")
        self.h = self.slots(variables, "h")

    def _estimate(self, loss, batch, variables, refresh):
        """h^ where `refresh`, else zeros: the local half in the cond, the all-reduce after."""
        key = probe_key(self.seed, self.step)
        local = tf.cond(refresh,
                        lambda: self.estimator.local(loss, batch, variables, key),
                        lambda: [tf.zeros(v.shape, v.dtype) for v in variables])
        return self.estimator.finish(replica_mean(local), batch)

    def apply(self, grads: Sequence[Tensor], variables: Sequence[tf.Variable],
              loss: Callable[[Batch], Tensor], batch: Batch) -> None:
        """One Sophia step (replica context).

        Args:
          grads: the global gradient, one tensor per variable.
          variables: the variables.
          loss: the step's objective (differentiated twice by the Hutchinson estimator).
          batch: this replica's batch.
        """
        variables = list(variables)
        refresh = tf.equal(self.step % self.every, 0)
        estimate = self._estimate(loss, batch, variables, refresh)
        new_w, new_m, new_h, clipped = [], [], [], []
        for w, g, e, m, h in zip(variables, grads, estimate, self.m, self.h):
            dtype = tf.as_dtype(w.dtype)
            b1, b2 = tf.constant(self.b1, dtype), tf.constant(self.b2, dtype)
            one = tf.constant(1.0, dtype)
            m_t = b1 * m + (one - b1) * tf.cast(g, dtype)
            h_t = tf.where(refresh, b2 * h + (one - b2) * e, tf.convert_to_tensor(h))
            ratio = m_t / tf.maximum(tf.constant(self.rho, dtype) * h_t,
                                     tf.constant(self.eps, dtype))
            step = tf.clip_by_value(ratio, -one, one)
            new_w.append(self.decayed(w) - tf.constant(self.lr, dtype) * step)
            new_m.append(m_t)
            new_h.append(h_t)
            clipped.append(tf.cast(tf.abs(ratio) > one, dtype))
        refreshed = tf.cast(refresh, self.dtype)
        hessian_mean = tf.where(refresh, self.mean(estimate), self.log_values[1])
        assign(variables + self.m + self.h + [self.step] + self.log_values,
               new_w + new_m + new_h + [self.step + 1, refreshed, hessian_mean,
                                        self.mean(clipped)])


@gin.configurable
def sophia(learning_rate: float, b1: float = 0.965, b2: float = 0.99, rho: float = 0.04,
           hessian_every: int = 10, estimator: str = "hutchinson",
           model: Optional[keras.Model] = None, loss: Optional[Loss] = None,
           weight_decay: float = 0.0, eps: float = 1e-12, seed: int = 0) -> Sophia:
    """Sophia (Liu et al. 2023), a `hogrod.train.StepOptimizer` for `make_train_step`.

    The clipped step lr * clip(m / max(rho * h, eps), -1, 1) with h an EMA of a
    Hessian-diagonal estimate refreshed every `hessian_every` steps (the module docstring
    gives the update and how it compares to the authors' and pytorch-optimizer's code).
    The refresh uses the step's batch (so gradient accumulation is refused).

    Args:
      learning_rate: the step size (the largest change of a coordinate per step).
      b1: the gradient moment's decay, in [0, 1).
      b2: the Hessian EMA's decay, in [0, 1).
      rho: the clipping scale gamma (> 0): rho * h is the curvature the momentum is divided
        by (the authors' code's rho; the paper's gamma).
      hessian_every: refresh the estimate every this many steps (>= 1), the first step
        included.
      estimator: "hutchinson" (z ⊙ (H z) of the step's objective, one Rademacher probe:
        Sophia-H) or "gauss_newton_bartlett" (B g^ ⊙ g^ at labels sampled from the model's
        likelihood: Sophia-G; needs `model` and `loss`, and covers the Keras loss only,
        not a regularizer in the objective).
      model: the Keras model the objective calls (for "gauss_newton_bartlett"; ignored by
        "hutchinson").
      loss: its Keras loss object (for "gauss_newton_bartlett"; a loss whose likelihood
        `hogrod.curvature` knows; ignored by "hutchinson").
      weight_decay: decoupled weight decay (>= 0): lr * weight_decay * w subtracted.
      eps: the floor of rho * h (> 0): a coordinate with rho * h <= eps (a negative
        Hutchinson h too) takes the clipped step lr * sign(m) unless abs(m) <= eps.
      seed: the integer seed of the probes or sampled labels (with the step counter).

    Returns:
      A `Sophia` optimizer.

    Raises:
      ArgumentError: a rate that is not positive, b1 or b2 outside [0, 1), rho or eps not
        positive, hessian_every < 1, an unknown estimator, weight_decay negative or a bad
        seed; the message names the argument.
      ValueError: "gauss_newton_bartlett" without `model` or `loss`, with a model that is
        not built, or with a loss whose likelihood `hogrod.curvature` does not know.
    """
    kind = checks.choice(estimator, ESTIMATORS, "estimator", WHERE)
    if kind == "hutchinson":
        diagonal = HutchinsonEstimator(1, WHERE)
    else:
        missing = [f"{name}=" for name, value in (("model", model), ("loss", loss))
                   if value is None]
        if missing:
            raise ValueError(f"{WHERE}: estimator='gauss_newton_bartlett' samples labels from "
                             f"the model's likelihood and needs {' and '.join(missing)} "
                             "(the Keras model and its loss object)")
        diagonal = GaussNewtonBartlettEstimator(model, loss, WHERE)
    return Sophia(learning_rate, b1, b2, rho, hessian_every, diagonal, weight_decay, eps,
                  seed)
