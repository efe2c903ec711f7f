"""Policies as Keras models, and the action distributions they give.

A policy wraps a network (any built Keras model or layer from observations
`[..., observation_dim]` to `[..., n]` outputs) and adds a head:

- `CategoricalPolicy(network, num_actions)`: the network's outputs are the logits of
  `num_actions` discrete actions;
- `GaussianPolicy(network, action_dim, init_std)`: the outputs are the mean of a diagonal
  Gaussian whose log standard deviation is a learned, state-independent weight
  (`log_std`, `[action_dim]`).

`policy.distribution(observations, params=None)` returns the distribution of the actions,
a `Categorical` or a `DiagonalGaussian` (NamedTuples of tensors: `tf.nest` maps over them,
`tf.stop_gradient` freezes one, they cross `tf.function` and `tf.vectorized_map`
boundaries), with `log_prob(actions)`, `sample(seed)` (stateless: the same seed, the same
actions), `entropy()` and `kl(other)`. With `params` (tensors ordered as
`policy.trainable_variables`, e.g. adapted ones in MAML's inner step) the policy is
evaluated through `hogrod.functional_call`, so a tape on `params` sees through it.

A continuous action is the unclipped sample: an environment clips it to its bounds, and
its log-probability is that of the unclipped action.
"""

import math
from typing import Any, NamedTuple, Optional

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.functional import functional_call
from hogrod.types import Params, Seed, TensorLike

__all__ = ["Categorical", "DiagonalGaussian", "CategoricalPolicy", "GaussianPolicy"]


def _same_kind(self, other, where):
    if type(other) is not type(self):
        raise checks.ArgumentError(f"{where}: other must be a {type(self).__name__}, got "
                                   f"{type(other).__name__}")
    for a, b in zip(self, other):
        if a.dtype != b.dtype or not a.shape.is_compatible_with(b.shape):
            raise checks.ArgumentError(f"{where}: other is {checks.describe(tuple(other))}, "
                                       f"this distribution {checks.describe(tuple(self))}")


def _finite(log_p):
    """`log_p` with the impossible actions' -inf (masked logits) replaced by 0, so that
    ``p * log p`` is 0 there, in value and gradient, instead of 0 * -inf = NaN."""
    return tf.where(tf.math.is_inf(log_p), tf.zeros_like(log_p), log_p)


def _where_possible(log_p, terms):
    """`terms` where the action is possible, 0 where its probability is 0."""
    return tf.where(tf.math.is_inf(log_p), tf.zeros_like(terms), terms)


class Categorical(NamedTuple):
    """A batch of categorical distributions over `n` actions, from logits.

    Its fields are its constructor's arguments, `Categorical(logits)`.

    Args:
      logits: `[..., n]` floating logits (unnormalized log-probabilities).
    """

    logits: tf.Tensor

    def _actions(self, actions, where):
        a = tf.convert_to_tensor(actions)
        n = self.logits.shape[-1]
        if not a.dtype.is_integer:
            raise checks.ArgumentError(f"{where}: actions must have an integer dtype (indices "
                                       f"0..{n - 1}), got {a.dtype.name}")
        if not a.shape.is_compatible_with(self.logits.shape[:-1]):
            raise checks.ArgumentError(
                f"{where}: actions must have shape {self.logits.shape[:-1].as_list()} (the "
                f"logits' without the last axis), got {a.shape.as_list()}")
        check = checks.require(
            tf.reduce_all((a >= 0) & (a < tf.cast(tf.shape(self.logits)[-1], a.dtype))),
            f"{where}: actions must lie in 0..{n - 1}")
        with tf.control_dependencies(check):  # before a gather fails with its own message
            return tf.identity(a)

    def log_prob(self, actions: TensorLike) -> tf.Tensor:
        """The log-probability of each action.

        Args:
          actions: integer actions in 0..n-1 shaped as the logits without their last axis.

        Returns:
          A tensor shaped as the logits without their last axis, of their dtype.

        Raises:
          ArgumentError: actions not integer, of another shape, or out of range (eagerly;
            in a graph an assertion fails when it runs, except under XLA, `jit_compile=True`,
            which drops it).
        """
        a = self._actions(actions, "Categorical.log_prob")
        log_p = tf.nn.log_softmax(self.logits)
        # a gather, not one_hot * log_p: an impossible action's -inf (a masked logit) times 0
        # would be NaN in every log-probability of the row
        return tf.gather(log_p, a, batch_dims=a.shape.rank)

    def sample(self, seed: Seed) -> tf.Tensor:
        """Actions drawn from the distributions (stateless: a seed gives the same actions).

        Args:
          seed: an int >= 0 or a `[2]` integer tensor (`tf.random.stateless_*`'s seed).

        Returns:
          int32 actions shaped as the logits without their last axis.
        """
        s = checks.stateless_seed(seed, "seed", "Categorical.sample")
        n = tf.shape(self.logits)[-1]
        flat = tf.reshape(self.logits, [-1, n])
        draws = tf.random.stateless_categorical(flat, 1, s, dtype=tf.int32)[:, 0]
        return tf.reshape(draws, tf.shape(self.logits)[:-1])

    def entropy(self) -> tf.Tensor:
        """The entropy ``-sum_a p_a log p_a`` of each distribution.

        Returns:
          A tensor shaped as the logits without their last axis.
        """
        log_p = tf.nn.log_softmax(self.logits)
        return -tf.reduce_sum(_where_possible(log_p, tf.exp(log_p) * _finite(log_p)), -1)

    def kl(self, other: "Categorical") -> tf.Tensor:
        """``KL(self || other) = sum_a p_a (log p_a - log q_a)`` of each pair.

        Args:
          other: a `Categorical` of the same shape and dtype.

        Returns:
          A tensor shaped as the logits without their last axis.

        Raises:
          ArgumentError: `other` is not a `Categorical` of the same shape and dtype.
        """
        _same_kind(self, other, "Categorical.kl")
        log_p, log_q = tf.nn.log_softmax(self.logits), tf.nn.log_softmax(other.logits)
        # where p is 0 the difference is replaced, not multiplied by 0: log q may be -inf too
        gap = tf.where(tf.math.is_inf(log_p), tf.zeros_like(log_p), log_p - log_q)
        return tf.reduce_sum(tf.exp(log_p) * gap, -1)


