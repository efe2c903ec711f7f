"""One XLA convention for every compiled step: `jit_compile = "auto" | True | False`.

    step = compiled(step_body, "auto", "make_train_step")
    logs = step(batch)   # the first call decides: XLA, or a plain tf.function

- `"auto"` (the default of every step builder): the function compiled with XLA when XLA
  compiles it. The choice is made once, at the first call, before the function runs (so
  before it changes any state): the function is traced for XLA and lowered to XLA's HLO
  without running it. If XLA refuses (an op it has no kernel for: `tf.numpy_function`,
  `tf.py_function`, a string op, ...), or would not compute what TensorFlow computes (the
  traced graph holds assertions, `hogrod.checks.require` in a graph, which XLA drops, so
  the checks would silently vanish; or random ops, which XLA draws otherwise for the same
  seed), the function runs as a plain `tf.function` instead, and ONE absl warning says why
  and which binding skips the attempt. Every later call takes the path chosen, with one
  exception: if XLA compiles the function anew at each of its first calls (an input taken
  as a compile-time constant, as `tf.vectorized_map`'s does), it takes the plain function
  from then on, with one warning.
- `True`: XLA required; its error, if it cannot compile, is raised at the first call.
- `False`: a plain `tf.function`.

What XLA changes besides speed where "auto" takes it: floating-point sums in another order
(float64 agrees with the plain function to rounding). With True, also the random numbers
(as reproducible, but other ones) and no graph assertions.
"""

import time
from typing import Any, Callable, Literal, Optional

import tensorflow as tf
from absl import logging

from hogrod import checks

__all__ = ["compiled", "AutoCompiled", "check_jit_compile", "xla_blocker", "JIT_COMPILE"]

JIT_COMPILE = ("auto", True, False)  # every step builder's jit_compile


def check_jit_compile(jit_compile: Any, where: str) -> bool | Literal["auto"]:
    """`jit_compile` checked: "auto", True or False.

    Args:
      jit_compile: the value given.
      where: the builder or binding checked (`make_train_step`, `pinn_experiment`), named
        in the message as `<where>.jit_compile`.

    Returns:
      The value, unchanged.

    Raises:
      ArgumentError: anything else (a string other than "auto", 0 or 1, None).
    """
    if isinstance(jit_compile, bool) or (isinstance(jit_compile, str) and jit_compile == "auto"):
        return jit_compile
    raise checks.ArgumentError(f"{where}.jit_compile must be 'auto', True or False, got "
                               f"{jit_compile!r}")


# Ops that draw random numbers: XLA draws other numbers than TensorFlow's kernels for the
# same seed (stateless) or state (tf.random.Generator), so a step under XLA would not take
# the plain step's steps.
_RANDOM_PREFIXES = ("StatelessTruncatedNormal", "StatelessMultinomial", "StatelessParameterized",
                    "TruncatedNormal", "Multinomial", "StatefulUniform", "StatefulStandardNormal",
                    "StatefulTruncatedNormal", "StatefulRandom", "Rng")


# The recompile check: the first call and the next two timed; those two each taking more
# than this share of the first (a compile), and more than this many seconds.
_RECOMPILE_CALLS, _RECOMPILE_SHARE, _RECOMPILE_SECONDS = 3, 0.5, 0.005


def _graph_blocker(concrete) -> Optional[str]:
    """Why XLA would not run the traced function as TensorFlow does (None: nothing), from
    its ops and its nested functions' (loops, conds, inner tf.functions): an Assert, which
    XLA compiles as nothing, or a random op, which XLA draws otherwise."""
    graph_def = concrete.graph.as_graph_def()
    ops = [n.op for n in graph_def.node] + [n.op for f in graph_def.library.function
                                             for n in f.node_def]
    asserts = sum(op == "Assert" for op in ops)
    if asserts:
        return (f"the step holds {asserts} graph assertion(s) (hogrod.checks.require, "
                "tf.debugging.Assert), which XLA would drop")
    random = sorted({op for op in ops if "Random" in op or op.startswith(_RANDOM_PREFIXES)})
    if random:
        return (f"the step draws random numbers ({', '.join(random[:3])}), which XLA draws "
                "otherwise for the same seed")
    return None


