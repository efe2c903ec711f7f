"""A run's evaluation history, beside its checkpoints: what survives a resume.

    ckpt = Checkpointer(output_dir, model=model, optimizer=opt)
    history = read_history(output_dir, ckpt.latest_step())
    ...
    record_eval(output_dir, history, {"step": step, "accuracy": acc})

`read_history` gives the evaluations earlier runs of `output_dir` made up to the step the
run resumes from (later ones are redone, so none is listed twice); `record_eval` appends one,
rewrites `<output_dir>/eval_history.json` atomically and writes its scalars to TensorBoard
(`<output_dir>/eval`).
"""

import json
import numbers
import os

import tensorflow as tf

__all__ = ["EvalHistory", "read_history", "record_eval", "write_json"]


def write_json(path, value, **kwargs):
    """Write `value` as JSON atomically: a kill mid-write leaves the previous file, never a
    truncated one.

    Args:
      path: the file to write.
      value: anything `json.dump` takes (numpy scalars are written as floats).
      **kwargs: passed to `json.dump` (e.g. `indent`, `sort_keys`).
    Returns:
      None.
    """
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, default=float, **kwargs)
    os.replace(tmp, path)


class EvalHistory(list):
    """The evaluations of one run's `output_dir` (a list of {"step": ..., name: value}),
    owning the TensorBoard writer `record_eval` writes `<output_dir>/eval` with: one events
    file per run, never shared with another run that names the same (relative) directory
    from another working directory."""

    def __init__(self, output_dir, evaluations=()):
        super().__init__(evaluations)
        self.output_dir = os.path.abspath(output_dir)
        self._writer = None

    def writer(self):
        """The run's summary writer (created on first use).

        Returns:
          A `tf.summary` writer for `<output_dir>/eval`.
        """
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.output_dir, "eval"))
        return self._writer


def read_history(output_dir, upto_step):
    """The evaluations earlier runs recorded in `<output_dir>/eval_history.json`.

    Args:
      output_dir: the run's directory.
      upto_step: the step this run resumes from (`Checkpointer.latest_step()`); later
        evaluations are dropped (the run makes them again).
    Returns:
      An `EvalHistory` to give `record_eval`; empty for a new run.
    """
    path = os.path.join(output_dir, "eval_history.json")
    if not os.path.exists(path):
        return EvalHistory(output_dir)
    with open(path) as f:
        return EvalHistory(output_dir, [h for h in json.load(f) if h["step"] <= upto_step])


def record_eval(output_dir, history, result):
    """Append an evaluation to a run's history, on disk and in TensorBoard.

    An evaluation at the step of the last one replaces it (a finished run's re-evaluation).

    Args:
      output_dir: the run's directory.
      history: what `read_history(output_dir, ...)` returned (its writer keeps one events
        file for the run); a plain list also works, with an events file for each call.
      result: {"step": ..., name: value}; its real-number values become scalars.
    Returns:
      None.
    Raises:
      ValueError: `history` is another directory's.
      TypeError: `history` is not a list.
    """
    if isinstance(history, EvalHistory):
        if history.output_dir != os.path.abspath(output_dir):
            raise ValueError(f"record_eval: history is that of {history.output_dir}, not of "
                             f"output_dir {os.path.abspath(output_dir)}; pass the history "
                             "read_history gave for this output_dir")
        writer = history.writer()
    elif isinstance(history, list):
        writer = tf.summary.create_file_writer(os.path.join(output_dir, "eval"))
    else:
        raise TypeError(f"record_eval: history must be the list read_history returned, got "
                        f"{type(history).__name__}")
    if history and history[-1]["step"] == result["step"]:
        history[-1] = result
    else:
        history.append(result)
    write_json(os.path.join(output_dir, "eval_history.json"), history)
    with writer.as_default():
        for name, value in result.items():
            if name != "step" and isinstance(value, numbers.Real):
                tf.summary.scalar(name, value, step=int(result["step"]))
    writer.flush()
    if not isinstance(history, EvalHistory):
        writer.close()
