"""Several train steps in one compiled call: what `train_loop(..., steps_per_execution=N)`
runs between two returns to Python.

A step's fixed costs outside its arithmetic (the Python call into TensorFlow, the tf.data
iterator's `next`, the logs brought back to the host) are paid once per call instead of once
per step. From a tf.data iterator (or a tf.distribute one) the batches are drawn inside the
call, by the iterator's own op; from a Python iterator the call's batches are drawn before
it and handed in together, stacked on a leading axis (one trace, one XLA compile of the
step inside, whatever the call's length), or one by one where they do not stack (batches
of different shapes: a trace per call length).

Where the step is compiled with XLA (`hogrod.train.compiled`'s "auto" decided for it, or
True), the call's loop is one XLA computation too: the steps, their logs and the guard
between them, over the call's batches stacked on a leading axis. Between XLA's steps
nothing returns to TensorFlow's executor, which costs as much as a small step's arithmetic
(a MAML sinusoid meta-step: 0.5 ms). If XLA cannot compile the loop, it runs as a plain
`tf.function` around the XLA step, with one warning. A tf.data iterator's batches are
drawn before the loop (XLA cannot run the iterator's op): the first call's by a plain call,
each later one's by the call before it, beside that call's loop (`MultiStep.run`'s `then`),
where TensorFlow runs the draw on another thread; drawing 25 sinusoid meta-batches costs
about a third of the 25 steps. So a call that a non-finite step stops has drawn its later
batches too, as from a Python iterator, and those of the next call.

The NaN guard stays per step: the call stops after the first step whose logs are not all
finite, so no later step of the call runs (the train step's own guard has already kept that
step's update out when its loss or gradient was the non-finite value), and every step's
logs come back, so `train_loop` names the step and checks, summarizes and calls back per
step.
"""

import weakref
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from hogrod.types import Batch

__all__ = ["MultiStep", "Drawn", "multi_step", "built"]

# {step_fn: {(log names, dtypes, from_graph_iterator): its MultiStep}}: a later train_loop
# call with the same step (a run in rounds, a benchmark) reuses the traced loop instead of
# tracing it again. The MultiStep refers to its step weakly, so the entry goes with it.
_BUILT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _all_finite(values: list) -> tf.Tensor:
    checked = [tf.reduce_all(tf.math.is_finite(v)) for v in values if v.dtype.is_floating]
    return tf.reduce_all(checked) if checked else tf.constant(True)


class Drawn(NamedTuple):
    """Batches a `MultiStep.run` call drew for the next.

    Attributes:
      batches: the batches, stacked on a leading axis.
      count: how many (the next call's n).
    """
    batches: Batch
    count: int


