"""What every meta-learning algorithm shares: the `Algorithm` it returns, the per-pass
seeds of random layers, the eager-call compilation and `meta_gradient`.

An algorithm's per-task computation is `fn(task, seeds, params)`: `task` one
(x_support, y_support, x_query, y_query), `seeds` that task's seeds for its forward
passes (`pass_seed` picks one; None without random layers), `params` the model's weights
as read once per meta-batch (what the meta-gradient reaches). `hogrod.taskmap`'s
`mean_over_tasks` maps it over the meta-batch as the algorithm's `task_map` says (one of
`hogrod.taskmap.MODES`) and averages every output over the tasks.
"""

import functools
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from hogrod import checks, optim
from hogrod.meta.inner import Rates, adapt, draw_seeds, run
from hogrod.types import Loss

__all__ = ["Algorithm", "Tasks", "check_loss", "task_seeds", "pass_seed",
           "compiled_when_eager", "query_loss", "adapt_with", "meta_gradient"]


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


#: A meta-batch (x_support, y_support, x_query, y_query), each with a leading task axis.
Tasks = Sequence[tf.Tensor]


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


def _check_tasks(tasks, input_rank=None):
    if not isinstance(tasks, (tuple, list)) or len(tasks) != 4:
        raise ValueError("meta_loss(tasks): tasks must be (x_support, y_support, x_query, "
                         f"y_query), each with a leading task axis; got {type(tasks).__name__}"
                         + (f" of length {len(tasks)}" if isinstance(tasks, (tuple, list))
                            else ""))
    if input_rank is None:
        return
    for i, name in ((0, "x_support"), (2, "x_query")):
        shape = getattr(tasks[i], "shape", None)
        if shape is not None and len(shape) != input_rank + 1:
            # one task given without its axis reaches the model as a batch of the wrong
            # rank, and fails deep inside it (or, worse, runs)
            raise ValueError(f"meta_loss(tasks): {name} has shape {list(shape)}, but the model "
                             f"takes batches of rank {input_rank}, so tasks need rank "
                             f"{input_rank + 1}: [tasks, examples, ...] (x[None] for one task)")


def _input_rank(model):
    """The rank of the model's one input batch, where Keras knows it (None: unknown, a
    subclassed model or several inputs)."""
    inputs = getattr(model, "inputs", None) if model is not None else None
    if not inputs or len(inputs) != 1 or inputs[0].shape is None:
        return None
    return len(inputs[0].shape)


def _check_step(step):
    if step is None:
        return None
    step = tf.convert_to_tensor(step)
    if not step.dtype.is_integer or step.shape.rank != 0:
        raise TypeError("meta_loss(tasks, step): step must be an integer scalar (the outer "
                        f"iteration counter, e.g. optimizer.iterations), got {step.dtype.name} "
                        f"of shape {step.shape}")
    return step


def compiled_when_eager(meta_loss: Callable[..., Dict[str, tf.Tensor]],
                        model: Optional[keras.Model] = None
                        ) -> Callable[..., Dict[str, tf.Tensor]]:
    """`meta_loss(tasks, step=None)` run as one tf.function when called eagerly.

    Eager tf.vectorized_map traces a new function on every call and TF warns of retracing;
    inside a caller's tf.function (the train step) it is traced into that function as is.
    Checks its arguments either way: `tasks` a 4-tuple or list (its inputs of the model's
    input rank plus the task axis, where the model's input shape is known), `step` None or
    an integer scalar (ValueError or TypeError naming `meta_loss(tasks, step)` otherwise).

    Args:
      meta_loss: an algorithm's `meta_loss(tasks, step)`.
      model: the model the tasks' inputs are fed to, or None (no rank check).

    Returns:
      `call(tasks, step=None)`, the checked and compiled `meta_loss`.
    """
    # a partial, because TF keys its retracing warning on the code object: every
    # algorithm built would count as a retrace of the others
    compiled = tf.function(functools.partial(meta_loss))

    input_rank = _input_rank(model)

    def call(tasks, step=None):
        _check_tasks(tasks, input_rank)
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
