"""Reptile (Nichol et al. 2018): move theta toward the adapted weights phi."""

import gin
import keras
import tensorflow as tf

from hogrod import checks, taskmap
from hogrod.meta.common import (Algorithm, adapt_with, check_loss, compiled_when_eager,
                                pass_seed, query_loss, task_seeds)
from hogrod.meta.inner import adapt, check_rate, initial_params
from hogrod.types import Loss, Scalar

__all__ = ["reptile"]


@gin.configurable
def reptile(model: keras.Model, loss: Loss, inner_lr: Scalar = 0.01, inner_steps: int = 5,
            task_map: str = "vectorized") -> Algorithm:
    """Reptile: move theta toward the adapted weights phi, through a surrogate objective.

    The surrogate ``0.5 ||theta - sg(phi)||**2``, averaged over tasks, has gradient
    ``theta - mean phi``; with SGD at rate eps the outer step is Reptile's
    ``theta += eps (phi - theta)``. The inner loop runs on support and query together
    (Reptile has no query split); the query loss after it is logged as `monitor/query`.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the inner rate.
      inner_steps: inner steps per task (>= 1).
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      an `Algorithm`.

    Raises:
      hogrod.checks.ArgumentError: a bad `loss`, `task_map` or `inner_steps`, named.
    """
    check_loss(loss, "hogrod.meta.reptile")
    taskmap.check_task_map(task_map, "hogrod.meta.reptile")
    inner_steps = checks.integer(inner_steps, "inner_steps", "hogrod.meta.reptile", least=1)
    check_rate(inner_lr, "inner_lr", "hogrod.meta.reptile")

    def task_loss(task, seeds, params):
        xs, ys, xq, yq = task
        x, y = tf.concat([xs, xq], 0), tf.concat([ys, yq], 0)
        fast = adapt(model, loss, (x, y), inner_lr, inner_steps, True, params,
                     seeds=pass_seed(seeds, 0, inner_steps))
        gap = tf.add_n([tf.reduce_sum((p - tf.stop_gradient(f)) ** 2)
                        for p, f in zip(params, fast)])
        return {"loss": 0.5 * gap, "monitor/query": tf.stop_gradient(
            query_loss(model, loss, fast, xq, yq, pass_seed(seeds, inner_steps)))}

    def meta_loss(tasks, step=None):  # step: unused
        seeds = task_seeds(model, tasks, inner_steps + 1)
        return taskmap.mean_over_tasks(task_loss, tasks, seeds, initial_params(model), task_map)

    return Algorithm(compiled_when_eager(meta_loss, model), adapt_with(model, loss, inner_lr), [])