def xla_blocker(xla: Callable, plain: Callable, *args: Any, **kwargs: Any) -> Optional[str]:
    """Why XLA would not run a function as TensorFlow does, or None: it would.

    The function is traced for XLA and lowered to HLO, not run (no state changes). XLA is
    refused where it cannot compile the function, or would compute something else: graph
    assertions (XLA drops them), random ops (XLA draws other numbers for the same seed).

    Args:
      xla: the function as a `tf.function(..., jit_compile=True)`.
      plain: the same function as a plain `tf.function`: where only the XLA trace fails
        (code that takes another branch under XLA: `taskmap.vectorized_map`), the reason
        says so; where both fail, the error is the user's code's and is raised.
      *args: the call's arguments (tensors, or `tf.TensorSpec` objects where called while
        another function is traced).
      **kwargs: the call's keyword arguments.

    Returns:
      None, or the reason as a sentence (what "auto" warns with).
    """
    try:
        concrete = xla.get_concrete_function(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (re-raised unless the plain trace succeeds)
        try:
            plain.get_concrete_function(*args, **kwargs)
        except Exception:  # noqa: BLE001
            raise e from None
        return f"tracing it for XLA failed: {_first_line(e)}"
    reason = _graph_blocker(concrete)
    if reason is None:
        try:  # eagerly (its requirement), from the trace above
            with tf.init_scope():
                xla.experimental_get_compiler_ir(*args, **kwargs)(stage="hlo")
        except (tf.errors.OpError, ValueError, TypeError, NotImplementedError) as e:
            reason = f"XLA cannot compile it: {_first_line(e)}"
    return reason


def _first_line(error: Exception) -> str:
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = lines[0] if lines else type(error).__name__
    if text.startswith("in user code") and len(lines) > 1:  # autograph's: the error is last
        text = lines[-1]
    # tf2xla's refusal names the op on a later line ("... PyFunc (No registered ...)")
    detail = next((ln for ln in lines[1:] if "No registered" in ln or "unsupported" in ln), "")
    return (text + (" " + detail if detail else ""))[:400]


class AutoCompiled:
    """A function compiled with XLA where XLA compiles it, else a plain `tf.function`
    (`compiled(fn, "auto", where)`; the module docstring).

    Called like the `tf.function` it wraps. The first call made eagerly decides the path
    (`jit_compile` then says which: True for XLA, False for the plain function, None before
    the decision, `reason` why XLA was refused). A call inside another function's trace
    before that decision takes the plain function without deciding.

    Args:
      fn: the Python function.
      where: the builder it belongs to, named in the fallback's warning
        (`<where>.jit_compile = False` skips the attempt).
      autograph: `tf.function`'s autograph.
    """

    def __init__(self, fn: Callable, where: str, autograph: bool = True) -> None:
        self.python_function = fn
        self.where = where
        self._xla = tf.function(fn, jit_compile=True, autograph=autograph)
        self._plain = tf.function(fn, autograph=autograph)
        self.jit_compile: Optional[bool] = None
        self.reason: Optional[str] = None
        self._seconds: list = []  # the first XLA calls' times, until the recompile check

    def _decide(self, args, kwargs) -> None:
        reason = xla_blocker(self._xla, self._plain, *args, **kwargs)
        self.jit_compile, self.reason = reason is None, reason
        if reason is None:
            logging.info("%s: compiled with XLA (jit_compile='auto')", self.where)
        else:
            logging.warning("%s: jit_compile='auto' runs a plain tf.function, not XLA: %s. "
                            "Bind %s.jit_compile = False to skip the attempt (True requires "
                            "XLA and raises its error).", self.where, reason, self.where)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.jit_compile is None:
            if not tf.executing_eagerly():
                return self._plain(*args, **kwargs)
            self._decide(args, kwargs)
        if self.jit_compile and len(self._seconds) < _RECOMPILE_CALLS and tf.executing_eagerly():
            start = time.perf_counter()
            out = self._xla(*args, **kwargs)
            self._seconds.append(time.perf_counter() - start)
            self._check_recompiling()
            return out
        return (self._xla if self.jit_compile else self._plain)(*args, **kwargs)

    def _check_recompiling(self) -> None:
        """After the first calls: a step that takes as long as its first call (which
        compiled it) every time is compiled anew at every call (XLA takes an input as a
        compile-time constant: `tf.vectorized_map`'s pfor does this), hundreds of times
        slower than the plain function; it takes the plain function from then on."""
        if len(self._seconds) < _RECOMPILE_CALLS:
            return
        first, later = self._seconds[0], self._seconds[1:]
        if min(later) > max(_RECOMPILE_SHARE * first, _RECOMPILE_SECONDS):
            self.jit_compile = False
            self.reason = (f"XLA compiled the step anew at each call ({first:.2f} s for the "
                           f"first, {min(later):.2f} s or more for the next)")
            logging.warning("%s: jit_compile='auto' runs a plain tf.function from here on: %s; "
                            "often a tf.vectorized_map in the step (hogrod.taskmap."
                            "vectorized_map compiles once). Bind %s.jit_compile = False to skip "
                            "the attempt.", self.where, self.reason, self.where)

    @property
    def function(self) -> Callable:
        """The `tf.function` calls take: XLA's once decided for it, else the plain one."""
        return self._xla if self.jit_compile else self._plain

    def experimental_get_tracing_count(self) -> int:
        """How many times the function calls take has been traced.

        Returns:
          That `tf.function`'s tracing count (the XLA attempt of a fallback not counted).
        """
        return self.function.experimental_get_tracing_count()

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The concrete function of the path calls take (the plain one before the decision).

        Args:
          *args: as for a call (tensors or `tf.TensorSpec` objects).
          **kwargs: as for a call.

        Returns:
          A `tf.types.experimental.ConcreteFunction`.
        """
        return self.function.get_concrete_function(*args, **kwargs)


def compiled(fn: Callable, jit_compile: bool | Literal["auto"] = "auto",
             where: str = "make_train_step", autograph: bool = True) -> Callable:
    """`fn` as a compiled function under the XLA convention (the module docstring).

    Args:
      fn: the Python function (a train step's body).
      jit_compile: "auto" (XLA where it compiles, else a plain `tf.function` with one
        warning, decided at the first call before anything runs), True (XLA required) or
        False (a plain `tf.function`).
      where: the builder or binding it belongs to, named in messages
        (`<where>.jit_compile`).
      autograph: `tf.function`'s autograph.

    Returns:
      A `tf.function` (True, False) or an `AutoCompiled` ("auto"), called as `fn`.

    Raises:
      ArgumentError: `jit_compile` is not "auto", True or False, or `fn` not callable.
    """
    check_jit_compile(jit_compile, where)
    checks.function(fn, "fn", "compiled", "fn(*args) -> outputs")
    if jit_compile == "auto":
        return AutoCompiled(fn, where, autograph)
    return tf.function(fn, jit_compile=jit_compile, autograph=autograph)
