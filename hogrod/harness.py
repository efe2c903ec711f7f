"""The one main of every experiment binary: absl flags + gin, Dopamine style.

An experiment is a gin-configurable function `fn(output_dir) -> dict | None`.
Its binary ends with

    if __name__ == "__main__":
        harness.main(fn)

and is launched as

    python -m experiments.NAME --gin_file=configs/FAMILY/x.gin \
        --gin_param='FN.steps = 10' --output_dir=runs/x

where FN is the experiment function's name (`maml_experiment` in experiments/maml.py),
which is also its gin configurable. The harness parses every gin file and binding once
(a bad one exits with code 2 and gin's message, which names the configurable or parameter
and the file and line), creates the output directory, runs `fn`, writes the dict it
returns to `<output_dir>/metrics.json` and the operative config (every binding that was
actually used, defaults included) to `<output_dir>/operative_config.gin`. Gin files may
`include` each other by paths relative to the repository root.

Re-using an output directory resumes the run: the experiment restores its checkpoint,
`read_history` gives the evaluations made up to that checkpoint (later ones are redone,
so none is listed twice), and, when the directory held a checkpoint, the new metrics update
the old `metrics.json` (a value this run did not measure, such as the training time of a
phase it skipped, is kept); otherwise (a benchmark) they replace it. JSON files are written
atomically.

A `ValueError` or `FileNotFoundError` raised by the run (bad input, named in its message)
ends the binary with that message and code 2; `--verbosity=1` shows the traceback.
"""

import datetime
import json
import numbers
import os
import sys

import gin
import tensorflow as tf
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin config file (repeatable; later files override).")
flags.DEFINE_multi_string("gin_param", [], "Gin binding, e.g. 'maml.steps = 10' (repeatable).")
flags.DEFINE_string("output_dir", None,
                    "Where the run writes its outputs; default runs/<experiment>/<timestamp>. "
                    "Re-using a directory resumes from its last checkpoint.")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ConfigError(Exception):
    """A gin file or binding that cannot be used; the message names it."""


def parse_config(gin_files, gin_params):
    """Clear any previous config, then parse gin files and then bindings.

    Raises ConfigError with gin's message, which names the configurable or parameter
    and, for files, the file and line.
    """
    gin.add_config_file_search_path(REPO_ROOT)
    for path in gin_files:
        if not os.path.exists(path) and not os.path.exists(os.path.join(REPO_ROOT, path)):
            raise ConfigError(f"gin file not found: {path}")
    files = [p if os.path.exists(p) else os.path.join(REPO_ROOT, p) for p in gin_files]
    try:
        with gin.unlock_config():  # a previous run in this process may have locked it
            gin.clear_config()
            gin.parse_config_files_and_bindings(files, gin_params, finalize_config=False)
    except (ValueError, KeyError, TypeError, IOError, SyntaxError) as e:
        raise ConfigError(f"bad gin config: {e}") from None


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


def read_history(output_dir, upto_step):
    """The evaluations earlier runs recorded in `<output_dir>/eval_history.json`, up to the
    step this run resumes from (`Checkpointer.latest_step()`); [] for a new run."""
    path = os.path.join(output_dir, "eval_history.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [h for h in json.load(f) if h["step"] <= upto_step]


_EVAL_WRITERS = {}


def record_eval(output_dir, history, result):
    """Append `result` ({"step": ..., name: value}) to `history`, rewrite
    eval_history.json, and write its scalar values to TensorBoard (`<output_dir>/eval`)."""
    history.append(result)
    write_json(os.path.join(output_dir, "eval_history.json"), history)
    path = os.path.join(output_dir, "eval")
    if path not in _EVAL_WRITERS:
        _EVAL_WRITERS[path] = tf.summary.create_file_writer(path)
    with _EVAL_WRITERS[path].as_default():
        for name, value in result.items():
            if name != "step" and isinstance(value, numbers.Real):
                tf.summary.scalar(name, value, step=int(result["step"]))
    _EVAL_WRITERS[path].flush()


def default_output_dir(fn):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", fn.__name__, stamp)


def run(fn, gin_files=(), gin_params=(), output_dir=None):
    """Parse the config, run `fn(output_dir)`, write metrics and operative config.

    Usable from Python (tests, notebooks) as well as from `main`.
    """
    parse_config(list(gin_files), list(gin_params))
    output_dir = output_dir or default_output_dir(fn)
    resumed = os.path.isdir(os.path.join(output_dir, "ckpt"))  # a checkpointed earlier run
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "config.gin"), "w") as f:
        f.write(gin.config_str())
    logging.info("%s: writing outputs to %s", fn.__name__, os.path.abspath(output_dir))
    try:
        metrics = fn(output_dir)
    finally:
        write_operative_config(output_dir)
    if metrics is not None:
        write_metrics(output_dir, metrics, resumed)
    return output_dir, metrics


def run_cli(fn, gin_files=(), gin_params=(), output_dir=None, show_traceback=False):
    """`run` as a binary runs it; returns the exit code: 0, or 2 with the message of a bad
    config or of a bad input (a ValueError or FileNotFoundError raised by the run, which
    names what is wrong) on stderr, without a traceback unless `show_traceback`."""
    try:
        output_dir, _ = run(fn, gin_files, gin_params, output_dir)
    except ConfigError as e:
        print(f"{fn.__name__}: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:
        if show_traceback:
            raise
        print(f"{fn.__name__}: error: {e}\n(run with --verbosity=1 for the traceback)",
              file=sys.stderr)
        return 2
    print(f"{fn.__name__}: outputs in {os.path.abspath(output_dir)}")
    return 0


def main(fn):
    """absl entry point for an experiment binary (see the module docstring)."""

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        sys.exit(run_cli(fn, FLAGS.gin_file, FLAGS.gin_param, FLAGS.output_dir,
                         show_traceback=FLAGS.verbosity >= 1))

    app.run(_main)