class DiagonalGaussian(NamedTuple):
    """A batch of Gaussians with diagonal covariance.

    Its fields are its constructor's arguments, `DiagonalGaussian(mean, log_std)`.

    Args:
      mean: `[..., d]` floating means.
      log_std: `[..., d]` log standard deviations, `mean`'s shape and dtype.
    """

    mean: tf.Tensor
    log_std: tf.Tensor

    def log_prob(self, actions: TensorLike) -> tf.Tensor:
        """The log-density of each action, summed over the `d` dimensions.

        Args:
          actions: `[..., d]` floating actions of `mean`'s shape and dtype (unclipped).

        Returns:
          A tensor shaped as `mean` without its last axis.

        Raises:
          ArgumentError: actions not floating, or of another shape or dtype.
        """
        a = checks.floating(actions, "actions", "DiagonalGaussian.log_prob")
        a = checks.like(a, "actions", "DiagonalGaussian.log_prob", self.mean, "mean")
        z = (a - self.mean) * tf.exp(-self.log_std)
        log_2pi = tf.constant(math.log(2 * math.pi), self.mean.dtype)
        return -0.5 * tf.reduce_sum(z * z + 2 * self.log_std + log_2pi, -1)

    def sample(self, seed: Seed) -> tf.Tensor:
        """Actions ``mean + exp(log_std) eps``, eps standard normal (stateless).

        Args:
          seed: an int >= 0 or a `[2]` integer tensor.

        Returns:
          Actions of `mean`'s shape and dtype.
        """
        s = checks.stateless_seed(seed, "seed", "DiagonalGaussian.sample")
        eps = tf.random.stateless_normal(tf.shape(self.mean), s, dtype=self.mean.dtype)
        return self.mean + tf.exp(self.log_std) * eps

    def entropy(self) -> tf.Tensor:
        """The entropy ``sum_i (log_std_i + (1 + log 2 pi) / 2)`` of each distribution.

        Returns:
          A tensor shaped as `mean` without its last axis.
        """
        c = tf.constant(0.5 * (1 + math.log(2 * math.pi)), self.mean.dtype)
        return tf.reduce_sum(self.log_std + c, -1)

    def kl(self, other: "DiagonalGaussian") -> tf.Tensor:
        """``KL(self || other)`` of each pair, summed over dimensions: ``log(s2/s1) + (s1**2 +
        (m1 - m2)**2) / (2 s2**2) - 1/2`` per dimension.

        Args:
          other: a `DiagonalGaussian` of the same shapes and dtype.

        Returns:
          A tensor shaped as `mean` without its last axis.

        Raises:
          ArgumentError: `other` is not a `DiagonalGaussian` of the same shapes and dtype.
        """
        _same_kind(self, other, "DiagonalGaussian.kl")
        ratio = tf.exp(2 * (self.log_std - other.log_std))
        gap = (self.mean - other.mean) * tf.exp(-other.log_std)
        return tf.reduce_sum(other.log_std - self.log_std + 0.5 * (ratio + gap * gap - 1), -1)


def _outputs(policy, observations, params, where):
    if not policy.built:
        raise checks.ArgumentError(f"{where}: the policy is not built; call it once on "
                                   "observations or build it first")
    if params is None:
        return policy(observations)
    return functional_call(policy, checks.params(params, where), observations)


