"""Curvature matrices of a loss as `tf.linalg.LinearOperator`s: Hessian and Gauss-Newton.

Every operator of this package is built the same way, `Operator(model, loss, data, *,
params=None, strategy=None, ...)`: a Keras model, a Keras loss `loss(y_true, y_pred)` (its
batch reduction says whether the curvature is of the mean or the sum over `data`) and one
`(x, y)` batch or a `tf.data.Dataset` of them. The one alternative for an arbitrary
objective is a class method: `HessianOperator.from_objective(objective, params, data)`
for `objective(batch) -> scalar` (a mean over the batch), and
`GaussNewtonOperator.from_output_loss(outputs, output_loss, params, data)` for outputs
`z = outputs(batch)` and a loss of them `output_loss(z, batch)`.

The operators act on flat vectors (all params flattened row-major and concatenated in
`tf.nest.flatten` order, the order `hogrod.hessian` uses), so `tf.linalg` solvers and the
estimators of this package work on them. Data is one batch or a `tf.data.Dataset` of
batches; over a data set the product is the mean over examples (each batch weighted by its
size). Each product is one compiled HVP per batch; `num_matvecs` counts them, so the cost
of an estimator is measurable.

With `strategy=` (a `tf.distribute.Strategy`), each batch of the data set is split over the
replicas: every replica computes the product on its shard, weighted by its size, and the
sums are all-reduced, so the product equals the single-device one.
"""

from typing import Any, Callable, List, Optional

import keras
import numpy as np
import tensorflow as tf

from hogrod import autodiff, checks, tree
from hogrod.curvature.data import (MEAN_REDUCTIONS, BatchPasses, batch_loss, batch_size,
                                   check_data, check_loss_dtype, distribute_batches,
                                   model_params, params_dtype, replica_sums)
from hogrod.types import Batch, DType, Loss, Objective, OutputLoss, Params, Tensor, TensorLike, Tree

__all__ = ["CurvatureOperator", "HessianOperator", "GaussNewtonOperator", "layer_params",
           "loss_is_mean"]


def layer_params(model: keras.Model, layer_name: str) -> List[tf.Variable]:
    """The trainable variables of one layer, for the per-layer (diagonal block) operators.

    Pass them as `params=` to an operator of this package: it is then the layer's diagonal
    block of the curvature over `model.trainable_variables`.

    Args:
      model: a Keras model holding the layer.
      layer_name: the layer's name (`model.get_layer(layer_name)`; an unknown name raises
        Keras's ValueError).

    Returns:
      The layer's trainable variables, in the layer's order (kernel before bias).

    Raises:
      ArgumentError: the layer has no trainable variables.
    """
    layer = model.get_layer(layer_name)
    if not layer.trainable_variables:
        raise checks.ArgumentError(f"layer_params: layer '{layer_name}' has no trainable "
                                   "variables")
    return layer.trainable_variables


def loss_is_mean(loss: Loss) -> bool:
    """Whether a Keras loss averages over the batch (anything but reduction "sum").

    Args:
      loss: a Keras loss object or function.
    Returns:
      False for a `keras.losses.Loss` with reduction "sum", else True.
    """
    return not (isinstance(loss, keras.losses.Loss) and loss.reduction == "sum")


def _keras_objective(model: keras.Model, loss: Loss, where: str) -> OutputLoss:
    """`batch -> loss(y, model(x))` of an `(x, y)` batch, checked."""
    if not isinstance(model, keras.Model):
        raise checks.ArgumentError(f"{where}: model must be a keras.Model, got "
                                   f"{type(model).__name__}")
    checks.function(loss, "loss", where, "Keras loss(y_true, y_pred)")
    if isinstance(loss, keras.losses.Loss) and loss.reduction not in MEAN_REDUCTIONS + ("sum",):
        raise checks.ArgumentError(f"{where}: loss has reduction={loss.reduction!r}; the "
                                   "curvature needs 'sum_over_batch_size' (a mean) or 'sum'")
    return lambda z, batch: batch_loss(loss, batch[1], z)


