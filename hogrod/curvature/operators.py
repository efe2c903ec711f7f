"""Curvature matrices of a loss as `tf.linalg.LinearOperator`s: Hessian and Gauss-Newton.

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

import numpy as np
import tensorflow as tf

import hogrod
from hogrod import checks, tree
from hogrod.curvature.data import (batch_size, check_data, distribute_batches,
                                   replica_sums)

__all__ = ["HessianOperator", "GaussNewtonOperator", "layer_params"]


def layer_params(model, layer_name):
    """The trainable variables of one layer: the per-layer (diagonal block) variant."""
    layer = model.get_layer(layer_name)
    if not layer.trainable_variables:
        raise ValueError(f"layer '{layer_name}' has no trainable variables")
    return layer.trainable_variables


class _CurvatureOperator(tf.linalg.LinearOperator):
    """Shared machinery: flat vectors in and out, batches reduced by size-weighted mean."""

    def __init__(self, product, params, data, dtype, name, strategy=None, **hints):
        check_data(data, name)
        if not tf.as_dtype(dtype).is_floating:
            raise ValueError(f"{name}: dtype must be a floating dtype (float32 or float64), got "
                             f"{tf.as_dtype(dtype).name}")
        self._params = list(tf.nest.flatten(params))
        self._n = sum(int(np.prod(p.shape)) for p in self._params)
        self._single = not isinstance(data, tf.data.Dataset)
        self._data = distribute_batches(data, strategy, name)
        self.num_matvecs = 0
        params_ = self._params

        def weighted_product(batch, vector):  # (size * product, size) of one (shard of a) batch
            v = tree.unflatten(tf.cast(vector, params_[0].dtype), params_)
            size = tf.cast(batch_size(batch), dtype)
            return size * tree.flatten(product(batch, v), dtype), size

        product_sums = replica_sums(weighted_product, strategy)
        self._batch_product = lambda vector, batch: product_sums(batch, vector)
        super().__init__(dtype=dtype, is_self_adjoint=True, is_square=True, name=name, **hints)

    def _shape(self):
        return tf.TensorShape([self._n, self._n])

    def _shape_tensor(self):
        return tf.constant([self._n, self._n])

    def matvec_flat(self, vector):
        """The product with one flat vector of length n (a tensor of this operator's dtype)."""
        self.num_matvecs += 1
        vector = tf.convert_to_tensor(vector, self.dtype)
        if self._single:
            total, count = self._batch_product(vector, self._data)
            return total / count
        total, count = tf.zeros([self._n], self.dtype), tf.zeros([], self.dtype)
        for batch in self._data:
            part, size = self._batch_product(vector, batch)
            total, count = total + part, count + size
        return total / count

    def _matmul(self, x, adjoint=False, adjoint_arg=False):
        x = tf.linalg.adjoint(x) if adjoint_arg else x
        cols = [self.matvec_flat(x[:, j]) for j in range(x.shape[-1])]
        return tf.stack(cols, axis=1)

    def to_dense(self):
        return self._matmul(tf.eye(self._n, dtype=self.dtype))


class HessianOperator(_CurvatureOperator):
    """H = d^2/dparams^2 of `loss_fn(batch)` (the mean over a data set of batches).

    Args:
      loss_fn: an objective over a batch (the kind `make_train_step` minimizes, not a
        Keras loss): `loss_fn(batch) -> scalar`, a mean over the batch's examples.
      params: variables / tensors (nested structure); for a per-layer Hessian pass one
        layer's variables (`layer_params`).
      data: one batch (any structure) or a `tf.data.Dataset` of batches.
      dtype: the operator's dtype (float32 or float64); vectors are cast to the params'.
      mode: the `hogrod.hvp` mode.
      strategy: a `tf.distribute.Strategy` to split each batch of `data` (a Dataset) over.
    """

    def __init__(self, loss_fn, params, data, dtype=tf.float32, mode="auto", strategy=None):
        checks.function(loss_fn, "loss_fn", "HessianOperator", "loss_fn(batch) -> scalar")
        flat_params = checks.params(params, "HessianOperator")
        if mode != "auto" and mode not in hogrod.autodiff.HVP_MODES:
            raise ValueError(f"HessianOperator: mode must be 'auto' or one of "
                             f"{hogrod.autodiff.HVP_MODES}, got {mode!r}")
        product = lambda batch, v: hogrod.hvp(lambda: loss_fn(batch), flat_params, v,  # noqa
                                              mode=mode)
        super().__init__(product, flat_params, data, dtype, "HessianOperator", strategy)


class GaussNewtonOperator(_CurvatureOperator):
    """G = J^T H_L J for outputs z = `model_fn(batch)` and loss `loss_fn(z, batch)`.

    Positive semi-definite for convex losses of the outputs (MSE, cross-entropy on logits).

    Args:
      model_fn: `model_fn(batch) -> z`, the outputs the loss is convex in (e.g. logits).
      loss_fn: an output loss `loss_fn(z, batch) -> scalar`: the outputs FIRST, then the
        whole batch (read the labels from it). Not Keras's `loss(y_true, y_pred)` order;
        wrap a Keras loss as `lambda z, batch: loss(batch[1], z)`.
      params, data, dtype, strategy: as for `HessianOperator`.
    """

    def __init__(self, model_fn, loss_fn, params, data, dtype=tf.float32, strategy=None):
        checks.function(model_fn, "model_fn", "GaussNewtonOperator", "model_fn(batch) -> z")
        checks.function(loss_fn, "loss_fn", "GaussNewtonOperator", "loss_fn(z, batch) -> scalar")
        flat_params = checks.params(params, "GaussNewtonOperator")
        product = lambda batch, v: hogrod.gnvp(  # noqa: E731
            lambda: model_fn(batch), lambda z: loss_fn(z, batch), flat_params, v)
        super().__init__(product, flat_params, data, dtype, "GaussNewtonOperator", strategy,
                         is_non_singular=None)
