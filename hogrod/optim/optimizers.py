"""SGD (momentum, Nesterov), Adam, AdamW and RMSProp as pure functions.

Each constructor returns `Optimizer(init, update, name, hyperparameters)`:

- `state = init(params)`: zeros for the moment buffers (one per param, same structure) and
  a step count (an int64 scalar tensor, 0);
- `new_params, new_state = update(grads, state, params)`: one step. `params` and `grads`
  are the same `tf.nest` structure of float tensors (a list, a dict, ...; `tf.Variable`
  leaves are read, never assigned); the results are tensors in `params`' structure.

Formulas (those of Keras 3's `update_step`, keras/src/optimizers/*.py; t = count + 1):

- sgd:     m <- momentum * m - lr * g;  p <- p + m, or with nesterov
           p <- p + momentum * m - lr * g (with the new m). momentum = 0 is plain SGD.
- adam:    m <- m + (g - m)(1 - b1);  v <- v + (g^2 - v)(1 - b2);
           p <- p - lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)   (eps outside).
- adamw:   p <- p - p * weight_decay * lr (decoupled decay, applied first, with the
           undecayed learning rate), then the adam step. Keras 3's default weight_decay is
           0.004.
- rmsprop: v <- rho v + (1 - rho) g^2;  step = lr g / sqrt(v + eps)   (eps inside);
           mom <- momentum * mom + step;  p <- p - mom (centered=False).

The momentum buffers are always kept (also when momentum is 0, where Keras keeps none) so
that the state's structure does not depend on a hyperparameter's value and the update is
differentiable with respect to momentum at 0; the forward values are the same.

Hyperparameters may be Python numbers, tensors or `tf.Variable`s, read at each `update`
(so changing a variable does not retrace a `tf.function`). A Python number is applied at
each leaf's dtype (`tf.constant(x, dtype)`). A tensor must be a scalar of the leaf's dtype
(a cast would round or widen a float32 value silently). Python numbers are range-checked
when the optimizer is built (an error names the hyperparameter); tensors cannot be checked
without running the graph, so they are not.

What equals what: in float64, an update equals these formulas evaluated in numpy float64
with the same Python-number hyperparameters (to about 1e-15 relative; tests/test_optim.py).
Keras 3's optimizers keep their hyperparameters in float32 (the learning rate is a float32
variable, and b1, b2, eps, rho are rounded through float32 even for float64 variables), so
in float64 Keras departs from the same formulas by that rounding: `Adam(1e-3)` with its
default betas moves a float64 weight about 7e-9 away from the formula at the first step,
7e-6 of the step. hogrod equals Keras's update to float64 rounding (1e-12) when every
hyperparameter is a float32 number (2**-7, 0.875, ...), and to float32 rounding in float32.

Zero gradients (higher #125, TorchOpt #26): sqrt has an infinite derivative at 0, so Adam's
sqrt(v) with v = 0 (a zero gradient from a zero state: a dead ReLU, an unused parameter)
makes autodiff multiply 0 by inf, and the first and second derivatives of the update come
out NaN. Adam uses `safe_sqrt`, whose value is tf.sqrt's but whose derivative at 0 is
defined as 0 (the double-`tf.where` trick, so every order of derivative is finite). This is
the right value for the update: near g = 0, v = (1 - b2) g^2 and m/(sqrt(v) + eps) ~
c g / (a|g| + eps), whose exact derivative at 0 is c/eps, which the 0 gives (the term with
d sqrt(v) is multiplied by m = 0 anyway). The second derivative of that function jumps at
g = 0 (from +2ca/eps^2 to -2ca/eps^2); hogrod returns 0, the mean of the two sides.
RMSProp takes sqrt(v + eps) with eps > 0 inside, which is smooth: it needs nothing.
"""

import collections
import math
import numbers
from typing import Any, List, Optional, Sequence, Tuple, Type, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from hogrod import checks, tree
from hogrod.types import Scalar, Tree

# Python control flow here is on Python values only (structure, dtypes, hyperparameter types).
_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["Optimizer", "Logit", "SGDState", "AdamState", "RMSPropState", "sgd", "adam", "adamw",
           "rmsprop", "safe_sqrt"]

Optimizer = collections.namedtuple("Optimizer", ["init", "update", "name", "hyperparameters"],
                                   defaults=(None, None))
