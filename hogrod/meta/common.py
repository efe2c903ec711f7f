"""What every meta-learning algorithm shares: the `Algorithm` it returns, the task
mappings (`MODES`: vectorized, sequential or recomputed; each algorithm's `task_map`
argument), the per-pass seeds of random layers, the eager-call compilation and
`meta_gradient`.

An algorithm's per-task computation is `fn(task, seeds, params)`: `task` one
(x_support, y_support, x_query, y_query), `seeds` that task's seeds for its forward
passes (`pass_seed` picks one; None without random layers), `params` the model's weights
as read once per meta-batch (what the meta-gradient reaches). `mean_over_tasks` maps it
over the meta-batch as its mode says and averages every output over the tasks.
"""

import contextlib
import functools
import logging
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import keras
import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.ops.parallel_for import control_flow_ops as pfor_ops

from hogrod import checks, optim
from hogrod.meta.inner import Rates, adapt, draw_seeds, run
from hogrod.types import Loss, Params, Tree

__all__ = ["Algorithm", "MODES", "Tasks", "TaskFn", "check_task_map", "check_loss",
           "map_tasks", "mean_over_tasks", "task_seeds", "pass_seed", "compiled_when_eager",
           "query_loss", "adapt_with", "meta_gradient"]


class Algorithm(NamedTuple):
    """What every meta-learning algorithm returns (`hogrod.meta.maml(model, loss)`, ...).

    Attributes:
      meta_loss: `meta_loss(tasks, step=None) -> {"loss": scalar, "monitor/...": scalar}`:
        the objective to minimize (under "loss") and values only logged; `tasks` is a
        meta-batch (x_support, y_support, x_query, y_query), each with a leading task axis;
        `step` the outer iteration counter (e.g. `optimizer.iterations`), which MAML++
        needs and the others ignore.
      adapt: `adapt(support, steps, seeds=None) -> adapted`: what `predict` takes. For the
        gradient-based algorithms the fast weights (a list of tensors in
        `model.trainable_variables` order); for the few-shot heads (`steps` 0) the head's
        solution on the support embeddings: ProtoNet's prototypes `[n_way, d]`, R2D2's
        ridge weights `[d, n_way]`, MetaOptNet's `(weights [d, n_way], dual [n, n_way])`.
        `seeds` is None (random layers use the model's seed states) or one pass's seeds
        per step, [steps, generators, 2]; at 0 steps the evaluation gives one, [1,
        generators, 2], which the heads' support pass takes.
      variables: the algorithm's own trainable variables (learned rates, ...), meta-trained
        with the model's.
      predict: `predict(adapted, x, steps, seed=None) -> outputs` on query inputs after
        `steps` adaptation steps (`seed`: one pass's seeds, or None; the heads' query
        logits `[q, n_way]`); None (the default) means
        `functional_call(model, fast, x, training=True)`: BatchNorm on the query batch's
        statistics, the transductive setting.
      state: the algorithm's non-trainable variables (MAML++'s per-step BatchNorm
        statistics), to checkpoint with the model; () by default.
    """

    meta_loss: Callable[..., Dict[str, tf.Tensor]]
    adapt: Callable[..., List[tf.Tensor]]
    variables: Sequence[tf.Variable]
    predict: Optional[Callable[..., tf.Tensor]] = None
    state: Sequence[tf.Variable] = ()


MODES = ("vectorized", "sequential", "recomputed")
#: A meta-batch (x_support, y_support, x_query, y_query), each with a leading task axis.
Tasks = Sequence[tf.Tensor]
#: The per-task computation `fn(task, seeds, params) -> any nest of tensors`.
TaskFn = Callable[[Tasks, Optional[tf.Tensor], List[tf.Tensor]], Tree]


