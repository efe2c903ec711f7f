"""The outer loop: checkpoints that survive a kill, a NaN/Inf guard, summaries, progress.

    ckpt = Checkpointer(output_dir, model=model, optimizer=opt, rng=rng)
    logs = train_loop(step, iterator, steps=10_000, checkpointer=ckpt, output_dir=output_dir)

`Checkpointer` is `tf.train.Checkpoint` + `tf.train.CheckpointManager` over everything that
makes a run resumable (model, optimizers, step counter, `tf.random.Generator`, the tf.data
iterator); a run killed with SIGKILL and started again with the same output dir restores
the last checkpoint and, with a fixed seed, ends with the weights an uninterrupted run ends
with. `train_loop` checks every step's logs: the first non-finite term or gradient stops the
run with `NonFiniteError` naming the step and the term, before anything is saved, so the
last good checkpoint stays the latest.
"""

import logging as std_logging
import math
import os
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Optional

import keras
import tensorflow as tf
from absl import logging

from hogrod import checks
from hogrod.train.execution import built, multi_step
from hogrod.types import Batch, Scalar

__all__ = ["Checkpointer", "train_loop", "NonFiniteError", "CheckpointMismatchError"]


class _DropShardingTiming(std_logging.Filter):
    """TensorFlow's checkpoint saver logs "Sharding callback duration: N microseconds"
    through absl at INFO on every save (tensorflow/python/checkpoint/functional_saver.py);
    drop that line only."""

    def filter(self, record):
        return not str(record.msg).startswith("Sharding callback duration")


for _logger in (logging.get_absl_logger(), std_logging.getLogger("tensorflow")):
    _logger.addFilter(_DropShardingTiming())


def _progress(message, *args):
    """A progress line: through absl logging when its logger passes INFO (a binary, whose
    absl flags set INFO; Python logging configured at INFO), else printed to stderr, so a
    plain script, where logging stays at its WARNING default, sees its progress too."""
    if logging.get_absl_logger().isEnabledFor(std_logging.INFO):
        logging.info(message, *args)
    else:
        print(message % args, file=sys.stderr, flush=True)


class NonFiniteError(FloatingPointError):
    """A loss term or the gradient became NaN or Inf; the message names the step and term."""


class CheckpointMismatchError(ValueError):
    """The checkpoint directory holds a checkpoint of a different model or setup."""


