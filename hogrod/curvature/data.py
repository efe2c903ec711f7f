"""The empirical risk over data, written once for every curvature operator and estimator.

A curvature of the objective `L = (1/N or 1) sum_i loss_i` over `data` is a sum over
batches of per-batch SUMS (each weighted by its number of examples), divided once by the
global count N when the loss averages over the batch (Keras's default reduction,
"sum_over_batch_size") and not when its reduction is "sum":

- `data_batches(data, where, strategy=None, pair=False)`: checks `data` (one batch, any
  structure of tensors, or a `tf.data.Dataset` of batches; `pair=True`: `(x, y)` batches)
  and returns what to iterate: `[data]` for one batch, the Dataset itself, or under a
  `tf.distribute.Strategy` its batches split over the replicas (`distribute_batches`).
- `BatchPasses(data, strategy, where)`: the same batches for an operator that passes over
  `data` once per product, drawn from ONE iterator (a distributed iterator costs far more
  to create than a small product).
- `replica_sums(fn, strategy)`: `fn(batch, *args)` compiled (`compile_closure`); under a
  strategy run on every replica's shard and its sums all-reduced, so the result equals one
  device's.
- `accumulate(fn, batches, where, *args)`: the data loop: the sum over batches of
  `fn(batch, index, *args) -> (sums, count)`; `normalize(total, count, mean)` divides.
- `fold_replica(key)`, `batch_key(seed, index)`: stateless sampling keys per batch (and
  replica), so a Monte Carlo operator is one fixed matrix.
- `indexed(data, where)`: each `(x, y)` batch paired with its index, for those keys.
- `model_params`, `params_dtype`, `check_loss_dtype`: what an operator of
  `(model, loss, data)` acts on, and the rule that a Keras loss computes at the model's
  dtype (a float32 loss on a float64 model is refused, naming the loss's `dtype`).
- `batch_loss(loss, y, z)`: a Keras loss's value on a (shard of a) batch, undoing Keras's
  division by the number of replicas.
- `split_arrays(x, y, batch_size, where)`: `(x, y)` arrays cut into batches, in order.

The likelihood of a Keras loss (per-example values, sampled labels for the Monte Carlo
Fisher, the square root of its output Hessian) is `hogrod.curvature.likelihood`.
"""

import functools
import itertools
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from hogrod import checks, distribute
from hogrod.autodiff import unwrap
from hogrod.types import Batch, DType, Loss, Params, Scalar, Tensor, Tree

__all__ = ["MEAN_REDUCTIONS", "check_strategy", "check_data", "data_batches",
           "distribute_batches", "BatchPasses", "replica_sums", "compile_closure", "accumulate",
           "normalize", "batch_size", "fold_replica", "batch_key", "indexed", "model_params",
           "params_dtype", "check_loss_dtype", "batch_loss", "split_arrays"]

MEAN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def check_strategy(strategy: Optional[tf.distribute.Strategy],
                   where: str) -> Optional[tf.distribute.Strategy]:
    """Checks that `strategy` is None or a `tf.distribute.Strategy`.

    Args:
      strategy: the value given.
      where: the public function checked, first in the message.
    Returns:
      `strategy`.
    Raises:
      ArgumentError: anything else.
    """
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise checks.ArgumentError(
            f"{where}: strategy must be a tf.distribute.Strategy (e.g. "
            f"hogrod.distribute.make_strategy('mirrored')) or None, got {type(strategy).__name__}")
    return strategy


def check_data(data: Batch, where: str, pair: bool = False) -> Batch:
    """Checks `data` here, not at the first product deep inside a trace.

    Args:
      data: one batch (any structure of tensors, no None in it) or a `tf.data.Dataset` of
        batches.
      where: the public function checked.
      pair: whether every batch must be an `(x, y)` pair.
    Returns:
      `data`.
    Raises:
      ArgumentError: `data` is None, holds None, or is not a pair where one is needed.
    """
    if data is None:
        raise checks.ArgumentError(
            f"{where}: data is None; pass one " + ("(x, y) batch" if pair else "batch")
            + " or a tf.data.Dataset of them")
    spec = data.element_spec if isinstance(data, tf.data.Dataset) else data
    if pair and (not isinstance(spec, (tuple, list)) or len(spec) != 2):
        raise checks.ArgumentError(
            f"{where}: data must be one (x, y) batch or a tf.data.Dataset of (x, y) batches, "
            f"got {type(spec).__name__}"
            + (f" of length {len(spec)}" if isinstance(spec, (tuple, list)) else ""))
    if not isinstance(data, tf.data.Dataset):
        flat = tf.nest.flatten(data)
        missing = [i for i, t in enumerate(flat) if t is None]
        if missing:
            raise checks.ArgumentError(
                f"{where}: data holds None (flattened part(s) {missing} of {len(flat)}); every "
                "part of a batch must be a tensor")
    return data