def check_task_map(task_map: str, where: str) -> str:
    """The task mapping an algorithm (or the evaluation) was given, checked.

    - 'vectorized': `tf.vectorized_map`, the inner tapes included (fastest for dense
      nets; memory grows with the meta-batch);
    - 'sequential': `tf.map_fn`, one task at a time (less memory; faster for conv nets,
      whose filter gradient pfor runs as a while loop);
    - 'recomputed': a loop over the tasks, each task's forward pass recomputed in the
      backward pass (`tf.recompute_grad`): the least memory, one more forward pass.

    Args:
      task_map: the mode given, one of `MODES`.
      where: the public function (or gin binding) that takes it, named in the message.

    Returns:
      `task_map`, unchanged.

    Raises:
      hogrod.checks.ArgumentError: `task_map` is not one of `MODES`.
    """
    return checks.choice(task_map, MODES, "task_map", where)


def check_loss(loss: Loss, where: str) -> Loss:
    """A Keras loss `loss(y_true, y_pred) -> scalar`, returned unchanged.

    Args:
      loss: the loss given.
      where: the public function that takes it, named in the message.

    Returns:
      `loss`, unchanged.

    Raises:
      hogrod.checks.ArgumentError: `loss` is not callable.
    """
    return checks.function(loss, "loss", where, "loss(y_true, y_pred) -> scalar (a Keras loss)")


class _RandomOpLoops(logging.Filter):
    """Drops pfor's notice that a stateless random op runs as a loop over the tasks: that
    is how per-task dropout masks are drawn (TF cannot vectorize a per-task seed), not a
    problem to report on every trace. Every other notice (e.g. a conv gradient run as a
    loop) passes."""

    def filter(self, record):
        return "Using a while_loop for converting StatelessRandom" not in record.getMessage()


@contextlib.contextmanager
def _quiet_random_op_loops():
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


def _vectorized_map(fn, elems):
    """tf.vectorized_map, except in a graph XLA compiles (make_train_step.jit_compile):
    there tf.vectorized_map wraps its loop in a nested tf.function, and XLA then takes
    every input of the compiled step (the data, the weights) as a compile-time constant,
    compiling it anew on every step. The same pfor loop, not wrapped, compiles once."""
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
    return loop(lambda i: fn(tf.nest.map_structure(lambda t: tf.gather(t, i), elems)), n,
                fallback_to_while_loop=True)


def _recomputed(fn, tasks, seeds, params):
    """A Python loop over the tasks (recompute_grad inside a while loop cannot capture
    BatchNorm's state variables), each task's forward pass recomputed in the backward."""
    n = tasks[0].shape[0]
    if n is None:
        raise ValueError("task_map='recomputed' needs a meta-batch of static size "
                         f"(the tasks' leading axis), got shape {tasks[0].shape}; use "
                         "'sequential' for a dynamic one")
    params, k = list(params), len(params)
    per_task = []
    for i in range(n):
        seed = None if seeds is None else seeds[i]
        task = tf.nest.map_structure(lambda t: t[i], tasks)

        def forward(*args, seed=seed, task=task):
            return tf.nest.flatten(fn(tf.nest.pack_sequence_as(task, list(args[k:])), seed,
                                      list(args[:k])))

        # recompute_grad runs its forward pass with every tape stopped, the inner loop's
        # included: its value is the loss without adaptation. Its gradient (a
        # recomputation under a live tape) is right; the value comes from a forward pass
        # on constants, which keeps nothing for the backward pass.
        grad_only = tf.recompute_grad(forward)(*params, *tf.nest.flatten(task))
        value = fn(task, seed, [tf.stop_gradient(p) for p in params])
        per_task.append(tf.nest.pack_sequence_as(value, [
            tf.stop_gradient(v) + (g - tf.stop_gradient(g))
            for v, g in zip(tf.nest.flatten(value), grad_only)]))
    return tf.nest.map_structure(lambda *v: tf.stack(v), *per_task)


