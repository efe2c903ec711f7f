"""Running experiment binaries in subprocesses and summarising results over seeds: what the
benchmark drivers share (`pinnacle_deepxde`, `pinnacle_table`, `navigation2d_baselines`), since binaries never
import one another (`tests/test_configs.py`).

A binary runs as a user runs it, `python -m experiments.<name> --gin_file=... --gin_param=...
--output_dir=...`, in its own process (its gin bindings and TensorFlow state stay there);
its metrics come back from `<output_dir>/metrics.json`.
"""

import ast
import json
import math
import os
import subprocess
import sys

from hogrod import harness

__all__ = ["run_binary", "run_pinn_binary", "finished_metrics", "config_bindings",
           "seconds_per_step", "seed_stats", "agree_within_spread"]


def run_binary(module, gin_files, gin_params, output_dir):
    """`python -m <module>` with these configs and `--output_dir`; its metrics.json."""
    if not isinstance(module, str) or not module.startswith("experiments."):
        raise ValueError(f"module must name a binary experiments.<name>, got {module!r}")
    argv = ([sys.executable, "-m", module] + [f"--gin_file={f}" for f in gin_files]
            + [f"--gin_param={p}" for p in gin_params]
            + [f"--output_dir={os.path.abspath(output_dir)}"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [harness.REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=harness.REPO_ROOT)
    if out.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited with code {out.returncode}:\n"
                           f"{out.stderr[-3000:]}")
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return json.load(f)


def run_pinn_binary(gin_files, gin_params, output_dir):
    """`python -m experiments.pinn` (see `run_binary`)."""
    return run_binary("experiments.pinn", gin_files, gin_params, output_dir)


def config_bindings(text):
    """{binding: Python value} of a gin config string (values as literals; a reference
    such as @mlp_network stays its string)."""
    out = {}
    for key, _, value in harness.config_changes("", text):
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def finished_metrics(output_dir, expected=None):
    """The metrics of a finished run in `output_dir` (its metrics.json), None when it has
    none (not started, or stopped before the end: a re-run resumes it).

    expected: {binding: value} the run's recorded config (`config.gin`) must give; a
    finished run with other values is an error (its numbers are not the ones asked for)."""
    path = os.path.join(output_dir, "metrics.json")
    if not os.path.exists(path):
        return None
    if expected:
        config = os.path.join(output_dir, "config.gin")
        if not os.path.exists(config):
            raise ValueError(f"{output_dir} holds metrics.json but no config.gin: cannot tell "
                             "which run it is; remove the directory or use another output_dir")
        with open(config) as f:
            got = config_bindings(f.read())
        wrong = {k: got.get(k) for k, v in expected.items() if got.get(k) != v}
        if wrong:
            raise ValueError(f"the finished run in {output_dir} has {wrong}, not "
                             f"{ {k: expected[k] for k in wrong} }: remove the directory or "
                             "use another output_dir")
    with open(path) as f:
        return json.load(f)


def seconds_per_step(metrics, n1):
    """Seconds per Adam step between step n1 and the last step on an experiments.pinn
    run's curve (`error_history`: training clock, evaluations not counted; the curve leaves
    out the final step)."""
    clock = {int(step): seconds for seconds, phase, step, _ in metrics["error_history"]
             if phase == "adam"}
    last = max(clock, default=0)
    if n1 not in clock or last <= n1:
        raise ValueError(f"the run's error_history needs Adam step {n1} and a later one, got "
                         f"{sorted(clock)}")
    return (clock[last] - clock[n1]) / (last - n1)


def seed_stats(values):
    """{"mean", "std" (sample, ddof 1; 0 for one value), "min", "max", "n"} of the
    per-seed values."""
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"seed_stats needs one or more finite values, got {values}")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}


def agree_within_spread(a, b):
    """Whether two methods' per-seed values agree within seed spread: their means differ
    by at most the sum of their sample standard deviations (with one seed each, never,
    unless equal)."""
    sa, sb = seed_stats(a), seed_stats(b)
    return abs(sa["mean"] - sb["mean"]) <= sa["std"] + sb["std"]
