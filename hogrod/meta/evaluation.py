"""Post-adaptation evaluation: query loss (and accuracy) after 0, 1, ... inner steps."""

import gin
import numpy as np
import tensorflow as tf

import hogrod

__all__ = ["evaluate"]

_COMPILED = {}


@gin.configurable
def evaluate(algorithm, model, loss_fn, tasks, steps=(0, 1, 10), accuracy=False,
             vectorize=True):
    """Per-step means over the tasks of a meta-batch, with 95% confidence half-widths.

    Args:
      algorithm: an `Algorithm` (its `adapt` is used, so learned rates count).
      tasks: (x_support, y_support, x_query, y_query) with a leading task axis.
      steps: numbers of adaptation steps to evaluate after.
      accuracy: also report query accuracy (classification: argmax of the outputs).
      vectorize: tf.vectorized_map over the tasks (fast for dense nets); False: tf.map_fn,
        faster for conv nets, whose filter gradient pfor runs as a while loop.

    Returns:
      {"loss_after_{s}": mean, "loss_after_{s}_ci95": half-width, "loss_after_{s}_median",
      "loss_after_{s}_nonfinite": how many tasks gave inf or NaN, ...} as floats. One task
      that diverges makes the mean inf; the median and the count say how many did.
    """
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
        return tf.stack(out)

    results = {}
    for s in steps:
        key = (id(algorithm), s, accuracy, vectorize)
        if key not in _COMPILED:  # one trace per algorithm and step count, reused across calls
            _COMPILED[key] = tf.function(lambda t, s=s: (
                tf.vectorized_map(lambda task: per_task(task, s), t) if vectorize else
                tf.map_fn(lambda task: per_task(task, s), t, fn_output_signature=tf.float32)))
        values = _COMPILED[key](tasks).numpy()
        names = ["loss", "accuracy"] if accuracy else ["loss"]
        for j, name in enumerate(names):
            v = values[:, j]
            results[f"{name}_after_{s}"] = float(v.mean())
            results[f"{name}_after_{s}_ci95"] = (
                float(1.96 * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan"))
            # a diverged task (inf or NaN) ranks above every finite loss
            results[f"{name}_after_{s}_median"] = float(
                np.median(np.where(np.isfinite(v), v, np.inf)))
            results[f"{name}_after_{s}_nonfinite"] = float(np.sum(~np.isfinite(v)))
    return results
