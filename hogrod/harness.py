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
"""

import datetime
import json
import os
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import gin
import keras
from absl import app, flags, logging

from hogrod.bindings import (PACKAGE_DIR, ConfigError, Count, Fraction, NonNegative, Positive,
                             PositiveInt, Range, check_required, check_values, config_changes,
                             format_changes, parse_config, resolve_gin_file)
from hogrod.train.history import write_json

__all__ = ["main", "run", "run_cli", "parse_config", "resolve_gin_file", "config_changes",
           "write_metrics", "define_flags", "ConfigError", "Range", "Count", "PositiveInt",
           "Positive", "NonNegative", "Fraction"]

FLAGS = flags.FLAGS
# Keras's learning-rate schedules, for any binary's rate binding (e.g.
# `pinn_experiment.adam_lr = @ExponentialDecay()`, `maml_experiment.meta_lr =
# @PiecewiseConstantDecay()`); registered here, once per process, for every binary.
for _schedule in (keras.optimizers.schedules.ExponentialDecay,
                  keras.optimizers.schedules.PolynomialDecay,  # power 1: linear decay
                  keras.optimizers.schedules.PiecewiseConstantDecay,
                  keras.optimizers.schedules.CosineDecay):
    gin.external_configurable(_schedule, module="keras")
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


def run(fn: Experiment, gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
        output_dir: Optional[str] = None, allow_config_change: bool = False
        ) -> Tuple[str, Optional[Dict[str, Any]]]:
    """Parse and check the config, run `fn(output_dir)`, write metrics and operative config.

    Before it creates `output_dir` it checks the required bindings and every bound value
    against its parameter's annotation (`hogrod.bindings`: `adam_steps: harness.Count =
    2000`), and refuses a config other than the one `<output_dir>/config.gin` records
    unless `allow_config_change` (then the changes are appended to `config_changes.txt`).
    It writes `config.gin`, `operative_config.gin` and `metrics.json` (a resumed run keeps
    the values it did not measure again). The config is cleared afterwards, even when the
    run fails: no binding reaches later code in the process.

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
      ConfigError: a bad config, or one other than the earlier run's (nothing is written).
    """
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
        os.makedirs(output_dir, exist_ok=True)
        _write(output_dir, "config.gin", config)
        if changes:
            now = datetime.datetime.now().isoformat(timespec="seconds")
            _write(output_dir, "config_changes.txt", f"# {now}: continued with "
                   f"--allow_config_change (old -> new)\n{changes}\n", mode="a")
            logging.warning("config changed from the earlier run in %s (old -> new):\n%s",
                            output_dir, changes)
        logging.info("%s: writing outputs to %s", fn.__name__, os.path.abspath(output_dir))
        start = time.perf_counter()
        try:
            metrics = fn(output_dir)
        finally:
            _write(output_dir, "operative_config.gin", gin.operative_config_str())
        if metrics is not None:
            metrics = dict(metrics, wall_seconds=time.perf_counter() - start)
            write_metrics(output_dir, metrics, resumed)
        return output_dir, metrics
    finally:
        with gin.unlock_config():
            gin.clear_config()


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
      the run, or gin's RuntimeError naming a missing required binding) on stderr.
    """
    try:
        output_dir, _ = run(fn, gin_files, gin_params, output_dir, allow_config_change)
    except ConfigError as e:
        print(f"{fn.__name__}: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        if show_traceback or (isinstance(e, RuntimeError)
                              and "Required bindings for" not in str(e)):
            raise
        print(f"{fn.__name__}: error: {e}\n(run with --verbosity=1 for the traceback)",
              file=sys.stderr)
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
