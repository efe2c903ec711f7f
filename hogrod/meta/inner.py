"""The inner loop of gradient-based meta-learning, as one pure function.

`adapt` takes a few gradient steps on a support set starting from `params` and returns
the fast weights, a list of tensors shaped like `model.trainable_variables`. Nothing is
assigned: the model runs through `hogrod.functional_call`, so an outer tape that watched
the starting params differentiates through every inner step (the exact second-order MAML
meta-gradient), or through none of the inner gradients when `first_order=True`.

Random layers (Dropout, GaussianNoise, ...): a functional call reads the layers' seed
states but never writes them back, so without help every pass would reuse one mask. The
algorithms therefore draw seeds per meta-batch with `draw_seeds` (which advances the
model's seed states, so every meta-step gets new masks and a restored checkpoint
reproduces them) and give each forward pass its own with `seeded_state`. Evaluation
draws them with `evaluation_seeds` from an evaluation seed and the task's index instead,
so one evaluation reproduces exactly and never moves the model's seed states.
"""

import numbers
from typing import Any, Callable, List, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

from hogrod import autodiff, checks, functional, optim
from hogrod.types import Batch, DType, Loss, Objective, Params, Scalar, TensorLike

__all__ = ["Rates", "adapt", "check_rate", "initial_params", "as_dtype", "seed_slots", "draw_seeds",
           "evaluation_seeds", "seeded_state", "run"]

SEED_STATE = "seed_generator_state"  # the name Keras gives every SeedGenerator's state

#: Inner rates (`adapt`'s inner_lr): a scalar; one per param (a scalar, a tensor
#: broadcastable to the param, or None to freeze it); a callable `inner_lr(step)` returning
#: either; or None (with an optimizer).
Rates = Union[Scalar, Sequence[Optional[TensorLike]], Callable[[int], Any], None]


def initial_params(model: keras.Model) -> List[tf.Tensor]:
    """The model's trainable variables read as tensors (recorded by any enclosing tape).

    Args:
      model: a built Keras 3 model.

    Returns:
      a list of tensors in `model.trainable_variables` order.
    """
    return [tf.convert_to_tensor(v) for v in model.trainable_variables]


def as_dtype(x: TensorLike, dtype: DType) -> tf.Tensor:
    """x at `dtype`, a Python number converted directly (never through float32).

    A Python or NumPy number (or array, list, tuple) is converted directly (0.05 in float64
    is the nearest float64, not float32's 0.05000000074505806, which `tf.cast(0.05, dtype)`
    gives); a tensor or variable is cast.

    Args:
      x: a Python or NumPy number or array, a tensor or a variable.
      dtype: the dtype wanted.

    Returns:
      a tensor of `dtype`.
    """
    if isinstance(x, (int, float, np.number, np.ndarray, list, tuple)):
        return tf.constant(x, dtype)
    return tf.cast(x, dtype)


def seed_slots(model: keras.Model) -> List[int]:
    """Positions in `model.non_trainable_variables` of the random layers' seed states.

    Args:
      model: a Keras 3 model.

    Returns:
      a list of indices (empty without random layers).
    """
    return [i for i, v in enumerate(model.non_trainable_variables) if v.name == SEED_STATE]


def draw_seeds(model: keras.Model, num_tasks: Union[int, tf.Tensor],
               passes: int) -> Optional[tf.Tensor]:
    """Seeds for `passes` forward passes of each of `num_tasks` tasks (None: no random layer).

    The seeds are [num_tasks, passes, generators, 2] of the seed states' dtype (int64).
    Derived statelessly from each seed generator's state (and the replica id, so replicas
    drop different units); each state is then advanced by one, so the next call draws new
    masks. Call once per meta-batch, outside the per-task map.

    Args:
      model: a built Keras 3 model.
      num_tasks: the number of tasks (an int or a scalar tensor).
      passes: forward passes per task.

    Returns:
      the seeds, or None for a model without random layers.
    """
    slots = seed_slots(model)
    if not slots:
        return None
    ctx = tf.distribute.get_replica_context()
    replica = tf.cast(0 if ctx is None else ctx.replica_id_in_sync_group, tf.int32)
    drawn = []
    for i in slots:
        var = model.non_trainable_variables[i]
        state = tf.convert_to_tensor(var.value)
        var.assign(state + tf.constant([0, 1], state.dtype))
        # int32 seeds (XLA's stateless ops take no others), reduced as Keras reduces them
        key = tf.cast(tf.math.floormod(tf.cast(state, tf.int64), tf.int32.max - 1), tf.int32)
        key = tf.random.experimental.stateless_fold_in(key, replica)
        drawn.append(tf.random.stateless_uniform(
            tf.stack([num_tasks, passes, 2]), key, minval=None, maxval=None, dtype=state.dtype))
    return tf.stack(drawn, axis=2)


