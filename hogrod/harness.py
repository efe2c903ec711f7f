"""The one main of every experiment binary: absl flags + gin, Dopamine style.

An experiment is a gin-configurable function `fn(output_dir) -> dict | None`; its binary
ends with `def main(): harness.main(fn)` and runs as a console command or a module:

    hogrod-maml --gin_file=maml/sinusoid_maml.gin --gin_param='maml.inner_lr = 0.01'
    python -m experiments.maml --gin_file=configs/maml/sinusoid_maml.gin --output_dir=runs/x

A `--gin_file`, and every `include` inside one, is a path as given, else one relative to the
configs shipped in the package (`hogrod/configs/`; the repository's form `configs/maml/...`
too), so every form works from any directory. Before it creates the output directory the
harness parses the config, checks the required bindings and every bound value against its
parameter's annotation (`hogrod.bindings`: `adam_steps: harness.Count = 2000`), and refuses
a config other than the one `<output_dir>/config.gin` records (a resumed run) unless
`--allow_config_change` (recorded in `config_changes.txt`); each failure exits with code 2
and a message naming the binding, or the file and line, without a traceback. It then runs
`fn`, writes the dict it returns with `wall_seconds` to `metrics.json` (a resumed run keeps
the values it did not measure again) and the operative config. A `ValueError` or
`TypeError` raised by the run (a bad input, named in its message) also exits 2 with that
message; `--verbosity=1` shows the traceback.
"""

import datetime
import importlib
import json
import os
import re
import sys
import time
import tokenize

import gin
from absl import app, flags, logging
from gin import config_parser

from hogrod.bindings import (ConfigError, Count, Fraction, Named, NonNegative, Positive,
                             PositiveInt, Range, check_required, check_values, statements)
from hogrod.train.history import write_json

__all__ = ["main", "run", "run_cli", "parse_config", "resolve_gin_file", "config_changes",
           "write_metrics", "define_flags", "ConfigError", "Range", "Count", "PositiveInt",
           "Positive", "NonNegative", "Fraction"]

FLAGS = flags.FLAGS
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(PACKAGE_DIR, "configs")  # the shipped gin configs
REPO_ROOT = os.path.dirname(PACKAGE_DIR)  # the checkout, for a development install
# the library's packages whose configurables a config may bind (imported before parsing)
LIBRARY = ("train", "meta", "gan", "pinn", "curvature", "distribute", "optim", "implicit",
           "hypergrad")


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


