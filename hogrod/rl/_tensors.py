"""Checks of the `[batch, T]` tensors the estimators and returns take, written once for the
package: each error names the public function and the argument."""

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.types import DType, TensorLike


def floating(x: TensorLike, arg: str, where: str) -> tf.Tensor:
    """`x` as a tensor of a floating dtype.

    Args:
      x: a tensor, variable, array or nested list of Python numbers (read in float64).
      arg: the argument's name in the message.
      where: the public function checked.

    Returns:
      The tensor.

    Raises:
      ArgumentError: `x` is not convertible or not floating.
    """
    if isinstance(x, (list, tuple, float)):  # Python numbers in float64, never via float32
        x = np.asarray(x)
    try:
        t = tf.convert_to_tensor(x)
    except (TypeError, ValueError) as e:
        raise checks.ArgumentError(f"{where}: {arg} must be a floating tensor, got "
                                   f"{type(x).__name__} ({e})") from None
    if not t.dtype.is_floating:
        raise checks.ArgumentError(f"{where}: {arg} must have a floating dtype, got "
                                   f"{t.dtype.name}")
    return t


def like(x: TensorLike, arg: str, where: str, ref: tf.Tensor, ref_arg: str,
         rank: Optional[int] = None) -> tf.Tensor:
    """`x` as a floating tensor of `ref`'s dtype and shape.

    Dtypes, ranks and the dimensions known when the graph is built are checked in Python;
    dimensions known only when the graph runs by a `tf.debugging.Assert`, which XLA
    (`jit_compile=True`) drops.

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
                raise checks.ArgumentError(
                    f"{where}: {name} must have rank {rank} ([batch, T]), got shape "
                    f"{v.shape.as_list()}")
    if t.dtype != ref.dtype:
        raise checks.ArgumentError(f"{where}: {arg} has dtype {t.dtype.name} but {ref_arg} "
                                   f"has {ref.dtype.name}; they must be equal")
    if not t.shape.is_compatible_with(ref.shape):
        raise checks.ArgumentError(f"{where}: {arg} has shape {t.shape.as_list()} but "
                                   f"{ref_arg} has {ref.shape.as_list()}; they must be equal")
    if not (t.shape.is_fully_defined() and ref.shape.is_fully_defined()):
        tf.debugging.assert_equal(tf.shape(t), tf.shape(ref),
                                  message=f"{where}: {arg} and {ref_arg} differ in shape")
    return t


def require(ok: tf.Tensor | Callable[..., tf.Tensor], message: str,
            *inputs: TensorLike) -> Optional[tf.Operation]:
    """An error with `message` unless a condition holds.

    `ok` is a boolean scalar tensor, or a function of `inputs` giving one. Given a function
    and inputs whose values are known when the graph is built (constants: Python numbers,
    numpy arrays, `tf.constant`s), the condition is evaluated on those values at once, so
    a bad constant raises an `ArgumentError` when a function is traced, compiled with XLA
    or not. Otherwise, in a graph, the check is a `tf.debugging.Assert` that fails when the
    graph runs; XLA (`jit_compile=True`) drops assertions, so such data-dependent checks do
    not run in XLA-compiled code.

    Args:
      ok: a boolean scalar tensor, or a function of `inputs` returning one.
      message: the error message.
      *inputs: the tensors `ok` is a function of (only with a function).

    Returns:
      In a graph, the assertion (for a control dependency where an op that follows could
      fail first with another message); else None.

    Raises:
      ArgumentError: eagerly, or at tracing for constant inputs, where the condition is
        False.
    """
    if callable(ok):
        static = [tf.get_static_value(x) for x in inputs]
        if all(v is not None for v in static):
            with tf.init_scope():  # evaluated eagerly, also while a graph is traced
                ok = ok(*[tf.constant(v) for v in static])
            if not bool(np.asarray(ok)):
                raise checks.ArgumentError(message)
            return None
        ok = ok(*inputs)
    if tf.executing_eagerly():
        if not bool(np.asarray(ok)):
            raise checks.ArgumentError(message)
        return None
    return tf.debugging.Assert(ok, [message])


def mask_of(mask: Optional[TensorLike], where: str, ref: tf.Tensor,
            ref_arg: str) -> Optional[tf.Tensor]:
    """The mask checked: `ref`'s dtype and shape, every entry 0 or 1, non-increasing along
    time (1 before an episode ends, 0 after).

    Args:
      mask: the `[batch, T]` mask, or None.
      where: the public function checked.
      ref: the `[batch, T]` tensor the mask belongs to.
      ref_arg: `ref`'s name in the message.

    Returns:
      The mask tensor, or None.
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


def powers(base: float, steps: TensorLike, dtype: DType) -> tf.Tensor:
    """`[base**0, ..., base**(steps-1)]` at `dtype` (the base a Python number applied at
    `dtype`, never through float32).

    Args:
      base: a Python number.
      steps: the length, a scalar int tensor or int.
      dtype: the floating dtype.

    Returns:
      A `[steps]` tensor.
    """
    return tf.pow(tf.constant(base, dtype), tf.cast(tf.range(steps), dtype))


TASK_SAMPLING = ("independent", "latin_hypercube")


def latin_hypercube(seed: tf.Tensor, n: int, d: int, dtype: DType) -> tf.Tensor:
    """`[n, d]` draws on the unit interval forming a Latin hypercube, for a meta-batch's
    tasks (`TASK_SAMPLING`'s "latin_hypercube").

    In each column every one of the `n` intervals [k / n, (k + 1) / n] holds exactly one
    draw, uniform inside it, the intervals assigned to the rows by an independent random
    permutation per column. Each draw is still uniform, so a mean over the tasks keeps its
    expectation, but the meta-batch covers the range evenly: a mean over tasks whose value
    varies smoothly with the task (a return that grows with a goal's distance) varies far
    less from one meta-batch to the next.

    Args:
      seed: an int64 `[2]` tensor.
      n: the rows (tasks), an int >= 1.
      d: the columns, an int >= 1.
      dtype: a floating dtype.

    Returns:
      The `[n, d]` tensor.
    """
    order, within = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    intervals = tf.argsort(tf.random.stateless_uniform([d, n], order), axis=1)
    u = tf.random.stateless_uniform([n, d], within, dtype=dtype)
    # an interval's index and the offset are summed first: exact for n < 2**24 in float32
    return (tf.cast(tf.transpose(intervals), dtype) + u) / tf.cast(n, dtype)
