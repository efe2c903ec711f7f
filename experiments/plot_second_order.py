"""Overlay the training curves of several `second_order_experiment` runs in one PNG.

    python -m experiments.plot_second_order --runs=runs/ae_kfac,runs/ae_adam,runs/ae_sgd \
        --output=autoencoder.png [--labels=K-FAC,Adam,SGD]

Each run's metrics.json gives its training loss per step (`train_loss`) and its training
clock (`train_wall_seconds`); eval_history.json its held-out metrics. The PNG has the training
loss against steps and against training seconds (log scale), and the held-out metric (test
accuracy for the classifier, test loss for the autoencoder) against training seconds. A
table of each run's steps, seconds, final and best training loss goes to stdout.
"""

import json
import os
import sys
from typing import Optional, Sequence

import matplotlib
import numpy as np
from absl import app, flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(run_dir: str) -> dict:
    """A run's curves: `train_loss`, `train_wall_seconds`, `task`, `history`.

    Args:
      run_dir: a `second_order_experiment` output directory.

    Returns:
      Its metrics.json as a dict, with the evaluations of eval_history.json as `history`.

    Raises:
      FileNotFoundError: the directory holds no metrics.json (the run has not finished an
        invocation).
      ValueError: its metrics.json is not a second_order_experiment's.
    """
    path = os.path.join(run_dir, "metrics.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: --runs takes the output directories "
                                "of finished second_order_experiment runs")
    with open(path) as f:
        metrics = json.load(f)
    if "train_wall_seconds" not in metrics:
        raise ValueError(f"{path} has no train_wall_seconds: not a second_order_experiment run")
    history = os.path.join(run_dir, "eval_history.json")
    if os.path.exists(history):
        with open(history) as f:
            metrics["history"] = json.load(f)
    return metrics


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """The running mean over the last `window` values (fewer at the start).

    Args:
      values: a curve.
      window: the window (1: the curve itself).

    Returns:
      The smoothed curve, as long as `values`.
    """
    values = np.asarray(values, np.float64)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def plot_comparison(run_dirs: Sequence[str], output: str,
                    labels: Optional[Sequence[str]] = None, window: int = 20) -> list:
    """Write the comparison PNG of `run_dirs` to `output`; return one summary row per run.

    Args:
      run_dirs: the runs' output directories.
      output: the PNG's path.
      labels: one legend label per run (default: each run's optimizer and directory name).
      window: the training losses are averaged over this many steps (1: raw).

    Returns:
      [(label, steps, train seconds, final smoothed loss, best smoothed loss)].

    Raises:
      ValueError: `labels` does not give one label per run, or the runs mix tasks.
    """
    runs = [read_run(d) for d in run_dirs]
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"--labels gives {len(labels)} labels for {len(runs)} --runs")
    tasks = {r.get("task") for r in runs}
    if len(tasks) > 1:
        raise ValueError(f"--runs mixes tasks {sorted(map(str, tasks))}: compare one task")
    labels = labels or [f"{r.get('optimizer', '?')} ({os.path.basename(os.path.normpath(d))})"
                        for r, d in zip(runs, run_dirs)]
    metric = "test_accuracy" if tasks == {"classifier"} else "test_loss"
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    rows = []
    for run, label in zip(runs, labels):
        loss = smooth(run["train_loss"], window)
        steps = np.arange(1, len(loss) + 1)
        axes[0].plot(steps, loss, lw=1, label=label)
        axes[1].plot(run["train_wall_seconds"], loss, lw=1, label=label)
        points = [(h["seconds"], h[metric]) for h in run.get("history", []) if metric in h]
        if points:
            axes[2].plot(*zip(*points), "o-", ms=3, label=label)
        rows.append((label, len(loss), run["train_wall_seconds"][-1] if len(loss) else 0.0,
                     loss[-1] if len(loss) else float("nan"),
                     loss.min() if len(loss) else float("nan")))
    for ax, xlabel, ylabel in ((axes[0], "step", "training loss"),
                               (axes[1], "training seconds", "training loss"),
                               (axes[2], "training seconds", metric.replace("_", " "))):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    for ax in axes[:2]:
        ax.set_yscale("log")
    axes[0].set_title(f"training loss (mean of {window} steps)")
    fig.tight_layout()
    fig.savefig(output, dpi=90)
    plt.close(fig)
    return rows


def main():
    """Parse --runs, --labels, --output and --window; plot and print the table."""
    flags.DEFINE_list("runs", None, "the runs' output directories, comma-separated")
    flags.DEFINE_list("labels", None, "one legend label per run (default: optimizer and dir)")
    flags.DEFINE_string("output", "second_order_comparison.png", "the PNG to write")
    flags.DEFINE_integer("window", 20, "average the training losses over this many steps")
    flags.mark_flag_as_required("runs")

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        f = flags.FLAGS
        try:
            rows = plot_comparison(f.runs, f.output, f.labels, f.window)
        except (ValueError, FileNotFoundError) as e:
            print(f"plot_second_order: error: {e}", file=sys.stderr)
            sys.exit(2)
        print(f"{'run':40s} {'steps':>7s} {'seconds':>8s} {'final':>10s} {'best':>10s}")
        for label, steps, seconds, final, best in rows:
            print(f"{label[:40]:40s} {steps:7d} {seconds:8.1f} {final:10.4g} {best:10.4g}")
        print(f"wrote {f.output}")

    app.run(_main)


if __name__ == "__main__":
    main()