def evaluation_seeds(model: keras.Model, num_tasks: Union[int, tf.Tensor], passes: int,
                     seed: int) -> Optional[tf.Tensor]:
    """Seeds for `passes` forward passes of each of `num_tasks` tasks in an evaluation.

    [num_tasks, passes, generators, 2] of the seed states' dtype, like `draw_seeds`; None
    for a model without random layers.

    Task i's seeds are a function of `seed` and i only (not of the model's seed states,
    which they leave alone, nor of the number of tasks): an evaluation with the same seed
    reproduces, every task gets its own masks, and so does every pass of a task.

    Args:
      model: a built Keras 3 model.
      num_tasks: the number of tasks (an int or a scalar tensor).
      passes: forward passes per task (an int).
      seed: the evaluation's integer seed (>= 0).

    Returns:
      the seeds, or None for a model without random layers.

    Raises:
      hogrod.checks.ArgumentError: `seed` is not an integer >= 0.
    """
    slots = seed_slots(model)
    if not slots:
        return None
    seed = checks.seed(seed, "seed", "hogrod.meta.evaluate")
    dtype = tf.as_dtype(model.non_trainable_variables[slots[0]].value.dtype)
    key = tf.constant([seed % (2**31 - 1), 0], tf.int32)

    def one_task(i):
        task_key = tf.random.experimental.stateless_fold_in(key, i)
        return tf.random.stateless_uniform([passes, len(slots), 2], task_key, minval=None,
                                           maxval=None, dtype=dtype)
    return tf.map_fn(one_task, tf.range(num_tasks, dtype=tf.int32),
                     fn_output_signature=tf.TensorSpec([passes, len(slots), 2], dtype))


def seeded_state(model: keras.Model, seed: Optional[tf.Tensor],
                 state: Optional[Sequence[TensorLike]] = None) -> Optional[List[TensorLike]]:
    """The model's state (or `state`) with the seed states replaced by `seed`.

    Args:
      model: a built Keras 3 model.
      seed: None, or one pass's seeds [generators, 2] (a slice of `draw_seeds`).
      state: the state to start from (None: `functional.model_state(model)`).

    Returns:
      the state as a list, or `state` unchanged when `seed` is None.
    """
    if seed is None:
        return state
    state = functional.model_state(model) if state is None else list(state)
    for g, i in enumerate(seed_slots(model)):
        state[i] = seed[g]
    return state


def run(model: keras.Model, params: Sequence[TensorLike], x: Batch, training: bool = True,
        seed: Optional[tf.Tensor] = None,
        state: Optional[Sequence[TensorLike]] = None) -> Any:
    """One forward pass through `hogrod.functional_call` with one pass's seed.

    Args:
      model: a built Keras 3 model.
      params: its trainable weights (a list in `model.trainable_variables` order).
      x: the inputs.
      training: passed to the model (BatchNorm on the batch's statistics, Dropout active).
      seed: None (the model's seed states), or one pass's seeds [generators, 2].
      state: the non-trainable state to run with (None: the model's).

    Returns:
      the model's outputs.
    """
    state = seeded_state(model, seed, state)
    if state is None:
        return functional.functional_call(model, params, x, training=training)
    return functional.functional_call(model, params, x, training=training, state=state)[0]


def _rates(inner_lr, step, params, where):
    lr = inner_lr(step) if callable(inner_lr) else inner_lr
    if isinstance(lr, (list, tuple)):
        if len(lr) != len(params):
            raise ValueError(f"inner_lr has {len(lr)} entries but there are {len(params)} "
                             "params; give one rate (or None to freeze) per param")
        rates = list(lr)
    else:
        rates = [lr] * len(params)
    for i, r in enumerate(rates):
        check_rate(r, "inner_lr" if r is lr else f"inner_lr[{i}]", where)
    return rates