class CategoricalPolicy(keras.Model):
    """A policy over `num_actions` discrete actions: the network's outputs are the logits.

    Args:
      network: a Keras model or layer from observations `[..., observation_dim]` to logits
        `[..., num_actions]`.
      num_actions: the number of actions, an int >= 2.
      **kwargs: passed to `keras.Model` (`name`, `dtype`).

    Raises:
      ArgumentError: `num_actions` not an int >= 2, or `network` not a Keras layer.
    """

    def __init__(self, network: keras.Layer, num_actions: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(network, keras.Layer):
            raise checks.ArgumentError(f"CategoricalPolicy: network must be a Keras model or "
                                       f"layer, got {type(network).__name__}")
        self.network = network
        self.num_actions = checks.integer(num_actions, "num_actions", "CategoricalPolicy", 2)

    def build(self, input_shape: tf.TensorShape) -> None:
        """Builds the network for observations of `input_shape`.

        Args:
          input_shape: the observations' shape, `[..., observation_dim]`.
        """
        if not self.network.built:
            self.network.build(input_shape)
        self.built = True

    def call(self, observations: TensorLike, training: bool = False) -> tf.Tensor:
        """The logits of the actions.

        Args:
          observations: `[..., observation_dim]` observations.
          training: passed to the network (Dropout, BatchNormalization).

        Returns:
          `[..., num_actions]` logits.

        Raises:
          ArgumentError: the network's output's last axis is not `num_actions`.
        """
        logits = self.network(observations, training=training)
        if logits.shape[-1] != self.num_actions:
            raise checks.ArgumentError(
                f"CategoricalPolicy: the network gives {logits.shape[-1]} outputs, not "
                f"num_actions = {self.num_actions}")
        return logits

    def distribution(self, observations: TensorLike, params: Optional[Params] = None
                     ) -> Categorical:
        """The distribution of the actions at `observations`.

        Args:
          observations: `[..., observation_dim]` observations.
          params: None (the policy's variables) or tensors for `self.trainable_variables`,
            in their order, through `hogrod.functional_call`.

        Returns:
          A `Categorical` with `[..., num_actions]` logits.
        """
        return Categorical(_outputs(self, observations, params,
                                    "CategoricalPolicy.distribution"))


class GaussianPolicy(keras.Model):
    """A diagonal-Gaussian policy: the network's outputs are the mean, the log standard
    deviation a learned weight `log_std` (`[action_dim]`, independent of the state).

    Args:
      network: a Keras model or layer from observations `[..., observation_dim]` to means
        `[..., action_dim]`.
      action_dim: the size of an action, an int >= 1.
      init_std: the initial standard deviation (`log_std` starts at its log), > 0.
      **kwargs: passed to `keras.Model` (`name`, `dtype`: also `log_std`'s dtype).

    Raises:
      ArgumentError: an argument out of range, or `network` not a Keras layer.
    """

    def __init__(self, network: keras.Layer, action_dim: int, init_std: float = 1.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(network, keras.Layer):
            raise checks.ArgumentError(f"GaussianPolicy: network must be a Keras model or "
                                       f"layer, got {type(network).__name__}")
        self.network = network
        self.action_dim = checks.integer(action_dim, "action_dim", "GaussianPolicy", 1)
        self.init_std = checks.positive(init_std, "init_std", "GaussianPolicy")
        self.log_std = self.add_weight(shape=(self.action_dim,), name="log_std",
                                       initializer="zeros")
        # assigned at the variable's dtype: Keras's Constant initializer rounds through float32
        self.log_std.assign(np.full(self.action_dim, math.log(self.init_std),
                                    tf.as_dtype(self.log_std.dtype).as_numpy_dtype))

    def build(self, input_shape: tf.TensorShape) -> None:
        """Builds the network for observations of `input_shape`.

        Args:
          input_shape: the observations' shape, `[..., observation_dim]`.
        """
        if not self.network.built:
            self.network.build(input_shape)
        self.built = True

    def call(self, observations: TensorLike, training: bool = False) -> tuple:
        """The mean and the log standard deviation of the actions.

        Args:
          observations: `[..., observation_dim]` observations.
          training: passed to the network (Dropout, BatchNormalization).

        Returns:
          `(mean, log_std)`, both `[..., action_dim]` (`log_std` broadcast).

        Raises:
          ArgumentError: the network's output's last axis is not `action_dim`.
        """
        mean = self.network(observations, training=training)
        if mean.shape[-1] != self.action_dim:
            raise checks.ArgumentError(
                f"GaussianPolicy: the network gives {mean.shape[-1]} outputs, not "
                f"action_dim = {self.action_dim}")
        log_std = tf.cast(tf.convert_to_tensor(self.log_std), mean.dtype)
        return mean, tf.broadcast_to(log_std, tf.shape(mean))

    def distribution(self, observations: TensorLike, params: Optional[Params] = None
                     ) -> DiagonalGaussian:
        """The distribution of the actions at `observations`.

        Args:
          observations: `[..., observation_dim]` observations.
          params: None (the policy's variables) or tensors for `self.trainable_variables`,
            in their order, through `hogrod.functional_call`.

        Returns:
          A `DiagonalGaussian` with `[..., action_dim]` mean and log standard deviation.
        """
        mean, log_std = _outputs(self, observations, params, "GaussianPolicy.distribution")
        return DiagonalGaussian(mean, log_std)