Optimizer.__doc__ = """A differentiable optimizer: a pair of pure functions and how it was built.

Attributes:
    init: ``init(params) -> state``, the optimizer's starting state for a tree of float
        params (zero buffers of the params' structure and a step count of 0).
    update: ``update(grads, state, params) -> (new_params, new_state)``, one step; nothing
        is assigned.
    name: the constructor's name ('sgd', 'adam', 'adamw', 'rmsprop'); None (default) for a
        hand-made Optimizer.
    hyperparameters: the arguments it was built with (a dict), which
        `hogrod.optim.learnable` reads to rebuild it with learned hyperparameters; None
        (default) for a hand-made or an already learnable Optimizer.
"""
SGDState = collections.namedtuple("SGDState", ["count", "momentum"])
SGDState.__doc__ = """The state of `sgd`.

Attributes:
    count: the steps taken, an int64 scalar tensor.
    momentum: the momentum buffer m, a tree of the params' structure, shapes and dtypes.
"""
AdamState = collections.namedtuple("AdamState", ["count", "mu", "nu"])
AdamState.__doc__ = """The state of `adam` and `adamw`.

Attributes:
    count: the steps taken, an int64 scalar tensor.
    mu: the first moment m (not bias-corrected), a tree of the params' structure.
    nu: the second moment v (not bias-corrected), a tree of the params' structure.
"""
RMSPropState = collections.namedtuple("RMSPropState", ["count", "nu", "momentum"])
RMSPropState.__doc__ = """The state of `rmsprop`.

Attributes:
    count: the steps taken, an int64 scalar tensor.
    nu: the moving average v of the squared gradients, a tree of the params' structure.
    momentum: the momentum buffer, a tree of the params' structure.
"""


class Logit(collections.namedtuple("Logit", ["logit"])):
    """A hyperparameter in (0, 1) given by its logit v: the value is ``sigmoid(v)``.

    `hogrod.optim.learnable` passes b1, b2, rho and sgd's momentum this way. The optimizers
    take ``1 - value`` as ``sigmoid(-v)`` and ``1 - value^t`` as
    ``-expm1(t log_sigmoid(v))``, never as ``1 - sigmoid(v)``: in float32 ``sigmoid(v)``
    rounds to exactly 1 from ``v ~ 16.6``, and ``1 - b2 = 0`` makes Adam's
    ``sqrt(1 - b2^t)`` have an infinite derivative (a NaN meta-gradient once a learned b2
    drifts towards 1), long before that ``1 - sigmoid(v)`` loses most of its digits. Where
    even ``sigmoid(-v)`` underflows to 0 (``v > ~88`` in float32, ``~710`` in float64) the
    update raises an InvalidArgumentError naming the hyperparameter instead.

    Attributes:
        logit: v, a scalar tensor or variable of the params' dtype (or a Python number).
    """
    __slots__ = ()


#: A hyperparameter: a Python number, a scalar tensor or variable, or a `Logit`.
Hyperparameter = Union[Scalar, tf.Variable, keras.Variable, Logit]


def safe_sqrt(x: tf.Tensor) -> tf.Tensor:
    """``tf.sqrt(x)`` (NaN below 0), with derivative 0 at ``x = 0`` instead of inf, at every order.

    The double `tf.where`: sqrt only ever sees positive inputs (1 where ``x <= 0``), so
    neither its value nor its derivative is non-finite where the outer ``where`` discards
    it.

    Args:
        x: a floating-point tensor (any shape).

    Returns:
        A tensor of x's shape and dtype: ``sqrt(x)`` where ``x > 0``, 0 where ``x = 0``, NaN
        where ``x < 0``.
    """
    positive = x > 0
    root = tf.sqrt(tf.where(positive, x, tf.ones_like(x)))
    other = tf.where(tf.equal(x, 0), tf.zeros_like(x), tf.fill(tf.shape(x),
                                                                tf.constant(np.nan, x.dtype)))
    return tf.where(positive, root, other)


# ---- hyperparameters ----------------------------------------------------------------------

def _is_number(x: Any) -> bool:
    return isinstance(x, (numbers.Real, np.floating, np.integer)) and not isinstance(x, bool)


def _check_hyper(opt: str, name: str, value: Hyperparameter, low: float, high: float,
                 low_open: bool = False, high_open: bool = False) -> None:
    """Range-check a Python-number hyperparameter; tensors, variables and a `Logit` (built
    by `learnable` from a variable) pass unchecked."""
    if isinstance(value, (tf.Tensor, tf.Variable, keras.Variable, Logit)):
        return
    checks.number(value, name, f"hogrod.optim.{opt}", low, high, low_open, high_open)


