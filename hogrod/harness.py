"""The one main of every experiment binary: absl flags + gin, Dopamine style.

An experiment is a gin-configurable function `fn(output_dir) -> dict | None`.
Its binary ends with

    def main():
        harness.main(fn)

    if __name__ == "__main__":
        main()

and is launched as a console command (`hogrod-NAME`, from pyproject.toml's
[project.scripts]) or as a module from the repository root:

    hogrod-maml --gin_file=maml/sinusoid_maml.gin --gin_param='maml.inner_lr = 0.01'
    python -m experiments.maml --gin_file=configs/maml/sinusoid_maml.gin --output_dir=runs/x

A `--gin_file` is a path as given, else a path relative to the configs shipped in the
package (`hogrod/configs/`; `configs/` at the repository root links there), where the
repository's form `configs/maml/...` also resolves, so every form works from any
directory; `include`s inside configs resolve the same way. The bindings name the
experiment function (`maml_experiment`, its gin configurable) or any configurable it uses.

The harness parses every gin file and binding once (a bad one exits with code 2 and a
message naming the binding, or the file and line), checks that the experiment's required
bindings are given (else exit 2 listing the shipped configs for it), and only then creates
the output directory, runs `fn`, writes the dict it returns, with `wall_seconds` (this
invocation's time in `fn`), to `<output_dir>/metrics.json` and the operative config (every
binding that was actually used, defaults included) to `<output_dir>/operative_config.gin`.

Re-using an output directory resumes the run: the experiment restores its checkpoint,
`read_history` gives the evaluations made up to that checkpoint (later ones are redone,
so none is listed twice), and, when the directory held a checkpoint, the new metrics update
the old `metrics.json` (a value this run did not measure, such as the training time of a
phase it skipped, is kept); otherwise (a benchmark) they replace it. JSON files are written
atomically. A finished run run again trains nothing and re-evaluates its final model.
The config must be the one the directory's `config.gin` records: another one is refused
(exit 2, naming each binding that differs, old and new value), unless
`--allow_config_change`, which continues with the new config and appends the differences
to `<output_dir>/config_changes.txt`.

A `ValueError` or `FileNotFoundError` raised by the run (bad input, named in its message)
ends the binary with that message and code 2; `--verbosity=1` shows the traceback.
"""

import datetime
import glob
import inspect
import importlib
import json
import numbers
import os
import re
import sys
import time
import tokenize

import gin
import tensorflow as tf
from absl import app, flags, logging
from gin import config_parser

import hogrod
from hogrod.train import loop as _loop  # noqa: F401  (drops TF's per-checkpoint timing line)

FLAGS = flags.FLAGS


_FLAG_DEFINITIONS = (  # (name, flag type as absl names it, define, default, help)
    ("gin_file", "multi string", flags.DEFINE_multi_string, [],
     "Gin config file (repeatable; later files override): a path, or one relative to the "
     "shipped configs (maml/sinusoid_maml.gin or configs/maml/...)."),
    ("gin_param", "multi string", flags.DEFINE_multi_string, [],
     "Gin binding, e.g. 'maml.steps = 10' (repeatable)."),
    ("output_dir", "string", flags.DEFINE_string, None,
     "Where the run writes its outputs; default runs/<experiment>/<timestamp>. Re-using a "
     "directory resumes from its last checkpoint."),
    ("allow_config_change", "bool", flags.DEFINE_boolean, False,
     "Continue a run in an --output_dir whose config.gin records other bindings (refused "
     "without this flag); the differences are appended to <output_dir>/config_changes.txt."),
)


def _define_flags(flag_values=FLAGS):
    """Define the binary's flags on absl's global FLAGS, once per process: only running a
    binary defines them (importing hogrod defines none, so a program that imports it keeps
    its flag names free), and several binaries or tests in one process share them. A flag
    of the same name but another type, defined by the program, is an error, not reused."""
    for name, flag_type, define, default, help_text in _FLAG_DEFINITIONS:
        if name not in flag_values:
            define(name, default, help_text, flag_values=flag_values)
        elif flag_values[name].flag_type() != flag_type:
            raise flags.DuplicateFlagError(
                f"--{name} is already defined as a {flag_values[name].flag_type()} flag (by "
                f"{flag_values.find_module_defining_flag(name)}); harness.main needs it as a "
                f"{flag_type} flag: rename the program's flag")


PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(PACKAGE_DIR, "configs")  # the shipped gin configs
REPO_ROOT = os.path.dirname(PACKAGE_DIR)  # the checkout, for a development install


class ConfigError(Exception):
    """A gin file or binding that cannot be used; the message names it."""


def resolve_gin_file(path):
    """The file a `--gin_file` names: the path as given, else relative to the shipped
    configs (`maml/sinusoid_maml.gin`, or the repository's form `configs/maml/...`)."""
    candidates = [path]
    if not os.path.isabs(path):
        candidates.append(os.path.join(CONFIG_DIR, path))
        if path.replace(os.sep, "/").startswith("configs/"):
            candidates.append(os.path.join(PACKAGE_DIR, path))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise ConfigError(f"gin file not found: {path} (looked in the working directory "
                      f"{os.getcwd()} and in the shipped configs {CONFIG_DIR})")


_SEARCH_PATHS = []


def _add_search_paths():
    # a shipped config's `include 'configs/maml/base.gin'` resolves wherever hogrod is installed
    for prefix in (PACKAGE_DIR, CONFIG_DIR):
        if prefix not in _SEARCH_PATHS:
            gin.add_config_file_search_path(prefix)
            _SEARCH_PATHS.append(prefix)
    # gin 0.5's reader of configs inside Python packages looks an include's folder up as a
    # package and raises TypeError, instead of trying the next search path, when that folder
    # is a namespace package (a folder on sys.path without __init__.py, such as the
    # repository's `configs` link when the repository root is on sys.path).
    readers = gin.config._FILE_READERS
    for i, (reader, exists) in enumerate(readers):
        if getattr(exists, "__module__", "") == "gin.resource_reader":
            readers[i] = (reader, _tolerant(exists))


def _tolerant(exists):
    def tolerant_exists(path):
        try:
            return exists(path)
        except TypeError:
            return False
    return tolerant_exists


