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
from typing import Any, Iterable, Mapping

import tensorflow as tf

__all__ = ["EvalHistory", "read_history", "record_eval", "write_json"]


def write_json(path: str | os.PathLike, value: Any, **kwargs: Any) -> None:
    """Write `value` as JSON atomically: a kill mid-write leaves the previous file.

    The text goes to `<path>.tmp` first, which then replaces `path` (`os.replace`), so the
    file is never left truncated.

    Args:
      path: the file to write.
      value: anything `json.dump` takes; any other value (a numpy scalar) is written as
        `float(value)`.
      **kwargs: passed to `json.dump` (e.g. `indent`, `sort_keys`).
    """
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, default=float, **kwargs)
    os.replace(tmp, path)


class EvalHistory(list):
    """The evaluations of one run's `output_dir`: a list of {"step": ..., name: value}.

    It owns the TensorBoard writer `record_eval` writes `<output_dir>/eval` with: one events
    file per run, never shared with another run that names the same (relative) directory
    from another working directory. `read_history` makes it; a user rarely does.

    Args:
      output_dir: the run's directory, kept as an absolute path (`self.output_dir`).
      evaluations: the evaluations recorded so far, in step order (default: none).
    """

    def __init__(self, output_dir: str | os.PathLike,
                 evaluations: Iterable[Mapping[str, Any]] = ()) -> None:
        super().__init__(evaluations)
        self.output_dir = os.path.abspath(output_dir)
        self._writer = None

    def writer(self) -> tf.summary.SummaryWriter:
        """The run's summary writer (created on first use).

        Returns:
          A `tf.summary` writer for `<output_dir>/eval`.
        """
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.output_dir, "eval"))
        return self._writer


def read_history(output_dir: str | os.PathLike, upto_step: int) -> EvalHistory:
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


def record_eval(output_dir: str | os.PathLike, history: list,
                result: Mapping[str, Any]) -> None:
    """Append an evaluation to a run's history, on disk and in TensorBoard.

    An evaluation at the step of the last one replaces it (a finished run's re-evaluation).

    Args:
      output_dir: the run's directory.
      history: what `read_history(output_dir, ...)` returned (its writer keeps one events
        file for the run); a plain list also works, with an events file for each call.
      result: {"step": ..., name: value}; its real-number values become TensorBoard
        scalars at that step, the others are only written to the JSON file.

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