class MultiStep:
    """`step_fn` run up to n times per call, stopping after a step with a non-finite log.

    Args:
      step_fn: the train step, `step_fn(batch) -> {name: scalar}`: a `tf.function`, a
        `hogrod.train.compiled` function (its XLA decision made by a call before this one)
        or any function of TensorFlow ops; called inside this object's `tf.function`s.
      logs: one step's logs, their names and dtypes those of every step.
      from_graph_iterator: whether the batches come from a tf.data (or tf.distribute)
        iterator, drawn inside the call; else from a Python iterator, drawn before it.

    Attributes:
      jit_compile: whether the loop is one XLA computation (the step's is; False once XLA
        refused the loop).
    """

    def __init__(self, step_fn: Callable[[Batch], Mapping[str, Any]],
                 logs: Mapping[str, Any], from_graph_iterator: bool) -> None:
        try:
            self._step_ref = weakref.ref(step_fn)
        except TypeError:  # not weakly referable: held
            self._step_ref = lambda: step_fn
        self.names = list(logs)
        self.dtypes = [tf.convert_to_tensor(v).dtype for v in logs.values()]
        self.from_graph_iterator = from_graph_iterator
        # the loop compiled with XLA where the step is (a `compiled` step's decision)
        self.jit_compile = getattr(step_fn, "jit_compile", None) is True
        # one trace for every call length from a graph iterator; one per length otherwise
        self._loop = tf.function(self._graph_loop)
        self._draw = tf.function(_draw)
        # {element specs: the loop over batches stacked on a leading axis of any length}:
        # a Python iterator's first call's, a tf.data iterator's for each element_spec
        self._stacked = {}
        self._unrolled = tf.function(self._given_batches)
        self._ahead = {}  # {element specs: the loop with the next call's draw beside it}

    @property
    def step_fn(self) -> Callable[[Batch], Mapping[str, Any]]:
        """The train step."""
        return self._step_ref()

    def _values(self, logs):
        if set(logs) != set(self.names):
            raise ValueError(f"train_loop: the step's logs changed names between steps: "
                             f"{sorted(self.names)}, then {sorted(logs)}")
        return [tf.cast(logs[name], dtype) for name, dtype in zip(self.names, self.dtypes)]

    def _while(self, next_batch, n):
        """Up to n steps in a `tf.while_loop`, step i on `next_batch(i)`."""
        # sized n (XLA's arrays are static); a call stopped early leaves zeros, cut by `ran`
        arrays = [tf.TensorArray(d, size=n, element_shape=[]) for d in self.dtypes]

        def cond(i, ok, *arrays):
            return tf.logical_and(i < n, ok)

        def body(i, ok, *arrays):
            values = self._values(self.step_fn(next_batch(i)))
            arrays = [a.write(i, v) for a, v in zip(arrays, values)]
            return (i + 1, _all_finite(values), *arrays)

        ran, _, *arrays = tf.while_loop(cond, body, (tf.constant(0), tf.constant(True),
                                                     *arrays))
        return ran, [a.stack() for a in arrays]

    def _graph_loop(self, iterator, n):
        return self._while(lambda i: next(iterator), n)

    def _stacked_loop(self, stacked):
        n = tf.shape(tf.nest.flatten(stacked)[0])[0]
        return self._while(lambda i: tf.nest.map_structure(lambda t: t[i], stacked), n)

    def _given(self, batches):
        """The Python iterator's batches: stacked into one loop where they stack."""
        try:
            stacked = tf.nest.map_structure(lambda *xs: tf.stack(xs), *batches)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError):
            return self._unrolled(tuple(batches))
        return self._run_stacked(stacked, lambda: self._unrolled(tuple(batches)))

    def _run_stacked(self, stacked, otherwise):
        """The loop over `stacked` batches; `otherwise()` where they do not match the
        structure and element shapes of the first call's (one loop is traced)."""
        specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec([None] + t.shape[1:].as_list(), t.dtype), stacked)
        key = _key(specs)
        if not self._stacked:
            self._stacked[key] = self._stacked_function(specs, stacked)
        elif key not in self._stacked:  # another structure or element shape: one by one
            return otherwise()
        return self._stacked[key](stacked)

    def _specs(self, element_spec):
        return tf.nest.map_structure(
            lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype), element_spec)

    def _stacked_function(self, specs, stacked):
        """The loop over stacked batches: with XLA where the step has it and XLA compiles
        the loop (lowered to HLO first, nothing run), else a plain `tf.function`."""
        plain = tf.function(self._stacked_loop, input_signature=[specs])
        if not self.jit_compile:
            return plain
        xla = tf.function(self._stacked_loop, input_signature=[specs], jit_compile=True)
        try:
            xla.experimental_get_compiler_ir(stacked)(stage="hlo")
        except (tf.errors.OpError, ValueError, TypeError, NotImplementedError) as e:
            lines = [ln for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            logging.warning("train_loop(steps_per_execution): the step is compiled with XLA "
                            "but its loop is not (%s); the loop runs as a plain tf.function "
                            "around it.", lines[0][:300])
            self.jit_compile = False
            return plain
        return xla

    def _given_batches(self, batches):
        ok, ran, rows = tf.constant(True), tf.constant(0), []
        for batch in batches:
            def run(batch=batch):
                values = self._values(self.step_fn(batch))
                return values, _all_finite(values)

            def skip():
                return [tf.zeros([], d) for d in self.dtypes], tf.constant(True)

            values, finite = tf.cond(ok, run, skip)
            ran += tf.cast(ok, tf.int32)
            ok = tf.logical_and(ok, finite)
            rows.append(values)
        return ran, [tf.stack([row[j] for row in rows]) for j in range(len(self.names))]

    def experimental_get_tracing_count(self) -> int:
        """How many times the several-step loop has been traced (both kinds of iterator;
        the draws of an XLA loop's batches, alone or beside the loop, not counted: they
        trace no step).

        Returns:
          The traces of its `tf.function`s.
        """
        stacked = sum(f.experimental_get_tracing_count() for f in self._stacked.values())
        return (self._loop.experimental_get_tracing_count() + stacked
                + self._unrolled.experimental_get_tracing_count())

    def __call__(self, iterator: Iterator[Batch], n: int) -> list[dict[str, float]]:
        """Run up to `n` steps in one call.

        Args:
          iterator: where the batches come from (the kind given at construction).
          n: the most steps to run (>= 1).

        Returns:
          Each step's logs as Python floats, in order: n of them, or fewer when a step's
          logs were not all finite (that step's are the last).
        """
        return self.run(iterator, n)[0]

    def run(self, iterator: Iterator[Batch], n: int, drawn: Optional[Drawn] = None,
            then: int = 0) -> tuple[list[dict[str, float]], Optional[Drawn]]:
        """Run up to `n` steps in one call, drawing the next call's batches meanwhile.

        An XLA loop over a tf.data iterator's batches draws them before it runs, by
        another (plain) call; `then > 0` draws the next call's `then` batches in the
        same call as this one's loop, where TensorFlow runs the two side by side, so the
        draw is off the loop's critical path. The iterator is then ahead of the model by
        those batches until the next call, given them as `drawn`, runs them: a caller
        that saves the iterator (a checkpoint) or hands it on must ask for none.

        Args:
          iterator: where the batches come from (the kind given at construction).
          n: the most steps to run (>= 1).
          drawn: the batches the previous call drew for this one (its second return),
            exactly n of them; None: drawn here.
          then: how many batches of the next call to draw during this one (0: none).
            Only an XLA loop over a tf.data iterator draws ahead; others ignore it.

        Returns:
          (logs, drawn): each step's logs as Python floats, in order (n, or fewer when
          a step's logs were not all finite: that step's are the last); the next call's
          batches (None where none were drawn).

        Raises:
          ValueError: `drawn` holds other than n batches.
        """
        ahead = None
        if drawn is not None or (self.from_graph_iterator and self.jit_compile):
            if drawn is None:
                stacked = self._draw(iterator, tf.constant(n))
            elif drawn.count != n:
                raise ValueError(f"MultiStep.run: drawn holds {drawn.count} batches for a "
                                 f"call of n = {n} steps")
            else:
                stacked = drawn.batches
            specs = self._specs(iterator.element_spec)
            key = _key(specs)
            if key not in self._stacked:
                self._stacked[key] = self._stacked_function(specs, stacked)
            loop = self._stacked[key]
            if then > 0 and self.jit_compile:
                if key not in self._ahead:
                    self._ahead[key] = tf.function(
                        lambda it, stacked, m: (*loop(stacked), _draw(it, m)),
                        input_signature=[tf.type_spec_from_value(iterator), specs,
                                         tf.TensorSpec([], tf.int32)])
                ran, arrays, nxt = self._ahead[key](iterator, stacked, tf.constant(then))
                ahead = Drawn(nxt, then)
            else:
                ran, arrays = loop(stacked)
        elif self.from_graph_iterator:
            ran, arrays = self._loop(iterator, tf.constant(n))
        else:
            ran, arrays = self._given([next(iterator) for _ in range(n)])
        ran = int(ran)
        columns = [np.asarray(a)[:ran] for a in arrays]
        logs = [{name: float(col[j]) for name, col in zip(self.names, columns)}
                for j in range(ran)]
        return logs, ahead


def _key(specs) -> tuple:
    """A dict key for a structure of TensorSpecs (lists and dicts are not hashable)."""
    return (str(tf.nest.map_structure(lambda _: None, specs)), tuple(tf.nest.flatten(specs)))


def _draw(iterator: Iterator[Batch], n: tf.Tensor) -> Batch:
    """n batches of a tf.data iterator, stacked on a leading axis (its op, n times)."""
    arrays = tf.nest.map_structure(
        lambda spec: tf.TensorArray(spec.dtype, size=n, element_shape=spec.shape),
        iterator.element_spec)

    def body(i, arrays):
        return i + 1, tf.nest.map_structure(lambda a, t: a.write(i, t), arrays, next(iterator))

    _, arrays = tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), arrays))
    return tf.nest.map_structure(lambda a: a.stack(), arrays)


