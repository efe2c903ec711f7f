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

import collections
import contextlib
import functools
import logging

import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.ops.parallel_for import control_flow_ops as pfor_ops

from hogrod import checks
from hogrod.meta.inner import adapt, draw_seeds, run

__all__ = ["Algorithm", "MODES", "check_task_map", "check_loss", "map_tasks",
           "mean_over_tasks", "task_seeds", "pass_seed", "compiled_when_eager", "query_loss",
           "adapt_with", "meta_gradient"]

Algorithm = collections.namedtuple(
    "Algorithm", ["meta_loss", "adapt", "variables", "predict", "state"], defaults=(None, ()))
Algorithm.__doc__ = """meta_loss(tasks, step=None) -> {"loss": scalar, "monitor/...": scalar}:
the objective to minimize (under "loss") and values only logged; step is the outer
iteration counter (e.g. `optimizer.iterations`), which MAML++ needs and the others ignore.
adapt(support, steps, seeds=None) -> fast weights (seeds: None, the model's seed states
for random layers, or one pass's seeds per step, [steps, generators, 2]); variables: the
algorithm's own trainables; predict(fast, x, steps, seed=None) -> outputs on query inputs
after `steps` adaptation steps (seed: one pass's seeds, or None; predict None:
`functional_call(model, fast, x, training=True)`, BatchNorm on the query batch's
statistics, the transductive setting); state: the algorithm's non-trainable variables
(MAML++'s per-step BatchNorm statistics), to checkpoint with the model."""

MODES = ("vectorized", "sequential", "recomputed")


def check_task_map(task_map, where):
    """The task mapping an algorithm (or the evaluation) was given, checked.

    - 'vectorized': `tf.vectorized_map`, the inner tapes included (fastest for dense
      nets; memory grows with the meta-batch);
    - 'sequential': `tf.map_fn`, one task at a time (less memory; faster for conv nets,
      whose filter gradient pfor runs as a while loop);
    - 'recomputed': a loop over the tasks, each task's forward pass recomputed in the
      backward pass (`tf.recompute_grad`): the least memory, one more forward pass.

    Args:
      task_map: the mode given.
      where: the public function (or gin binding) that takes it, named in the message.

    Returns:
      `task_map`.
    """
    return checks.choice(task_map, MODES, "task_map", where)


def check_loss(loss, where):
    """A Keras loss `loss(y_true, y_pred) -> scalar`, returned unchanged.

    Args:
      loss: the loss given.
      where: the public function that takes it.

    Returns:
      `loss`.
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


def map_tasks(fn, tasks, seeds=None, params=(), mode="vectorized"):
    """fn(task, seeds, params) for every task of the meta-batch, outputs stacked on a
    leading task axis. seeds: None, or one row per task (`task_seeds`), given to fn with
    its task; params: what fn differentiates through (given as is to every task, and the
    arguments `tf.recompute_grad` recomputes for in mode 'recomputed').

    Args:
      fn: `fn(task, seeds, params)`, the per-task computation (any nest of tensors out).
      tasks: (x_support, y_support, x_query, y_query), each with a leading task axis.
      seeds: None, or [tasks, passes, generators, 2].
      params: the weights fn differentiates through.
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


def mean_over_tasks(fn, tasks, seeds=None, params=(), mode="vectorized"):
    """`map_tasks`, every output averaged over the task axis.

    Args:
      fn, tasks, seeds, params, mode: as `map_tasks`.

    Returns:
      fn's outputs, each the mean over the tasks.
    """
    return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0),
                                 map_tasks(fn, tasks, seeds, params, mode))


def task_seeds(model, tasks, passes):
    """Seeds for `passes` forward passes per task (None without random layers); draws
    (and advances the model's seed states) once per meta-batch.

    Args:
      model: the model meta-trained.
      tasks: the meta-batch (its leading axis counts the tasks).
      passes: forward passes per task.

    Returns:
      [tasks, passes, generators, 2] seeds, or None.
    """
    return draw_seeds(model, tf.shape(tasks[0])[0], passes)


def pass_seed(seeds, i, stop=None):
    """Pass i's seed of one task's seeds (passes i..stop-1 if stop is given), or None.

    Args:
      seeds: one task's seeds [passes, generators, 2], or None.
      i: the pass.
      stop: None, or the end of a range of passes.

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


def compiled_when_eager(meta_loss):
    """`meta_loss(tasks, step=None)` run as one tf.function when called eagerly (eager
    tf.vectorized_map traces a new function on every call and TF warns of retracing);
    inside a caller's tf.function (the train step) it is traced into that function as is.
    Checks its arguments either way.

    Args:
      meta_loss: an algorithm's `meta_loss(tasks, step)`.

    Returns:
      `call(tasks, step=None)`.
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


def query_loss(model, loss, fast, xq, yq, seed=None):
    """`loss(yq, model(xq))` at the fast weights, with one pass's seed.

    Args:
      model: the model.
      loss: a Keras loss `loss(y_true, y_pred)`.
      fast: the fast weights.
      xq, yq: the query set.
      seed: one pass's seeds [generators, 2], or None.

    Returns:
      the scalar query loss.
    """
    return loss(yq, run(model, fast, xq, True, seed))


def adapt_with(model, loss, rates, first_order=False, optimizer=None):
    """`Algorithm.adapt` for an algorithm whose evaluation is plain gradient steps at
    `rates` (a scalar, one per param, None to freeze, or a callable of the step), or the
    steps of a `hogrod.optim` optimizer (then rates is None), from a fresh state.

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


def meta_gradient(algorithm, model, tasks, step=None):
    """`(loss, grads)`: the algorithm's objective on a meta-batch and its gradient with
    respect to `model.trainable_variables + algorithm.variables` (in that order; zeros
    where a variable does not reach the loss), what `make_train_step` would apply.

    step: the outer iteration counter; None gives `meta_loss(tasks)`, which MAML++ only
    accepts when built with `iterations` (its annealing and first-order phase read it).
    A meta-gradient at a given iteration: `step=0`, ...

    Args:
      algorithm: an `Algorithm` (`hogrod.meta.maml(model, loss)`, ...).
      model: the model it was built on.
      tasks: a meta-batch (x_support, y_support, x_query, y_query).
      step: the outer iteration counter, or None.

    Returns:
      `(loss, grads)`.
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
