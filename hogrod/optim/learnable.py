"""Optimizer hyperparameters as trainable variables (learned inner optimizers in
meta-learning).

`opt, variables = learnable(adam(0.01), tf.float32)` returns an optimizer whose
hyperparameters are functions of `variables`, in a parametrization whose every real value
is a valid hyperparameter, so a gradient step can never leave the valid range:

- learning_rate, eps, weight_decay, rmsprop's momentum (> 0): value = exp(v), v = log value;
- b1, b2, rho, sgd's momentum (in (0, 1)): value = sigmoid(v), v = logit value, passed
  to the optimizer as `optimizers.Logit(v)` so that 1 - value is sigmoid(-v), exact in
  float32 where 1 - sigmoid(v) rounds to 0 (a learned b2 drifting to 1 made MAML's
  meta-gradient NaN; see `optimizers.Logit`). A logit so large that even sigmoid(-v)
  underflows is an error naming the hyperparameter, not a NaN.

The values are recomputed from the variables at every `update`, under the caller's tape, so
an outer tape differentiates the updated params with respect to `variables` (and a changed
variable does not retrace a tf.function). The starting values are the optimizer's own; one
at the boundary of its range (a momentum of 0) has no finite parameter and is refused.
"""

import math
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.optim import optimizers
from hogrod.types import DType

__all__ = ["learnable", "LEARNED_BY_DEFAULT"]

# what `learnable` learns when `names` is None (eps is left out: it guards a division)
LEARNED_BY_DEFAULT = {
    "sgd": ("learning_rate", "momentum"),
    "adam": ("learning_rate", "b1", "b2"),
    "adamw": ("learning_rate", "b1", "b2", "weight_decay"),
    "rmsprop": ("learning_rate", "rho", "momentum"),
}

_UNIT_INTERVAL = {("sgd", "momentum"), ("adam", "b1"), ("adam", "b2"), ("adamw", "b1"),
                  ("adamw", "b2"), ("rmsprop", "rho")}


def _parametrization(opt: str, name: str) -> Tuple[str, Callable, Callable]:
    """(prefix, to_variable, from_variable) for one hyperparameter."""
    if (opt, name) in _UNIT_INTERVAL:
        # the optimizer takes the logit itself, so 1 - b is sigmoid(-v), never 1 - sigmoid(v)
        return ("logit", lambda x: math.log(x) - math.log1p(-x), optimizers.Logit)
    return ("log", math.log, tf.exp)


def _check_start(opt: str, name: str, value: object) -> float:
    where = f"hogrod.optim.learnable: {opt}'s {name}"
    if isinstance(value, (tf.Tensor, tf.Variable)) or not np.isscalar(value) or isinstance(
            value, (bool, str, bytes)):
        raise checks.ArgumentError(
            f"{where} is {value!r}; only a Python number can be made learnable (a tensor or "
            "tf.Variable hyperparameter is already yours to train)")
    v = checks.number(value, name, f"hogrod.optim.learnable ({opt})")
    unit = (opt, name) in _UNIT_INTERVAL
    if v <= 0 or (unit and v >= 1):
        rng = "(0, 1)" if unit else "(0, inf)"
        raise checks.ArgumentError(f"{where} starts at {value!r}, on the boundary of its "
                         f"parametrization; start it in {rng} or leave it out of `names` "
                         f"(the default names for {opt}: {LEARNED_BY_DEFAULT[opt]})")
    return v


def learnable(optimizer: optimizers.Optimizer, dtype: DType,
              names: Optional[Sequence[str]] = None, prefix: str = "inner") -> Tuple[optimizers.Optimizer, List[tf.Variable]]:
    """`optimizer` rebuilt with some hyperparameters computed from new trainable variables.

    Each hyperparameter in `names` becomes a function of a new scalar `tf.Variable` of
    `dtype` (the params' dtype), in a parametrization whose every real value is valid:
    learning_rate, eps, weight_decay and rmsprop's momentum (> 0) as ``exp(v)``; b1, b2,
    rho and sgd's momentum (in (0, 1)) as ``sigmoid(v)``, passed as a `Logit`. The values
    are recomputed from the variables at every `update`, under the caller's tape.

    Args:
        optimizer: a `hogrod.optim` optimizer (``adam(0.01)``,
            ``sgd(0.1, momentum=0.9)``, ...), not already learnable; the hyperparameters to
            learn must be Python numbers strictly inside their range.
        dtype: the floating dtype of the params it will update (and of the variables).
        names: the hyperparameters to learn; None (default) means
            ``LEARNED_BY_DEFAULT[optimizer.name]``.
        prefix: the variables are named ``{prefix}_{log|logit}_{name}``; default "inner".

    Returns:
        A tuple ``(optimizer, variables)``: the rebuilt `Optimizer` (its
        ``hyperparameters`` None) and the new variables, in `names` order.

    Raises:
        TypeError: `optimizer` is not a `hogrod.optim` optimizer or is already learnable,
            or `dtype` is not floating.
        ValueError: `names` is empty or names a hyperparameter the optimizer does not
            have (or `nesterov`).
        ArgumentError: a hyperparameter to learn is not a Python number, or starts on the
            boundary of its range (a momentum of 0).
    """
    if not isinstance(optimizer, optimizers.Optimizer) or optimizer.hyperparameters is None:
        raise TypeError("hogrod.optim.learnable: optimizer must be built by hogrod.optim "
                        f"(sgd/adam/adamw/rmsprop(...)) and not already learnable, got {optimizer!r}")
    dtype = tf.as_dtype(dtype)
    if not dtype.is_floating:
        raise TypeError(f"hogrod.optim.learnable: dtype must be floating, got {dtype.name}")
    opt, hyper = optimizer.name, dict(optimizer.hyperparameters)
    names = LEARNED_BY_DEFAULT[opt] if names is None else tuple(names)
    if not names:
        raise ValueError("hogrod.optim.learnable: names is empty; nothing would be learned")
    variables, transforms = [], {}
    for name in names:
        if name not in hyper or name == "nesterov":
            learnable_names = sorted(k for k in hyper if k != "nesterov")
            raise ValueError(f"hogrod.optim.learnable: {opt} has no learnable hyperparameter "
                             f"{name!r}; it has {learnable_names}")
        kind, to_var, from_var = _parametrization(opt, name)
        start = to_var(_check_start(opt, name, hyper[name]))
        var = tf.Variable(np.asarray(start, dtype.as_numpy_dtype), name=f"{prefix}_{kind}_{name}")
        variables.append(var)
        transforms[name] = (var, from_var)
    constructor = getattr(optimizers, opt)

    def build():
        kwargs = dict(hyper)
        kwargs.update({n: f(tf.convert_to_tensor(v)) for n, (v, f) in transforms.items()})
        return constructor(**kwargs)

    def update(grads, state, params):
        # rebuilt per call: the hyperparameters are read from the variables under the
        # caller's tape (building only closes over them; it traces nothing)
        return build().update(grads, state, params)

    # no hyperparameters: they are the variables now (learnable again would drop them)
    return optimizers.Optimizer(optimizer.init, update, opt, None), variables
