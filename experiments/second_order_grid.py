"""Adam's and SGD-with-momentum's learning-rate grids on a short budget, one run at a time.

    python -m experiments.second_order_grid --optimizer=adam --task=autoencoder \
        --wall_seconds=60 --root=runs/grid

Each rate runs `second_order_experiment` in its own process (the same seed, initialization
and batches; `configs/second_order/<task>_<optimizer>.gin` with the rate and the budget
bound) in `<root>/<task>_<optimizer>_<rate>`; a directory that holds a finished run is
resumed, so it re-evaluates and trains nothing. The best rate is the one with the lowest
training loss averaged over the last `--window` steps (the classifier: the highest last
test accuracy). Writes `<root>/<task>_<optimizer>_grid.json` and the overlay PNG beside it,
and prints the table. Run it on a quiet machine: the runs share one wall-time budget each.
"""

import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

# Adam's rates as the comparison states them; SGD's (momentum 0.9) around autoencoder_sgd.gin's
# (the loss is a mean over pixels: rates 784 times a summed loss's)
GRIDS = {"adam": (1e-4, 3e-4, 1e-3, 3e-3), "sgd": (0.1, 0.3, 1.0, 3.0)}
KERAS = {"adam": "Adam", "sgd": "SGD"}


def grid_command(package: str, task: str, optimizer: str, rate: float, wall_seconds: float,
                 max_steps, output_dir: str) -> list:
    """The command line of one run of the grid.

    Args:
      package: the package the binaries are in (`experiments`, or `hogrod.experiments`).
      task: "autoencoder" or "classifier".
      optimizer: "adam" or "sgd".
      rate: the learning rate.
      wall_seconds: the run's training budget.
      max_steps: a step budget too (None: none).
      output_dir: the run's directory.

    Returns:
      The argv list.
    """
    params = [f"keras.optimizers.{KERAS[optimizer]}.learning_rate = {rate!r}",
              f"second_order_experiment.wall_seconds = {float(wall_seconds)!r}",
              f"second_order_experiment.max_steps = {max_steps!r}"]
    return [sys.executable, "-m", f"{package}.second_order",
            f"--gin_file=second_order/{task}_{optimizer}.gin", f"--output_dir={output_dir}",
            *[f"--gin_param={p}" for p in params]]


def score(run_dir: str, task: str, window: int) -> float:
    """A finished run's score, lower is better.

    Args:
      run_dir: the run's directory.
      task: its task.
      window: the steps the training loss is averaged over.

    Returns:
      The mean training loss of the last `window` steps (autoencoder), or minus the last
      test accuracy (classifier); inf for a run that diverged.
    """
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    if task == "classifier":
        return -metrics["test_accuracy"]
    tail = np.asarray(metrics["train_loss"][-window:], np.float64)
    return float(tail.mean()) if tail.size and np.isfinite(tail).all() else float("inf")


def main():
    """Parse the flags; run the grid; write the table, the JSON and the PNG."""
    flags.DEFINE_enum("optimizer", "adam", sorted(GRIDS), "the grid to run")
    flags.DEFINE_enum("task", "autoencoder", ["autoencoder", "classifier"], "the task")
    flags.DEFINE_float("wall_seconds", 60.0, "each run's training budget in seconds")
    flags.DEFINE_integer("max_steps", None, "each run's step budget too")
    flags.DEFINE_list("rates", None, "the rates (default: GRIDS[--optimizer])")
    flags.DEFINE_string("root", os.path.join("runs", "second_order_grid"), "where runs go")
    flags.DEFINE_integer("window", 50, "steps the final training loss is averaged over")

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        f = flags.FLAGS
        rates = [float(r) for r in f.rates] if f.rates else GRIDS[f.optimizer]
        package = __package__ or "experiments"
        runs, rows = [], []
        for rate in rates:
            run_dir = os.path.join(f.root, f"{f.task}_{f.optimizer}_{rate:g}")
            command = grid_command(package, f.task, f.optimizer, rate, f.wall_seconds,
                                   f.max_steps, run_dir)
            print(" ".join(command), flush=True)
            if subprocess.run(command).returncode != 0:
                rows.append({"rate": rate, "run": run_dir, "score": None})
                continue
            runs.append(run_dir)
            rows.append({"rate": rate, "run": run_dir, "score": score(run_dir, f.task, f.window)})
        done = [r for r in rows if r["score"] is not None]
        best = min(done, key=lambda r: r["score"]) if done else None
        name = os.path.join(f.root, f"{f.task}_{f.optimizer}_grid")
        with open(f"{name}.json", "w") as out:
            json.dump({"rows": rows, "best": best, "wall_seconds": f.wall_seconds}, out, indent=2)
        for r in rows:
            mark = " <- best" if r is best else ""
            print(f"rate {r['rate']:<8g} score {r['score']}{mark}")
        if runs:
            subprocess.run([sys.executable, "-m", f"{package}.plot_second_order",
                            f"--runs={','.join(runs)}", f"--output={name}.png"], check=False)

    app.run(_main)


if __name__ == "__main__":
    main()