def _operator_dtype(dtype: Optional[DType], params: List[Tensor], where: str) -> tf.DType:
    """The operator's dtype: `dtype`, or the parameters' one; floating."""
    dtype = params_dtype(params, where) if dtype is None else tf.as_dtype(dtype)
    if not dtype.is_floating:
        raise checks.ArgumentError(f"{where}: dtype must be a floating dtype (float32 or "
                                   f"float64), got {dtype.name}")
    return dtype


class CurvatureOperator(tf.linalg.LinearOperator):
    """The base of the data-driven operators: flat vectors in and out; each batch's product
    weighted by its size (a mean objective) or not (a sum), summed over the batches (and
    replicas, `data.replica_sums`), and divided once by the global count for a mean.

    Args:
      product: `product(batch, v) -> tree like params`, the curvature of one batch's
        objective (its mean over the batch, or its sum when `mean` is False) times `v`.
      params: the variables (a flat list).
      data: one batch or a `tf.data.Dataset` of batches.
      dtype: the operator's dtype, or None for the parameters'.
      name: the public function building it, named in errors.
      strategy: None or a `tf.distribute.Strategy`.
      mean: whether the objective is a mean over the examples.
      **hints: `tf.linalg.LinearOperator` hints.
    """

    def __init__(self, product: Callable[[Batch, Tree], Tree], params: List[Tensor],
                 data: Batch, dtype: Optional[DType], name: str,
                 strategy: Optional[tf.distribute.Strategy] = None, mean: bool = True,
                 **hints: Any) -> None:
        check_data(data, name)
        dtype = _operator_dtype(dtype, params, name)
        self._params = list(tf.nest.flatten(params))
        self._n = sum(int(np.prod(p.shape)) for p in self._params)
        self._single = not isinstance(data, tf.data.Dataset)
        # one batch: itself (refused under a strategy); a Dataset: passes from one iterator
        self._data = (distribute_batches(data, strategy, name) if self._single
                      else BatchPasses(data, strategy, name))
        self._mean = mean
        self.num_matvecs = 0
        params_ = self._params

        def weighted_product(batch, vector):  # (size * product or product, size) of a batch
            v = tree.unflatten(tf.cast(vector, params_[0].dtype), params_)
            size = tf.cast(batch_size(batch), dtype)
            out = tree.flatten(product(batch, v), dtype)
            return (size * out if mean else out), size

        product_sums = replica_sums(weighted_product, strategy)
        self._batch_product = lambda vector, batch: product_sums(batch, vector)
        super().__init__(dtype=dtype, is_self_adjoint=True, is_square=True,
                         name=type(self).__name__, **hints)

    def _shape(self):
        return tf.TensorShape([self._n, self._n])

    def _shape_tensor(self):
        return tf.constant([self._n, self._n])

    def matvec_flat(self, vector: TensorLike) -> tf.Tensor:
        """The product with one flat vector.

        Args:
          vector: a vector of length n (converted to this operator's dtype).

        Returns:
          The product, a tensor of length n at this operator's dtype.
        """
        self.num_matvecs += 1
        vector = tf.convert_to_tensor(vector, self.dtype)
        if self._single:
            total, count = self._batch_product(vector, self._data)
        else:
            total, count = tf.zeros([self._n], self.dtype), tf.zeros([], self.dtype)
            for batch in self._data:
                part, size = self._batch_product(vector, batch)
                total, count = total + part, count + size
        return total / count if self._mean else total

    def _matmul(self, x, adjoint=False, adjoint_arg=False):
        x = tf.linalg.adjoint(x) if adjoint_arg else x
        cols = [self.matvec_flat(x[:, j]) for j in range(x.shape[-1])]
        return tf.stack(cols, axis=1)

    def to_dense(self) -> tf.Tensor:
        """The dense matrix, one product per column (small operators only).

        Returns:
          A [n, n] tensor at this operator's dtype.
        """
        return self._matmul(tf.eye(self._n, dtype=self.dtype))