class _Text:
    """A reference or macro as it is written, so bindings compare without the registry."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


class _SyntaxOnly(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return _Text(f"@{scoped_configurable_name}{'()' if evaluate else ''}")

    def macro(self, macro_name):
        return _Text(f"%{macro_name}")


def _binding_hint(binding):
    if "=" not in binding:
        return "a binding is 'configurable.parameter = value'"
    value = binding.split("=", 1)[1].strip()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?", value):
        plain = value.replace(",", "")
        return (f"write the number without thousands separators: {plain} (or "
                f"{value.replace(',', '_')}); a comma makes a tuple only in parentheses")
    if re.fullmatch(r"[A-Za-z_][\w.]*", value):
        return (f"a string needs quotes ('{value}'), a configurable an @ (@{value}), a macro "
                f"a % (%{value})")
    return ("the value must be a Python literal (2000, 1e-3, 'text', (1, 2), [1, 2], "
            "{'a': 1}, True, None), a configurable reference (@maml) or a macro (%N_WAY)")


def check_binding_syntax(binding):
    """Raise ConfigError naming `binding` and what to change if gin cannot parse it."""
    try:
        list(config_parser.ConfigParser(binding, _SyntaxOnly()))
    except (SyntaxError, tokenize.TokenError) as e:
        if isinstance(e, SyntaxError):
            lines = [line.strip() for line in str(e.msg).splitlines()
                     if "object at 0x" not in line]  # Python's ast reprs say nothing
            what = " ".join(lines).rstrip(".") + (f" (column {e.offset})" if e.offset else "")
        else:
            what = "unclosed bracket or quote"
        raise ConfigError(f"bad gin binding {binding!r}: {what}; {_binding_hint(binding)}"
                          ) from None


def parse_config(gin_files, gin_params):
    """Clear any previous config, then parse gin files and then bindings.

    Raises ConfigError naming the binding (with a hint for a malformed value) or, from
    gin, the configurable or parameter and, for files, the file and line.
    """
    _add_search_paths()
    for name in hogrod._SUBPACKAGES:  # register every library configurable before parsing
        importlib.import_module(f"hogrod.{name}")
    files = [resolve_gin_file(p) for p in gin_files]
    for binding in gin_params:
        check_binding_syntax(binding)
    try:
        with gin.unlock_config():  # a previous run in this process may have locked it
            gin.clear_config()
            gin.parse_config_files_and_bindings(files, gin_params, finalize_config=False)
    except (ValueError, KeyError, TypeError, IOError, SyntaxError) as e:
        raise ConfigError(f"bad gin config: {e}") from None


def shipped_configs(bindings):
    """The shipped configs (paths relative to CONFIG_DIR) that give any of `bindings`
    ('configurable.parameter'), themselves or through their includes; of the configs in
    subfolders (fragments such as maml/algorithms/maml.gin), only those nothing includes."""
    texts = {}
    for path in glob.glob(os.path.join(CONFIG_DIR, "**", "*.gin"), recursive=True):
        with open(path) as f:
            texts[os.path.relpath(path, CONFIG_DIR).replace(os.sep, "/")] = f.read()
    includes = {name: [re.sub(r"^configs/", "", i) for i in
                       re.findall(r"^\s*include\s+['\"]([^'\"]+)['\"]", text, re.M)]
                for name, text in texts.items()}
    keys = "|".join(re.escape(b) for b in bindings)
    binds = re.compile(rf"^\s*(?:[\w.]+/)?(?:{keys})\s*=", re.M)

    def binds_it(name, seen):
        return bool(binds.search(texts.get(name, ""))) or any(
            binds_it(i, seen | {name}) for i in includes.get(name, ()) if i not in seen)

    included = {i for names in includes.values() for i in names}
    return sorted(n for n in texts if (n.count("/") <= 1 or n not in included)
                  and binds_it(n, frozenset()))


def check_required(fn):
    """Raise ConfigError if a parameter `fn` marks `gin.REQUIRED` has no binding, naming
    it and listing the shipped configs that give it."""
    name = fn.__name__
    missing = []
    for param, spec in inspect.signature(inspect.unwrap(fn)).parameters.items():
        if spec.default is gin.REQUIRED:
            try:
                gin.query_parameter(f"{name}.{param}")
            except ValueError:
                missing.append(f"{name}.{param}")
    if missing:
        configs = shipped_configs(missing)
        listing = (f"; the shipped configs that give it (--gin_file=PATH, from any directory; "
                   f"in {CONFIG_DIR}): " + ", ".join(configs)) if configs else ""
        raise ConfigError(f"no value for the required binding(s) {', '.join(missing)}: give a "
                          f"config with --gin_file or bind it with --gin_param='{missing[0]} "
                          f"= ...'{listing}")


def _bindings(text):
    """{binding: value as written} of a gin config string, such as config.gin."""
    out = {}
    for statement in config_parser.ConfigParser(text, _SyntaxOnly()):
        if isinstance(statement, config_parser.BindingStatement):
            key = ((f"{statement.scope}/" if statement.scope else "") + statement.selector
                   + (f".{statement.arg_name}" if statement.arg_name else ""))
            out[key] = repr(statement.value)
    return out


def config_changes(old_config, new_config):
    """[(binding, old value, new value)] for every binding the two gin config strings give
    differently; None for a side that does not bind it (the default applies)."""
    old, new = _bindings(old_config), _bindings(new_config)
    return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]


def _format_changes(changes):
    unset = "(not bound: the default)"
    return "\n".join(f"  {k}: {unset if a is None else a} -> {unset if b is None else b}"
                     for k, a, b in changes)


def _check_config_change(output_dir, config, allow):
    """The changes from the config recorded in `<output_dir>/config.gin`; a ConfigError
    naming them unless `allow`."""
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


def _record_changes(output_dir, changes):
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    text = f"# {stamp}: continued with --allow_config_change (old -> new)\n"
    text += _format_changes(changes) + "\n"
    with open(os.path.join(output_dir, "config_changes.txt"), "a") as f:
        f.write(text)
    logging.warning("config changed from the earlier run in %s (old -> new):\n%s",
                    output_dir, _format_changes(changes))


def write_operative_config(output_dir):
    with open(os.path.join(output_dir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())


def write_json(path, value, **kwargs):
    """Write JSON atomically (a temporary file, then a rename): a kill mid-write leaves the
    previous file, never a truncated one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, default=float, **kwargs)
    os.replace(tmp, path)


