"""Sinusoid regression tasks (Finn et al. 2017), sampled on the device from stateless seeds.

A task is y = A sin(x - phase) with A ~ U[0.1, 5], phase ~ U[0, pi], x ~ U[-5, 5]; K support
and K query points. `sinusoid_meta_batches(seed, ...)` is an infinite tf.data stream of
meta-batches: fresh tasks every step, deterministic given the seed, and its iterator is
checkpointable (a resumed run continues the same stream).
"""

import math
from typing import Tuple, Union

import gin
import tensorflow as tf

from hogrod import checks
from hogrod.types import DType

__all__ = ["sample_sinusoids", "sinusoid_meta_batches"]

AMPLITUDE = (0.1, 5.0)
PHASE = (0.0, math.pi)
X_RANGE = (-5.0, 5.0)


def sample_sinusoids(seed: tf.Tensor, num_tasks: Union[int, tf.Tensor],
                     k_support: Union[int, tf.Tensor], k_query: Union[int, tf.Tensor],
                     dtype: DType = tf.float32) -> Tuple[tf.Tensor, ...]:
    """One meta-batch from a stateless seed.

    Args:
      seed: a stateless seed, an int tensor of shape [2].
      num_tasks: tasks in the meta-batch (>= 1; a tensor is not checked).
      k_support: support points per task (>= 1; a tensor is not checked).
      k_query: query points per task (>= 1; a tensor is not checked).
      dtype: the float dtype of the values.

    Returns:
      (x_support, y_support, x_query, y_query, amplitude, phase); x and y have shape
      [num_tasks, k, 1]; amplitude and phase [num_tasks, 1, 1].

    Raises:
      hogrod.checks.ArgumentError: a count that is not an integer >= 1.
    """
    for arg, value in (("num_tasks", num_tasks), ("k_support", k_support),
                       ("k_query", k_query)):
        if not isinstance(value, tf.Tensor):
            checks.integer(value, arg, "hogrod.meta.sample_sinusoids", least=1)
    seeds = tf.random.experimental.stateless_split(seed, 4)
    amp = tf.random.stateless_uniform([num_tasks, 1, 1], seeds[0], *AMPLITUDE, dtype=dtype)
    phase = tf.random.stateless_uniform([num_tasks, 1, 1], seeds[1], *PHASE, dtype=dtype)
    xs = tf.random.stateless_uniform([num_tasks, k_support, 1], seeds[2], *X_RANGE, dtype=dtype)
    xq = tf.random.stateless_uniform([num_tasks, k_query, 1], seeds[3], *X_RANGE, dtype=dtype)
    return xs, amp * tf.sin(xs - phase), xq, amp * tf.sin(xq - phase), amp, phase


@gin.configurable
def sinusoid_meta_batches(seed: int = 0, meta_batch_size: int = 25, k_support: int = 10,
                          k_query: int = 10) -> tf.data.Dataset:
    """An infinite tf.data stream of (x_s, y_s, x_q, y_q) meta-batches.

    Args:
      seed: the stream's integer seed (>= 0); meta-batch i comes from (seed, i).
      meta_batch_size: tasks per meta-batch (>= 1).
      k_support: support points per task (>= 1).
      k_query: query points per task (>= 1).

    Returns:
      a `tf.data.Dataset` of (x_support, y_support, x_query, y_query), each
      [meta_batch_size, k, 1] float32.

    Raises:
      hogrod.checks.ArgumentError: a seed that is not an integer >= 0, or a count that is
        not an integer >= 1.
    """
    where = "hogrod.meta.sinusoid_meta_batches"
    seed = checks.seed(seed, "seed", where)
    for arg, value in (("meta_batch_size", meta_batch_size), ("k_support", k_support),
                       ("k_query", k_query)):
        checks.integer(value, arg, where, least=1)
    def make(i):
        xs, ys, xq, yq, _, _ = sample_sinusoids(tf.stack([tf.cast(seed, tf.int64), i]),
                                                meta_batch_size, k_support, k_query)
        return xs, ys, xq, yq
    return tf.data.Dataset.range(2**62).map(make).prefetch(2)
