"""MAML (Finn et al. 2017) and first-order MAML: the query loss after a few inner steps,
differentiated through the inner loop. `unrolled` is the shared form (any per-param
rates, learned or frozen), which ANIL and Meta-SGD reuse."""

from typing import Optional, Sequence, Union

import gin
import keras
import tensorflow as tf

from hogrod import checks, optim, taskmap
from hogrod.meta.common import (Algorithm, adapt_with, check_loss, compiled_when_eager,
                                pass_seed, query_loss, task_seeds)
from hogrod.meta.inner import Rates, adapt, check_rate, initial_params
from hogrod.types import Loss, Scalar

__all__ = ["maml", "fomaml", "unrolled"]


def unrolled(model: keras.Model, loss: Loss, rates: Rates, inner_steps: int, first_order: bool,
             task_map: str, variables: Sequence[tf.Variable] = (),
             optimizer: Optional[optim.Optimizer] = None, where: str = "maml") -> Algorithm:
    """The `Algorithm` whose objective is the mean query loss after `inner_steps` steps.

    The steps are plain gradient steps at `rates` (see `hogrod.meta.adapt`'s inner_lr), or
    those of `optimizer` (rates None), from the model's weights.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred)`.
      rates: the inner rates (`hogrod.meta.adapt`'s inner_lr), or None with `optimizer`.
      inner_steps: inner steps per task (>= 1).
      first_order: stop gradients through the inner gradients.
      task_map: 'vectorized', 'sequential' or 'recomputed'.
      variables: the algorithm's own trainables (learned rates, ...).
      optimizer: None, or the `hogrod.optim` optimizer taking the inner steps.
      where: the public algorithm's name, in error messages.

    Returns:
      an `Algorithm`.

    Raises:
      hogrod.checks.ArgumentError: a bad `loss`, `task_map` or `inner_steps`, named.
    """
    check_loss(loss, f"hogrod.meta.{where}")
    taskmap.check_task_map(task_map, f"hogrod.meta.{where}")
    inner_steps = checks.integer(inner_steps, "inner_steps", f"hogrod.meta.{where}", least=1)

    def meta_loss(tasks, step=None):  # step: unused (no schedule)
        params = initial_params(model)  # read once, under the train step's tape
        seeds = task_seeds(model, tasks, inner_steps + 1)  # the inner steps, then the query

        def task_loss(task, seeds, start):
            xs, ys, xq, yq = task
            fast = adapt(model, loss, (xs, ys), rates, inner_steps, first_order, start,
                         seeds=pass_seed(seeds, 0, inner_steps), optimizer=optimizer)
            return query_loss(model, loss, fast, xq, yq, pass_seed(seeds, inner_steps))

        return {"loss": taskmap.mean_over_tasks(task_loss, tasks, seeds, params, task_map)}

    return Algorithm(compiled_when_eager(meta_loss, model),
                     adapt_with(model, loss, rates, optimizer=optimizer), list(variables))


DEFAULT_INNER_LR = 0.01


def _inner(where, model, inner_lr, inner_optimizer, learn):
    """(rates, optimizer, variables) of MAML's inner loop: plain steps at inner_lr (0.01
    when neither is given), or the optimizer's steps, its hyperparameters learned if asked."""
    if inner_optimizer is None:
        if learn is not False:
            raise ValueError(f"{where}: learn_inner_hyperparameters={learn!r} needs an "
                             f"inner_optimizer (e.g. `{where}.inner_optimizer = "
                             "@hogrod.optim.adam()`); for learned plain-step rates use "
                             "meta_sgd")
        return (DEFAULT_INNER_LR if inner_lr is None
                else check_rate(inner_lr, "inner_lr", where)), None, []
    if inner_lr is not None:
        # the shipped configs bind inner_lr (configs/maml/algorithms/*.gin), so a binding
        # added on top of one of them cannot be removed, only overridden
        raise ValueError(f"{where}: give inner_lr or inner_optimizer, not both (the "
                         f"optimizer's learning_rate is the step size); got inner_lr="
                         f"{inner_lr!r}: bind `{where}.inner_lr = None` (e.g. "
                         f"--gin_param=\"{where}.inner_lr = None\"), or pass inner_lr=None")
    if not isinstance(inner_optimizer, optim.Optimizer):
        raise TypeError(f"{where}: inner_optimizer must be a hogrod.optim optimizer "
                        "(gin: `@hogrod.optim.adam()`, with the parentheses), got "
                        f"{inner_optimizer!r}")
    if learn is False:
        return None, inner_optimizer, []
    if learn is not True and (isinstance(learn, (str, bytes)) or
                              not isinstance(learn, (list, tuple))):
        raise TypeError(f"{where}: learn_inner_hyperparameters must be False, True or a "
                        f"list of hyperparameter names, got {learn!r}")
    dtypes = {v.dtype for v in model.trainable_variables}
    if len(dtypes) != 1:
        raise ValueError(f"{where}: learned inner hyperparameters need one dtype for every "
                         f"trainable variable of the model, got {sorted(dtypes)}")
    opt, variables = optim.learnable(inner_optimizer, dtypes.pop(),
                                     None if learn is True else learn)
    return None, opt, variables