def map_tasks(fn: TaskFn, tasks: Tasks, seeds: Optional[tf.Tensor] = None, params: Params = (),
              mode: str = "vectorized") -> Tree:
    """`fn(task, seeds, params)` for every task of the meta-batch, stacked on a task axis.

    Args:
      fn: `fn(task, seeds, params)`, the per-task computation (any nest of tensors out);
        it gets one task, that task's row of `seeds` (or None) and `params`.
      tasks: (x_support, y_support, x_query, y_query), each with a leading task axis.
      seeds: None, or one row per task (`task_seeds`), [tasks, passes, generators, 2].
      params: the weights fn differentiates through, given as is to every task (and the
        arguments `tf.recompute_grad` recomputes for in mode 'recomputed').
      mode: one of `MODES`.

    Returns:
      fn's outputs, stacked on a leading task axis.
    """
    check_task_map(mode, "map_tasks")
    if mode == "recomputed":
        return _recomputed(fn, tasks, seeds, params)
    params = list(params)
    if seeds is None:
        elems, call = tasks, lambda t: fn(t, None, params)  # noqa: E731
    else:
        elems, call = (tasks, seeds), lambda e: fn(e[0], e[1], params)  # noqa: E731
    if mode == "vectorized":
        with _quiet_random_op_loops():
            return _vectorized_map(call, elems)
    return tf.map_fn(call, elems, fn_output_signature=_signature(call, elems))


def mean_over_tasks(fn: TaskFn, tasks: Tasks, seeds: Optional[tf.Tensor] = None,
                    params: Params = (), mode: str = "vectorized") -> Tree:
    """`map_tasks`, every output averaged over the task axis.

    Args:
      fn: `fn(task, seeds, params)`, as for `map_tasks`.
      tasks: the meta-batch, as for `map_tasks`.
      seeds: None, or [tasks, passes, generators, 2], as for `map_tasks`.
      params: the weights fn differentiates through, as for `map_tasks`.
      mode: one of `MODES`.

    Returns:
      fn's outputs, each the mean over the tasks.
    """
    return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0),
                                 map_tasks(fn, tasks, seeds, params, mode))


def task_seeds(model: keras.Model, tasks: Tasks, passes: int) -> Optional[tf.Tensor]:
    """Seeds for `passes` forward passes per task (None without random layers).

    Draws (and advances the model's seed states) once per meta-batch (`draw_seeds`).

    Args:
      model: the model meta-trained.
      tasks: the meta-batch (its leading axis counts the tasks).
      passes: forward passes per task.

    Returns:
      [tasks, passes, generators, 2] seeds, or None.
    """
    return draw_seeds(model, tf.shape(tasks[0])[0], passes)


def pass_seed(seeds: Optional[tf.Tensor], i: int,
              stop: Optional[int] = None) -> Optional[tf.Tensor]:
    """Pass i's seed of one task's seeds (passes i..stop-1 if stop is given), or None.

    Args:
      seeds: one task's seeds [passes, generators, 2], or None.
      i: the pass.
      stop: None, or the end (exclusive) of a range of passes.

    Returns:
      the seed(s), or None when `seeds` is None.
    """
    if seeds is None:
        return None
    return seeds[i] if stop is None else seeds[i:stop]


def _check_tasks(tasks):
    if not isinstance(tasks, (tuple, list)) or len(tasks) != 4:
        raise ValueError("meta_loss(tasks): tasks must be (x_support, y_support, x_query, "
                         f"y_query), each with a leading task axis; got {type(tasks).__name__}"
                         + (f" of length {len(tasks)}" if isinstance(tasks, (tuple, list))
                            else ""))


def _check_step(step):
    if step is None:
        return None
    step = tf.convert_to_tensor(step)
    if not step.dtype.is_integer or step.shape.rank != 0:
        raise TypeError("meta_loss(tasks, step): step must be an integer scalar (the outer "
                        f"iteration counter, e.g. optimizer.iterations), got {step.dtype.name} "
                        f"of shape {step.shape}")
    return step


