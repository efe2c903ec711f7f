"""Argument checks shared by every family, written once so every message has one form.

Each check takes the value, the argument's name as the user wrote it (`arg`: a keyword, a
gin binding such as `pinn_experiment.adam_steps`, or a path such as `params[2]`) and the
public function it guards (`where`), and returns the value normalized (a Python int or
float, a list) or raises `ArgumentError`, whose message is
`"{where}: {arg} must be ..., got {value!r}"`.

`ArgumentError` is both a `ValueError` and a `TypeError`: a string where a number belongs is
a wrong type, a negative count a wrong value, and a caller (the harness, a test) catches
either without knowing which one a check chose. Checks run on Python values when a
function is called or traced, so a compiled caller pays nothing for them.
"""

import math
import numbers
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

__all__ = ["ArgumentError", "boolean", "integer", "number", "positive", "nonnegative", "probability",
           "choice", "seed", "stateless_seed", "function", "params", "describe", "require",
           "floating", "like", "mask_of", "counts"]


class ArgumentError(ValueError, TypeError):
    """A public function was given an argument it cannot use; the message names it."""


def _fail(where: str, arg: str, wanted: str, value: Any) -> None:
    raise ArgumentError(f"{where}: {arg} must be {wanted}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.floating, np.integer)) \
        and not isinstance(value, bool)


def boolean(value: Any, arg: str, where: str) -> bool:
    """A Python or numpy bool, as a Python bool.

    Args:
        value: the value given; integers (0, 1), strings ("False" would be true), None and
            tensors are refused.
        arg: the argument's name in the message.
        where: the public function (or binding) checked, first in the message.

    Returns:
        `bool(value)`.

    Raises:
        ArgumentError: `value` is not a bool.
    """
    if not isinstance(value, (bool, np.bool_)):
        _fail(where, arg, "True or False", value)
    return bool(value)


def integer(value: Any, arg: str, where: str, least: int = 0,
            most: Optional[int] = None) -> int:
    """A Python or numpy integer in [least, most] (bools refused), as a Python int.

    Args:
        value: the value given.
        arg: the argument's name in the message.
        where: the public function (or binding) checked, first in the message.
        least: the smallest allowed value (inclusive); default 0.
        most: the largest allowed value (inclusive), or None (default) for no upper bound.

    Returns:
        `int(value)`.

    Raises:
        ArgumentError: `value` is not an integer in range (a float such as 20.5, a bool or
            the string "20" too).
    """
    wanted = f"an integer >= {least}" + ("" if most is None else f" and <= {most}")
    if not _is_int(value) or value < least or (most is not None and value > most):
        _fail(where, arg, wanted, value)
    return int(value)


def number(value: Any, arg: str, where: str, low: float = -math.inf, high: float = math.inf,
           low_open: bool = False, high_open: bool = False) -> float:
    """A finite real Python or numpy number in the interval given, as a Python float.

    Args:
        value: the value given; bools, strings, tensors, NaN and infinities are refused.
        arg: the argument's name in the message.
        where: the public function checked.
        low: the interval's lower end; default minus infinity (no bound).
        high: the interval's upper end; default infinity (no bound).
        low_open: whether `low` itself is excluded; default False (closed).
        high_open: whether `high` itself is excluded; default False (closed).

    Returns:
        `float(value)`.

    Raises:
        ArgumentError: `value` is not a finite real number in the interval.
    """
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if not _is_real(value) or not math.isfinite(value):
        _fail(where, arg, f"a finite number in {interval}", value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        _fail(where, arg, f"a finite number in {interval}", value)
    return float(value)


def positive(value: Any, arg: str, where: str) -> float:
    """A finite number > 0, as a Python float (see `number`).

    Args:
        value: the value given: a Python or numpy real number (bools refused).
        arg: the argument's name in the message.
        where: the public function checked.

    Returns:
        `float(value)`.

    Raises:
        ArgumentError: `value` is not a finite real number, or is <= 0.
    """
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        _fail(where, arg, "a positive finite number", value)
    return float(value)


def nonnegative(value: Any, arg: str, where: str) -> float:
    """A finite number >= 0, as a Python float (see `number`).

    Args:
        value: the value given: a Python or numpy real number (bools refused).
        arg: the argument's name in the message.
        where: the public function checked.

    Returns:
        `float(value)`.

    Raises:
        ArgumentError: `value` is not a finite real number, or is < 0.
    """
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        _fail(where, arg, "a finite number >= 0", value)
    return float(value)


def probability(value: Any, arg: str, where: str, open_ends: bool = False) -> float:
    """A number in [0, 1] ((0, 1) with `open_ends`), as a Python float (see `number`).

    Args:
        value: the value given: a Python or numpy real number (bools refused).
        arg: the argument's name in the message.
        where: the public function checked.
        open_ends: whether 0 and 1 themselves are excluded; default False ([0, 1]).

    Returns:
        `float(value)`.

    Raises:
        ArgumentError: `value` is not a finite real number in the interval.
    """
    return number(value, arg, where, 0.0, 1.0, low_open=open_ends, high_open=open_ends)


def choice(value: Any, allowed: Sequence[str], arg: str, where: str) -> str:
    """One of the strings in `allowed`, returned unchanged.

    Args:
        value: the value given; anything but a string is refused.
        allowed: the accepted strings (listed, as a tuple, in the message).
        arg: the argument's name in the message.
        where: the public function checked.

    Returns:
        `value`.

    Raises:
        ArgumentError: `value` is not a string among `allowed`.
    """
    if not isinstance(value, str) or value not in allowed:
        _fail(where, arg, f"one of {tuple(allowed)}", value)
    return value


def seed(value: Any, arg: str, where: str) -> int:
    """An integer random seed (>= 0), as a Python int (see `integer`).

    Args:
        value: the value given: a Python or numpy integer (bools refused).
        arg: the argument's name in the message.
        where: the public function checked.

    Returns:
        `int(value)`.

    Raises:
        ArgumentError: `value` is not an integer >= 0.
    """
    return integer(value, arg, where, least=0)


def stateless_seed(value: Any, arg: str, where: str) -> tf.Tensor:
    """A stateless random seed: an int (>= 0) becomes ``[value, 0]``; a `[2]` integer tensor
    (or array, or a pair such as ``[seed, i]``) is kept; both as int64.

    Args:
        value: an int >= 0, or a `[2]` integer tensor, variable, numpy array, list or tuple.
        arg: the argument's name in the message.
        where: the public function checked.

    Returns:
        A `[2]` int64 tensor.

    Raises:
        ArgumentError: anything else (a negative int, a float, a bool, a tensor of another
            shape or dtype).
    """
    if isinstance(value, (list, tuple)):
        try:
            value = tf.convert_to_tensor(value)
        except (TypeError, ValueError):
            _fail(where, arg, "an int >= 0 or a [2] integer tensor", value)
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        s = tf.convert_to_tensor(value)
        if not s.dtype.is_integer or not s.shape.is_compatible_with([2]):
            _fail(where, arg, "an int >= 0 or a [2] integer tensor", describe(s))
        return tf.cast(s, tf.int64)
    return tf.constant([seed(value, arg, where), 0], tf.int64)


def function(value: Any, arg: str, where: str, form: str) -> Callable:
    """A callable, returned unchanged.

    Args:
        value: the value given.
        arg: the argument's name in the message.
        where: the public function checked.
        form: what the callable must compute, shown in the message (e.g.
            ``"objective(batch) -> scalar"``).

    Returns:
        `value`.

    Raises:
        ArgumentError: `value` is not callable.
    """
    if not callable(value):
        _fail(where, arg, f"a callable {form}", value)
    return value


class _Leaf:
    """Stands for a tensor in a message: its dtype and shape, never its values (a model's
    variables would fill the screen)."""

    def __init__(self, t: Any) -> None:
        if isinstance(t, (tf.Tensor, tf.Variable, keras.Variable, np.ndarray, np.generic)):
            # a Keras 3 variable's dtype is a string ("float32"), tf.as_dtype reads it too
            self.text = f"{tf.as_dtype(t.dtype).name}{list(t.shape)}"
        else:
            self.text = type(t).__name__

    def __repr__(self) -> str:
        return self.text


def describe(structure: Any) -> str:
    """A nested structure as its leaves' dtypes and shapes, for error messages.

    Tensors, variables (Keras's too) and numpy arrays show as their dtype and shape, never
    their values; any other leaf shows as its type's name.

    Args:
        structure: any nest (`tf.nest`) of tensors, variables, arrays or other objects.

    Returns:
        A string such as ``[float32[3, 2], float32[2]]``.
    """
    return repr(tf.nest.map_structure(_Leaf, structure))


def _leaf_name(p: Any, index: int, arg: str) -> str:
    path = getattr(p, "path", None) or getattr(p, "name", None)
    try:
        return f"{path} ({arg}[{index}])" if path else f"{arg}[{index}]"
    except Exception:  # symbolic tensors in graph mode have no usable name
        return f"{arg}[{index}]"


def params(value: Any, where: str, arg: str = "params") -> List[Any]:
    """The flat list of a nest of differentiable variables or tensors.

    What can be differentiated with respect to: every leaf a `tf.Variable`, a Keras 3
    variable or a tensor, of a floating or complex dtype.

    Args:
        value: a nest (`tf.nest`) of TensorFlow variables, Keras 3 variables or tensors.
        where: the public function checked.
        arg: the argument's name in the message; default ``"params"``.

    Returns:
        `tf.nest.flatten(value)`, a list of the leaves in `tf.nest` order.

    Raises:
        ArgumentError: the nest is empty, holds something else (a numpy array, a number), or
            a leaf of an integer or boolean dtype.
    """
    flat = tf.nest.flatten(value)
    if not flat:
        raise ArgumentError(f"{where}: {arg} is empty ({value!r}); pass the variables or "
                            "tensors to differentiate with respect to")
    for i, p in enumerate(flat):
        if not isinstance(p, (tf.Tensor, tf.Variable, keras.Variable)):
            raise ArgumentError(
                f"{where}: {arg}[{i}] must be a tf.Variable, a Keras variable or a tensor, got "
                f"{type(p).__name__} (convert it with tf.constant(x, dtype) first)")
        dtype = tf.as_dtype(p.value.dtype if isinstance(p, keras.Variable) else p.dtype)
        if not (dtype.is_floating or dtype.is_complex):
            raise ArgumentError(f"{where}: {_leaf_name(p, i, arg)} has dtype {dtype.name}; "
                                "only floating-point (or complex) values can be "
                                "differentiated")
    return flat


# ---- tensor checks: raise eagerly, assert in a graph -------------------------------------


def require(ok: Union[bool, tf.Tensor, Callable[..., tf.Tensor]], message: str,
            *inputs: Any, error: type = ArgumentError, data: Sequence[Any] = ()) -> List[Any]:
    """An error with `message` unless a condition holds: raised eagerly, asserted in a graph.

    `ok` is a boolean (any shape: all of it must hold), or a function of `inputs` giving
    one. Given a function and inputs whose values are known when the graph is built
    (constants: Python numbers, numpy arrays, `tf.constant`s), the condition is evaluated
    on those values at once, so a bad constant raises when a function is traced, compiled
    with XLA or not. Otherwise, in a graph, the check is a `tf.debugging.Assert` that fails
    when the graph runs; XLA (`jit_compile=True`) drops assertions.

    Args:
        ok: a boolean tensor or Python bool, or a function of `inputs` returning one.
        message: the error message.
        *inputs: the tensors `ok` is a function of (only with a function).
        error: the exception raised eagerly; default `ArgumentError` (a solver that did not
            converge raises ValueError or FloatingPointError).
        data: tensors printed after the message by a failing graph assertion.

    Returns:
        ``[]`` eagerly or for constants; in a graph a list of one assertion, for a control
        dependency of the result (so an op that follows cannot fail first with another
        message).

    Raises:
        ArgumentError: (or `error`) eagerly, or at tracing for constant inputs, where the
            condition is False.
    """
    if callable(ok):
        static = [tf.get_static_value(x) for x in inputs]
        if all(v is not None for v in static):
            with tf.init_scope():  # evaluated eagerly, also while a graph is traced
                ok = ok(*[tf.constant(v) for v in static])
            if not bool(np.all(np.asarray(ok))):
                raise error(message)
            return []
        ok = ok(*inputs)
    if isinstance(ok, (bool, np.bool_)) or tf.executing_eagerly():
        if not bool(np.all(np.asarray(ok))):
            raise error(message)
        return []
    return [tf.debugging.Assert(tf.reduce_all(ok), [message, *data])]


def floating(x: Any, arg: str, where: str) -> tf.Tensor:
    """`x` as a tensor of a floating dtype (Python numbers read in float64, never float32).

    Args:
        x: a tensor, variable, array or nested list of Python numbers.
        arg: the argument's name in the message.
        where: the public function checked.

    Returns:
        The tensor.

    Raises:
        ArgumentError: `x` is not convertible or not floating.
    """
    if isinstance(x, (list, tuple, float)):
        x = np.asarray(x)
    try:
        t = tf.convert_to_tensor(x)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"{where}: {arg} must be a floating tensor, got "
                            f"{type(x).__name__} ({e})") from None
    if not t.dtype.is_floating:
        raise ArgumentError(f"{where}: {arg} must have a floating dtype, got {t.dtype.name}")
    return t


def like(x: Any, arg: str, where: str, ref: tf.Tensor, ref_arg: str,
         rank: Optional[int] = None) -> tf.Tensor:
    """`x` as a floating tensor of `ref`'s dtype and shape.

    Dtypes, ranks and the dimensions known when the graph is built are checked in Python;
    dimensions known only when the graph runs by an assertion (which XLA drops).

    Args:
        x: a tensor, variable or array.
        arg: the argument's name in the message.
        where: the public function checked.
        ref: the tensor `x` must match.
        ref_arg: `ref`'s name in the message.
        rank: if given, the rank `ref` must have (checked on `ref` too).

    Returns:
        The tensor.

    Raises:
        ArgumentError: a dtype or (static) shape differs, or the rank is wrong.
    """
    t = floating(x, arg, where)
    if rank is not None:
        for name, v in ((ref_arg, ref), (arg, t)):
            if v.shape.rank is not None and v.shape.rank != rank:
                raise ArgumentError(f"{where}: {name} must have rank {rank} ([batch, T]), got "
                                    f"shape {v.shape.as_list()}")
    if t.dtype != ref.dtype:
        raise ArgumentError(f"{where}: {arg} has dtype {t.dtype.name} but {ref_arg} has "
                            f"{ref.dtype.name}; they must be equal")
    if not t.shape.is_compatible_with(ref.shape):
        raise ArgumentError(f"{where}: {arg} has shape {t.shape.as_list()} but {ref_arg} has "
                            f"{ref.shape.as_list()}; they must be equal")
    if not (t.shape.is_fully_defined() and ref.shape.is_fully_defined()):
        tf.debugging.assert_equal(tf.shape(t), tf.shape(ref),
                                  message=f"{where}: {arg} and {ref_arg} differ in shape")
    return t


def mask_of(mask: Any, where: str, ref: tf.Tensor, ref_arg: str) -> Optional[tf.Tensor]:
    """An episode mask checked: `ref`'s dtype and shape `[batch, T]`, every entry 0 or 1,
    non-increasing along time (1 before an episode ends, 0 after).

    Args:
        mask: the `[batch, T]` mask, or None.
        where: the public function checked.
        ref: the `[batch, T]` tensor the mask belongs to.
        ref_arg: `ref`'s name in the message.

    Returns:
        The mask tensor, or None.

    Raises:
        ArgumentError: a dtype, shape or (eagerly, or for constants) value is wrong.
    """
    if mask is None:
        return None
    m = like(mask, "mask", where, ref, ref_arg, rank=2)
    require(lambda m: tf.reduce_all((m == 0) | (m == 1)),
            f"{where}: mask must hold only 0 and 1 (1 before an episode ends, 0 after)", m)
    require(lambda m: tf.reduce_all(m[:, 1:] <= m[:, :-1]),
            f"{where}: mask must not increase along time (1 before an episode ends, 0 after; "
            "an episode cannot restart)", m)
    return m


def counts(value: Any, arg: str, where: str) -> Tuple[int, ...]:
    """A non-empty sequence of integers >= 0 (the inner-step counts an evaluation reports
    after), as a tuple of Python ints in the order given.

    Args:
        value: the value given, any iterable (a string or a lone int is refused).
        arg: the argument's name in the message.
        where: the public function (or binding) checked, first in the message.

    Returns:
        `tuple(int(v) for v in value)`.

    Raises:
        ArgumentError: `value` is not a sequence, is empty, or holds anything but integers
            >= 0 (the message names the entry, e.g. ``steps[1]``).
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        _fail(where, arg, "a non-empty sequence of integers >= 0, e.g. (0, 1, 10)", value)
    value = tuple(value)
    if not value:
        raise ArgumentError(f"{where}: {arg} is empty; give the counts to report, e.g. "
                            "(0, 1, 10)")
    return tuple(integer(v, f"{arg}[{i}]", where) for i, v in enumerate(value))