class HessianOperator(CurvatureOperator):
    """H = d^2/dparams^2 of the loss of `model` over `data`.

    The loss of an `(x, y)` batch is `loss(y, model(x, training=False))`; over a data set
    the Hessian of the mean over every example (a batch-mean loss, Keras's default) or of
    the sum (reduction "sum").

    Args:
      model: a built Keras model, called as `model(x, training=False)`.
      loss: a Keras loss `loss(y_true, y_pred)` (any; a `keras.losses.Loss` must compute at
        the model's dtype and have reduction "sum_over_batch_size" (a mean) or "sum").
      data: one `(x, y)` batch or a `tf.data.Dataset` of them.
      params: the variables (default None: `model.trainable_variables`); a subset of the
        model's, e.g. one layer's (`layer_params`), for that diagonal block.
      strategy: a `tf.distribute.Strategy` to split each batch of `data` (then a Dataset)
        over; default None, one device.
      dtype: the operator's dtype (default None: the parameters'); vectors are cast to
        theirs for the product.
      mode: the `hogrod.hvp` mode, "auto" or one of `hogrod.autodiff.HVP_MODES`.

    Raises:
      ArgumentError: `model` is not a Keras model, `loss` not callable or of another
        reduction or dtype, `data` not `(x, y)` batches, `params` not variables of one
        floating dtype, `strategy` or `mode` invalid.
    """

    def __init__(self, model: keras.Model, loss: Loss, data: Batch, *,
                 params: Optional[Params] = None,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 dtype: Optional[DType] = None, mode: str = "auto") -> None:
        where = "HessianOperator"
        output_loss = _keras_objective(model, loss, where)
        params = model_params(model, params, where)
        check_loss_dtype(loss, params_dtype(params, where), where)
        check_data(data, where, pair=True)
        self._build(lambda batch: output_loss(model(batch[0], training=False), batch), params,
                    data, dtype, mode, strategy, loss_is_mean(loss))

    @classmethod
    def from_objective(cls, objective: Objective, params: Params, data: Batch, *,
                       strategy: Optional[tf.distribute.Strategy] = None,
                       dtype: Optional[DType] = None, mode: str = "auto") -> "HessianOperator":
        """The Hessian of an arbitrary objective.

        Args:
          objective: `objective(batch) -> scalar`, the mean over the batch's examples (the
            kind `make_train_step` minimizes); over a data set the operator is the Hessian of
            the mean over every example (each batch weighted by its size).
          params: variables / tensors (nested structure) differentiated, of one floating
            dtype.
          data: one batch (any structure of tensors) or a `tf.data.Dataset` of batches.
          strategy: a `tf.distribute.Strategy` to split each batch of `data` (then a
            Dataset) over; default None, one device.
          dtype: the operator's dtype (default None: the parameters').
          mode: the `hogrod.hvp` mode, "auto" or one of `hogrod.autodiff.HVP_MODES`.

        Returns:
          A `HessianOperator` on the flat vector of `params`.

        Raises:
          ArgumentError: `objective` not callable, `params`, `data`, `strategy` or `mode`
            invalid.
        """
        where = "HessianOperator.from_objective"
        checks.function(objective, "objective", where, "objective(batch) -> scalar")
        op = object.__new__(cls)
        op._build(objective, checks.params(params, where), data, dtype, mode, strategy, True,
                  where)
        return op

    def _build(self, objective: Objective, params: Params, data: Batch,
               dtype: Optional[DType], mode: str, strategy: Optional[tf.distribute.Strategy],
               mean: bool, where: str = "HessianOperator") -> None:
        """Checks `mode` and initializes the operator with `objective`'s HVP."""
        if mode != "auto" and mode not in autodiff.HVP_MODES:
            raise checks.ArgumentError(f"{where}: mode must be 'auto' or one of "
                                       f"{autodiff.HVP_MODES}, got {mode!r}")
        flat = list(tf.nest.flatten(params))
        product = lambda batch, v: autodiff.hvp(lambda: objective(batch), flat, v,  # noqa
                                                mode=mode)
        CurvatureOperator.__init__(self, product, flat, data, dtype, where, strategy, mean)


