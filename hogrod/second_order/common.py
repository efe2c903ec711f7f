"""What the curvature optimizers share: the Levenberg-Marquardt damping rule, the
quadratic model's reduction ratio, Gauss-Newton products on a step's batch, and the
model-and-loss checks.

The quadratic model of the objective f at the weights theta, in a step delta, is

    m(delta) = f(theta) + g^T delta + 1/2 delta^T C delta,

C a curvature (Gauss-Newton or Fisher, plus an L2 term's). The reduction ratio of a step
is rho = (f(theta + delta) - f(theta)) / (m(delta) - f(theta)): near 1 where the model is
trusted. Levenberg-Marquardt adapts the damping lambda added to C from it (Martens 2010,
section 4.1; kfac-jax's `damping_adaptation`): rho > upper -> lambda * decay (trust the
model more), rho < lower (or not finite) -> lambda / decay, clipped to
[min_damping, max_damping].
"""

from typing import Callable, Sequence

import keras
import tensorflow as tf

from hogrod import checks, tree
from hogrod.autodiff import gnvp
from hogrod.curvature.data import batch_loss
from hogrod.curvature.per_example import batch_gradients
from hogrod.train.protocol import replica_mean
from hogrod.types import Batch, Loss, Scalar, Tensor

__all__ = ["levenberg_marquardt", "reduction_ratio", "gauss_newton_product",
           "empirical_fisher_diagonal", "split_batch",
           "check_model_and_loss", "check_decay", "value_on_batch", "stateless", "LOWER",
           "UPPER"]

LOWER, UPPER = 0.25, 0.75  # Martens 2010's thresholds on rho (kfac-jax's too)


def check_decay(value: float, arg: str, where: str) -> float:
    """A decay factor in the open interval (0, 1), as a Python float.

    Args:
      value: the value given.
      arg: its argument's name.
      where: the public function checked.

    Returns:
      `float(value)`.

    Raises:
      ArgumentError: `value` is not a number in (0, 1); the message names `arg`.
    """
    return checks.probability(value, arg, where, open_ends=True)


def levenberg_marquardt(damping: Tensor, rho: Tensor, decay: Scalar,
                        min_damping: Scalar = 0.0, max_damping: Scalar = float("inf"),
                        lower: float = LOWER, upper: float = UPPER) -> tf.Tensor:
    """The damping after a step of reduction ratio `rho` (the rule of the module docstring).

    Args:
      damping: the damping the step used, a scalar tensor.
      rho: the step's reduction ratio, a scalar tensor of `damping`'s dtype (NaN or inf:
        the model failed, the damping grows).
      decay: the factor in (0, 1) applied on a good step (its inverse on a bad one).
      min_damping: the least damping (>= 0).
      max_damping: the largest damping.
      lower: below this rho, the damping grows.
      upper: above this rho, the damping shrinks.

    Returns:
      The new damping, a scalar tensor of `damping`'s dtype.
    """
    damping = tf.convert_to_tensor(damping)
    dtype = damping.dtype
    rho = tf.cast(rho, dtype)
    decay = tf.cast(decay, dtype) if isinstance(decay, (tf.Tensor, tf.Variable)) \
        else tf.constant(decay, dtype)
    good = tf.logical_and(tf.math.is_finite(rho), rho > tf.constant(upper, dtype))
    bad = tf.logical_or(tf.logical_not(tf.math.is_finite(rho)), rho < tf.constant(lower, dtype))
    new = tf.where(good, damping * decay, tf.where(bad, damping / decay, damping))
    return tf.clip_by_value(new, tf.constant(min_damping, dtype), tf.constant(max_damping, dtype))


def reduction_ratio(new_value: Tensor, old_value: Tensor, model_change: Tensor) -> tf.Tensor:
    """rho = (f(theta + delta) - f(theta)) / (m(delta) - f(theta)).

    Args:
      new_value: f at the new weights.
      old_value: f at the old weights.
      model_change: the quadratic model's change m(delta) - f(theta) (negative for a
        descent step).

    Returns:
      rho, a scalar tensor; NaN when the model predicts no change (then the damping
      grows: `levenberg_marquardt` treats a non-finite rho as a failed step).
    """
    model_change = tf.convert_to_tensor(model_change)
    change = tf.cast(new_value, model_change.dtype) - tf.cast(old_value, model_change.dtype)
    return tf.where(model_change < 0, change / tf.where(model_change < 0, model_change, -1.0),
                    tf.constant(float("nan"), model_change.dtype))


def stateless() -> keras.StatelessScope:
    """The scope of an optimizer's extra pass through the model or the objective: the
    step's own pass has updated the model's state (BatchNorm moving statistics, random
    layers' seeds) once, an extra pass writes none of it.

    Losses a layer adds while called (an activity regularizer's) are collected in the scope,
    so `model.losses` read inside it holds them, as outside. (A weight regularizer's
    `model.losses` fails inside any `keras.StatelessScope` that does not map its weight.)

    Returns:
      A `keras.StatelessScope` to enter.
    """
    return keras.StatelessScope(collect_losses=True)