@gin.configurable
def maml(model: keras.Model, loss: Loss, inner_lr: Optional[Scalar] = None,
         inner_steps: int = 1, first_order: bool = False, task_map: str = "vectorized",
         inner_optimizer: Optional[optim.Optimizer] = None,
         learn_inner_hyperparameters: Union[bool, Sequence[str]] = False) -> Algorithm:
    """MAML: the query loss after `inner_steps` steps, differentiated through the inner loop.

    The inner steps start from theta (the model's weights); the meta-gradient is second
    order unless `first_order`.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the plain gradient step's rate (None: 0.01).
      inner_steps: inner steps per task (>= 1).
      first_order: treat the inner gradients as constants (FOMAML).
      task_map: how the tasks of a meta-batch are mapped: 'vectorized'
        (`tf.vectorized_map`), 'sequential' (`tf.map_fn`: less memory, faster for conv
        nets) or 'recomputed' (each task's inner loop recomputed in the backward pass: the
        least memory).
      inner_optimizer: instead of inner_lr, a `hogrod.optim` optimizer taking the inner
        steps (MAML with an inner Adam or momentum), its state fresh per task and threaded
        through the steps, in training and in `Algorithm.adapt`; give one or the other.
      learn_inner_hyperparameters: False; True (the optimizer's
        `hogrod.optim.LEARNED_BY_DEFAULT` hyperparameters, e.g. Adam's learning_rate, b1,
        b2) or a list of names: those become `Algorithm.variables` (log learning rate,
        logit b1, ...: see `hogrod.optim.learnable`), meta-trained with the weights.

    Returns:
      an `Algorithm`.

    Raises:
      ValueError: inner_lr and inner_optimizer both given, learned hyperparameters without
        an inner_optimizer or on a model of several dtypes.
      TypeError: inner_optimizer is not a `hogrod.optim` optimizer, or
        learn_inner_hyperparameters not False, True or a list of names.
      hogrod.checks.ArgumentError: a bad `loss`, `task_map` or `inner_steps`, named.
    """
    rates, opt, variables = _inner("maml", model, inner_lr, inner_optimizer,
                                   learn_inner_hyperparameters)
    return unrolled(model, loss, rates, inner_steps, first_order, task_map, variables, opt,
                    "maml")


@gin.configurable
def fomaml(model: keras.Model, loss: Loss, inner_lr: Optional[Scalar] = None,
           inner_steps: int = 1, task_map: str = "vectorized",
           inner_optimizer: Optional[optim.Optimizer] = None,
           learn_inner_hyperparameters: Union[bool, Sequence[str]] = False) -> Algorithm:
    """First-order MAML: `maml` with the inner gradients treated as constants.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the plain gradient step's rate (None: 0.01), as for `maml`.
      inner_steps: inner steps per task (>= 1).
      task_map: 'vectorized', 'sequential' or 'recomputed', as for `maml`.
      inner_optimizer: instead of inner_lr, a `hogrod.optim` optimizer taking the inner
        steps, as for `maml`.
      learn_inner_hyperparameters: False, True or a list of the optimizer's hyperparameter
        names to meta-train, as for `maml`.

    Returns:
      an `Algorithm`.

    Raises:
      ValueError: as for `maml`.
      TypeError: as for `maml`.
      hogrod.checks.ArgumentError: as for `maml`.
    """
    rates, opt, variables = _inner("fomaml", model, inner_lr, inner_optimizer,
                                   learn_inner_hyperparameters)
    return unrolled(model, loss, rates, inner_steps, True, task_map, variables, opt, "fomaml")