def compiled_when_eager(meta_loss: Callable[..., Dict[str, tf.Tensor]]
                        ) -> Callable[..., Dict[str, tf.Tensor]]:
    """`meta_loss(tasks, step=None)` run as one tf.function when called eagerly.

    Eager tf.vectorized_map traces a new function on every call and TF warns of retracing;
    inside a caller's tf.function (the train step) it is traced into that function as is.
    Checks its arguments either way: `tasks` a 4-tuple or list, `step` None or an integer
    scalar (ValueError or TypeError naming `meta_loss(tasks, step)` otherwise).

    Args:
      meta_loss: an algorithm's `meta_loss(tasks, step)`.

    Returns:
      `call(tasks, step=None)`, the checked and compiled `meta_loss`.
    """
    # a partial, because TF keys its retracing warning on the code object: every
    # algorithm built would count as a retrace of the others
    compiled = tf.function(functools.partial(meta_loss))

    def call(tasks, step=None):
        _check_tasks(tasks)
        step = _check_step(step)
        return compiled(tuple(tasks), step) if tf.executing_eagerly() else meta_loss(
            tuple(tasks), step)
    return call


def query_loss(model: keras.Model, loss: Loss, fast: Sequence[tf.Tensor], xq: tf.Tensor,
               yq: tf.Tensor, seed: Optional[tf.Tensor] = None) -> tf.Tensor:
    """`loss(yq, model(xq))` at the fast weights, with one pass's seed (training=True).

    Args:
      model: the model.
      loss: a Keras loss `loss(y_true, y_pred)`.
      fast: the fast weights, in `model.trainable_variables` order.
      xq: the query inputs.
      yq: the query targets.
      seed: one pass's seeds [generators, 2], or None.

    Returns:
      the scalar query loss.
    """
    return loss(yq, run(model, fast, xq, True, seed))


def adapt_with(model: keras.Model, loss: Loss, rates: Rates, first_order: bool = False,
               optimizer: Optional[optim.Optimizer] = None) -> Callable[..., List[tf.Tensor]]:
    """`Algorithm.adapt` of plain gradient steps at `rates`, or of an optimizer's steps.

    For an algorithm whose evaluation is plain gradient steps at `rates` (a scalar, one per
    param, None to freeze, or a callable of the step), or the steps of a `hogrod.optim`
    optimizer (then rates is None) from a fresh state.

    Args:
      model: the model.
      loss: a Keras loss `loss(y_true, y_pred)`.
      rates: as `hogrod.meta.adapt`'s inner_lr.
      first_order: stop gradients through the inner gradients.
      optimizer: None, or a `hogrod.optim` optimizer.

    Returns:
      `adapt_eval(support, steps, seeds=None) -> fast weights`.
    """
    def adapt_eval(support, steps, seeds=None):
        return adapt(model, loss, support, rates, steps, first_order, seeds=seeds,
                     optimizer=optimizer)
    return adapt_eval


def meta_gradient(algorithm: Algorithm, model: keras.Model, tasks: Tasks,
                  step: Optional[Any] = None) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    """The algorithm's objective on a meta-batch and its gradient.

    The gradient is with respect to `model.trainable_variables + algorithm.variables` (in
    that order; zeros where a variable does not reach the loss): what `make_train_step`
    would apply.

    Args:
      algorithm: an `Algorithm` (`hogrod.meta.maml(model, loss)`, ...).
      model: the model it was built on (built: it has trainable variables).
      tasks: a meta-batch (x_support, y_support, x_query, y_query), each with a leading
        task axis.
      step: the outer iteration counter (an integer scalar: `0`, `optimizer.iterations`);
        None gives `meta_loss(tasks)`, which MAML++ only accepts when built with
        `iterations` (its annealing and first-order phase read it).

    Returns:
      `(loss, grads)`: the scalar objective (`meta_loss(tasks, step)["loss"]`) and one
      gradient per variable, in the order above.

    Raises:
      TypeError: `algorithm` is not an `Algorithm`.
      ValueError: the model has no trainable variables (not built).
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError("meta_gradient: algorithm must be a hogrod.meta Algorithm (e.g. "
                        f"meta.maml(model, loss)), got {type(algorithm).__name__}")
    variables = list(model.trainable_variables) + list(algorithm.variables)
    if not variables:
        raise ValueError("meta_gradient: the model has no trainable variables (not built?)")
    with tf.GradientTape() as tape:
        loss = algorithm.meta_loss(tasks, step)["loss"]
    grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, grads