def split_batch(batch: Batch, where: str):
    """A step's batch as (x, y): the convention of the optimizers that take a model and a
    loss (Keras's `(inputs, targets)`).

    Args:
      batch: the step's batch.
      where: the public optimizer, named in the message.

    Returns:
      `(x, y)`.

    Raises:
      ValueError: `batch` is not a pair.
    """
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ValueError(f"{where}: the train step's batch must be a pair (x, y) for an "
                         f"optimizer built from a model and a loss, got {checks.describe(batch)}")
    return batch[0], batch[1]


def gauss_newton_product(model: keras.Model, loss: Loss, batch: Batch,
                         variables: Sequence[tf.Variable], vector: Sequence[Tensor],
                         where: str) -> list:
    """The Gauss-Newton matrix of `mean(loss(y, model(x)))` on the step's batch times
    `vector`, averaged over the replicas (the global batch's), in `stateless()`:
    the model's state (BatchNorm moving statistics, random layers' seeds) is not written.

    Args:
      model: the model (called with `training=True`, as in the objective).
      loss: a Keras loss `loss(y_true, y_pred)`, convex in the outputs.
      batch: this replica's `(x, y)`.
      variables: the variables the product is over.
      vector: one tensor per variable.
      where: the public optimizer, named in messages.

    Returns:
      A list of tensors like `vector`.
    """
    x, y = split_batch(batch, where)
    with stateless():  # an extra pass: BatchNorm statistics, seeds not written
        product = gnvp(lambda: model(x, training=True), lambda z: batch_loss(loss, y, z),
                       list(variables), list(vector))
    return replica_mean(product)


def empirical_fisher_diagonal(model: keras.Model, per_example: Callable, batch: Batch,
                              variables: Sequence[tf.Variable], chunk: int,
                              where: str) -> list:
    """The empirical Fisher's diagonal on the step's batch: the mean over its examples of
    each per-example gradient squared, averaged over the replicas, in `stateless()`.

    Args:
      model: the model (called with `training=True`, as in the objective).
      per_example: ``per_example(y, z) -> [n]`` losses (`curvature.likelihood`'s
        `per_example_loss`).
      batch: this replica's `(x, y)`.
      variables: the variables.
      chunk: examples per vectorized per-example gradient pass.
      where: the public optimizer, named in messages.

    Returns:
      One tensor per variable, at the variables' dtype.
    """
    x, y = split_batch(batch, where)
    n = tf.shape(tf.nest.flatten(x)[0])[0]
    size = sum(v.shape.num_elements() for v in variables)
    dtype = variables[0].dtype

    def body(i, total):
        part = lambda t: t[i:i + chunk]  # noqa: E731
        xs, ys = tf.nest.map_structure(part, x), tf.nest.map_structure(part, y)
        with tf.GradientTape() as tape, stateless():  # an extra pass: no state written
            losses = tf.convert_to_tensor(per_example(ys, model(xs, training=True)))
        rows = batch_gradients(losses, list(variables), tape)
        return i + chunk, total + tf.reduce_sum(tf.square(tf.cast(rows, dtype)), 0)

    _, total = tf.while_loop(lambda i, total: i < n, body,
                             (tf.constant(0), tf.zeros([size], dtype)))
    mean = total / tf.cast(n, dtype)
    return replica_mean(tree.unflatten(mean, [tf.convert_to_tensor(v) for v in variables]))


def check_model_and_loss(model: keras.Model, loss: Loss, where: str) -> None:
    """A built Keras model with trainable variables and a callable loss.

    Args:
      model: the model.
      loss: the loss `loss(y_true, y_pred)`.
      where: the public optimizer, named in the messages.

    Raises:
      ValueError: `model` is not a built `keras.Model` or has no trainable variables.
      TypeError: `loss` is not callable.
    """
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"{where}: model must be a built keras.Model, got {model!r}")
    if not model.trainable_variables:
        raise ValueError(f"{where}: model '{model.name}' has no trainable variables")
    checks.function(loss, "loss", where, "loss(y_true, y_pred)")


def value_on_batch(loss: Callable[[Batch], Tensor], batch: Batch) -> tf.Tensor:
    """The objective on this replica's batch, averaged over the replicas, evaluated in
    `stateless()`: an extra pass writes no model state (BatchNorm moving
    statistics, random layers' seeds).

    Args:
      loss: the step's `loss(batch)`.
      batch: this replica's batch.

    Returns:
      The global batch's objective, a scalar.
    """
    with stateless():
        value = loss(batch)
    return replica_mean(value)