def _at(value: Hyperparameter, dtype: tf.DType, opt: str, name: str) -> tf.Tensor:
    """The hyperparameter as a scalar tensor of `dtype` (a Python number converts exactly)."""
    if _is_number(value):
        return tf.constant(value, dtype)
    if isinstance(value, Logit):
        return tf.sigmoid(_at(value.logit, dtype, opt, f"{name}'s logit"))
    t = tf.convert_to_tensor(value)
    if t.shape.rank != 0:
        raise ValueError(f"hogrod.optim.{opt}: {name} must be a scalar, got shape {t.shape}")
    if t.dtype != dtype:
        raise TypeError(f"hogrod.optim.{opt}: {name} is a {t.dtype.name} tensor but a "
                        f"parameter is {dtype.name}; pass a Python number or a "
                        f"{dtype.name} tensor")
    return t


def _complements(value: Hyperparameter, dtype: tf.DType, t: tf.Tensor, opt: str,
                 name: str) -> Tuple[tf.Tensor, tf.Tensor]:
    """(1 - b, 1 - b^t) for a hyperparameter b in (0, 1) and a step number t (a tensor of
    `dtype`); exact for a `Logit` (see there), as written otherwise (Keras's arithmetic)."""
    if not isinstance(value, Logit):
        b = _at(value, dtype, opt, name)
        return 1 - b, 1 - tf.pow(b, t)
    v = _at(value.logit, dtype, opt, f"{name}'s logit")
    one_minus = tf.sigmoid(-v)
    check = tf.debugging.assert_positive(
        one_minus, message=f"hogrod.optim.{opt}: the learned {name} = sigmoid(logit) is 1 "
        f"to {dtype.name} precision (1 - {name} underflows to 0: the update's derivative "
        f"would be NaN); its logit has drifted too far: lower the outer learning rate or "
        f"leave {name} out of hogrod.optim.learnable's names")
    with tf.control_dependencies([check]):
        return tf.identity(one_minus), -tf.math.expm1(t * tf.math.log_sigmoid(v))


# ---- structure ----------------------------------------------------------------------------

def _float_leaves(params: Tree, opt: str, fn: str) -> List[tf.Tensor]:
    return tree.leaves(params, "params", f"hogrod.optim.{opt}.{fn}", floating=True)


def _zeros(params: Tree, opt: str) -> Tree:
    return tf.nest.pack_sequence_as(params, [tf.zeros_like(p)
                                             for p in _float_leaves(params, opt, "init")])


def _count0() -> tf.Tensor:
    return tf.zeros([], tf.int64)


def _check_update(opt: str, state_type: Type[tuple], grads: Tree, state: tuple, params: Tree,
                  buffers: Sequence[str]) -> Tuple[List[tf.Tensor], List[tf.Tensor], tf.Tensor,
                                                   List[List[tf.Tensor]]]:
    """Leaves of params, grads and each state buffer, after checking they all match."""
    p = _float_leaves(params, opt, "update")
    try:
        tree.check_same(grads, params, "grads", "params")
    except (ValueError, TypeError) as e:
        raise type(e)(f"hogrod.optim.{opt}.update: {e}") from None
    if not isinstance(state, state_type):
        raise TypeError(f"hogrod.optim.{opt}.update: state must be the {state_type.__name__} "
                        f"that {opt}(...).init returns, got {type(state).__name__}")
    count = tf.convert_to_tensor(state.count)
    if count.dtype != tf.int64 or count.shape.rank != 0:
        raise TypeError(f"hogrod.optim.{opt}.update: state.count must be an int64 scalar, "
                        f"got {count.dtype.name} of shape {count.shape}")
    out = []
    for name in buffers:
        try:
            tree.check_same(getattr(state, name), params, f"state.{name}", "params")
        except (ValueError, TypeError) as e:
            raise type(e)(f"hogrod.optim.{opt}.update: {e}") from None
        out.append([tf.convert_to_tensor(b) for b in tf.nest.flatten(getattr(state, name))])
    g = [tf.convert_to_tensor(x) for x in tf.nest.flatten(grads)]
    return p, g, count, out


def _pack(params: Tree, leaves: List[tf.Tensor]) -> Tree:
    return tf.nest.pack_sequence_as(params, leaves)


# ---- optimizers ---------------------------------------------------------------------------