def check_rate(rate: Any, arg: str, where: str) -> Any:
    """An inner rate given as a number checked > 0; any other rate returned as it is.

    A number is a step size the caller chose: 0 would do nothing (None freezes a param)
    and a negative one would ascend the loss. A tensor or variable rate may be learned
    (Meta-SGD's, MAML++'s) and take any sign, so it is not checked.

    Args:
      rate: the rate: a Python or numpy number, a tensor, a variable, a callable or None.
      arg: its name in the message (`inner_lr`, `inner_lr[2]`).
      where: the function or gin binding it was given to (`maml`, `hogrod.meta.adapt`).

    Returns:
      `rate`, unchanged.

    Raises:
      hogrod.checks.ArgumentError: a number that is not finite and > 0, named.
    """
    if isinstance(rate, numbers.Real) and not isinstance(rate, bool):
        checks.positive(rate, arg, where)
    return rate


def adapt(model: keras.Model, loss: Optional[Loss], support: Any, inner_lr: Rates,
          inner_steps: int = 1, first_order: bool = False, params: Optional[Params] = None,
          training: bool = True, seeds: Optional[tf.Tensor] = None,
          optimizer: Optional[optim.Optimizer] = None,
          objective: Optional[Objective] = None) -> List[tf.Tensor]:
    """Fast weights after `inner_steps` gradient steps on `support`.

    Each step descends either a Keras `loss` of the model's outputs on the support set,
    ``loss(y, model(x))`` at the current fast weights, or any per-task `objective(params,
    support) -> scalar` (minimized; e.g. MAML-RL's negated, scaled DiCE surrogate of one
    task's episodes, `hogrod.rl.inner_step`): exactly one of the two.

    Args:
      model: a built Keras 3 model (with `objective`: the model whose
        `trainable_variables` `params` stands for; its variables start the steps when
        `params` is None and name a parameter the objective ignores).
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`, or None with `objective`.
      support: with `loss`, `(x, y)`, the support inputs and targets; with `objective`,
        anything `objective` takes (a nest of tensors).
      inner_lr: a scalar; or a list with one rate per param (a scalar or a tensor
        broadcastable to the param, as Meta-SGD learns; None freezes that param, as ANIL
        does for the body); or a callable `inner_lr(step)` returning either (MAML++'s
        per-step rates).
      inner_steps: number of inner gradient steps, an int >= 0.
      first_order: stop gradients through the inner gradients (FOMAML).
      params: starting weights; None means the model's trainable variables, read under
        the caller's tape so the meta-gradient reaches them.
      training: passed to the model with `loss` (True: BatchNorm uses the support batch's
        statistics, the transductive setting of MAML).
      seeds: with `loss`, None (random layers use the model's seed states, the same masks
        every step), or one seed per step for the random layers, [inner_steps, generators,
        2] (`draw_seeds`); None with `objective` (which draws what it needs itself).
      optimizer: None (plain gradient steps at `inner_lr`), or a `hogrod.optim` optimizer
        (`hogrod.optim.adam(0.01)`, ...) that takes the inner steps instead; then
        `inner_lr` must be None (the optimizer's learning rate is the step size) and every
        param is updated. Its state starts at `optimizer.init(params)` and is threaded
        through the steps; the outer tape differentiates through it (and through the
        optimizer's hyperparameters, when they are watched tensors or variables).
      objective: None (with `loss`), or `objective(params, support) -> scalar`, minimized,
        `params` a list like the fast weights; it must compute from every param given a
        nonzero rate (a param it ignores is an error: its step would be a silent zero).

    Returns:
      the fast weights, a list of tensors in `model.trainable_variables` order.

    Raises:
      hogrod.checks.ArgumentError: both or neither of `loss` and `objective`, either not
        callable, `seeds` with `objective`, `inner_steps` not an integer >= 0, a rate
        given as a number that is not > 0, or an objective that does not depend on a
        param it steps (named).
      ValueError: a list `inner_lr` whose length is not the number of params, or an
        `inner_lr` given with an optimizer.
      TypeError: `optimizer` is not a `hogrod.optim` optimizer.
    """
    where = "hogrod.meta.adapt"
    inner_steps = checks.integer(inner_steps, "inner_steps", where)
    fast = initial_params(model) if params is None else list(params)
    step_objective = _step_objective(model, loss, objective, support, training, seeds, where)
    if optimizer is not None:
        return _adapt_with(optimizer, step_objective, inner_lr, inner_steps, first_order,
                           fast, objective is not None, model, where)
    for step in range(inner_steps):
        rates = _rates(inner_lr, step, fast, where)
        active = [i for i, r in enumerate(rates) if r is not None]

        def value(sub, fast=fast, step=step):
            full = list(fast)
            for i, p in zip(active, sub):
                full[i] = p
            return step_objective(full, step)

        sub = [fast[i] for i in active]
        grads = _grads(lambda: value(sub), sub, objective is not None, model,
                       active, where)
        if first_order:
            grads = [tf.stop_gradient(g) for g in grads]
        fast = list(fast)
        for i, g in zip(active, grads):
            fast[i] = fast[i] - as_dtype(rates[i], g.dtype) * g
    return fast