def define_flags(flag_values=FLAGS):
    """Define the binary's flags once per process (importing hogrod defines none).

    Args:
      flag_values: the absl `FlagValues` to define them on.
    Returns:
      None.
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


def resolve_gin_file(path):
    """The file a `--gin_file` or an `include` names.

    Args:
      path: as given, else relative to the shipped configs (`maml/sinusoid_maml.gin` or
        the repository's form `configs/maml/...`).
    Returns:
      The path of an existing file.
    Raises:
      ConfigError: no such file.
    """
    candidates = [path] + ([] if os.path.isabs(path) else [
        os.path.join(CONFIG_DIR, path), os.path.join(PACKAGE_DIR, path)])
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise ConfigError(f"gin file not found: {path} (looked in the working directory "
                      f"{os.getcwd()} and in the shipped configs {CONFIG_DIR})")


def _binding_hint(binding):
    if "=" not in binding:
        return "a binding is 'configurable.parameter = value'"
    value = binding.split("=", 1)[1].strip()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?", value):
        return (f"write the number without thousands separators: {value.replace(',', '')} "
                f"(or {value.replace(',', '_')}); a comma makes a tuple only in parentheses")
    if re.fullmatch(r"[A-Za-z_][\w.]*", value):
        return (f"a string needs quotes ('{value}'), a configurable an @ (@{value}), a macro "
                f"a % (%{value})")
    return ("the value must be a Python literal (2000, 1e-3, 'text', (1, 2), [1, 2], "
            "{'a': 1}, True, None), a configurable reference (@maml) or a macro (%N_WAY)")


def _check_syntax(binding):
    try:
        statements(binding)
    except (SyntaxError, tokenize.TokenError) as e:
        if isinstance(e, SyntaxError):
            lines = [line.strip() for line in str(e.msg).splitlines()
                     if "object at 0x" not in line]  # Python's ast reprs say nothing
            what = " ".join(lines).rstrip(".") + (f" (column {e.offset})" if e.offset else "")
        else:
            what = "unclosed bracket or quote"
        raise ConfigError(f"bad gin binding {binding!r}: {what}; {_binding_hint(binding)}"
                          ) from None


def _parse_file(path, including=()):
    """Parse a gin file, resolving its includes here (gin's own search would first ask its
    package reader, which logs an error for every include it cannot import as a package)."""
    if path in including:
        raise ConfigError(f"{path} includes itself (through {' -> '.join(including)})")
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    start = 0
    for statement in statements("".join(lines), path):
        if isinstance(statement, config_parser.IncludeStatement):
            end = statement.location.line_num - 1
            gin.parse_config(Named("\n" * start + "".join(lines[start:end]), path))
            try:
                included = resolve_gin_file(statement.filename)
            except ConfigError as e:
                raise ConfigError(f"{e}; included in {path}, line {end + 1}") from None
            _parse_file(included, including + (path,))
            start = end + 1
    gin.parse_config(Named("\n" * start + "".join(lines[start:]), path))


def parse_config(gin_files, gin_params):
    """Clear any previous config, then parse gin files and then bindings.

    Args:
      gin_files: paths (see `resolve_gin_file`), later ones overriding.
      gin_params: binding strings, parsed last.
    Returns:
      None.
    Raises:
      ConfigError: naming the binding (with a hint for a malformed value), or the
        configurable or parameter and, for files, the file and line.
    """
    for name in LIBRARY:  # register every library configurable before parsing
        importlib.import_module(f"hogrod.{name}")
    files = [resolve_gin_file(p) for p in gin_files]
    for binding in gin_params:
        _check_syntax(binding)
    try:
        with gin.unlock_config():  # a previous run in this process may have locked it
            gin.clear_config()
            for path in files:
                _parse_file(path)
            gin.parse_config(list(gin_params))
    except (ValueError, KeyError, TypeError, IOError, SyntaxError) as e:
        raise ConfigError(f"bad gin config: {e}") from None


def config_changes(old_config, new_config):
    """The bindings two gin config strings give differently.

    Args:
      old_config: a config string (such as a run's config.gin).
      new_config: another.
    Returns:
      [(binding, old value, new value)] as written; None for a side that does not bind it.
    """
    def bindings(text):
        return {(f"{s.scope}/" if s.scope else "") + s.selector
                + (f".{s.arg_name}" if s.arg_name else ""): repr(s.value)
                for s in statements(text) if isinstance(s, config_parser.BindingStatement)}
    old, new = bindings(old_config), bindings(new_config)
    return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]


def _format_changes(changes):
    unset = "(not bound: the default)"
    return "\n".join(f"  {k}: {unset if a is None else a} -> {unset if b is None else b}"
                     for k, a, b in changes)


def _config_change(output_dir, config, allow):
    """The changes from `<output_dir>/config.gin`; a ConfigError naming them unless `allow`."""
    path = os.path.join(output_dir, "config.gin")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = f.read()
    try:
        changes = config_changes(old, config)
    except SyntaxError as e:
        raise ConfigError(f"cannot read {path}, the config of the run in {output_dir}: "
                          f"{e.msg}; use a new --output_dir") from None
    if changes and not allow:
        raise ConfigError(
            f"{output_dir} holds a run with another config ({path}); these bindings "
            f"differ (old -> new):\n{_format_changes(changes)}\nUse a new --output_dir, the "
            "same config, or --allow_config_change to continue this run with the new one "
            "(recorded in config_changes.txt).")
    return changes


def write_metrics(output_dir, metrics, resumed=False):
    """Write `<output_dir>/metrics.json` atomically.

    Args:
      output_dir: the run's directory.
      metrics: a JSON-able dict.
      resumed: keep the earlier run's values these metrics do not replace (what it did not
        measure again, such as a skipped phase's time); else replace the file.
    Returns:
      None.
    """
    path = os.path.join(output_dir, "metrics.json")
    old = {}
    if resumed and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    write_json(path, dict(old, **metrics), indent=2, sort_keys=True)


def run(fn, gin_files=(), gin_params=(), output_dir=None, allow_config_change=False):
    """Parse and check the config, run `fn(output_dir)`, write metrics and operative config.

    Args:
      fn: the experiment's gin configurable.
      gin_files: config files (see `resolve_gin_file`).
      gin_params: bindings, parsed after the files.
      output_dir: where the run writes; default runs/<fn name>/<timestamp>.
      allow_config_change: continue a run whose `config.gin` records other bindings.
    Returns:
      (output_dir, metrics) where metrics is what `fn` returned with `wall_seconds`, or None.
    Raises:
      ConfigError: a bad config (nothing is written).
    """
    try:
        parse_config(list(gin_files), list(gin_params))
        check_required(fn)
        check_values()
        if callable(getattr(fn, "check_config", None)):  # an experiment's own cross-checks
            fn.check_config()
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        output_dir = output_dir or os.path.join("runs", fn.__name__, stamp)
        config = gin.config_str()
        changes = _config_change(output_dir, config, allow_config_change)
        resumed = os.path.isdir(os.path.join(output_dir, "ckpt"))  # a checkpointed earlier run
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "config.gin"), "w") as f:
            f.write(config)
        if changes:
            with open(os.path.join(output_dir, "config_changes.txt"), "a") as f:
                f.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')}: continued "
                        f"with --allow_config_change (old -> new)\n{_format_changes(changes)}\n")
            logging.warning("config changed from the earlier run in %s (old -> new):\n%s",
                            output_dir, _format_changes(changes))
        logging.info("%s: writing outputs to %s", fn.__name__, os.path.abspath(output_dir))
        start = time.perf_counter()
        try:
            metrics = fn(output_dir)
        finally:
            with open(os.path.join(output_dir, "operative_config.gin"), "w") as f:
                f.write(gin.operative_config_str())
        if metrics is not None:
            metrics = dict(metrics, wall_seconds=time.perf_counter() - start)
            write_metrics(output_dir, metrics, resumed)
        return output_dir, metrics
    finally:
        with gin.unlock_config():  # the run's bindings must not reach later code
            gin.clear_config()


def run_cli(fn, gin_files=(), gin_params=(), output_dir=None, show_traceback=False,
            allow_config_change=False):
    """`run` as a binary runs it.

    Args:
      fn, gin_files, gin_params, output_dir, allow_config_change: as for `run`.
      show_traceback: re-raise a bad input's error instead of printing its message.
    Returns:
      The exit code: 0, or 2 with the message of a bad config or of a bad input (a
      ValueError, TypeError or FileNotFoundError raised by the run) on stderr.
    """
    try:
        output_dir, _ = run(fn, gin_files, gin_params, output_dir, allow_config_change)
    except ConfigError as e:
        print(f"{fn.__name__}: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        # gin's RuntimeError for a nested configurable's missing REQUIRED binding names it
        if show_traceback or (isinstance(e, RuntimeError)
                              and "Required bindings for" not in str(e)):
            raise
        print(f"{fn.__name__}: error: {e}\n(run with --verbosity=1 for the traceback)",
              file=sys.stderr)
        return 2
    print(f"{fn.__name__}: outputs in {os.path.abspath(output_dir)}")
    return 0


def main(fn):
    """The absl entry point of an experiment binary: defines the flags (`define_flags`),
    parses the command line and exits with `run_cli`'s code.

    Args:
      fn: the experiment's gin configurable.
    Returns:
      Never; exits the process.
    """
    define_flags()

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        sys.exit(run_cli(fn, FLAGS.gin_file, FLAGS.gin_param, FLAGS.output_dir,
                         show_traceback=FLAGS.verbosity >= 1,
                         allow_config_change=FLAGS.allow_config_change))

    app.run(_main)