def write_metrics(output_dir, metrics, resumed=False):
    """Write metrics.json; a resumed run keeps the earlier run's values that these metrics
    do not replace (what it did not measure again, such as a skipped phase's time)."""
    path = os.path.join(output_dir, "metrics.json")
    old = {}
    if resumed and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    write_json(path, dict(old, **metrics), indent=2, sort_keys=True)


class EvalHistory(list):
    """The evaluations of one run's `output_dir` (a list of {"step": ..., name: value}),
    owning the TensorBoard writer `record_eval` writes `<output_dir>/eval` with: one events
    file per run, closed when the history goes, never shared with another run that names
    the same (relative) directory from another working directory."""

    def __init__(self, output_dir, evaluations=()):
        super().__init__(evaluations)
        self.output_dir = os.path.abspath(output_dir)
        self._writer = None

    def writer(self):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.output_dir, "eval"))
        return self._writer


def read_history(output_dir, upto_step):
    """The evaluations earlier runs recorded in `<output_dir>/eval_history.json`, up to the
    step this run resumes from (`Checkpointer.latest_step()`), as an `EvalHistory` to give
    `record_eval`; empty for a new run."""
    path = os.path.join(output_dir, "eval_history.json")
    if not os.path.exists(path):
        return EvalHistory(output_dir)
    with open(path) as f:
        return EvalHistory(output_dir, [h for h in json.load(f) if h["step"] <= upto_step])


def record_eval(output_dir, history, result):
    """Append `result` ({"step": ..., name: value}) to `history` (replacing an evaluation
    at the same step, such as a finished run's re-evaluation), rewrite eval_history.json,
    and write its scalar values to TensorBoard (`<output_dir>/eval`).

    `history` is what `read_history(output_dir, ...)` returned (its writer keeps one events
    file for the run); a plain list also works, with an events file for each call.
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


def default_output_dir(fn):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", fn.__name__, stamp)


def run(fn, gin_files=(), gin_params=(), output_dir=None, allow_config_change=False):
    """Parse and check the config, run `fn(output_dir)`, write metrics and operative config.

    Usable from Python (tests, notebooks) as well as from `main`. Nothing is written before
    the config is valid. `allow_config_change`: continue a run whose `config.gin` records
    other bindings (see the module docstring).
    """
    try:
        return _run(fn, gin_files, gin_params, output_dir, allow_config_change)
    finally:
        with gin.unlock_config():  # the run's bindings must not reach later code
            gin.clear_config()


def _run(fn, gin_files, gin_params, output_dir, allow_config_change):
    parse_config(list(gin_files), list(gin_params))
    check_required(fn)
    output_dir = output_dir or default_output_dir(fn)
    config = gin.config_str()
    changes = _check_config_change(output_dir, config, allow_config_change)
    resumed = os.path.isdir(os.path.join(output_dir, "ckpt"))  # a checkpointed earlier run
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "config.gin"), "w") as f:
        f.write(config)
    if changes:
        _record_changes(output_dir, changes)
    logging.info("%s: writing outputs to %s", fn.__name__, os.path.abspath(output_dir))
    start = time.perf_counter()
    try:
        metrics = fn(output_dir)
    finally:
        write_operative_config(output_dir)
    if metrics is not None:
        metrics = dict(metrics, wall_seconds=time.perf_counter() - start)
        write_metrics(output_dir, metrics, resumed)
    return output_dir, metrics


def run_cli(fn, gin_files=(), gin_params=(), output_dir=None, show_traceback=False,
            allow_config_change=False):
    """`run` as a binary runs it; returns the exit code: 0, or 2 with the message of a bad
    config or of a bad input (a ValueError or FileNotFoundError raised by the run, which
    names what is wrong) on stderr, without a traceback unless `show_traceback`."""
    try:
        output_dir, _ = run(fn, gin_files, gin_params, output_dir, allow_config_change)
    except ConfigError as e:
        print(f"{fn.__name__}: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, RuntimeError) as e:
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
    """absl entry point for an experiment binary (see the module docstring): defines the
    flags `--gin_file`, `--gin_param`, `--output_dir`, `--allow_config_change` (importing
    the module defines none), parses the command line and runs `fn`."""
    _define_flags()

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        sys.exit(run_cli(fn, FLAGS.gin_file, FLAGS.gin_param, FLAGS.output_dir,
                         show_traceback=FLAGS.verbosity >= 1,
                         allow_config_change=FLAGS.allow_config_change))

    app.run(_main)
