"""AdaHessian (Yao et al. 2021): Adam whose second moment is of a Hessian diagonal.

Each step t = 1, 2, ... (g the step's gradient, w a variable):

    D_t = spatial_average(|z ⊙ (H z)|)            Hutchinson, Rademacher z (`diagonal.py`)
    m_t = b1 m_{t-1} + (1 - b1) g
    v_t = b2 v_{t-1} + (1 - b2) D_t ⊙ D_t
    w  <- w - lr * ( (m_t / (1 - b1^t)) / ((v_t / (1 - b2^t))^(k/2) + eps) + weight_decay * w )

with k the `hessian_power`: the authors' code (amirgholami/adahessian,
`image_classification/optim_adahessian.py`): the Hessian power on the bias-corrected second
moment, eps added after it, decoupled weight decay scaled by the rate. pytorch-optimizer's
`AdaHessian` takes the same step (its decay w * (1 - lr * wd) first: the same update) but
without the spatial average and with the signed z ⊙ (H z), whose square is the same.

The probes are drawn from (seed, t - 1) (`diagonal.probe_key`): a resumed run draws the
ones an uninterrupted run would. Under a strategy H z is all-reduced before the absolute
value and the spatial average, so two replicas take one device's steps.
"""

from typing import Callable, Sequence

import gin
import tensorflow as tf

from hogrod import checks
from hogrod.second_order.diagonal import (DiagonalOptimizer, HutchinsonEstimator, probe_key,
                                          spatial_average)
from hogrod.train.protocol import assign
from hogrod.types import Batch, Tensor

__all__ = ["adahessian", "AdaHessian"]

WHERE = "adahessian"


class AdaHessian(DiagonalOptimizer):
    """The AdaHessian step optimizer (made by `adahessian`; the module docstring's update).

    Logs "hessian_diagonal_mean": the mean over every coordinate of the step's D_t.

    Args:
      learning_rate: the step size.
      b1: the first moment's decay, in [0, 1).
      b2: the second moment's decay, in [0, 1).
      hessian_power: k, in (0, 1].
      eps: added to the denominator (> 0).
      weight_decay: decoupled weight decay (>= 0).
      seed: the probes' integer seed.
      num_probes: Rademacher probes per step (>= 1).
    """

    def __init__(self, learning_rate: float, b1: float, b2: float, hessian_power: float,
                 eps: float, weight_decay: float, seed: int, num_probes: int) -> None:
        super().__init__(learning_rate, weight_decay, seed, WHERE, ["hessian_diagonal_mean"])
        self.b1 = checks.number(b1, "b1", WHERE, 0.0, 1.0, high_open=True)
        self.b2 = checks.number(b2, "b2", WHERE, 0.0, 1.0, high_open=True)
        self.power = checks.number(hessian_power, "hessian_power", WHERE, 0.0, 1.0,
                                   low_open=True)
        self.eps = checks.positive(eps, "eps", WHERE)
        self.estimator = HutchinsonEstimator(num_probes, WHERE)

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """The counter, the moments m and v.

        Args:
          variables: the variables it will train.
        """
        super().build(variables)
        self.m = self.slots(variables, "m")
        self.v = self.slots(variables, "v")

    def apply(self, grads: Sequence[Tensor], variables: Sequence[tf.Variable],
              loss: Callable[[Batch], Tensor], batch: Batch) -> None:
        """One AdaHessian step (replica context).

        Args:
          grads: the global gradient, one tensor per variable.
          variables: the variables.
          loss: the step's objective, differentiated twice for H z.
          batch: this replica's batch.
        """
        variables = list(variables)
        diag = spatial_average(self.estimator.estimate(
            loss, batch, variables, probe_key(self.seed, self.step)))
        t = self.step + 1
        new_w, new_m, new_v = [], [], []
        for w, g, d, m, v in zip(variables, grads, diag, self.m, self.v):
            dtype = tf.as_dtype(w.dtype)
            b1, b2 = tf.constant(self.b1, dtype), tf.constant(self.b2, dtype)
            one = tf.constant(1.0, dtype)
            m_t = b1 * m + (one - b1) * tf.cast(g, dtype)
            v_t = b2 * v + (one - b2) * tf.square(d)
            correction1 = one - tf.pow(b1, tf.cast(t, dtype))
            second = v_t / (one - tf.pow(b2, tf.cast(t, dtype)))
            root = tf.sqrt(second) if self.power == 1.0 \
                else tf.pow(second, tf.constant(self.power / 2, dtype))
            step = (m_t / correction1) / (root + tf.constant(self.eps, dtype))
            new_w.append(self.decayed(w) - tf.constant(self.lr, dtype) * step)
            new_m.append(m_t)
            new_v.append(v_t)
        assign(variables + self.m + self.v + [self.step] + self.log_values,
               new_w + new_m + new_v + [t, self.mean(diag)])


@gin.configurable
def adahessian(learning_rate: float, b1: float = 0.9, b2: float = 0.999,
               hessian_power: float = 1.0, eps: float = 1e-4, weight_decay: float = 0.0,
               seed: int = 0, num_probes: int = 1) -> AdaHessian:
    """AdaHessian (Yao et al. 2021), a `hogrod.train.StepOptimizer` for `make_train_step`.

    Adam's update with the second moment of a Hutchinson Hessian diagonal, spatially
    averaged over each Conv2D kernel's (kh, kw) (the module docstring gives the update and
    how it compares to the authors' and pytorch-optimizer's code). Each step differentiates
    the step's objective twice on the step's batch (so gradient accumulation is refused).

    Args:
      learning_rate: the step size (the authors' default is 0.15).
      b1: the gradient moment's decay, in [0, 1).
      b2: the Hessian-diagonal moment's decay, in [0, 1).
      hessian_power: the power k of the bias-corrected root mean square diagonal, in (0, 1].
      eps: added to the denominator (> 0; the authors' 1e-4).
      weight_decay: decoupled weight decay (>= 0): lr * weight_decay * w subtracted.
      seed: the integer seed of the Rademacher probes (with the step counter).
      num_probes: probes per step (>= 1), averaged.

    Returns:
      An `AdaHessian` optimizer.

    Raises:
      ArgumentError: a rate that is not positive, b1 or b2 outside [0, 1), hessian_power
        outside (0, 1], eps not positive, weight_decay negative, a bad seed or num_probes;
        the message names the argument.
    """
    return AdaHessian(learning_rate, b1, b2, hessian_power, eps, weight_decay, seed,
                      num_probes)
