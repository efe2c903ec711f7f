"""A learned optimizer against Adam on held-out tasks, and the validation loss that selects
one during meta-training.

Held-out tasks are seeds ``0 .. tasks - 1`` of the "heldout" split (``[i, 0]``): no
training particle draws them (`task_seed`). Validation tasks are the same split's seeds
``[i, VALIDATION_SEED]``: never a training task either, and never a task of the
comparison, so choosing among thetas by their validation loss leaves the comparison's
tasks unseen.
"""

from typing import Callable, Dict, Sequence

import numpy as np
import tensorflow as tf

from hogrod import checks, optim, taskmap
from hogrod.learned.base import LearnedOptimizer
from hogrod.learned.tasks import TaskFamily, training_curves
from hogrod.types import Tree

__all__ = ["VALIDATION_SEED", "heldout_curves", "heldout_summary", "validation_loss"]

#: The second entry of the validation tasks' seeds (the comparison's is 0).
VALIDATION_SEED = 1


def heldout_curves(learned: LearnedOptimizer, theta: Tree, family: TaskFamily,
                   rates: Sequence[float], tasks: int, steps: int,
                   mode: str = "vectorized") -> Dict[str, np.ndarray]:
    """Each held-out task's loss on all its examples after 0..`steps` updates of the
    learned optimizer and of Adam at each rate, from the same weights and batches.

    Args:
        learned: the learned optimizer.
        theta: its parameters.
        family: the task family.
        rates: Adam's rates, each > 0.
        tasks: the held-out tasks, an int >= 1 (seeds ``0 .. tasks - 1``).
        steps: the updates, an int >= 0.
        mode: how the tasks are mapped (`hogrod.taskmap.MODES`).

    Returns:
        ``{"learned": [tasks, steps + 1], "adam_<rate:g>": ...}`` numpy arrays.

    Raises:
        ArgumentError: an argument is out of range (named).
    """
    where = "hogrod.learned.heldout_curves"
    tasks = checks.integer(tasks, "tasks", where, least=1)
    rates = [checks.positive(r, f"rates[{i}]", where) for i, r in enumerate(rates)]
    taskmap.check_task_map(mode, where)

    def curves(make):  # traced once per optimizer kind: Adam's rate is a tensor argument
        return tf.function(lambda arg: training_curves(
            make(arg), family, list(range(tasks)), steps, mode=mode), autograph=False)

    dtype = tf.nest.flatten(family.init(tf.constant([0, 0], tf.int64)))[0].dtype
    adam = curves(optim.adam)
    return {"learned": curves(learned.optimizer)(theta).numpy(),
            **{f"adam_{r:g}": adam(tf.constant(r, dtype)).numpy() for r in rates}}


def _number(x):
    x = float(x)
    return x if np.isfinite(x) else None


def heldout_summary(runs: Dict[str, np.ndarray], rates: Sequence[float], n: int) -> dict:
    """The comparison's figures from `heldout_curves` run over 2N steps: the mean losses at
    N and 2N, Adam's best rate chosen at each apart (a non-finite mean never best).

    Args:
        runs: `heldout_curves`' output, each ``[tasks, 2N + 1]``.
        rates: Adam's rates in `runs`.
        n: N.

    Returns:
        {"heldout_steps": [N, 2N], "heldout_tasks", "heldout_learned_loss": two means,
        "heldout_learned_stderr": their standard errors over the tasks (None for one task),
        "heldout_adam_best_loss", "heldout_adam_best_rate", "heldout_adam_loss": {rate:
        two means, None where not finite}, "heldout_initial_loss",
        "heldout_learned_below_adam": two bools}.
    """
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
            "heldout_adam_loss": {f"{r:g}": [_number(mean[f"adam_{r:g}"][t]) for t in at]
                                  for r in rates},
            "heldout_initial_loss": float(mean["learned"][0]),
            "heldout_learned_below_adam": [a < b for a, b in zip(mine, adam)]}


def validation_loss(learned: LearnedOptimizer, family: TaskFamily, tasks: int, n: int,
                    mode: str = "vectorized") -> Callable[[Tree], tf.Tensor]:
    """`loss(theta)`, compiled once: the mean over `tasks` validation tasks of each task's
    loss on all its examples after `n` updates of ``learned.optimizer(theta)``.

    Args:
        learned: the learned optimizer.
        family: the task family.
        tasks: the validation tasks, an int >= 1 (seeds ``[i, VALIDATION_SEED]``).
        n: the updates, an int >= 0.
        mode: how the tasks are mapped (`hogrod.taskmap.MODES`).

    Returns:
        A function of theta returning a scalar tensor.

    Raises:
        ArgumentError: an argument is out of range (named).
    """
    where = "hogrod.learned.validation_loss"
    tasks = checks.integer(tasks, "tasks", where, least=1)
    taskmap.check_task_map(mode, where)
    seeds = tf.constant([[i, VALIDATION_SEED] for i in range(tasks)], tf.int64)
    return tf.function(lambda theta: tf.reduce_mean(training_curves(
        learned.optimizer(theta), family, seeds, n, mode=mode)[:, -1]), autograph=False)
