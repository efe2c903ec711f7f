"""Input attribution: the seeds' `tape.watch` on inputs, as two functions.

`target` picks the scalar per example to explain: an int (a class/output index, the same
for every example), an int tensor of shape [batch] (one index per example), or None (the
model's output is already one scalar per example).
"""

import tensorflow as tf

__all__ = ["saliency", "integrated_gradients"]


def _score(model, x, target):
    out = model(x)
    if target is None:
        if out.shape.rank > 1 and out.shape[-1] != 1:
            raise ValueError(f"target=None needs one output per example, got shape {out.shape}")
        return tf.reshape(out, [tf.shape(out)[0]])
    target = tf.convert_to_tensor(target)
    if target.shape.rank == 0:
        return out[:, target]
    return tf.gather(out, tf.cast(target, tf.int32), axis=1, batch_dims=1)


def saliency(model, x, target=None):
    """d score / d x for each example: the gradient of the target output w.r.t. the input."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        score = _score(model, x, target)
    return tape.gradient(score, x)


def integrated_gradients(model, x, baseline=None, target=None, steps=64):
    """Integrated gradients (Sundararajan et al. 2017), trapezoidal rule over `steps` intervals.

    (x - baseline) * mean over the path of d score / d x. Completeness: the attributions of
    an example sum to score(x) - score(baseline), up to the quadrature error.
    """
    x = tf.convert_to_tensor(x)
    baseline = tf.zeros_like(x) if baseline is None else tf.cast(baseline, x.dtype)
    alphas = tf.linspace(tf.constant(0.0, x.dtype), 1.0, steps + 1)
    weights = tf.concat([[0.5], tf.ones([steps - 1], x.dtype), [0.5]], 0) / steps
    batch = tf.shape(x)[0]
    # All path points of all examples in one batch: [(steps + 1) * batch, ...].
    expand = [-1] + [1] * (x.shape.rank - 1)
    path = baseline[None] + tf.reshape(alphas, [-1, 1] + expand[1:]) * (x - baseline)[None]
    flat = tf.reshape(path, tf.concat([[-1], tf.shape(x)[1:]], 0))
    tiled = None if target is None else tf.convert_to_tensor(target)
    if tiled is not None and tiled.shape.rank == 1:
        tiled = tf.tile(tiled, [steps + 1])
    grads = tf.reshape(saliency(model, flat, tiled), tf.shape(path))
    avg = tf.tensordot(weights, grads, axes=[[0], [0]])
    del batch
    return (x - baseline) * avg
