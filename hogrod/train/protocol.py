"""The step-optimizer protocol: one interface for every optimizer `make_train_step` takes.

`make_train_step(objective, optimizer, variables)` computes the step's terms and its global
gradient (the mean over micro-batches and replicas, transformed, NaN-guarded) the same way
for every optimizer, then, only if every term and the gradient are finite, hands them on:

    optimizer.apply(grads, variables, loss, batch)       # in replica context

- `grads`: the global gradient (one tensor per variable, after the transform);
- `variables`: the variables this optimizer trains (its group's);
- `loss(batch)`: the objective's weighted total on a batch (a mean over its examples):
  an optimizer that needs the objective (a line search, a reduction ratio, a
  Hessian-vector product) calls it, inside its own tapes if it differentiates it;
- `batch`: this replica's batch of the step. Under a strategy each replica holds a shard:
  whatever the optimizer computes from it, it averages with `replica_mean` (equal shards:
  the global batch's mean), so every replica reaches the same update.

Three kinds of optimizer meet this protocol:

- `StepOptimizer` subclasses (`hogrod.second_order`: K-FAC, Hessian-free, AdaHessian,
  Sophia) own their state as variables built by `build(variables)` (checkpointed with the
  optimizer: `Checkpointer(optimizer=opt)`), assign through `assign` (which works in a
  replica context, where a Keras variable cannot be assigned directly), and report what
  they used in `logs()` (their damping, reduction ratio, ...), which the step adds to its
  logs;
- a Keras optimizer, adapted by `as_step_optimizer` (`apply_gradients`, the scale
  conventions of `step.py`);
- a `hogrod.optim` pure optimizer (`init`, `update`), adapted by `as_step_optimizer`:
  its state kept in variables, its update assigned.
"""

from typing import Any, Callable, Mapping, Optional, Sequence

import keras
import tensorflow as tf

from hogrod import checks
from hogrod.optim import Optimizer as PureOptimizer
from hogrod.types import Batch, Tensor

__all__ = ["StepOptimizer", "as_step_optimizer", "assign", "replica_mean", "state_variable"]


def replica_mean(value: Any) -> Any:
    """The mean over the replicas of a nest of tensors (the identity without a strategy).

    Args:
      value: a nest of tensors computed by each replica from its shard.

    Returns:
      The nest averaged over the replicas in sync: on equal shards, the global batch's
      mean of a per-shard mean.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return value
    return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, value)


def assign(variables: Sequence[tf.Variable], values: Sequence[Tensor]) -> None:
    """Assign `values` to `variables`, in a replica context or outside one.

    Keras variables cannot be assigned in a replica context of a multi-replica strategy
    (they carry no aggregation); this goes through the strategy's `merge_call`, as Keras's
    own optimizers do. Every replica must hand the same values (computed from all-reduced
    quantities); each replica's copy is set to its own.

    Args:
      variables: the variables (Keras or tf), in order.
      values: one tensor per variable, of its shape and dtype.
    """
    variables, values = list(variables), list(values)
    ctx = tf.distribute.get_replica_context()
    if not tf.distribute.has_strategy() or (ctx is not None and ctx.num_replicas_in_sync == 1
                                            and not _mirrored(variables)):
        for v, x in zip(variables, values):
            v.assign(x)
        return

    def update(strategy, *vals):
        for v, x in zip(variables, vals):
            strategy.extended.update(_tf_variable(v), lambda var, t: var.assign(t), args=(x,),
                                     group=False)

    if ctx is None:  # cross-replica context
        update(tf.distribute.get_strategy(), *values)
    else:
        ctx.merge_call(update, args=tuple(values))


def _tf_variable(v):
    return getattr(v, "value", v) if isinstance(v, keras.Variable) else v


def _mirrored(variables):
    return any(isinstance(_tf_variable(v), tf.distribute.DistributedValues) for v in variables)


def state_variable(value: Tensor, name: str, dtype: Optional[tf.DType] = None) -> tf.Variable:
    """A non-trainable state variable of an optimizer (a factor, a moment, a counter).

    Args:
      value: its initial value.
      name: its name (in the checkpoint too).
      dtype: its dtype; default the value's.

    Returns:
      A `tf.Variable`, created in the current strategy's scope (mirrored under one).
    """
    return tf.Variable(tf.convert_to_tensor(value, dtype), trainable=False, name=name)


class StepOptimizer(tf.Module):
    """Base class of an optimizer that owns its state and may use the objective.

    Subclasses set `uses_batch` (whether `apply` calls `loss` or reads `batch`: then
    gradient accumulation, which splits the batch, is refused), create their state in
    `build` and implement `apply`. `learning_rate` (the rate the last step used, read
    after it) is logged as "lr". `auto_jit_compile` says whether `make_train_step`'s
    default, `jit_compile="auto"`, compiles a step with this optimizer under XLA: False
    unless a subclass sets it, once its numbers under XLA are checked against the plain
    step (an eigendecomposition, a host loop or a line search may differ there or not
    compile); `jit_compile=True` compiles it regardless.

    Args:
      name: the optimizer's name (its variables' scope).
    """

    uses_batch = True
    adapted = False  # a Keras or hogrod.optim optimizer behind the protocol
    auto_jit_compile = False  # jit_compile="auto" tries XLA with it (checked against plain)

    def __init__(self, name: Optional[str] = None) -> None:
        super().__init__(name=name)
        self.built = False

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Create the optimizer's state for `variables` (in the strategy's scope).

        Args:
          variables: the variables it will train, in the order `apply` receives them.
        """
        self.built = True

    def apply(self, grads: Sequence[Tensor], variables: Sequence[tf.Variable],
              loss: Callable[[Batch], Tensor], batch: Batch) -> None:
        """One step: update `variables` and the state (replica context).

        Args:
          grads: the global gradient, one tensor per variable.
          variables: the variables, as given to `build`.
          loss: `loss(batch) -> scalar`, the objective's weighted total (a mean).
          batch: this replica's batch.
        """
        raise NotImplementedError

    @property
    def learning_rate(self) -> Tensor:
        """The learning rate the last step used (logged as "lr")."""
        raise NotImplementedError

    def logs(self) -> Mapping[str, Tensor]:
        """What the last step used, {name: scalar}, added to the train step's logs.

        Returns:
          A dict of scalar tensors or variables; empty by default.
        """
        return {}


