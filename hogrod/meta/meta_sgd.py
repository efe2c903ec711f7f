"""Meta-SGD (Li et al. 2017): MAML with a learned inner rate per parameter entry."""

import gin
import keras
import tensorflow as tf

from hogrod.meta.common import Algorithm
from hogrod.meta.inner import as_dtype, check_rate
from hogrod.meta.maml import unrolled
from hogrod.types import Loss, Scalar

__all__ = ["meta_sgd"]


@gin.configurable
def meta_sgd(model: keras.Model, loss: Loss, inner_lr: Scalar = 0.01, inner_steps: int = 1,
             task_map: str = "vectorized") -> Algorithm:
    """Meta-SGD: a learned inner learning rate per parameter entry.

    The rates (one variable shaped like each trainable variable, at its dtype) start at
    `inner_lr` and are meta-trained with the weights (`Algorithm.variables`).

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the learned rates' starting value.
      inner_steps: inner steps per task (>= 1).
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      an `Algorithm`.

    Raises:
      hogrod.checks.ArgumentError: a bad `loss`, `task_map` or `inner_steps`, named.
    """
    check_rate(inner_lr, "inner_lr", "meta_sgd")
    rates = [tf.Variable(tf.fill(v.shape, as_dtype(inner_lr, v.dtype)),
                         name=f"lr/{v.path.replace('/', '_')}")
             for v in model.trainable_variables]
    return unrolled(model, loss, rates, inner_steps, False, task_map, variables=rates,
                    where="meta_sgd")
