"""Per-example gradients of any Keras 3 model: the Jacobian of the per-example loss vector,
one vectorized (pfor) pass per batch, compiled once per call."""

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.likelihood import likelihood_of

__all__ = ["per_example_gradients", "per_example_gradient_norms", "batch_gradients"]


def batch_gradients(losses, params, tape):
    """[N, n] tensor: row i is d losses[i] / d params, flattened in `tf.nest.flatten` order.

    `losses` is a rank-1 tensor recorded on `tape` (which watched `params`); one vectorized
    Jacobian (pfor), graph-safe: call it inside a tf.function.
    """
    if losses.shape.rank != 1:
        raise ValueError(f"batch_gradients: the per-example losses must have shape [batch], "
                         f"got {losses.shape} (a reduced loss gives one summed gradient)")
    flat = tf.nest.flatten(params)
    jac = tape.jacobian(losses, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO,
                        experimental_use_pfor=True)
    rows = tf.shape(losses)[0]
    return tf.concat([tf.reshape(j, [rows, -1]) for j in jac], axis=1)


def _per_example_loss(loss_fn, where):
    """A callable (y_true, y_pred) -> [batch]: a supported Keras loss object becomes its
    per-example value at the model's dtype; other callables are taken as per-example."""
    if isinstance(loss_fn, keras.losses.Loss):
        lik, _ = likelihood_of(loss_fn, where)
        return lik.per_example
    if not callable(loss_fn):
        raise TypeError(f"{where}: loss_fn must be callable, got {type(loss_fn).__name__}")
    return loss_fn


def _compiled(model, loss_fn, params, where):
    per_example = _per_example_loss(loss_fn, where)
    params = list(checks.params(params if params is not None else model.trainable_variables,
                                where))

    @tf.function(reduce_retracing=True)
    def grads(x, y):
        with tf.GradientTape() as tape:
            losses = tf.convert_to_tensor(per_example(y, model(x, training=False)))
            if losses.shape.rank != 1:
                raise ValueError(f"{where}: loss_fn(y_true, y_pred) must return per-example "
                                 f"losses of shape [batch], got shape {losses.shape}; pass "
                                 "a Keras loss object or a per-example function")
        return batch_gradients(losses, params, tape)
    return grads


def _batches(x, y, batch_size, where):
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"{where}: batch_size must be a positive int, got {batch_size!r}")
    n = int(tf.nest.flatten(x)[0].shape[0])
    if int(tf.nest.flatten(y)[0].shape[0]) != n:
        raise ValueError(f"{where}: x has {n} examples but y has "
                         f"{int(tf.nest.flatten(y)[0].shape[0])}")
    cut = lambda t, s: tf.nest.map_structure(lambda a: a[s:s + batch_size], t)  # noqa: E731
    return [(cut(x, s), cut(y, s)) for s in range(0, n, batch_size)]


def per_example_gradients(model, loss_fn, x, y, params=None, batch_size=256):
    """[n, num_params] float64 numpy: the gradient of each example's loss (rows in example
    order; columns the flat vector of `params`, default `model.trainable_variables`).

    `loss_fn` is a Keras loss object (MeanSquaredError, [Sparse]CategoricalCrossentropy,
    BinaryCrossentropy: its per-example value, computed at the model's dtype) or a callable
    `loss_fn(y_true, y_pred)` returning per-example losses (shape [batch]). One vectorized
    Jacobian per batch of `batch_size` examples.
    """
    where = "per_example_gradients"
    grads = _compiled(model, loss_fn, params, where)
    rows = [grads(xb, yb).numpy() for xb, yb in _batches(x, y, batch_size, where)]
    return np.concatenate(rows).astype(np.float64)


def per_example_gradient_norms(model, loss_fn, x, y, params=None, batch_size=256):
    """[n] float64 numpy: the Euclidean norm of each example's loss gradient (as
    `per_example_gradients`, without returning the [n, num_params] matrix)."""
    where = "per_example_gradient_norms"
    grads = _compiled(model, loss_fn, params, where)
    norms = [tf.norm(grads(xb, yb), axis=1).numpy()
             for xb, yb in _batches(x, y, batch_size, where)]
    return np.concatenate(norms).astype(np.float64)
