"""Post-adaptation evaluation: query loss (and accuracy) after 0, 1, ... inner steps."""

import gin
import numpy as np
import tensorflow as tf

import hogrod
from hogrod.meta.common import map_tasks, task_map

__all__ = ["evaluate", "evaluator"]


@gin.configurable
def evaluator(algorithm, model, loss_fn, steps=(0, 1, 10), accuracy=False, vectorize=None):
    """`evaluate` as a reusable function of the tasks: `ev = evaluator(algo, model, loss_fn);
    ev(tasks)` traces once per step count and reuses the traces on every later call (a
    periodic evaluation). The compiled functions belong to the returned function, so a
    later evaluator with another algorithm, model or loss never sees them."""
    mode = _mode(vectorize)
    steps = tuple(steps)
    if not steps or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0
                        for s in steps):
        raise ValueError(f"evaluate.steps must be non-negative integers, got {steps!r}")

    def per_task(task, s):
        xs, ys, xq, yq = task
        fast = algorithm.adapt((xs, ys), s)
        pred = (hogrod.functional_call(model, fast, xq, training=True)
                if algorithm.predict is None else algorithm.predict(fast, xq, s))
        out = [loss_fn(yq, pred)]
        if accuracy:
            out.append(tf.reduce_mean(tf.cast(
                tf.equal(tf.argmax(pred, -1, output_type=tf.int32), tf.cast(yq, tf.int32)),
                tf.float32)))
        return tf.stack([tf.cast(v, tf.float64) for v in out])  # exact for float32 values

    compiled = {s: tf.function(lambda t, s=s: map_tasks(
        lambda task, _, __: per_task(task, s), tuple(t), mode=mode)) for s in steps}

    def run(tasks):
        results = {}
        for s in steps:
            values = compiled[s](tasks).numpy()
            names = ["loss", "accuracy"] if accuracy else ["loss"]
            for j, name in enumerate(names):
                results.update(_summary(f"{name}_after_{s}", values[:, j]))
        return results
    return run


def _mode(vectorize):
    """The evaluation's task mapping: the `task_map.mode` binding ('recomputed', which
    only matters for a gradient, evaluates sequentially), unless `vectorize` is given."""
    if vectorize is None:
        return "vectorized" if task_map() == "vectorized" else "sequential"
    if not isinstance(vectorize, bool):
        raise ValueError(f"evaluator.vectorize must be None (follow task_map.mode), True or "
                         f"False, got {vectorize!r}")
    return "vectorized" if vectorize else "sequential"


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


def evaluate(algorithm, model, loss_fn, tasks, steps=(0, 1, 10), accuracy=False,
             vectorize=None):
    """Per-step means over the tasks of a meta-batch, with 95% confidence half-widths.

    Args:
      algorithm: an `Algorithm` (its `adapt` is used, so learned rates count).
      tasks: (x_support, y_support, x_query, y_query) with a leading task axis.
      steps: numbers of adaptation steps to evaluate after.
      accuracy: also report query accuracy (classification: argmax of the outputs).
      vectorize: tf.vectorized_map over the tasks (fast for dense nets); False: tf.map_fn,
        faster for conv nets, whose filter gradient pfor runs as a while loop; None: as
        the `task_map.mode` binding says ('sequential' and 'recomputed': False).

    Returns:
      {"loss_after_{s}": mean, "loss_after_{s}_ci95": half-width, "loss_after_{s}_median",
      "loss_after_{s}_nonfinite": how many tasks gave inf or NaN, ...} as floats. One task
      that diverges makes the mean inf; the median and the count say how many did.

    Each call traces anew; to evaluate the same algorithm periodically, build
    `evaluator(algorithm, model, loss_fn, ...)` once and call it (gin binds `evaluator`'s
    arguments; its `vectorize` follows `task_map.mode` unless bound).

    Dropout is active (training=True is one flag for BatchNorm and Dropout) with the
    model's current seed state: the same masks on every call, until a meta-step advances
    the state.
    """
    return evaluator(algorithm, model, loss_fn, steps, accuracy, vectorize)(tasks)