class GaussNewtonOperator(CurvatureOperator):
    """G = J^T H_L J: the Gauss-Newton matrix of the loss of `model` over `data`.

    J is the Jacobian of the model output z = `model(x, training=False)` and H_L the Hessian
    of the loss in z; positive semi-definite for losses convex in the output (MSE,
    cross-entropy on logits). Mean or sum over `data` as the loss's reduction says.

    Args:
      model: a built Keras model, called as `model(x, training=False)`.
      loss: a Keras loss `loss(y_true, y_pred)`, convex in `y_pred` for a PSD matrix (a
        `keras.losses.Loss` must compute at the model's dtype and have reduction
        "sum_over_batch_size" (a mean) or "sum").
      data: one `(x, y)` batch or a `tf.data.Dataset` of them.
      params: the variables (default None: `model.trainable_variables`); a subset of the
        model's, e.g. one layer's (`layer_params`), for that diagonal block.
      strategy: a `tf.distribute.Strategy` to split each batch of `data` (then a Dataset)
        over; default None, one device.
      dtype: the operator's dtype (default None: the parameters').

    Raises:
      ArgumentError: as for `HessianOperator`.
    """

    def __init__(self, model: keras.Model, loss: Loss, data: Batch, *,
                 params: Optional[Params] = None,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 dtype: Optional[DType] = None) -> None:
        where = "GaussNewtonOperator"
        output_loss = _keras_objective(model, loss, where)
        params = model_params(model, params, where)
        check_loss_dtype(loss, params_dtype(params, where), where)
        check_data(data, where, pair=True)
        self._build(lambda batch: model(batch[0], training=False), output_loss, params, data,
                    dtype, strategy, loss_is_mean(loss), where)

    @classmethod
    def from_output_loss(cls, outputs: Callable[[Batch], Tree], output_loss: OutputLoss,
                         params: Params, data: Batch, *,
                         strategy: Optional[tf.distribute.Strategy] = None,
                         dtype: Optional[DType] = None) -> "GaussNewtonOperator":
        """The Gauss-Newton matrix of an arbitrary output loss.

        Args:
          outputs: `outputs(batch) -> z`, the outputs the loss is convex in (e.g. logits).
          output_loss: `output_loss(z, batch) -> scalar`, the mean over the batch's examples:
            the outputs FIRST, then the whole batch (read the labels from it).
          params: variables / tensors (nested structure) differentiated, of one floating
            dtype.
          data: one batch (any structure) or a `tf.data.Dataset` of batches.
          strategy: a `tf.distribute.Strategy` to split each batch of `data` (then a
            Dataset) over; default None, one device.
          dtype: the operator's dtype (default None: the parameters').

        Returns:
          A `GaussNewtonOperator` on the flat vector of `params`.

        Raises:
          ArgumentError: `outputs` or `output_loss` not callable, `params`, `data` or
            `strategy` invalid.
        """
        where = "GaussNewtonOperator.from_output_loss"
        checks.function(outputs, "outputs", where, "outputs(batch) -> z")
        checks.function(output_loss, "output_loss", where, "output_loss(z, batch) -> scalar")
        op = object.__new__(cls)
        op._build(outputs, output_loss, checks.params(params, where), data, dtype, strategy,
                  True, where)
        return op

    def _build(self, outputs: Callable[[Batch], Tree], output_loss: OutputLoss, params: Params,
               data: Batch, dtype: Optional[DType],
               strategy: Optional[tf.distribute.Strategy], mean: bool, where: str) -> None:
        """Initializes the operator with the Gauss-Newton-vector product of `outputs`."""
        flat = list(tf.nest.flatten(params))
        product = lambda batch, v: autodiff.gnvp(  # noqa: E731
            lambda: outputs(batch), lambda z: output_loss(z, batch), flat, v)
        CurvatureOperator.__init__(self, product, flat, data, dtype, where, strategy, mean,
                                    is_non_singular=None)