def distribute_batches(data: Batch, strategy: Optional[tf.distribute.Strategy],
                       where: str) -> Iterable[Batch]:
    """The batches of a Dataset, split over the replicas of `strategy`.

    Args:
      data: a `tf.data.Dataset` of batches (one batch when `strategy` is None).
      strategy: None or a `tf.distribute.Strategy`.
      where: the public function checked.
    Returns:
      Without a strategy, `data` itself (a Dataset with tf.data's autotuning off,
      `hogrod.distribute.without_autotune`); else `hogrod.distribute.distribute_dataset`
      of `data` (a batch that does not split evenly gives shards of different sizes,
      possibly empty).
    Raises:
      ArgumentError: a strategy with data that is not a Dataset.
    """
    check_strategy(strategy, where)
    if strategy is None:
        return distribute.without_autotune(data) if isinstance(data, tf.data.Dataset) else data
    if not isinstance(data, tf.data.Dataset):
        raise checks.ArgumentError(f"{where}: with a strategy, data must be a tf.data.Dataset "
                                   "of batches (each batch is split over the replicas)")
    return distribute.distribute_dataset(strategy, data)


class BatchPasses:
    """Passes over a Dataset's (distributed) batches, all drawn from one iterator.

    Creating an iterator over `strategy.experimental_distribute_dataset(data)` costs far
    more than a small product (about 0.2 s against 0.01 s on two CPU replicas), and an
    operator passes over its data once per product. When the cardinality of `data` is
    known and finite, one iterator runs over `data.repeat()` and each pass takes exactly
    that many batches: for a deterministic Dataset the same batches in the same order every
    pass, as a fresh iterator would give. A Dataset that reshuffles each iteration still
    contributes every example once per pass (repeat reshuffles each epoch), though its
    batches may differ from those a fresh iterator would draw. A pass left unfinished (an
    error in a product) is skipped to its end before the next, so passes stay aligned. An
    unknown or infinite cardinality falls back to a fresh iterator per pass.

    Args:
      data: a `tf.data.Dataset` of batches.
      strategy: None or a `tf.distribute.Strategy` to split each batch over its replicas.
      where: the public function building the passes, named in errors.
    """

    def __init__(self, data: tf.data.Dataset, strategy: Optional[tf.distribute.Strategy],
                 where: str) -> None:
        self._fresh = distribute_batches(data, strategy, where)  # checks data and strategy
        count = int(data.cardinality())
        self._count = count if count > 0 else None
        self._repeated = (None if self._count is None
                          else distribute_batches(data.repeat(), strategy, where))
        self._iterator, self._taken = None, 0

    def __iter__(self) -> Iterator[Batch]:
        """One pass over the batches.

        Returns:
          An iterator over the batches of one pass (shards per replica under a strategy).
        """
        if self._count is None:
            return iter(self._fresh)
        if self._iterator is None:
            self._iterator = iter(self._repeated)
        behind = -self._taken % self._count  # the rest of an unfinished pass
        for _ in range(behind):
            next(self._iterator)
        self._taken += behind
        return self._pass()

    def _pass(self) -> Iterator[Batch]:
        """The next `count` batches of the one iterator."""
        for batch in itertools.islice(self._iterator, self._count):
            self._taken += 1
            yield batch


def data_batches(data: Batch, where: str, strategy: Optional[tf.distribute.Strategy] = None,
                 pair: bool = False) -> Iterable[Batch]:
    """What to iterate over for `data`, checked.

    Args:
      data: one batch or a `tf.data.Dataset` of batches (see `check_data`).
      where: the public function checked.
      strategy: None or a `tf.distribute.Strategy` (then `data` must be a Dataset).
      pair: whether every batch must be an `(x, y)` pair.
    Returns:
      `[data]` for one batch, the Dataset, or its distributed batches under `strategy`.
    """
    check_data(data, where, pair)
    check_strategy(strategy, where)
    if strategy is None and not isinstance(data, tf.data.Dataset):
        return [tuple(data) if pair else data]
    return distribute_batches(data, strategy, where)


