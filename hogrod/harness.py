"""The one main of every experiment binary: absl flags + gin, Dopamine style.

An experiment is a gin-configurable function `fn(output_dir) -> dict | None`; its binary
ends with `def main(): harness.main(fn)` and runs as a console command or a module::

    hogrod-maml --gin_file=maml/sinusoid_maml.gin --gin_param='maml.inner_lr = 0.01'
    python -m experiments.maml --gin_file=configs/maml/sinusoid_maml.gin --output_dir=runs/x

A `--gin_file`, and every `include` inside one, is a path as given, else one relative to the
configs shipped in the package (`hogrod/configs/`, or the repository's `configs/...`), so
every form works from any directory. `run` checks the config before it writes anything
and says what a run writes; a bad config or a bad input exits with code 2 and the message
alone (`run_cli`), `--verbosity=1` shows the traceback.

The run's directory and its records (`config.gin`, `config_changes.txt`) are made only once
the experiment has built its objects from the bindings and restored its checkpoint: the
experiment says so by calling `started(output_dir)` (or `started(output_dir, checkpointer)`,
which restores the checkpoint first). An error before that point (the library refusing a
binding, a checkpoint that does not fit a changed config) leaves no directory, or leaves a
resumed run's directory as it was::

    ckpt = train.Checkpointer(output_dir, model=model, optimizer=opt)
    start = harness.started(output_dir, ckpt)  # config.gin is written here
"""

import datetime
import json
import os
import re
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import gin
import keras
import tensorflow as tf
from absl import app, flags, logging

from hogrod.bindings import (PACKAGE_DIR, ConfigError, Count, Fraction, NonNegative, Positive,
                             PositiveInt, Range, check_required, check_values, config_changes,
                             format_changes, parse_config, resolve_gin_file)
from hogrod.train.history import write_json
from hogrod.train.loop import Checkpointer

__all__ = ["main", "run", "run_cli", "started", "parse_config", "resolve_gin_file",
           "config_changes", "write_metrics", "define_flags", "ConfigError", "Range", "Count",
           "PositiveInt", "Positive", "NonNegative", "Fraction"]

FLAGS = flags.FLAGS
# Keras's learning-rate schedules, for any binary's rate binding (e.g.
# `pinn_experiment.adam_lr = @ExponentialDecay()`, `maml_experiment.outer_lr =
# @PiecewiseConstantDecay()`); registered here, once per process, for every binary.
for _schedule in (keras.optimizers.schedules.ExponentialDecay,
                  keras.optimizers.schedules.PolynomialDecay,  # power 1: linear decay
                  keras.optimizers.schedules.PiecewiseConstantDecay,
                  keras.optimizers.schedules.CosineDecay):
    gin.external_configurable(_schedule, module="keras")
# Keras's first-order optimizers, for a binary whose optimizer is a factory reference
# (`second_order_experiment.optimizer = @keras.optimizers.Adam`, its rate bound as
# `keras.optimizers.Adam.learning_rate = 1e-3`).
for _optimizer in (keras.optimizers.Adam, keras.optimizers.SGD, keras.optimizers.AdamW,
                   keras.optimizers.RMSprop):
    gin.external_configurable(_optimizer, module="keras.optimizers")
REPO_ROOT = os.path.dirname(PACKAGE_DIR)  # the checkout, for a development install
#: An experiment: a gin configurable `fn(output_dir) -> metrics or None`.
Experiment = Callable[[str], Optional[Mapping[str, Any]]]

