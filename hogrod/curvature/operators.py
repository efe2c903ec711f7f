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
from hogrod import tree
from hogrod import checks

__all__ = ["flatten", "unflatten", "HessianOperator", "GaussNewtonOperator", "layer_params"]


def flatten(tensors, dtype=None):
    """Concatenate tensors into one flat vector (`hogrod.tree.flatten`)."""
    return tree.flatten(tensors, dtype)


def unflatten(vector, like):
    """Split a flat vector into tensors shaped (and typed) like `like` (`hogrod.tree.unflatten`)."""
    return tree.unflatten(vector, like)


def layer_params(model, layer_name):
    """The trainable variables of one layer: the per-layer (diagonal block) variant."""
    layer = model.get_layer(layer_name)
    if not layer.trainable_variables:
        raise ValueError(f"layer '{layer_name}' has no trainable variables")
    return layer.trainable_variables


def _batch_size(batch):
    return tf.shape(tf.nest.flatten(batch)[0])[0]


def _check_data(data, name):
    """Data is one batch (a structure of tensors, no None in it) or a tf.data.Dataset: checked
    here, not at the first product deep inside a trace."""
    if data is None:
        raise ValueError(f"{name}: data is None; pass one batch (any structure of tensors, as "
                         "loss_fn takes it) or a tf.data.Dataset of batches")
    if isinstance(data, tf.data.Dataset):
        return
    missing = [i for i, t in enumerate(tf.nest.flatten(data)) if t is None]
    if missing:
        raise ValueError(f"{name}: data holds None (flattened part(s) {missing} of "
                         f"{len(tf.nest.flatten(data))}); every part of a batch must be a tensor")


def _check_callable(fn, arg, name):
    if not callable(fn):
        raise TypeError(f"{name}: {arg} must be callable, got {type(fn).__name__}")


def _check_strategy(strategy, name):
    """`strategy` is None or a tf.distribute.Strategy."""
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"{name}: strategy must be a tf.distribute.Strategy (e.g. "
                        "hogrod.distribute.make_strategy('mirrored')) or None, got "
                        f"{type(strategy).__name__}")


def _check_distributable(data, strategy, name):
    """With a strategy, `data` must be a Dataset (its batches are what is split)."""
    _check_strategy(strategy, name)
    if strategy is not None and not isinstance(data, tf.data.Dataset):
        raise ValueError(f"{name}: with a strategy, data must be a tf.data.Dataset of "
                         "batches (each batch is split over the replicas)")


def distribute_batches(data, strategy, name):
    """`data` as the batches to iterate: itself without a strategy, else each batch split
    over the replicas (`experimental_distribute_dataset`; a batch that does not split evenly
    gives shards of different sizes, possibly an empty one)."""
    _check_distributable(data, strategy, name)
    return data if strategy is None else strategy.experimental_distribute_dataset(data)


def replica_sums(fn, strategy):
    """`fn(batch, *args) -> structure of tensors`, each a SUM over the batch's examples (its
    size among them), compiled. With a strategy, `fn` runs on every replica's shard of a
    batch from `distribute_batches` and each part is summed over the replicas (all-reduce),
    so the result equals one device's on the whole batch: normalize by the summed size, never
    per replica. `args` are the same on every replica."""
    if strategy is None:
        return tf.function(fn, reduce_retracing=True)

    @tf.function(reduce_retracing=True)
    def summed(batch, *args):
        parts = strategy.run(fn, args=(batch, *args))
        return tf.nest.map_structure(
            lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), parts)
    return summed


def fold_replica(key):
    """A stateless key [2] with the replica id folded in (0 without a strategy): under a
    strategy every replica draws its own random numbers, a different (equally distributed)
    draw than one device's."""
    replica = tf.distribute.get_replica_context()
    rid = 0 if replica is None else replica.replica_id_in_sync_group
    return tf.random.experimental.stateless_fold_in(key, rid)


class _CurvatureOperator(tf.linalg.LinearOperator):
    """Shared machinery: flat vectors in and out, batches reduced by size-weighted mean."""

    def __init__(self, product, params, data, dtype, name, strategy=None, **hints):
        _check_data(data, name)
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
            v = unflatten(tf.cast(vector, params_[0].dtype), params_)
            size = tf.cast(_batch_size(batch), dtype)
            return size * flatten(product(batch, v), dtype), size

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
        _check_callable(loss_fn, "loss_fn", "HessianOperator")
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
        _check_callable(model_fn, "model_fn", "GaussNewtonOperator")
        _check_callable(loss_fn, "loss_fn", "GaussNewtonOperator")
        flat_params = checks.params(params, "GaussNewtonOperator")
        product = lambda batch, v: hogrod.gnvp(  # noqa: E731
            lambda: model_fn(batch), lambda z: loss_fn(z, batch), flat_params, v)
        super().__init__(product, flat_params, data, dtype, "GaussNewtonOperator", strategy,
                         is_non_singular=None)