def multi_step(step_fn: Callable[[Batch], Mapping[str, Any]], logs: Mapping[str, Any],
               from_graph_iterator: bool) -> MultiStep:
    """The `MultiStep` of `step_fn`, built once per step, logs and iterator kind and reused
    by later calls (so a `train_loop` run in several calls traces its loop once).

    Args:
      step_fn: the train step (as `MultiStep`'s).
      logs: one step's logs (as `MultiStep`'s).
      from_graph_iterator: as `MultiStep`'s.

    Returns:
      The `MultiStep`, new or the one an earlier call built.
    """
    key = (tuple(logs), tuple(tf.convert_to_tensor(v).dtype for v in logs.values()),
           from_graph_iterator)
    try:
        built = _BUILT.setdefault(step_fn, {})
    except TypeError:  # not weakly referable (a bound method): built anew
        return MultiStep(step_fn, logs, from_graph_iterator)
    if key not in built:
        built[key] = MultiStep(step_fn, logs, from_graph_iterator)
    return built[key]


def built(step_fn: Callable[[Batch], Mapping[str, Any]],
          from_graph_iterator: bool) -> Optional[MultiStep]:
    """The `MultiStep` an earlier `multi_step` call built for `step_fn` and this kind of
    iterator, where there is exactly one (so a later `train_loop` call over the same step
    needs no single first step to learn its logs).

    Args:
      step_fn: the train step.
      from_graph_iterator: as `MultiStep`'s.

    Returns:
      That `MultiStep`, or None (none built, or several: logs of other names).
    """
    try:
        found = [m for (_, _, kind), m in _BUILT.get(step_fn, {}).items()
                 if kind == from_graph_iterator]
    except TypeError:  # not weakly referable
        return None
    return found[0] if len(found) == 1 else None