@gin.configurable(module="hogrod.optim")
def sgd(learning_rate: Hyperparameter, momentum: Hyperparameter = 0.0,
        nesterov: bool = False) -> Optimizer:
    """Stochastic gradient descent with (Nesterov) momentum, as `keras.optimizers.SGD`.

    ``m <- momentum * m - lr * g; p <- p + m``, or with `nesterov`
    ``p <- p + momentum * m - lr * g`` (with the new m). Its state is an `SGDState`.

    Args:
        learning_rate: the step size, >= 0: a Python number (range-checked, applied at the
            params' dtype) or a scalar tensor / variable of the params' dtype (unchecked).
        momentum: in [0, 1], as `learning_rate`; default 0 (plain SGD; the buffer is kept).
        nesterov: a Python bool: Nesterov momentum; default False.

    Returns:
        The `Optimizer` ``(init, update, "sgd", hyperparameters)``.

    Raises:
        ArgumentError: a Python-number hyperparameter is out of range, or `nesterov` is not
            a bool.
    """
    _check_hyper("sgd", "learning_rate", learning_rate, 0.0, math.inf)
    _check_hyper("sgd", "momentum", momentum, 0.0, 1.0)
    if not isinstance(nesterov, (bool, np.bool_)):
        raise checks.ArgumentError(f"hogrod.optim.sgd: nesterov must be a Python bool, got "
                                   f"{nesterov!r}")

    def init(params):
        return SGDState(_count0(), _zeros(params, "sgd"))

    @_no_autograph
    def update(grads, state, params):
        p, g, count, (m,) = _check_update("sgd", SGDState, grads, state, params,
                                          ["momentum"])
        new_p, new_m = [], []
        for pi, gi, mi in zip(p, g, m):
            lr = _at(learning_rate, pi.dtype, "sgd", "learning_rate")
            mu = _at(momentum, pi.dtype, "sgd", "momentum")
            mi = mi * mu - gi * lr
            new_m.append(mi)
            new_p.append(pi + (mi * mu - gi * lr if nesterov else mi))
        return _pack(params, new_p), SGDState(count + 1, _pack(params, new_m))

    return Optimizer(init, update, "sgd", dict(learning_rate=learning_rate, momentum=momentum,
                                               nesterov=nesterov))


def _adam_like(opt: str, learning_rate: Hyperparameter, b1: Hyperparameter,
               b2: Hyperparameter, eps: Hyperparameter,
               weight_decay: Optional[Hyperparameter]) -> Optimizer:
    _check_hyper(opt, "learning_rate", learning_rate, 0.0, math.inf)
    _check_hyper(opt, "b1", b1, 0.0, 1.0, high_open=True)
    _check_hyper(opt, "b2", b2, 0.0, 1.0, high_open=True)
    _check_hyper(opt, "eps", eps, 0.0, math.inf, low_open=True)
    if weight_decay is not None:
        _check_hyper(opt, "weight_decay", weight_decay, 0.0, math.inf)

    def init(params):
        return AdamState(_count0(), _zeros(params, opt), _zeros(params, opt))

    @_no_autograph
    def update(grads, state, params):
        p, g, count, (m, v) = _check_update(opt, AdamState, grads, state, params,
                                            ["mu", "nu"])
        new_p, new_m, new_v = [], [], []
        for pi, gi, mi, vi in zip(p, g, m, v):
            dtype = pi.dtype
            lr = _at(learning_rate, dtype, opt, "learning_rate")
            epsilon = _at(eps, dtype, opt, "eps")
            t = tf.cast(count + 1, dtype)
            one_minus_b1, one_minus_b1_t = _complements(b1, dtype, t, opt, "b1")
            one_minus_b2, one_minus_b2_t = _complements(b2, dtype, t, opt, "b2")
            if weight_decay is not None:
                pi = pi - pi * _at(weight_decay, dtype, opt, "weight_decay") * lr
            alpha = lr * tf.sqrt(one_minus_b2_t) / one_minus_b1_t
            mi = mi + (gi - mi) * one_minus_b1
            vi = vi + (tf.square(gi) - vi) * one_minus_b2
            new_m.append(mi)
            new_v.append(vi)
            new_p.append(pi - (mi * alpha) / (safe_sqrt(vi) + epsilon))
        return _pack(params, new_p), AdamState(count + 1, _pack(params, new_m),
                                               _pack(params, new_v))

    hyper = dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps)
    if weight_decay is not None:
        hyper["weight_decay"] = weight_decay
    return Optimizer(init, update, opt, hyper)


@gin.configurable(module="hogrod.optim")
def adam(learning_rate: Hyperparameter, b1: Hyperparameter = 0.9, b2: Hyperparameter = 0.999,
         eps: Hyperparameter = 1e-7) -> Optimizer:
    """Adam, as `keras.optimizers.Adam` (amsgrad=False).

    eps outside the sqrt, bias correction folded into the step size:
    ``p <- p - lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``. The sqrt is
    `safe_sqrt`, so a zero gradient gives finite derivatives of every order. Its state is
    an `AdamState`. Each hyperparameter is a Python number (range-checked when built,
    applied at the params' dtype), a scalar tensor / variable of the params' dtype
    (unchecked), or a `Logit` (b1, b2).

    Args:
        learning_rate: the step size, >= 0.
        b1: the first moment's decay, in [0, 1) (b = 1 would divide by ``1 - b^t = 0``);
            default 0.9.
        b2: the second moment's decay, in [0, 1); default 0.999.
        eps: > 0 (0 divides 0 by 0 at a zero gradient); default 1e-7, Keras's.

    Returns:
        The `Optimizer` ``(init, update, "adam", hyperparameters)``.

    Raises:
        ArgumentError: a Python-number hyperparameter is out of range.
    """
    return _adam_like("adam", learning_rate, b1, b2, eps, None)


