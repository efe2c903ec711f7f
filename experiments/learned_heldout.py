"""A learned optimizer against Adam on held-out tasks, and the validation loss that selects
the learned optimizer a run reports (`experiments.learned_optimizer`)."""

import math
import os

import matplotlib
import numpy as np
import tensorflow as tf

from hogrod import learned as learned_lib
from hogrod import optim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: The validation tasks' seeds are [i, VALIDATION_SEED] of the "heldout" split: never a
#: training task (the split) and never one of the comparison's tasks (its seeds are [i, 0]).
VALIDATION_SEED = 1


def number(x):
    """A JSON number, None where not finite (metrics stay strict JSON)."""
    x = float(x)
    return x if math.isfinite(x) else None


def save_figure(fig, path):
    """Save a matplotlib figure as a PNG and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def validation_loss(learned, family, tasks, n, task_map):
    """`loss(theta)`, compiled once: the mean over `tasks` validation tasks of each task's
    loss on all its examples after `n` updates of ``learned.optimizer(theta)``."""
    seeds = tf.constant([[i, VALIDATION_SEED] for i in range(tasks)], tf.int64)
    return tf.function(lambda theta: tf.reduce_mean(learned_lib.training_curves(
        learned.optimizer(theta), family, seeds, n, mode=task_map)[:, -1]), autograph=False)


def heldout_comparison(output_dir, learned, family, theta, rates, tasks, n, title, task_map):
    """The learned optimizer against Adam at each rate on held-out tasks (seeds 0..tasks-1
    of the "heldout" split): each task's loss on all its examples after 0..2N updates
    (`hogrod.learned.training_curves`, the tasks mapped by `task_map`; saved in
    heldout_curves.npz), their means drawn in inner_curves.png. Returns `summarize`'s
    metrics."""
    def curves(make):  # traced once per optimizer kind: Adam's rate is a tensor argument
        return tf.function(lambda arg: learned_lib.training_curves(
            make(arg), family, list(range(tasks)), 2 * n, mode=task_map), autograph=False)

    dtype = tf.nest.flatten(family.init(tf.constant([0, 0], tf.int64)))[0].dtype
    adam = curves(optim.adam)
    runs = {"learned": curves(learned.optimizer)(theta).numpy(),
            **{f"adam_{r:g}": adam(tf.constant(r, dtype)).numpy() for r in rates}}
    np.savez(os.path.join(output_dir, "heldout_curves.npz"), **runs)
    metrics = summarize(runs, rates, n)
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rates:
        chosen = r in metrics["heldout_adam_best_rate"]
        ax.plot(runs[f"adam_{r:g}"].mean(0), lw=1.8 if chosen else 0.8,
                label=f"Adam {r:g}" + (" (best at N or 2N)" if chosen else ""))
    ax.plot(runs["learned"].mean(0), "k", lw=2, label="learned optimizer")
    ax.axvline(n, color="gray", ls="--", lw=0.8, label="N (meta-training horizon)")
    ax.set(yscale="log", xlabel="inner step", ylabel=f"training loss, mean of {tasks} "
           "held-out tasks")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(output_dir, "inner_curves.png"))
    return metrics


def summarize(runs, rates, n):
    """The `heldout_*` metrics of the curves `runs` ({"learned", "adam_<rate>": [tasks,
    2N + 1]}): the mean losses at N = `n` and 2N, Adam's best rate chosen at each
    separately (a non-finite mean never best)."""
    mean = {k: np.mean(v, 0) for k, v in runs.items()}
    at, tasks = (n, 2 * n), len(runs["learned"])
    best = [min(rates, key=lambda r: (not np.isfinite(mean[f"adam_{r:g}"][t]),
                                      mean[f"adam_{r:g}"][t])) for t in at]
    mine = [float(mean["learned"][t]) for t in at]
    adam = [float(mean[f"adam_{r:g}"][t]) for r, t in zip(best, at)]
    return {"heldout_steps": list(at), "heldout_tasks": tasks, "heldout_learned_loss": mine,
            "heldout_learned_stderr": [float(np.std(runs["learned"][:, t], ddof=1)
                                             / np.sqrt(tasks)) if tasks > 1 else None
                                       for t in at],
            "heldout_adam_best_loss": adam, "heldout_adam_best_rate": best,
            "heldout_adam_loss": {f"{r:g}": [number(mean[f"adam_{r:g}"][t]) for t in at]
                                  for r in rates},
            "heldout_initial_loss": float(mean["learned"][0]),
            "heldout_learned_below_adam": [a < b for a, b in zip(mine, adam)]}
