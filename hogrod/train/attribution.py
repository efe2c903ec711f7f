"""Input attribution: the seeds' `tape.watch` on inputs, as two functions.

`target` picks the scalar per example to explain: an int (a class/output index, the same
for every example), an int tensor of shape [batch] (one index per example), or None (the
model's output is already one scalar per example).
"""

from typing import Callable, Optional

import tensorflow as tf

from hogrod.types import TensorLike

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


def saliency(model: Callable[[tf.Tensor], tf.Tensor], x: TensorLike,
             target: Optional[int | TensorLike] = None) -> tf.Tensor:
    """d score / d x for each example: the gradient of the target output w.r.t. the input.

    Example i's score depends only on its own input row, so one gradient of the summed
    scores gives every example's gradient.

    Args:
      model: a Keras model or callable from a batch [batch, ...] to outputs
        [batch, outputs] (or [batch] with `target=None`).
      x: the inputs, [batch, ...], a float dtype.
      target: the output to explain: an int (the same output index for every example),
        an int tensor [batch] (one index per example), or None (the model gives one
        scalar per example, [batch] or [batch, 1]).

    Returns:
      The gradients, x's shape and dtype.

    Raises:
      ValueError: `target` is None and the model gives more than one output per example.
    """
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        score = _score(model, x, target)
    return tape.gradient(score, x)


def integrated_gradients(model: Callable[[tf.Tensor], tf.Tensor], x: TensorLike,
                         baseline: Optional[TensorLike] = None,
                         target: Optional[int | TensorLike] = None,
                         steps: int = 64) -> tf.Tensor:
    """Integrated gradients (Sundararajan et al. 2017), trapezoidal rule over `steps` intervals.

    ``(x - baseline) * mean over the path of d score / d x``, the path the straight line
    from `baseline` to `x`. Completeness: the attributions of an example sum to
    ``score(x) - score(baseline)``, up to the quadrature error. The ``steps + 1`` path points
    of every example go through the model as one batch of ``(steps + 1) * batch`` rows.

    Args:
      model: a Keras model or callable from a batch [batch, ...] to outputs
        [batch, outputs] (or [batch] with `target=None`).
      x: the inputs, [batch, ...], a float dtype.
      baseline: the path's start, x's shape (cast to x's dtype); None: zeros.
      target: the output to explain, as in `saliency`: an int, an int tensor [batch], or
        None (one scalar output per example).
      steps: the number of trapezoidal intervals along the path, >= 1.

    Returns:
      The attributions, x's shape and dtype.

    Raises:
      ValueError: `target` is None and the model gives more than one output per example.
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