def replica_sums(fn: Callable[..., Tree],
                 strategy: Optional[tf.distribute.Strategy]) -> Callable[..., Tree]:
    """`fn` compiled, its sums all-reduced over the replicas of `strategy`.

    Args:
      fn: `fn(batch, *args) -> structure of tensors`, each a SUM over the batch's examples
        (its size among them); `args` are the same on every replica.
      strategy: None or a `tf.distribute.Strategy`; with one, `fn` runs on every replica's
        shard of a batch from `distribute_batches` and each part is summed over the replicas,
        so the result equals one device's on the whole batch (normalize by the summed size,
        never per replica).
    Returns:
      The compiled function of `(batch, *args)`.
    """
    if strategy is None:
        return compile_closure(fn)

    def summed(batch, *args):
        parts = strategy.run(fn, args=(batch, *args))
        return tf.nest.map_structure(
            lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), parts)
    return compile_closure(summed)


def compile_closure(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`tf.function(fn, reduce_retracing=True)`, its retracing counted for this closure alone.

    TensorFlow warns about retracing per code object: the closures of many operators (one
    compiled product per operator, each capturing its own model and data) would read as one
    function retraced. Wrapped in a `functools.partial`, each closure is its own key, so the
    warning still reports a closure that retraces itself.

    Args:
      fn: the Python function to compile.
    Returns:
      The tf.function.
    """
    return tf.function(functools.partial(fn), reduce_retracing=True)


def accumulate(fn: Callable[..., Tuple[Tree, Tensor]], batches: Iterable[Batch], where: str,
               *args: Any) -> Tuple[Tree, Tensor]:
    """The data loop: the sum over batches of `fn(batch, index, *args)`.

    Args:
      fn: `fn(batch, index, *args) -> (sums, count)`, `index` the batch's position (an
        int64 scalar tensor), `sums` a structure of tensors and `count` its examples.
      batches: what `data_batches` returns.
      where: the public function, named when there is no batch.
      *args: passed on to `fn`.
    Returns:
      `(sums, count)` added over the batches.
    Raises:
      ValueError: `batches` is empty.
    """
    totals = count = None
    for index, batch in enumerate(batches):
        part, n = fn(batch, tf.constant(index, tf.int64), *args)
        totals = part if totals is None else tf.nest.map_structure(tf.add, totals, part)
        count = n if count is None else count + n
    if totals is None:
        raise ValueError(f"{where}: data is an empty tf.data.Dataset")
    return totals, count


def normalize(total: Tree, count: Scalar, mean: bool) -> Tree:
    """The empirical risk's normalization.

    Args:
      total: the sum over every example (a tensor, array or structure of them).
      count: the number of examples.
      mean: True when the loss averages over the batch, False when it sums.
    Returns:
      `total / count` if `mean`, else `total`.
    """
    if not mean:
        return total
    return tf.nest.map_structure(lambda t: t / count, total)


def batch_size(batch: Batch) -> tf.Tensor:
    """The number of examples in a batch: the leading dimension of its first tensor.

    Args:
      batch: any structure of tensors.
    Returns:
      An int32 scalar tensor.
    """
    return tf.shape(tf.nest.flatten(batch)[0])[0]


def fold_replica(key: tf.Tensor) -> tf.Tensor:
    """A stateless key with the replica id folded in.

    Args:
      key: an int64 key of shape [2].
    Returns:
      The key folded with the replica id (0 without a strategy): under a strategy every
      replica draws its own numbers, a different (equally distributed) draw than one
      device's.
    """
    replica = tf.distribute.get_replica_context()
    rid = 0 if replica is None else replica.replica_id_in_sync_group
    return tf.random.experimental.stateless_fold_in(key, rid)


def batch_key(seed: int, index: Tensor) -> tf.Tensor:
    """The stateless key of (seed, batch index, replica).

    Args:
      seed: a Python int.
      index: the batch's index, an int64 scalar, or a vector of it (one entry per example,
        as `indexed` gives, so that a strategy splits it with the batch; empty on an empty
        shard).
    Returns:
      An int64 key of shape [2], fixed per batch, so the products of one operator use the
      same draws (one matrix).
    """
    index = tf.reshape(tf.cast(index, tf.int64), [-1])
    key = tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int64),
                                                   tf.reduce_max(tf.concat([index, [0]], 0)))
    return fold_replica(key)


def indexed(data: Batch, where: str) -> Batch:
    """Each `(x, y)` batch paired with its index in `data`, one entry per example.

    Args:
      data: one `(x, y)` batch or a `tf.data.Dataset` of them.
      where: the public function checked.
    Returns:
      `((x, y), index)` for one batch, or a Dataset of them; `index` is an int64 vector the
      size of the batch (a strategy splits it with the batch).
    """
    check_data(data, where, pair=True)
    if isinstance(data, tf.data.Dataset):
        return data.enumerate().map(
            lambda i, b: (b, tf.fill(tf.shape(tf.nest.flatten(b[0])[0])[:1], i)))
    x, y = data
    return ((x, y), tf.zeros(tf.shape(tf.nest.flatten(x)[0])[:1], tf.int64))


def model_params(model: keras.Model, params: Optional[Params],
                 where: str) -> List[tf.Variable]:
    """The variables an operator of `model` acts on.

    Args:
      model: a built Keras model.
      params: None (all `model.trainable_variables`) or a subset of the model's variables,
        e.g. one layer's (`layer_params`) for that diagonal block.
      where: the public function checked.
    Returns:
      The flat list of variables.
    Raises:
      ArgumentError: no variables, or a tensor (not what `model(x)` reads).
    """
    if not isinstance(model, keras.Model):
        raise checks.ArgumentError(f"{where}: model must be a keras.Model, got "
                                   f"{type(model).__name__}")
    if params is None:
        params = model.trainable_variables
        if not params:
            raise checks.ArgumentError(f"{where}: the model has no trainable variables (build "
                                       "it first, e.g. with keras.Input)")
    params = list(checks.params(params, where))
    for i, p in enumerate(params):
        if not isinstance(p, (tf.Variable, keras.Variable)):
            raise checks.ArgumentError(
                f"{where}: params[{i}] must be a variable of the model (a tensor is not what "
                f"model(x) reads), got {type(p).__name__}")
    return params


def params_dtype(params: Sequence[Tensor], where: str) -> tf.DType:
    """The one floating dtype of `params`.

    Args:
      params: a list of variables or tensors.
      where: the public function checked.
    Returns:
      A `tf.DType`.
    Raises:
      ArgumentError: the parameters mix dtypes or are not floating.
    """
    dtypes = {tf.as_dtype(unwrap(p).dtype) for p in params}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating:
        raise checks.ArgumentError(f"{where}: the parameters must share one floating dtype, "
                                   f"got {sorted(d.name for d in dtypes)}")
    return dtypes.pop()


def check_loss_dtype(loss: Loss, dtype: DType, where: str) -> Loss:
    """A Keras loss object computes at its own dtype: it must be the model's.

    Args:
      loss: the loss given (a `keras.losses.Loss` is checked; a plain function computes at
        its inputs' dtype).
      dtype: the model's (parameters') dtype.
      where: the public function checked.
    Returns:
      `loss`.
    Raises:
      ArgumentError: the loss's dtype differs, naming its `dtype` argument.
    """
    loss_dtype = getattr(loss, "dtype", None)
    if isinstance(loss, keras.losses.Loss) and loss_dtype is not None \
            and tf.as_dtype(loss_dtype) != tf.as_dtype(dtype):
        name, want = type(loss).__name__, tf.as_dtype(dtype).name
        raise checks.ArgumentError(
            f"{where}: the loss computes in {tf.as_dtype(loss_dtype).name} but the model's "
            f"weights are {want}; build the loss with dtype='{want}' (e.g. "
            f"keras.losses.{name}(dtype='{want}'))")
    return loss


def batch_loss(loss: Loss, y: Tree, z: Tree) -> tf.Tensor:
    """`mean(loss(y, z))` over the examples of a (shard of a) batch.

    Keras (TF backend) divides a batch-mean loss by the number of replicas wherever a
    strategy with several is current (its training step sums the replicas' losses); it is
    multiplied back here, so a replica's shard is not down-weighted.

    Args:
      loss: a Keras loss `loss(y_true, y_pred)` (an object or a function).
      y: the labels.
      z: the model output.
    Returns:
      A scalar tensor.
    """
    value = tf.reduce_mean(loss(y, z))
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1 and isinstance(loss, keras.losses.Loss) and loss.reduction in MEAN_REDUCTIONS:
        value = value * replicas
    return value


def split_arrays(x: Tree, y: Tree, size: int, where: str) -> List[Tuple[Tree, Tree]]:
    """`(x, y)` arrays cut into consecutive batches.

    Args:
      x: inputs (a structure of arrays or tensors with one leading example dimension).
      y: labels, with as many examples.
      size: examples per batch (an int >= 1; the caller's argument `batch_size`).
      where: the public function checked.
    Returns:
      A list of `(x_batch, y_batch)` in example order.
    """
    size = checks.integer(size, "batch_size", where, least=1)
    n = int(tf.nest.flatten(x)[0].shape[0])
    if int(tf.nest.flatten(y)[0].shape[0]) != n:
        raise checks.ArgumentError(f"{where}: x has {n} examples but y has "
                                   f"{int(tf.nest.flatten(y)[0].shape[0])}")
    cut = lambda t, s: tf.nest.map_structure(lambda a: a[s:s + size], t)  # noqa: E731
    return [(cut(x, s), cut(y, s)) for s in range(0, n, size)]