_FLAGS = (  # (name, flag type as absl names it, define, default, help)
    ("gin_file", "multi string", flags.DEFINE_multi_string, [],
     "Gin config file (repeatable; later files override): a path, or one relative to the "
     "shipped configs (maml/sinusoid_maml.gin or configs/maml/...)."),
    ("gin_param", "multi string", flags.DEFINE_multi_string, [],
     "Gin binding, e.g. 'maml.steps = 10' (repeatable)."),
    ("output_dir", "string", flags.DEFINE_string, None,
     "Where the run writes its outputs; default runs/<experiment>/<timestamp>. Re-using a "
     "directory resumes from its last checkpoint."),
    ("allow_config_change", "bool", flags.DEFINE_boolean, False,
     "Continue a run in an --output_dir whose config.gin records other bindings; the "
     "differences are appended to <output_dir>/config_changes.txt."),
)


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define the binary's flags once per process (importing hogrod defines none).

    Args:
      flag_values: the absl `FlagValues` to define them on (default: absl's global one).

    Raises:
      flags.DuplicateFlagError: the program defines a flag of the same name and another type.
    """
    for name, flag_type, define, default, help_text in _FLAGS:
        if name not in flag_values:
            define(name, default, help_text, flag_values=flag_values)
        elif flag_values[name].flag_type() != flag_type:
            raise flags.DuplicateFlagError(
                f"--{name} is already defined as a {flag_values[name].flag_type()} flag (by "
                f"{flag_values.find_module_defining_flag(name)}); harness.main needs it as a "
                f"{flag_type} flag: rename the program's flag")


def _changes_since(output_dir, config, allow):
    """The bindings `config` changes from `<output_dir>/config.gin` (an earlier run), listed
    as `format_changes` writes them ('' for none); a ConfigError naming them unless `allow`."""
    path = os.path.join(output_dir, "config.gin")
    if not os.path.exists(path):
        return ""
    try:
        with open(path) as f:
            changes = format_changes(config_changes(f.read(), config))
    except SyntaxError as e:
        raise ConfigError(f"cannot read {path}, the config of the run in {output_dir}: "
                          f"{e.msg}; use a new --output_dir") from None
    if changes and not allow:
        raise ConfigError(
            f"{output_dir} holds a run with another config ({path}); these bindings "
            f"differ (old -> new):\n{changes}\nUse a new --output_dir, the same config, or "
            "--allow_config_change to continue this run with the new one (recorded in "
            "config_changes.txt).")
    return changes


def write_metrics(output_dir: str, metrics: Mapping[str, Any], resumed: bool = False) -> None:
    """Write `<output_dir>/metrics.json` atomically.

    Args:
      output_dir: the run's directory.
      metrics: a JSON-able dict.
      resumed: keep the earlier run's values these metrics do not replace (what it did not
        measure again, such as a skipped phase's time); else replace the file.
    """
    path = os.path.join(output_dir, "metrics.json")
    if resumed and os.path.exists(path):
        with open(path) as f:
            metrics = dict(json.load(f), **metrics)
    write_json(path, dict(metrics), indent=2, sort_keys=True)


def _write(output_dir, name, text, mode="w"):
    """Write (or with mode 'a' append) `text` to `<output_dir>/<name>`."""
    with open(os.path.join(output_dir, name), mode) as f:
        f.write(text)


class _Run:
    """The run `run` is making: what `started` writes once the experiment has built it."""

    def __init__(self, name, output_dir, config, changes):
        self.name, self.output_dir, self.config, self.changes = name, output_dir, config, changes
        self.existed = os.path.exists(output_dir)
        self.started = False

    def start(self):
        if not self.existed and os.path.exists(self.output_dir):
            raise RuntimeError(
                f"{self.name} wrote to {self.output_dir} before harness.started(output_dir): "
                "call it once the experiment's objects are built, before anything is written")
        os.makedirs(self.output_dir, exist_ok=True)
        _write(self.output_dir, "config.gin", self.config)
        if self.changes:
            now = datetime.datetime.now().isoformat(timespec="seconds")
            _write(self.output_dir, "config_changes.txt", f"# {now}: continued with "
                   f"--allow_config_change (old -> new)\n{self.changes}\n", mode="a")
            logging.warning("config changed from the earlier run in %s (old -> new):\n%s",
                            self.output_dir, self.changes)
        logging.info("%s: writing outputs to %s", self.name, os.path.abspath(self.output_dir))
        self.started = True


_RUN: Optional[_Run] = None  # the run `run` is making now (None outside one)


def started(output_dir: str, checkpointer: Optional[Checkpointer] = None) -> int:
    """Mark the point where the experiment has built its objects: the run starts writing.

    An experiment calls it once every object is built from the bindings (so the library has
    checked them) and its checkpoint restored, before it writes anything. The first call
    of a run makes the output directory and writes `config.gin` (and, for a run continued
    with another config, appends the changes to `config_changes.txt`); an error before it
    leaves no directory, or a resumed run's as it was. `run` refuses an experiment that
    writes to its directory before this point. Outside `run` (an experiment function called
    directly) it only makes the directory.

    Args:
      output_dir: the run's output directory, or a directory inside it (a binary keeping
        one checkpoint per subdirectory); made if missing.
      checkpointer: a `train.Checkpointer` to restore first (its latest checkpoint, if any);
        None: the experiment has restored its checkpoint itself, or has none.

    Returns:
      The step the checkpoint was taken at (0: none, or no `checkpointer`).

    Raises:
      ValueError: `output_dir` is not the run's directory nor one inside it.
      CheckpointMismatchError: the checkpoint does not fit the objects (nothing is written).
      RuntimeError: the experiment wrote to a new run's directory before this call.
    """
    step = checkpointer.restore() if checkpointer is not None else 0
    current = _RUN
    if current is not None:
        top = os.path.abspath(current.output_dir)
        if os.path.commonpath([top, os.path.abspath(output_dir)]) != top:
            raise ValueError(f"harness.started: {output_dir} is not the run's output_dir "
                             f"({current.output_dir}) nor a directory inside it")
        if not current.started:
            current.start()
    os.makedirs(output_dir, exist_ok=True)
    return step


def _before_start(error, current):
    """The error an experiment raised before `started`, as `run` raises it: the library's
    refusal of a binding (a TensorFlow op error too) is a bad config, and a continued
    run's error names the bindings that changed."""
    if isinstance(error, tf.errors.OpError):
        error = ConfigError(f"{current.name} failed while building its objects, before the "
                            f"run started: {type(error).__name__}: "
                            f"{error.message.strip().splitlines()[0][:500]}")
    if current.changes and isinstance(error, (ValueError, TypeError, FileNotFoundError,
                                              ConfigError)):
        error.add_note(f"{current.output_dir} was continued with --allow_config_change and "
                       f"these bindings changed (old -> new):\n{current.changes}\nnothing in "
                       f"it was changed; continue it with its own config ({current.output_dir}"
                       "/config.gin) or use a new --output_dir")
    return error


