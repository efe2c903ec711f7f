"""The XLA convention of hogrod's compiled steps, for the GAN trainer: a stand-in with the
signature of `hogrod.train.compiled(fn, jit_compile, where)`, which replaces it."""

from typing import Any, Callable, Union

import tensorflow as tf
from absl import logging

from hogrod import checks

__all__ = ["compiled"]


def _refused_by_xla(error: Exception) -> bool:
    """Whether an error at the first call is XLA refusing to compile (an op it lacks)."""
    text = str(error)
    return "XLA" in text or "compile" in text.lower()


def compiled(fn: Callable[..., Any], jit_compile: Union[bool, str],
             where: str) -> Callable[..., Any]:
    """`fn` as a `tf.function`, compiled with XLA as `jit_compile` says.

    Args:
      fn: the function compiled.
      jit_compile: True: XLA required (its error raised); False: a plain `tf.function`;
        "auto": XLA if it compiles; if XLA refuses at the first call (before any state
        changes: nothing runs until the whole computation compiles), a plain `tf.function`
        from then on, with one absl warning naming the reason and the binding `where`.
      where: the binding that sets `jit_compile`, named in the messages.

    Returns:
      The compiled callable.

    Raises:
      ArgumentError: `jit_compile` is not True, False or "auto".
    """
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        raise checks.ArgumentError(f"{where} must be True, False or 'auto', got "
                                   f"{jit_compile!r}")
    if jit_compile != "auto":
        return tf.function(fn, jit_compile=jit_compile)
    xla, plain = tf.function(fn, jit_compile=True), tf.function(fn)
    chosen = []

    def call(*args: Any) -> Any:
        if chosen:
            return chosen[0](*args)
        try:
            out = xla(*args)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
            if not _refused_by_xla(e):
                raise
            reason = str(e).strip().splitlines()[0][:300]
            logging.warning("%s: XLA cannot compile this step (%s); it runs as a plain "
                            "tf.function. Bind %s = False to skip the attempt.", where,
                            reason, where)
            chosen.append(plain)
            return plain(*args)
        chosen.append(xla)
        return out

    call.python_function = fn
    return call
