"""Mapping a computation over a leading task axis, the way every family does it.

A family's per-task computation is `fn(elem, seeds, params)`: `elem` one row of any nest of
tensors with a leading task axis (a meta-learning task `(x_support, y_support, x_query,
y_query)`, one task's episodes and their statistics, a particle of a truncated unroll),
`seeds` that row of an optional per-task seed tensor (None without one), `params` the
weights as read once outside the map, given as is to every task (what a gradient of the
mapped result reaches). `map_tasks` maps it as its mode says (`MODES`), `mean_over_tasks`
averages every output over the tasks.

- 'vectorized': `tf.vectorized_map` (pfor), inner tapes included: the fastest for dense
  nets; memory grows with the number of tasks. Under XLA it runs the same pfor loop
  without the nested `tf.function` `tf.vectorized_map` wraps it in (`vectorized_map`);
- 'sequential': `tf.map_fn`, one task at a time (less memory; faster for conv nets, whose
  filter gradient pfor runs as a while loop);
- 'recomputed': a Python loop over the tasks (a static count), each task's forward pass
  recomputed in the backward pass (`tf.recompute_grad`): the least memory, one more
  forward pass, first derivatives only.

pfor's notice that a stateless random op with a per-task seed runs as a loop over the tasks
(how per-task Dropout masks and per-task environment draws are drawn; TF cannot vectorize
a per-task seed) is dropped from TensorFlow's log while `vectorized_map` traces; every
other notice passes.
"""

import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.ops.parallel_for import control_flow_ops as pfor_ops

from hogrod import checks
from hogrod.types import Params, Tree

__all__ = ["MODES", "TaskFn", "check_task_map", "map_tasks", "mean_over_tasks",
           "vectorized_map", "quiet_random_op_loops"]

MODES = ("vectorized", "sequential", "recomputed")
#: The per-task computation `fn(elem, seeds, params) -> any nest of tensors`.
TaskFn = Callable[[Tree, Optional[tf.Tensor], list], Tree]


def check_task_map(task_map: str, where: str) -> str:
    """The task mapping a function (or a gin binding) was given, checked against `MODES`.

    Args:
      task_map: the mode given, one of `MODES` (see the module docstring).
      where: the public function (or gin binding) that takes it, named in the message.

    Returns:
      `task_map`, unchanged.

    Raises:
      hogrod.checks.ArgumentError: `task_map` is not one of `MODES`.
    """
    return checks.choice(task_map, MODES, "task_map", where)


