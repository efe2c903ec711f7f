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
from typing import Any, Callable, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

__all__ = ["ArgumentError", "integer", "number", "positive", "nonnegative", "probability",
           "choice", "seed", "function", "params", "describe"]


class ArgumentError(ValueError, TypeError):
    """A public function was given an argument it cannot use; the message names it."""


def _fail(where: str, arg: str, wanted: str, value: Any) -> None:
    raise ArgumentError(f"{where}: {arg} must be {wanted}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.floating, np.integer)) \
        and not isinstance(value, bool)


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
            dtype = t.dtype.value.dtype if isinstance(t, keras.Variable) else t.dtype
            self.text = f"{tf.as_dtype(dtype).name}{list(t.shape)}"
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