class Checkpointer:
    """Save and restore every piece of training state under `<directory>/ckpt`.

    A tf.data iterator whose pipeline cannot be saved (Python state: `from_generator`,
    `py_function`) or a tf.distribute iterator is dropped from the checkpoint with a
    warning: a resumed run restarts its data. Every Keras layer's or model's non-trainable
    variables are saved too (Keras 3's random layers keep their seed state there).

    Args:
      directory: the run's output dir (checkpoints go in `ckpt/` under it).
      max_to_keep: how many checkpoints to keep (the oldest are deleted).
      **trackables: the model, optimizers, `tf.random.Generator`s, tf.data iterators and
        anything else `tf.train.Checkpoint` can track, by name.

    Attributes:
      step: the int64 step counter variable (`train_loop` advances it), saved with the rest.
      directory: `<directory>/ckpt`, where the checkpoints are.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3,
                 **trackables: Any) -> None:
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        self.directory = os.path.join(directory, "ckpt")
        self.max_to_keep = max_to_keep
        self._build(trackables)

    def _build(self, trackables: dict) -> None:
        # tf.distribute's DistributedIterator (experimental_distribute_dataset) is not
        # trackable in TF 2.21: under a multi-replica strategy the data restarts on resume.
        untracked = [k for k, v in trackables.items()
                     if _is_iterator(v) and not isinstance(v, tf.__internal__.tracking.Trackable)]
        if untracked:
            logging.warning("not checkpointing data iterator(s) %s (a tf.distribute "
                            "DistributedIterator cannot be saved); a resumed run restarts "
                            "their data", untracked)
            trackables = {k: v for k, v in trackables.items() if k not in untracked}
        self.trackables = trackables
        # tf.train.Checkpoint does not reach the SeedGenerator state of Keras 3 random layers
        # (Dropout, ...); save every model's non-trainable variables explicitly so that a
        # resumed run draws the same dropout masks as an uninterrupted one.
        states = {f"{name}_state": [v.value for v in obj.non_trainable_variables]
                  for name, obj in trackables.items()
                  if isinstance(obj, keras.layers.Layer) and obj.non_trainable_variables}
        self.checkpoint = tf.train.Checkpoint(step=self.step, **trackables, **states)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory,
                                                  self.max_to_keep)

    def _drop_iterators(self, why: str) -> bool:
        """tf.data saves an iterator's position unless its pipeline holds Python state
        (`from_generator`, `py_function`); such data restarts from its beginning on resume."""
        names = [k for k, v in self.trackables.items() if _is_iterator(v)]
        if names:
            logging.warning("not checkpointing data iterator(s) %s (%s); a resumed run "
                            "restarts their data", names, why)
            self._build({k: v for k, v in self.trackables.items() if k not in names})
        return bool(names)

    def restore(self) -> int:
        """Restore the latest checkpoint if there is one.

        Returns:
          The step it was taken at (also the value of `step` now); 0 if there is none.

        Raises:
          CheckpointMismatchError: the checkpoint does not match the trackables (another
            model or setup wrote it).
        """
        path = self.manager.latest_checkpoint
        if not path:
            return 0
        saved = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
        if any(_is_iterator(v) and k not in saved for k, v in self.trackables.items()):
            self._drop_iterators("the checkpoint holds no state for them")
        try:
            status = self.checkpoint.restore(path)
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
            raise CheckpointMismatchError(
                f"the checkpoint {path} does not match this run's model/optimizer (a different "
                f"model or setup wrote it?): {str(e).splitlines()[0][:500]}. Use a new "
                "--output_dir, or the setup that wrote it.") from None
        logging.info("restored %s (step %d)", path, int(self.step))
        return int(self.step)

    def latest_step(self) -> int:
        """The step of the latest checkpoint, read without restoring it.

        Returns:
          That step; 0 if there is no checkpoint.
        """
        path = self.manager.latest_checkpoint
        return int(tf.train.load_variable(path, "step/.ATTRIBUTES/VARIABLE_VALUE")) if path else 0

    def save(self) -> str:
        """Save a checkpoint numbered by the current `step`.

        Checkpoints beyond `max_to_keep` are deleted, oldest first. A data iterator that
        cannot be saved (its pipeline holds Python state) is dropped from the checkpoint
        with a warning, and the save retried without it.

        Returns:
          The path prefix of the checkpoint written.
        """
        try:
            return self.manager.save(checkpoint_number=int(self.step))
        except tf.errors.FailedPreconditionError as e:
            if not self._drop_iterators(str(e).splitlines()[0][:200]):
                raise
            return self.manager.save(checkpoint_number=int(self.step))


def _is_iterator(obj):
    return isinstance(obj, (tf.data.Iterator, tf.distribute.DistributedIterator)) or \
        type(obj).__name__ == "OwnedIterator"


def _check_finite(logs, step):
    for name, value in logs.items():
        if not math.isfinite(value):
            what = "the gradient" if name == "grad_norm" else f"loss term '{name}'"
            raise NonFiniteError(f"step {step}: {what} is {value}; the update was not applied "
                                 "and the last checkpoint is the last good state")


def train_loop(step_fn: Callable[[Batch], Mapping[str, Scalar]], iterator: Iterator[Batch],
               steps: int, checkpointer: Optional[Checkpointer] = None,
               output_dir: Optional[str | os.PathLike] = None, checkpoint_every: int = 500,
               log_every: Optional[int] = 100, summary_every: int = 10,
               callback: Optional[Callable[[int, dict[str, float]], Any]] = None,
               time_limit_s: Optional[float] = None,
               stats: Optional[dict] = None, steps_per_execution: int = 1) -> dict[str, float]:
    """Run `step_fn(next(iterator))` until `checkpointer.step` reaches `steps`.

    With `steps_per_execution = N > 1` the steps run N to a compiled call (as Keras's
    `compile(steps_per_execution=N)`: `execution.py`), the batches drawn inside the call
    from a tf.data iterator. Calls end at the run's multiples of N (counted over the run,
    so a resumed run ends its calls where an uninterrupted one does), at checkpoints and at
    `steps`; the first call of the first `train_loop` call over a step is a single step
    (it makes a `compiled` step's XLA decision; later `train_loop` calls with the same
    step reuse the several-step call the first traced). Where the calls are one XLA loop
    over a tf.data iterator, each draws the next call's batches beside its loop, except
    before a checkpoint and the last step: in between, and after an error a step or a
    callback raises, the iterator is ahead of the model by those batches (a time limit
    runs them before it stops). Each step's logs still come back: the NaN guard,
    summaries, progress and `callback` are per step, the last two run after the call
    that holds the step, when the model is at the call's last step. So a callback that
    reads or changes the model (an evaluation, a schedule) must act at multiples of N,
    where the state is that step's; time limits are checked between calls. The numbers are
    those of N = 1: the same steps in the same order. The step is traced once more inside
    the call if the iterator's element shapes are less static than its batches' (a tf.data
    batch without `drop_remainder=True`).

    Args:
      step_fn: a compiled step returning a dict of scalar logs (see `make_train_step`);
        with `steps_per_execution > 1` it is called inside a `tf.function`, so it must be
        traceable (a `tf.function`, `hogrod.train.compiled`, TensorFlow ops).
      iterator: a (distributed) tf.data iterator, or any Python iterator of batches; put a
        tf.data iterator in the checkpointer to resume the data where it stopped.
      steps: the total number of steps of the run (not of this call).
      checkpointer: a `Checkpointer`; restored before the first step, saved every
        `checkpoint_every` steps and at the end. None: no checkpoints.
      output_dir: TensorBoard events go to `<output_dir>/train`. None: no summaries.
      checkpoint_every: save a checkpoint every this many steps (counted over the run),
        besides the one at the last step.
      log_every: a progress line (step, loss, steps/s, ETA) every this many steps and at
        the last, through absl logging when it shows INFO (binaries), else printed to
        stderr. None or 0: no progress lines.
      summary_every: tf.summary of every log value and steps/s every this many steps.
      callback: optional `callback(step, logs)` after each step (evaluation, plots); with
        `steps_per_execution > 1` after the call holding the step (above).
      time_limit_s: stop (with a checkpoint) once the steps of this call have taken this
        many seconds, callbacks excluded, checked between calls; a re-run resumes. None:
        no limit.
      stats: an optional dict that, when this call runs any steps, it fills with
        `train_steps` (how many), `train_seconds` (their time, callbacks excluded) and
        `train_steps_per_s`; binaries put them in metrics.json.
      steps_per_execution: the most steps per compiled call (1: one call per step).

    Returns:
      The last step's logs as Python floats (empty if there was nothing left to do).

    Raises:
      NonFiniteError: a step's log (a loss term or "grad_norm") is NaN or Inf; raised
        before that step is counted or saved, no later step run.
      CheckpointMismatchError: the checkpoint in the output dir is another setup's.
      ArgumentError: `steps_per_execution` or `checkpoint_every` is not a positive integer.
    """
    per_call = checks.integer(steps_per_execution, "steps_per_execution", "train_loop", least=1)
    checks.integer(checkpoint_every, "checkpoint_every", "train_loop", least=1)
    ckpt = checkpointer
    step = ckpt.restore() if ckpt else 0
    counter = ckpt.step if ckpt else tf.Variable(0, dtype=tf.int64)
    writer = (tf.summary.create_file_writer(os.path.join(output_dir, "train"))
              if output_dir else tf.summary.create_noop_writer())
    if log_every and step < steps:
        _progress("training steps %d to %d%s", step + 1, steps,
                  f" (resumed at step {step})" if step else "")
    logs = {}
    start, start_step = time.perf_counter(), step
    rate = 0.0
    in_callbacks = 0.0
    # the MultiStep: an earlier call's over this step, or built once a first single step
    # has given the logs' names (and made a `compiled` step's XLA decision)
    several = built(step_fn, _is_iterator(iterator)) if per_call > 1 else None
    drawn = None  # the batches the last several-step call drew for the next

    def size(at):  # the call from step `at`: to the next multiple of N, checkpoint or end
        return min(per_call - at % per_call, steps - at, checkpoint_every - at % checkpoint_every)

    def following(at):
        """The size of the call after the one ending at step `at`, where its batches may
        be drawn during that one: none after a checkpoint or the last step (the iterator
        saved or handed back is where the model is)."""
        return 0 if at >= steps or at % checkpoint_every == 0 else size(at)

    with writer.as_default():
        while step < steps:
            over = time_limit_s is not None and (
                time.perf_counter() - start - in_callbacks >= time_limit_s)
            if over and drawn is None:  # (drawn batches run first: the iterator is past them)
                _progress("time limit of %.0f s reached at step %d", time_limit_s, step)
                if ckpt:
                    ckpt.save()
                break
            if several is None:
                raw = step_fn(next(iterator))
                if per_call > 1:
                    several = multi_step(step_fn, raw, _is_iterator(iterator))
                done = [{k: float(v) for k, v in raw.items()}]
            else:
                n = drawn.count if drawn is not None else size(step)
                done, drawn = several.run(iterator, n, drawn,
                                          then=0 if over else following(step + n))
            for logs in done:
                try:
                    _check_finite(logs, step + 1)
                except NonFiniteError:
                    counter.assign(step)  # the model holds the steps before this one
                    raise
                step += 1
                elapsed = time.perf_counter() - start - in_callbacks
                rate = (step - start_step) / elapsed if elapsed > 0 else 0.0
                if output_dir and (step % summary_every == 0 or step == steps):
                    for name, value in logs.items():
                        tf.summary.scalar(name, value, step=step)
                    tf.summary.scalar("steps_per_sec", rate, step=step)
                if log_every and (step % log_every == 0 or step == steps):
                    eta = (steps - step) / rate if rate > 0 else float("inf")
                    _progress("step %d/%d  loss %.5g  %.1f steps/s  ETA %.0f s", step, steps,
                              logs.get("loss", float("nan")), rate, eta)
                save = ckpt and (step % checkpoint_every == 0 or step == steps)
                if callback is not None or save:  # (else once per call, below)
                    counter.assign(step)
                if callback is not None:
                    before = time.perf_counter()
                    callback(step, logs)
                    in_callbacks += time.perf_counter() - before
                if save:
                    ckpt.save()
            counter.assign(step)
    writer.flush()
    if stats is not None and step > start_step:
        stats.update(train_steps=step - start_step, train_steps_per_s=rate,
                     train_seconds=time.perf_counter() - start - in_callbacks)
    return logs