class _RandomOpLoops(logging.Filter):
    """Drops pfor's notice that a stateless random op runs as a loop over the tasks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Using a while_loop for converting StatelessRandom" not in record.getMessage()


@contextlib.contextmanager
def quiet_random_op_loops() -> Iterator[None]:
    """A context in which TensorFlow's log drops pfor's notice that a stateless random op
    with a per-task seed runs as a while loop over the tasks (the expected way per-task
    draws vectorize, not a problem to report on every trace); every other record passes.
    The filter is removed on exit.

    Yields:
      None.
    """
    logger, quiet = tf.get_logger(), _RandomOpLoops()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _signature(fn, elems):
    probe = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), elems)
    out = tf.function(fn).get_concrete_function(probe).structured_outputs
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), out)


def vectorized_map(fn: Callable[[Tree], Tree], elems: Tree) -> Tree:
    """`tf.vectorized_map(fn, elems)`, compiled once under XLA and quiet about random ops.

    In a graph XLA compiles (`jit_compile=True`), `tf.vectorized_map` wraps its loop in a
    nested `tf.function`, and XLA then takes every input of the compiled function (the
    data, the weights) as a compile-time constant, compiling it anew on every call; the same
    pfor loop, not wrapped, compiles once. Traced under `quiet_random_op_loops`.

    Args:
      fn: `fn(row) -> any nest of tensors`, for one row of `elems`.
      elems: any nest of tensors sharing a leading axis.

    Returns:
      fn's outputs, stacked on a leading axis.
    """
    with quiet_random_op_loops():
        under_xla = getattr(pfor_ops, "_is_under_xla_context", None)
        if tf.executing_eagerly() or under_xla is None or not under_xla():
            return tf.vectorized_map(fn, elems)
        loop = getattr(pfor_ops, "_pfor_impl", None)
        if loop is None:  # a TensorFlow without it: sequential, still compiled once
            absl_logging.warning("this TensorFlow has no unwrapped pfor; under XLA the tasks "
                                 "are mapped sequentially (tf.map_fn)")
            return tf.map_fn(fn, elems, fn_output_signature=_signature(fn, elems))
        flat = tf.nest.flatten(elems)
        n = flat[0].shape[0] if flat[0].shape[0] is not None else tf.shape(flat[0])[0]
        if n == 1:  # pfor's converter fails on some ops with one iteration (a conv's rank)
            row = tf.nest.map_structure(lambda t: t[0], elems)
            return tf.nest.map_structure(lambda t: t[None], fn(row))
        return loop(lambda i: fn(tf.nest.map_structure(lambda t: tf.gather(t, i), elems)), n,
                    fallback_to_while_loop=True)


def _recomputed(fn, elems, seeds, params):
    """A Python loop over the tasks (recompute_grad inside a while loop cannot capture
    BatchNorm's state variables), each task's forward pass recomputed in the backward."""
    n = tf.nest.flatten(elems)[0].shape[0]
    if n is None:
        raise checks.ArgumentError(
            "map_tasks: mode='recomputed' needs a static number of tasks (the leading axis "
            f"of elems), got {checks.describe(elems)}; use 'sequential' for a dynamic one")
    params, k = list(params), len(params)
    per_task = []
    for i in range(n):
        seed = None if seeds is None else seeds[i]
        elem = tf.nest.map_structure(lambda t: t[i], elems)

        def forward(*args, seed=seed, elem=elem):
            return tf.nest.flatten(fn(tf.nest.pack_sequence_as(elem, list(args[k:])), seed,
                                      list(args[:k])))

        # recompute_grad runs its forward pass with every tape stopped, an inner loop's
        # included: its value is the one without adaptation. Its gradient (a recomputation
        # under a live tape) is right; the value comes from a forward pass on constants,
        # which keeps nothing for the backward pass.
        grad_only = tf.recompute_grad(forward)(*params, *tf.nest.flatten(elem))
        value = fn(elem, seed, [tf.stop_gradient(p) for p in params])
        per_task.append(tf.nest.pack_sequence_as(value, [
            tf.stop_gradient(v) + (g - tf.stop_gradient(g))
            for v, g in zip(tf.nest.flatten(value), grad_only)]))
    return tf.nest.map_structure(lambda *v: tf.stack(v), *per_task)


def map_tasks(fn: TaskFn, elems: Tree, seeds: Optional[tf.Tensor] = None,
              params: Params = (), mode: str = "vectorized") -> Tree:
    """`fn(elem, seeds, params)` for every row of `elems`, stacked on a task axis.

    Args:
      fn: `fn(elem, seeds, params)`, the per-task computation (any nest of tensors out); it
        gets one row of `elems`, that row of `seeds` (or None) and `params`.
      elems: any nest of tensors with a common leading task axis.
      seeds: None, or a tensor with one row per task (e.g. the meta family's
        `[tasks, passes, generators, 2]` seeds of random layers).
      params: the weights fn differentiates through, given as is to every task (and the
        arguments `tf.recompute_grad` recomputes for in mode 'recomputed'), a list of
        tensors.
      mode: one of `MODES`.

    Returns:
      fn's outputs, stacked on a leading task axis.

    Raises:
      hogrod.checks.ArgumentError: `mode` not one of `MODES`, or 'recomputed' with a
        dynamic number of tasks.
    """
    check_task_map(mode, "map_tasks")
    if mode == "recomputed":
        return _recomputed(fn, elems, seeds, params)
    params = list(params)
    if seeds is None:
        rows, call = elems, lambda e: fn(e, None, params)  # noqa: E731
    else:
        rows, call = (elems, seeds), lambda e: fn(e[0], e[1], params)  # noqa: E731
    if mode == "vectorized":
        return vectorized_map(call, rows)
    return tf.map_fn(call, rows, fn_output_signature=_signature(call, rows))


def mean_over_tasks(fn: TaskFn, elems: Tree, seeds: Optional[tf.Tensor] = None,
                    params: Params = (), mode: str = "vectorized") -> Any:
    """`map_tasks`, every output averaged over the task axis.

    Args:
      fn: `fn(elem, seeds, params)`, as for `map_tasks`.
      elems: any nest of tensors with a common leading task axis, as for `map_tasks`.
      seeds: None, or one row per task, as for `map_tasks`.
      params: the weights fn differentiates through, as for `map_tasks`.
      mode: one of `MODES`.

    Returns:
      fn's outputs, each the mean over the tasks.

    Raises:
      hogrod.checks.ArgumentError: as `map_tasks`.
    """
    return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0),
                                 map_tasks(fn, elems, seeds, params, mode))