class _Keras(StepOptimizer):
    """A Keras optimizer: `apply_gradients` with step.py's scale conventions."""

    uses_batch = False
    adapted = True
    auto_jit_compile = True

    def __init__(self, optimizer, replicas, scaler):
        super().__init__(name="keras")
        self.optimizer, self.replicas, self.scaler = optimizer, replicas, scaler

    def build(self, variables):
        if not self.optimizer.built:
            self.optimizer.build(variables)
        self.built = True

    def apply(self, grads, variables, loss, batch):
        # Keras sums the replicas' gradients; a LossScaleOptimizer divides by its scale
        if self.replicas > 1:
            grads = [g / self.replicas for g in grads]
        if self.scaler is not None:
            grads = [g * tf.cast(self.scaler.dynamic_scale, g.dtype) for g in grads]
        self.optimizer.apply_gradients(zip(grads, variables))

    @property
    def learning_rate(self):
        return self.optimizer.learning_rate


class _Pure(StepOptimizer):
    """A `hogrod.optim` optimizer: its state in variables, its update assigned."""

    uses_batch = False
    adapted = True
    auto_jit_compile = True

    def __init__(self, optimizer):
        super().__init__(name=optimizer.name)
        self.optimizer = optimizer

    def build(self, variables):
        state = self.optimizer.init([tf.convert_to_tensor(v) for v in variables])
        self._structure = state
        self.state = [state_variable(t, f"{self.optimizer.name}_state_{i}")
                      for i, t in enumerate(tf.nest.flatten(state))]
        self.built = True

    def apply(self, grads, variables, loss, batch):
        state = tf.nest.pack_sequence_as(self._structure, [s.read_value() for s in self.state])
        params, state = self.optimizer.update(list(grads), state,
                                              [tf.convert_to_tensor(v) for v in variables])
        assign(list(variables) + self.state, list(params) + tf.nest.flatten(state))

    @property
    def learning_rate(self):
        # None: no single rate to log (a learned optimizer, or one `optim.learnable` rebuilt)
        lr = (self.optimizer.hyperparameters or {}).get("learning_rate")
        if lr is None:
            return None
        return lr.value if hasattr(lr, "value") and not isinstance(lr, tf.Variable) else lr


def _check_keras_rate(optimizer):
    """A Keras optimizer's current rate >= 0: Keras takes a negative one, which would ascend
    the objective and log a plausible loss (read eagerly; a rate traced inside a function
    is not known yet)."""
    if not tf.executing_eagerly():
        return
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    if not rate >= 0:  # NaN too
        raise checks.ArgumentError(
            f"make_train_step: the optimizer's learning_rate must be >= 0, got {rate:.6g} "
            f"(the {type(optimizer).__name__}'s rate, or its schedule's value now)")


def as_step_optimizer(optimizer: Any, replicas: int = 1,
                      scaler: Optional[keras.optimizers.LossScaleOptimizer] = None
                      ) -> StepOptimizer:
    """The optimizer behind the protocol: a `StepOptimizer` as it is, a Keras or a
    `hogrod.optim` optimizer adapted.

    Args:
      optimizer: a `StepOptimizer`, `keras.optimizers.Optimizer` or `hogrod.optim.Optimizer`.
      replicas: the replicas in sync (Keras sums their gradients).
      scaler: the LossScaleOptimizer when `optimizer` is one.

    Returns:
      A `StepOptimizer`.

    Raises:
      TypeError: `optimizer` is none of these; the message names what was given.
      hogrod.checks.ArgumentError: a Keras optimizer whose learning rate is negative.
    """
    if isinstance(optimizer, StepOptimizer):
        return optimizer
    if isinstance(optimizer, keras.optimizers.Optimizer):
        _check_keras_rate(optimizer)
        return _Keras(optimizer, replicas, scaler)
    if isinstance(optimizer, PureOptimizer):
        return _Pure(optimizer)
    raise TypeError(f"make_train_step: optimizer must be a Keras optimizer, a hogrod.optim "
                    f"optimizer or a hogrod.train.StepOptimizer (hogrod.second_order), got "
                    f"{type(optimizer).__name__}; a factory such as "
                    "hogrod.second_order.kfac must be called first")