@gin.configurable(module="hogrod.optim")
def adamw(learning_rate: Hyperparameter, b1: Hyperparameter = 0.9, b2: Hyperparameter = 0.999,
          eps: Hyperparameter = 1e-7, weight_decay: Hyperparameter = 0.004) -> Optimizer:
    """AdamW, as `keras.optimizers.AdamW`.

    ``p <- p - p * weight_decay * learning_rate``, then the Adam step (decoupled weight
    decay, scaled by the learning rate as Keras does). Hyperparameters as in `adam`; its
    state is an `AdamState`.

    Args:
        learning_rate: the step size, >= 0.
        b1: the first moment's decay, in [0, 1); default 0.9.
        b2: the second moment's decay, in [0, 1); default 0.999.
        eps: > 0; default 1e-7.
        weight_decay: >= 0; default 0.004, Keras 3's.

    Returns:
        The `Optimizer` ``(init, update, "adamw", hyperparameters)``.

    Raises:
        ArgumentError: a Python-number hyperparameter is out of range.
    """
    return _adam_like("adamw", learning_rate, b1, b2, eps, weight_decay)


@gin.configurable(module="hogrod.optim")
def rmsprop(learning_rate: Hyperparameter, rho: Hyperparameter = 0.9,
            momentum: Hyperparameter = 0.0, eps: Hyperparameter = 1e-7) -> Optimizer:
    """RMSProp, as `keras.optimizers.RMSprop` with centered=False.

    eps inside the sqrt, no bias correction:
    ``v <- rho v + (1 - rho) g^2; mom <- momentum * mom + lr g / sqrt(v + eps);
    p <- p - mom``. Hyperparameters as in `adam`; its state is an `RMSPropState`.

    Args:
        learning_rate: the step size, >= 0.
        rho: the decay of the squared-gradient average, in [0, 1]; default 0.9.
        momentum: >= 0; default 0 (the buffer is kept).
        eps: > 0 (it keeps ``sqrt(v + eps)`` away from 0, so derivatives are finite
            everywhere); default 1e-7.

    Returns:
        The `Optimizer` ``(init, update, "rmsprop", hyperparameters)``.

    Raises:
        ArgumentError: a Python-number hyperparameter is out of range.
    """
    _check_hyper("rmsprop", "learning_rate", learning_rate, 0.0, math.inf)
    _check_hyper("rmsprop", "rho", rho, 0.0, 1.0)
    _check_hyper("rmsprop", "momentum", momentum, 0.0, math.inf)
    _check_hyper("rmsprop", "eps", eps, 0.0, math.inf, low_open=True)

    def init(params):
        return RMSPropState(_count0(), _zeros(params, "rmsprop"), _zeros(params, "rmsprop"))

    @_no_autograph
    def update(grads, state, params):
        p, g, count, (v, mom) = _check_update("rmsprop", RMSPropState, grads, state, params,
                                              ["nu", "momentum"])
        new_p, new_v, new_mom = [], [], []
        for pi, gi, vi, ki in zip(p, g, v, mom):
            dtype = pi.dtype
            lr = _at(learning_rate, dtype, "rmsprop", "learning_rate")
            r = _at(rho, dtype, "rmsprop", "rho")
            one_minus_r, _ = _complements(rho, dtype, tf.ones([], dtype), "rmsprop", "rho")
            mu = _at(momentum, dtype, "rmsprop", "momentum")
            epsilon = _at(eps, dtype, "rmsprop", "eps")
            vi = r * vi + one_minus_r * tf.square(gi)
            step = (lr * gi) / tf.sqrt(vi + epsilon)
            ki = mu * ki + step
            new_v.append(vi)
            new_mom.append(ki)
            new_p.append(pi - ki)
        return _pack(params, new_p), RMSPropState(count + 1, _pack(params, new_v),
                                                  _pack(params, new_mom))

    return Optimizer(init, update, "rmsprop", dict(learning_rate=learning_rate, rho=rho,
                                                   momentum=momentum, eps=eps))
