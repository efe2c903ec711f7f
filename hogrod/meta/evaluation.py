"""Post-adaptation evaluation: query loss (and accuracy) after 0, 1, ... inner steps.

Random layers (Dropout) are active, as in training (`training=True` is one flag for
BatchNorm and Dropout), and get fresh masks the way training does: every task and every
forward pass of a task (each adaptation step, the query) its own; at 0 steps `adapt` gets
one seed too, for a pass over the support an algorithm makes without adaptation steps (the
few-shot heads embed the support set). The masks come from the evaluation's `seed` and the
task's index (`hogrod.meta.inner.evaluation_seeds`), not from the model's seed states,
which evaluation neither reads nor advances: the same seed
reproduces an evaluation exactly, and tasks that happen to be identical are still
evaluated independently. BatchNorm uses each batch's own statistics (transductive), unless
the algorithm predicts otherwise (`Algorithm.predict`).
"""

import functools
from typing import Callable, Dict, Sequence

import gin
import keras
import numpy as np
import tensorflow as tf

from hogrod import checks, taskmap
from hogrod.meta.common import Algorithm, Tasks, check_loss, pass_seed
from hogrod.meta.inner import evaluation_seeds, run
from hogrod.types import Loss

__all__ = ["evaluate", "evaluator"]


@gin.configurable
def evaluator(algorithm: Algorithm, model: keras.Model, loss: Loss,
              steps: Sequence[int] = (0, 1, 10), accuracy: bool = False,
              task_map: str = "vectorized", seed: int = 0
              ) -> Callable[[Tasks], Dict[str, float]]:
    """`evaluate` as a reusable function of the tasks, traced once per step count.

    `ev = evaluator(algo, model, loss); ev(tasks)` traces once per step count and reuses
    the traces on every later call (a periodic evaluation). The compiled functions belong
    to the returned function, so a later evaluator with another algorithm, model or loss
    never sees them. The arguments are checked here, as `evaluate` checks them.

    Args:
      algorithm: an `Algorithm`, as for `evaluate`.
      model: the model it was built on.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      steps: numbers of adaptation steps to evaluate after (a non-empty sequence of
        integers >= 0).
      accuracy: also report query accuracy, as for `evaluate`.
      task_map: 'vectorized', 'sequential' or 'recomputed', as for `evaluate`.
      seed: the evaluation's integer seed for random layers (>= 0).

    Returns:
      `ev(tasks) -> dict of floats`, as `evaluate` returns.

    Raises:
      hogrod.checks.ArgumentError: an argument of the wrong type or out of range, named.
    """
    where = "hogrod.meta.evaluate"
    if not isinstance(algorithm, Algorithm):
        raise checks.ArgumentError(f"{where}: algorithm must be a hogrod.meta Algorithm (e.g. "
                                   f"meta.maml(model, loss)), got {type(algorithm).__name__}")
    check_loss(loss, where)
    steps = checks.counts(steps, "steps", where)
    if not isinstance(accuracy, bool):
        raise checks.ArgumentError(f"{where}: accuracy must be True or False, got "
                                   f"{accuracy!r}")
    # 'recomputed' only saves memory in a backward pass; an evaluation has none
    recomputed = taskmap.check_task_map(task_map, where) == "recomputed"
    mode = "sequential" if recomputed else task_map
    seed = checks.seed(seed, "seed", where)

    def per_task(task, seeds, s):
        xs, ys, xq, yq = task
        # at 0 steps, one seed for a pass over the support before the query (the
        # few-shot heads embed the support set), drawn after the query's
        fast = algorithm.adapt((xs, ys), s,
                               pass_seed(seeds, 0, s) if s else pass_seed(seeds, 1, 2))
        query_seed = pass_seed(seeds, s)
        pred = (run(model, fast, xq, True, query_seed) if algorithm.predict is None
                else algorithm.predict(fast, xq, s, query_seed))
        out = [loss(yq, pred)]
        if accuracy:
            out.append(tf.reduce_mean(tf.cast(
                tf.equal(tf.argmax(pred, -1, output_type=tf.int32), tf.cast(yq, tf.int32)),
                tf.float32)))
        return tf.stack([tf.cast(v, tf.float64) for v in out])  # exact for float32 values

    def evaluate_after(tasks, s):
        # the adaptation steps, then the query: s + 1 passes per task (2 at 0 steps)
        seeds = evaluation_seeds(model, tf.shape(tasks[0])[0], s + 1 if s else 2, seed)
        return taskmap.map_tasks(lambda task, sd, _: per_task(task, sd, s), tasks, seeds,
                                 mode=mode)

    def after(tasks, s):
        return evaluate_after(tuple(tasks), s)

    # partials: TF keys its retracing warning on a function's code object, so one lambda
    # traced per step count and per `evaluate` call would read as one function retraced
    compiled = {s: tf.function(functools.partial(after, s=s)) for s in steps}

    def run_evaluation(tasks):
        results = {}
        for s in steps:
            values = compiled[s](tuple(tasks)).numpy()
            names = ["loss", "accuracy"] if accuracy else ["loss"]
            for j, name in enumerate(names):
                results.update(_summary(f"{name}_after_{s}", values[:, j]))
        return results
    return run_evaluation


def _summary(name, v):
    """Mean, 95% half-width, median and the count of non-finite values of per-task values."""
    return {
        name: float(v.mean()),
        f"{name}_ci95": (float(1.96 * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1
                         else float("nan")),
        # a diverged task (inf or NaN) ranks above every finite loss
        f"{name}_median": float(np.median(np.where(np.isfinite(v), v, np.inf))),
        f"{name}_nonfinite": float(np.sum(~np.isfinite(v))),
    }


def evaluate(algorithm: Algorithm, model: keras.Model, loss: Loss, tasks: Tasks,
             steps: Sequence[int] = (0, 1, 10), accuracy: bool = False,
             task_map: str = "vectorized", seed: int = 0) -> Dict[str, float]:
    """Per-step means over the tasks of a meta-batch, with 95% confidence half-widths.

    Each task is adapted with `algorithm.adapt` (so learned rates count) and its query
    loss taken, with Dropout masks fresh per task and per pass, drawn from `seed` and the
    task's index (see the module docstring): the same seed gives the same result.
    Each call traces anew; to evaluate the same algorithm periodically, build
    `evaluator(algorithm, model, loss, ...)` once and call it.

    Args:
      algorithm: an `Algorithm`.
      model: the model it was built on.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      tasks: (x_support, y_support, x_query, y_query) with a leading task axis.
      steps: numbers of adaptation steps to evaluate after (a non-empty sequence of
        integers >= 0).
      accuracy: also report query accuracy (classification: argmax of the outputs).
      task_map: 'vectorized' (`tf.vectorized_map` over the tasks, fast for dense nets);
        'sequential' (`tf.map_fn`: less memory, a faster trace, faster for conv nets,
        whose filter gradient pfor runs as a while loop); 'recomputed' evaluates
        sequentially.
      seed: the evaluation's integer seed for random layers (>= 0).

    Returns:
      {"loss_after_{s}": mean, "loss_after_{s}_ci95": half-width, "loss_after_{s}_median",
      "loss_after_{s}_nonfinite": how many tasks gave inf or NaN, ...} as floats, and the
      same four for "accuracy_after_{s}" with `accuracy`. One task that diverges makes the
      mean inf; the median and the count say how many did.

    Raises:
      hogrod.checks.ArgumentError: an argument of the wrong type or out of range, named.
    """
    return evaluator(algorithm, model, loss, steps, accuracy, task_map, seed)(tasks)