def run(fn: Experiment, gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
        output_dir: Optional[str] = None, allow_config_change: bool = False
        ) -> Tuple[str, Optional[Dict[str, Any]]]:
    """Parse and check the config, run `fn(output_dir)`, write metrics and operative config.

    Before it runs `fn` it checks the required bindings and every bound value against its
    parameter's annotation (`hogrod.bindings`: `adam_steps: harness.Count = 2000`), and
    refuses a config other than the one `<output_dir>/config.gin` records unless
    `allow_config_change`. The directory is made, and `config.gin` written (the changes
    appended to `config_changes.txt`), when `fn` calls `started` (once its objects are
    built and its checkpoint restored), or after `fn` returns if it never wrote to it; an
    error before then leaves no directory, or a resumed run's as it was. Then
    `operative_config.gin` and `metrics.json` (a resumed run keeps the values it did not
    measure again). The config is cleared afterwards, even when the run fails: no binding
    reaches later code in the process.

    Args:
      fn: the experiment's gin configurable; an attribute `fn.check_config()`, if any, is
        called after the bindings are checked (an experiment's own cross-checks).
      gin_files: config files (see `resolve_gin_file`).
      gin_params: bindings, parsed after the files.
      output_dir: where the run writes; default runs/<fn name>/<timestamp>. A directory
        holding a checkpoint (`ckpt/`) is resumed.
      allow_config_change: continue a run whose `config.gin` records other bindings.

    Returns:
      `(output_dir, metrics)`, metrics what `fn` returned with `wall_seconds`, or None.

    Raises:
      ConfigError: a bad config, one other than the earlier run's, or a TensorFlow error
        raised before `fn` called `started` (nothing is written).
      RuntimeError: `fn` wrote to a new run's directory before calling `started`.
    """
    global _RUN
    previous = _RUN
    try:
        parse_config(list(gin_files), list(gin_params))
        check_required(fn)
        check_values()
        if callable(getattr(fn, "check_config", None)):
            fn.check_config()
        output_dir = output_dir or os.path.join(
            "runs", fn.__name__, datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        config = gin.config_str()
        changes = _changes_since(output_dir, config, allow_config_change)
        resumed = os.path.isdir(os.path.join(output_dir, "ckpt"))
        current = _RUN = _Run(fn.__name__, output_dir, config, changes)
        start = time.perf_counter()
        try:
            metrics = fn(output_dir)
        except Exception as e:  # noqa: BLE001  (re-raised, named as `run` raises it)
            if current.started:
                raise
            error = _before_start(e, current)
            if error is e:
                raise
            raise error from e
        finally:
            if current.started:
                _write(output_dir, "operative_config.gin", gin.operative_config_str())
        if not current.started:  # an experiment that writes nothing of its own
            current.start()
            _write(output_dir, "operative_config.gin", gin.operative_config_str())
        if metrics is not None:
            metrics = dict(metrics, wall_seconds=time.perf_counter() - start)
            write_metrics(output_dir, metrics, resumed)
        return output_dir, metrics
    finally:
        _RUN = previous
        with gin.unlock_config():
            gin.clear_config()


def _message(error):
    """An error's message and notes, without the lines gin adds naming the configurable
    (with its address) the error passed through."""
    text = "\n".join([str(error), *getattr(error, "__notes__", ())])
    return re.sub(r"\n\s*In call to configurable '[^']*' \(<[^>]*>\)", "", text)


def run_cli(fn: Experiment, gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
            output_dir: Optional[str] = None, show_traceback: bool = False,
            allow_config_change: bool = False) -> int:
    """`run` as a binary runs it: an error's message on stderr and an exit code.

    Args:
      fn: the experiment's gin configurable, as for `run`.
      gin_files: config files, as for `run`.
      gin_params: bindings, as for `run`.
      output_dir: where the run writes, as for `run`.
      show_traceback: re-raise a bad input's error instead of printing its message.
      allow_config_change: as for `run`.

    Returns:
      The exit code: 0 (the output directory printed on stdout), or 2 with the message of a
      bad config or of a bad input (a ValueError, TypeError or FileNotFoundError raised by
      the run, a TensorFlow error raised before the run started, or gin's RuntimeError
      naming a missing required binding) on stderr; a continued run's message names the
      bindings that changed.
    """
    try:
        output_dir, _ = run(fn, gin_files, gin_params, output_dir, allow_config_change)
    except ConfigError as e:
        if show_traceback and e.__cause__ is not None:
            raise
        print(f"{fn.__name__}: {_message(e)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        if show_traceback or (isinstance(e, RuntimeError)
                              and "Required bindings for" not in str(e)):
            raise
        print(f"{fn.__name__}: error: {_message(e)}\n(run with --verbosity=1 for the "
              "traceback)", file=sys.stderr)
        return 2
    print(f"{fn.__name__}: outputs in {os.path.abspath(output_dir)}")
    return 0


def main(fn: Experiment) -> None:
    """The absl entry point of an experiment binary: `define_flags`, then `run_cli`.

    Args:
      fn: the experiment's gin configurable.

    Raises:
      SystemExit: always, with `run_cli`'s exit code (a positional argument: a usage error).
    """
    define_flags()

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        sys.exit(run_cli(fn, FLAGS.gin_file, FLAGS.gin_param, FLAGS.output_dir,
                         show_traceback=FLAGS.verbosity >= 1,
                         allow_config_change=FLAGS.allow_config_change))

    app.run(_main)
