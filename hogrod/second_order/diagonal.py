"""Hessian-diagonal estimators of the step's objective, for AdaHessian and Sophia.

Each estimator works in two halves so that an optimizer can compute it inside a `tf.cond`
(Sophia refreshes its estimate every few steps) under a multi-replica strategy, where a
cross-replica all-reduce may not sit inside a conditional branch:

    local = estimator.local(loss, batch, variables, key)   # this replica's shard, linear
    diag = estimator.finish(train.replica_mean(local), batch)

`estimate` does both. Under a strategy every replica draws the same probes, and the
all-reduced local halves are those of the global batch (equal shards).

- `HutchinsonEstimator`: z ⊙ (H z), z Rademacher, the mean over `num_probes` probes
  (Bekas et al. 2007): unbiased for the diagonal of H, and exact for a diagonal H. H z comes
  from a double tape on the step's objective `loss(batch)`: one forward pass, its gradient
  g, then the gradient of g . z. The probes are a function of a stateless key (`probe_key`:
  the optimizer's `seed` and step counter), so a resumed run draws the same ones.
- `GaussNewtonBartlettEstimator` (Liu et al. 2023, Sophia's Algorithm 2): labels y^ drawn
  from the model's predictive distribution (`hogrod.curvature.likelihood`), g^ the gradient
  of the batch's mean loss at y^, and B g^ ⊙ g^ / alpha, B the global batch size and alpha
  the loss's scale over the negative log-likelihood. By Bartlett's identity its expectation
  over y^ is the diagonal of the Gauss-Newton matrix of the batch's mean loss (times B for a
  "sum" reduction). It covers the Keras loss term only, not a regularizer in the objective.
  Under a strategy each replica folds its replica id into the key: its draws differ from
  one device's, with the same expectation.

Both estimators' forward passes run in `common.stateless()`: the step's own pass has
updated the model's state (BatchNorm moving statistics, random layers' seeds) once, an
estimator's extra pass writes none of it.

`spatial_average` is AdaHessian's rule for a 2-D convolution kernel (Yao et al. 2021; the
authors' code): the mean of |diag| over the kernel's spatial axes, which in Keras's
(kh, kw, in, out) layout are axes 0 and 1 (PyTorch's (out, in, kh, kw): 2 and 3).
"""

from typing import Callable, List, Mapping, Sequence

import keras
import tensorflow as tf

from hogrod import checks, tree
from hogrod.curvature.likelihood import likelihood_of
from hogrod.second_order.common import check_model_and_loss, split_batch, stateless
from hogrod.train.protocol import StepOptimizer, replica_mean, state_variable
from hogrod.types import Batch, Loss, Tensor

__all__ = ["HutchinsonEstimator", "GaussNewtonBartlettEstimator", "spatial_average",
           "probe_key", "DiagonalOptimizer", "SPATIAL_AXES"]

SPATIAL_AXES = (0, 1)  # a Keras Conv2D kernel is (kh, kw, in, out)


def probe_key(seed: int, step: Tensor) -> tf.Tensor:
    """The stateless key of a step's random draws: (seed, step) as int64.

    Args:
      seed: the optimizer's integer seed.
      step: the step counter (an integer scalar tensor or variable).

    Returns:
      A shape-[2] int64 tensor, a stateless seed.
    """
    return tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])


def _gradients(target, variables, tape):
    return tape.gradient(target, variables,
                         unconnected_gradients=tf.UnconnectedGradients.ZERO)


