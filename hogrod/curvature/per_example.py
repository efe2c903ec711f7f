"""Per-example gradients of any Keras 3 model: the Jacobian of the per-example loss vector,
one vectorized (pfor) pass per batch, compiled once per call."""

from typing import Callable, Optional

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import compile_closure, split_arrays
from hogrod.curvature.likelihood import per_example_loss
from hogrod.types import Loss, Params, Tree

__all__ = ["per_example_gradients", "per_example_gradient_norms", "batch_gradients",
           "gradient_rows"]


def batch_gradients(losses: tf.Tensor, params: Params, tape: tf.GradientTape) -> tf.Tensor:
    """The gradient of each entry of `losses`: one vectorized Jacobian (pfor).

    Graph-safe: call it inside a tf.function.

    Args:
      losses: a rank-1 tensor [N] recorded on `tape`.
      params: the variables or tensors differentiated (watched by `tape`).
      tape: the tape `losses` was recorded on.

    Returns:
      An [N, n] tensor: row i is d losses[i] / d params, flattened in `tf.nest.flatten`
      order (zeros where a parameter is unconnected).

    Raises:
      ValueError: `losses` is not rank 1.
    """
    if losses.shape.rank != 1:
        raise ValueError(f"batch_gradients: the per-example losses must have shape [batch], "
                         f"got {losses.shape} (a reduced loss gives one summed gradient)")
    flat = tf.nest.flatten(params)
    jac = tape.jacobian(losses, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO,
                        experimental_use_pfor=True)
    rows = tf.shape(losses)[0]
    return tf.concat([tf.reshape(j, [rows, -1]) for j in jac], axis=1)


def gradient_rows(model: keras.Model, loss: Loss, params: Optional[Params],
                  where: str) -> Callable[[Tree, Tree], tf.Tensor]:
    """The compiled per-example gradients of `model` under `loss`.

    Args:
      model: a Keras 3 model, called as `model(x, training=False)`.
      loss: a supported Keras loss object or a per-example `loss(y_true, y_pred) -> [batch]`
        (`likelihood.per_example_loss`).
      params: the variables (default `model.trainable_variables`).
      where: the public function checked.

    Returns:
      A tf.function `(x, y) -> [batch, num_params]` (`batch_gradients`' rows).
    """
    per_example = per_example_loss(loss, where)
    params = list(checks.params(params if params is not None else model.trainable_variables,
                                where))

    def grads(x, y):
        with tf.GradientTape() as tape:
            losses = tf.convert_to_tensor(per_example(y, model(x, training=False)))
            if losses.shape.rank != 1:
                raise ValueError(f"{where}: loss(y_true, y_pred) must return per-example "
                                 f"losses of shape [batch], got shape {losses.shape}; pass "
                                 "a Keras loss object or a per-example function")
        return batch_gradients(losses, params, tape)
    return compile_closure(grads)


def per_example_gradients(model: keras.Model, loss: Loss, x: Tree, y: Tree,
                          params: Optional[Params] = None, batch_size: int = 256) -> np.ndarray:
    """The gradient of each example's loss, as the rows of a float64 numpy matrix.

    Rows in example order; columns the flat vector of `params` (default
    `model.trainable_variables`). One vectorized Jacobian per batch of `batch_size`
    examples.

    Args:
      model: a Keras 3 model, called as `model(x, training=False)`.
      loss: a Keras loss object (MeanSquaredError, [Sparse]CategoricalCrossentropy,
        BinaryCrossentropy: its per-example value, computed at the model's dtype) or a
        callable `loss(y_true, y_pred)` returning per-example losses (shape [batch]).
      x: inputs (a structure of arrays or tensors), one leading example dimension n.
      y: labels, with as many examples.
      params: the variables (default None: `model.trainable_variables`).
      batch_size: examples per vectorized Jacobian (an int >= 1).

    Returns:
      float64 numpy [n, num_params].

    Raises:
      ArgumentError: `batch_size` below 1, or `x` and `y` of different lengths.
      ValueError: `loss` does not return per-example losses [batch].
    """
    where = "per_example_gradients"
    grads = gradient_rows(model, loss, params, where)
    rows = [grads(xb, yb).numpy() for xb, yb in split_arrays(x, y, batch_size, where)]
    return np.concatenate(rows).astype(np.float64)


def per_example_gradient_norms(model: keras.Model, loss: Loss, x: Tree, y: Tree,
                               params: Optional[Params] = None,
                               batch_size: int = 256) -> np.ndarray:
    """The Euclidean norm of each example's loss gradient.

    As `per_example_gradients`, without returning the [n, num_params] matrix (the norms are
    taken batch by batch).

    Args:
      model: a Keras 3 model, called as `model(x, training=False)`.
      loss: a supported Keras loss object or a per-example `loss(y_true, y_pred) ->
        [batch]`, as for `per_example_gradients`.
      x: inputs (a structure of arrays or tensors), one leading example dimension n.
      y: labels, with as many examples.
      params: the variables (default None: `model.trainable_variables`).
      batch_size: examples per vectorized Jacobian (an int >= 1).

    Returns:
      float64 numpy [n].

    Raises:
      ArgumentError: `batch_size` below 1, or `x` and `y` of different lengths.
      ValueError: `loss` does not return per-example losses [batch].
    """
    where = "per_example_gradient_norms"
    grads = gradient_rows(model, loss, params, where)
    norms = [tf.norm(grads(xb, yb), axis=1).numpy()
             for xb, yb in split_arrays(x, y, batch_size, where)]
    return np.concatenate(norms).astype(np.float64)