def _step_objective(model, loss, objective, support, training, seeds, where):
    """`(fast, step) -> scalar`, the value an inner step descends, after the checks of
    `adapt`'s exactly-one-of `loss` and `objective`."""
    if (loss is None) == (objective is None):
        raise checks.ArgumentError(
            f"{where}: give exactly one of loss (a Keras loss of the model's outputs on "
            "support = (x, y)) and objective (objective(params, support) -> scalar), got "
            + ("both" if loss is not None else "neither"))
    if objective is not None:
        checks.function(objective, "objective", where, "objective(params, support) -> scalar")
        if seeds is not None:
            raise checks.ArgumentError(f"{where}: seeds are for the model's random layers "
                                       "under `loss`; an objective draws its own (pass "
                                       "seeds=None)")
        return lambda fast, step: objective(fast, support)
    checks.function(loss, "loss", where, "loss(y_true, y_pred) -> scalar")
    x, y = support
    return lambda fast, step: loss(y, run(model, fast, x, training,
                                          None if seeds is None else seeds[step]))


def _grads(fn, params, named, model, indices, where):
    """`autodiff.grad(fn, params)`; with `named` (an objective), a param `fn` ignores is an
    ArgumentError naming it (the model's variable at that position)."""
    if not named:
        return autodiff.grad(fn, params)
    grads = autodiff.grad(fn, params, unconnected="none")
    variables = model.trainable_variables
    for g, i in zip(grads, indices):
        if g is None:
            name = variables[i].path if i < len(variables) else f"params[{i}]"
            raise checks.ArgumentError(
                f"{where}: the objective's values do not depend on parameter {name!r} "
                f"(params[{i}]), so its inner step would be a silent zero: "
                "objective(params, support) must compute from params (e.g. through "
                "hogrod.functional_call or a policy's distribution(observations, params))")
    return grads


def _adapt_with(optimizer, step_objective, inner_lr, inner_steps, first_order, fast, named,
                model, where):
    """`adapt`'s inner loop with a `hogrod.optim` optimizer's steps, its state threaded
    (`named`: an objective, whose ignored params are errors, as in plain steps)."""
    if not isinstance(optimizer, optim.Optimizer):
        raise TypeError("adapt: optimizer must be a hogrod.optim optimizer "
                        f"(hogrod.optim.sgd/adam/adamw/rmsprop(...)), got {optimizer!r}")
    if inner_lr is not None:
        raise ValueError("adapt: pass inner_lr=None with an optimizer (its learning_rate is "
                         f"the step size); got inner_lr={inner_lr!r}")
    state = optimizer.init(fast)
    for step in range(inner_steps):
        grads = _grads(lambda fast=fast, step=step: step_objective(fast, step), fast, named,
                       model, range(len(fast)), where)
        if first_order:
            grads = [tf.stop_gradient(g) for g in grads]
        fast, state = optimizer.update(list(grads), state, fast)
        fast = list(fast)
    return fast