class HutchinsonEstimator:
    """z ⊙ (H z) with Rademacher z, averaged over `num_probes` probes (module docstring).

    Args:
      num_probes: probes per estimate (an int >= 1).
      where: the public optimizer, named in messages.
    """

    def __init__(self, num_probes: int = 1, where: str = "HutchinsonEstimator") -> None:
        self.num_probes = checks.integer(num_probes, "num_probes", where, least=1)

    def local(self, loss: Callable[[Batch], Tensor], batch: Batch,
              variables: Sequence[tf.Variable], key: Tensor) -> List[tf.Tensor]:
        """This replica's mean over probes of z ⊙ (H_shard z).

        Args:
          loss: `loss(batch) -> scalar`, the step's objective (a mean over the batch).
          batch: this replica's batch.
          variables: the variables H is over.
          key: a stateless key (`probe_key`); probe p draws from `key` folded with p.

        Returns:
          One tensor per variable. z is the same on every replica, so the replicas' mean
          of these is z ⊙ (H z) for the global batch's H.
        """
        variables = list(variables)
        with tf.GradientTape(persistent=self.num_probes > 1) as outer:
            with tf.GradientTape() as inner, stateless():
                value = loss(batch)  # an extra pass: it writes no model state
            grads = _gradients(value, variables, inner)
            probes = [tree.rademacher_like(grads, tf.random.experimental.stateless_fold_in(
                key, p)) for p in range(self.num_probes)]
            dots = [tf.add_n([tf.reduce_sum(g * z) for g, z in zip(grads, zs)])
                    for zs in probes]
        total = None
        for zs, dot in zip(probes, dots):
            hz = _gradients(dot, variables, outer)
            products = [z * h for z, h in zip(zs, hz)]
            total = products if total is None else [a + b for a, b in zip(total, products)]
        if self.num_probes == 1:
            return total
        return [t / tf.constant(self.num_probes, t.dtype) for t in total]

    def finish(self, mean_local: Sequence[Tensor], batch: Batch) -> List[tf.Tensor]:
        """The estimate from the replicas' mean of `local`: the mean itself.

        Args:
          mean_local: `replica_mean` of `local`'s result.
          batch: this replica's batch (unused).

        Returns:
          The Hessian-diagonal estimate, one tensor per variable.
        """
        return list(mean_local)

    def estimate(self, loss: Callable[[Batch], Tensor], batch: Batch,
                 variables: Sequence[tf.Variable], key: Tensor) -> List[tf.Tensor]:
        """`finish(replica_mean(local(...)))`: the global batch's estimate.

        Args:
          loss: the step's objective.
          batch: this replica's batch.
          variables: the variables.
          key: the stateless key.

        Returns:
          One tensor per variable.
        """
        return self.finish(replica_mean(self.local(loss, batch, variables, key)), batch)


class GaussNewtonBartlettEstimator:
    """B g^ ⊙ g^ / alpha, g^ the gradient at labels sampled from the model (module
    docstring).

    Args:
      model: the built Keras model, called on the batch's x with `training=True`.
      loss: its Keras loss object (one `hogrod.curvature` knows the likelihood of:
        MeanSquaredError, (Sparse)CategoricalCrossentropy, BinaryCrossentropy).
      where: the public optimizer, named in messages.

    Raises:
      ValueError: `model` is not a built model with trainable variables, or `loss` a loss
        whose likelihood `hogrod.curvature` does not know.
      TypeError: `loss` is not a Keras loss object.
    """

    def __init__(self, model: keras.Model, loss: Loss,
                 where: str = "GaussNewtonBartlettEstimator") -> None:
        check_model_and_loss(model, loss, where)
        self.likelihood, self.mean = likelihood_of(loss, where)
        self.model, self.where = model, where

    def local(self, loss: Callable[[Batch], Tensor], batch: Batch,
              variables: Sequence[tf.Variable], key: Tensor) -> List[tf.Tensor]:
        """This replica's g^: the gradient of its shard's mean loss at sampled labels.

        Args:
          loss: the step's objective (unused: the Keras loss at sampled labels is used).
          batch: this replica's `(x, y)`; y is not used.
          variables: the variables.
          key: a stateless key, folded with the replica's id.

        Returns:
          g^ / sqrt(alpha), one tensor per variable; the replicas' mean is the global
          batch's.
        """
        x, _ = split_batch(batch, self.where)
        ctx = tf.distribute.get_replica_context()
        replica = 0 if ctx is None else ctx.replica_id_in_sync_group
        key = tf.random.experimental.stateless_fold_in(key, tf.cast(replica, tf.int64))
        key = tf.cast(key, tf.int32)  # XLA samples categorical labels from int32 seeds only
        with tf.GradientTape() as tape:
            with stateless():  # an extra pass: it writes no model state
                z = self.model(x, training=True)
            self.likelihood.check_output(z, self.where)
            labels = tf.stop_gradient(self.likelihood.sample(tf.stop_gradient(z), 1, key)[0])
            value = tf.reduce_mean(self.likelihood.per_example(labels, z))
        # g^ / sqrt(alpha): linear in the shard, so its replicas' mean is the global one's
        root = tf.sqrt(self.likelihood.alpha(z.shape[-1], z.dtype))
        return [g / tf.cast(root, g.dtype) for g in _gradients(value, list(variables), tape)]

    def finish(self, mean_local: Sequence[Tensor], batch: Batch) -> List[tf.Tensor]:
        """B (g^ / sqrt(alpha))^2 (times B for a "sum" loss) from the global batch's.

        Args:
          mean_local: `replica_mean` of `local`'s result.
          batch: this replica's `(x, y)` (its size times the replicas is B).

        Returns:
          The Gauss-Newton-diagonal estimate, one tensor per variable.
        """
        x, _ = split_batch(batch, self.where)
        ctx = tf.distribute.get_replica_context()
        replicas = 1 if ctx is None else ctx.num_replicas_in_sync
        size = tf.shape(tf.nest.flatten(x)[0])[0] * replicas
        out = []
        for g in mean_local:
            scale = tf.cast(size, g.dtype)
            out.append((scale if self.mean else scale * scale) * tf.square(g))
        return out

    def estimate(self, loss: Callable[[Batch], Tensor], batch: Batch,
                 variables: Sequence[tf.Variable], key: Tensor) -> List[tf.Tensor]:
        """`finish(replica_mean(local(...)))`: the global batch's estimate.

        Args:
          loss: the step's objective (unused).
          batch: this replica's `(x, y)`.
          variables: the variables.
          key: the stateless key.

        Returns:
          One tensor per variable.
        """
        return self.finish(replica_mean(self.local(loss, batch, variables, key)), batch)


def spatial_average(diagonal: Sequence[Tensor]) -> List[tf.Tensor]:
    """AdaHessian's |diag|, averaged over a 2-D convolution kernel's spatial axes.

    A rank-4 tensor is taken as a Keras Conv2D kernel (kh, kw, in, out): each entry becomes
    the mean of |diag| over its (kh, kw) block, the same for every spatial position; every
    other tensor is |diag| entrywise.

    Args:
      diagonal: Hessian-diagonal estimates, one tensor per variable.

    Returns:
      Tensors shaped like `diagonal`'s, non-negative.
    """
    out = []
    for d in diagonal:
        a = tf.abs(d)
        if a.shape.rank == 4:
            a = tf.broadcast_to(tf.reduce_mean(a, axis=SPATIAL_AXES, keepdims=True), tf.shape(a))
        out.append(a)
    return out


class DiagonalOptimizer(StepOptimizer):
    """What AdaHessian and Sophia share: a step counter, per-variable moments at each
    variable's dtype, a constant learning rate, decoupled weight decay, the logs.

    Args:
      learning_rate: the step size (a positive number).
      weight_decay: decoupled weight decay (>= 0): each step also subtracts
        learning_rate * weight_decay * w.
      seed: the integer seed of the random draws (with the step counter: `probe_key`).
      where: the public factory, named in messages.
      log_names: the names `logs()` reports, each kept in a variable.
    """

    def __init__(self, learning_rate: float, weight_decay: float, seed: int, where: str,
                 log_names: Sequence[str]) -> None:
        super().__init__(name=where)
        self.where = where
        self.lr = checks.positive(learning_rate, "learning_rate", where)
        self.weight_decay = checks.nonnegative(weight_decay, "weight_decay", where)
        self.seed = checks.seed(seed, "seed", where)
        self.log_names = tuple(log_names)

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """The step counter and the log variables (subclasses add their moments).

        Args:
          variables: the variables it will train.

        Raises:
          TypeError: a variable is not floating point.
        """
        variables = list(variables)
        for i, v in enumerate(variables):
            if not tf.as_dtype(v.dtype).is_floating:
                raise TypeError(f"{self.where}: variable {i} ('{v.name}') is "
                                f"{tf.as_dtype(v.dtype).name}; it trains floating-point "
                                "variables only")
        self.dtype = tf.as_dtype(variables[0].dtype)
        self.size = sum(int(tf.size(v)) for v in variables)
        self.step = state_variable(tf.constant(0, tf.int64), f"{self.where}_step")
        self.log_values = [state_variable(tf.zeros([], self.dtype), f"{self.where}_{name}")
                           for name in self.log_names]
        self.built = True

    def slots(self, variables: Sequence[tf.Variable], name: str) -> List[tf.Variable]:
        """Zero state variables shaped and typed like `variables`.

        Args:
          variables: the trained variables.
          name: the slot's name.

        Returns:
          One state variable per variable.
        """
        return [state_variable(tf.zeros(v.shape, v.dtype), f"{self.where}_{name}_{i}")
                for i, v in enumerate(variables)]

    def mean(self, tensors: Sequence[Tensor]) -> tf.Tensor:
        """The mean over every coordinate of `tensors`, at the log dtype.

        Args:
          tensors: one tensor per variable.

        Returns:
          A scalar.
        """
        return tf.add_n([tf.cast(tf.reduce_sum(t), self.dtype) for t in tensors]) \
            / tf.constant(self.size, self.dtype)

    def decayed(self, variable: tf.Variable) -> tf.Tensor:
        """w - learning_rate * weight_decay * w (the decoupled decay), at w's dtype.

        Args:
          variable: a trained variable.

        Returns:
          The decayed value.
        """
        w = tf.convert_to_tensor(variable)
        if not self.weight_decay:
            return w
        return w - tf.constant(self.lr * self.weight_decay, w.dtype) * w

    @property
    def learning_rate(self) -> Tensor:
        """The (constant) learning rate."""
        return tf.constant(self.lr, tf.float32)

    def logs(self) -> Mapping[str, Tensor]:
        """What the last step used (the subclass's names).

        Returns:
          {name: scalar variable}.
        """
        return dict(zip(self.log_names, self.log_values))
