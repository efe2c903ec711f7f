"""Gradient penalties: the gradient of a gradient norm, as plain gin-configurable functions.

Every penalty has one signature:

    penalty(critic, real, fake, *, noise=None) -> scalar

- `critic`: any callable from a batch to one score per example ([batch] or [batch, 1]);
- `real`, `fake`: batches of the same shape (a penalty ignores the one it does not use, but
  checks that the two match);
- `noise`: the dict of random numbers that came with the batch (`gan.with_noise` draws them
  in tf.data, so every replica of a tf.distribute strategy gets its shard of the numbers a
  single device would use, and the distributed step equals the single-device one).
  Keys (each optional: a penalty draws what is missing itself):
    "interpolation": U[0, 1] weights, one per example, shape [batch] (GP's e, DRAGAN's
        alpha);
    "perturbation": DRAGAN's perturbation at unit scale, shape of `real`: the std of the
        whole batch times U[0, 1] per element (drawn in tf.data, the std is the global
        batch's, as on one device).
  Hyperparameters (`target`, `one_sided`, `scale`) are keyword arguments, bound by gin.

Each returns the unweighted expectation over the batch (trainers apply weights). The input
gradient is taken with an inner tape, so an outer tape (the critic's update) differentiates
through it: double backprop. The norm is over all non-batch axes (vectors or images) and
is exact and safe at a zero gradient: value 0, finite gradients. Half-precision gradients
are reduced in float32, so the penalties work under mixed precision (float64 stays
float64); they use no Python state, so they run inside `tf.function` and `tf.distribute`
replica functions.

The trainer takes penalties by reference, each with its weight and lazy interval, so a
gin file selects and tunes them:

    make_gan_step.critic_penalties = [(@gradient_penalty, 10.0, 1)]   # WGAN-GP (the default)
    gradient_penalty.target = 0.0                                     # here zero-centred

the others are `@lp_penalty`, `@r1_penalty`, `@r2_penalty`, `@dragan_penalty`,
`@consistency_penalty`; `[]` is no penalty.

Adding a penalty is one function and one binding:

    @gin.configurable(denylist=["critic", "real", "fake", "noise"])
    def r1_plus_r2(critic, real, fake, *, noise=None, ratio=1.0):
        # E||grad D(real)||^2 + ratio E||grad D(fake)||^2
        return (tf.reduce_mean(squared_input_gradient(critic, real))
                + ratio * tf.reduce_mean(squared_input_gradient(critic, fake)))

    # in a gin file (the module defining it imported by the binary):
    make_gan_step.critic_penalties = [(@r1_plus_r2, 0.1, 1)]
    r1_plus_r2.ratio = 0.5
"""

import numbers
from typing import Callable, Mapping, Optional

import gin
import tensorflow as tf

from hogrod import checks
from hogrod.types import Seed, TensorLike

__all__ = ["input_gradient_norm", "squared_input_gradient", "gradient_penalty", "lp_penalty",
           "r1_penalty", "r2_penalty", "dragan_penalty", "perturbation", "NOISE_KEYS"]

NOISE_KEYS = ("interpolation", "perturbation")  # what `with_noise` draws for the penalties

_DATA = ["critic", "real", "fake", "noise"]  # arguments gin must not bind

# a critic: a batch [batch, ...] to one score per example, [batch] or [batch, 1]
Critic = Callable[[tf.Tensor], tf.Tensor]
# a batch's random numbers for the penalty, keyed by NOISE_KEYS
Noise = Optional[Mapping[str, TensorLike]]


def _safe_norm(squared: tf.Tensor) -> tf.Tensor:
    """sqrt with value 0 and gradient 0 (not NaN) where the argument is 0."""
    positive = squared > 0
    return tf.where(positive, tf.sqrt(tf.where(positive, squared, 1.0)), 0.0)


def _one_score_per_example(shape, n):
    """Whether a critic output of `shape` can be one score for each of n examples: [n] or
    [n, 1] ([] for a single example; unknown sizes are given the benefit of the doubt)."""
    if shape.rank is None:
        return True
    if shape.rank == 0:
        return n == 1
    if shape.rank > 2 or (shape.rank == 2 and shape[-1] != 1):
        return False
    return shape[0] is None or n is None or shape[0] == n


def squared_input_gradient(critic: Critic, x: TensorLike) -> tf.Tensor:
    """The squared norm of each example's input gradient, ``||d critic(x)_i / d x_i||^2``.

    The gradient is taken with an inner tape, so an outer tape differentiates through it
    (double backprop); the norm is over all non-batch axes.

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      x: the inputs, [batch, ...].

    Returns:
      A tensor [batch], x's dtype (float32 for half precision: reduced in float32).

    Raises:
      ValueError: the critic does not return one score per example.
    """
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = critic(x)
        if not _one_score_per_example(out.shape, x.shape[0]):
            raise ValueError(f"the critic must return one scalar per example (shape "
                             f"[{x.shape[0]}] or [{x.shape[0]}, 1]), got shape {out.shape}")
        total = tf.reduce_sum(out)  # example i's score depends only on x_i
    grad = tape.gradient(total, x)
    if grad.dtype in (tf.float16, tf.bfloat16):  # mixed precision: reduce in float32
        grad = tf.cast(grad, tf.float32)
    axes = list(range(1, x.shape.rank))
    return tf.reduce_sum(tf.square(grad), axis=axes)


def input_gradient_norm(critic: Critic, x: TensorLike) -> tf.Tensor:
    """The norm of each example's input gradient, ``||d critic(x)_i / d x_i||``.

    Exact and safe at a zero gradient: value 0, gradient 0 (not NaN).

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      x: the inputs, [batch, ...].

    Returns:
      A tensor [batch], of `squared_input_gradient`'s dtype.

    Raises:
      ValueError: the critic does not return one score per example.
    """
    return _safe_norm(squared_input_gradient(critic, x))


def _pair(real, fake):
    """real and fake as tensors (fake may be None), checked to have the same shape."""
    real = tf.convert_to_tensor(real)
    if fake is None:
        return real, None
    fake = tf.convert_to_tensor(fake)
    if not real.shape.is_compatible_with(fake.shape):
        raise ValueError(f"real and fake must have the same shape, got {real.shape} and "
                         f"{fake.shape}")
    if not (real.shape.is_fully_defined() and fake.shape.is_fully_defined()):
        # unknown sizes (a tf.function traced with None): checked when the step runs, before
        # anything computed from them (else a broadcasting error may come first)
        check = tf.debugging.assert_equal(tf.shape(real), tf.shape(fake),
                                          message="real and fake must have the same shape")
        with tf.control_dependencies([check]):
            real, fake = tf.identity(real), tf.identity(fake)
    return real, fake


def _noise(noise, name):
    if noise is None:
        return {}
    if not hasattr(noise, "get") or not hasattr(noise, "keys"):
        raise TypeError(f"{name}: noise must be a dict of random numbers (keys "
                        f"{NOISE_KEYS}) or None, got {type(noise).__name__}")
    unknown = sorted(set(noise.keys()) - set(NOISE_KEYS))
    if unknown:  # a misspelt key would otherwise be drawn here instead, silently
        raise ValueError(f"{name}: unknown noise key(s) {unknown} (a batch dict's keys other "
                         f"than 'real' and 'z' are the penalty's noise); the built-in "
                         f"penalties read {NOISE_KEYS}")
    return noise


def _per_example_shape(x):  # [batch, 1, ..., 1]: one value per example, broadcastable to x
    return tf.concat([tf.shape(x)[:1], tf.ones([x.shape.rank - 1], tf.int32)], 0)


def _per_example_weights(noise, real, name):
    """noise["interpolation"] (shape [batch]) as [batch, 1, ...] in real's dtype, or
    U[0, 1] drawn here when the batch brought none."""
    e = noise.get("interpolation")
    if e is None:
        return tf.random.uniform(_per_example_shape(real), dtype=real.dtype)
    e = tf.convert_to_tensor(e)
    if e.shape.rank != 1 or not e.shape.is_compatible_with(real.shape[:1]):
        raise ValueError(f"{name}: interpolation must hold one weight per example, shape "
                         f"[{real.shape[0]}], got {e.shape}")
    return tf.reshape(tf.cast(e, real.dtype), _per_example_shape(real))


def perturbation(real: TensorLike, seed: Optional[Seed] = None) -> tf.Tensor:
    """DRAGAN's perturbation at unit scale: ``std(real) * U[0, 1]`` per element.

    The std is over the whole batch, every element.

    Args:
      real: the real batch, [batch, ...].
      seed: a stateless seed, a [2] int tensor or pair (`tf.random.stateless_uniform`);
        None: a stateful random op.

    Returns:
      A tensor of real's shape and dtype.
    """
    real = tf.convert_to_tensor(real)
    if seed is None:
        u = tf.random.uniform(tf.shape(real), dtype=real.dtype)
    else:
        u = tf.random.stateless_uniform(tf.shape(real), seed, dtype=real.dtype)
    return tf.math.reduce_std(real) * u


@gin.configurable(denylist=_DATA)
def gradient_penalty(critic: Critic, real: TensorLike, fake: TensorLike, target: float = 1.0,
                     one_sided: bool = False, *, noise: Noise = None) -> tf.Tensor:
    """WGAN-GP (Gulrajani et al. 2017): ``E[(||grad D(x_hat)|| - target)^2]``.

    At random interpolates ``x_hat = e real + (1 - e) fake``, ``e ~ U[0, 1]`` per example.
    `one_sided`: ``E[max(0, ||grad|| - target)^2]``, the Lipschitz penalty (WGAN-LP,
    Petzka et al. 2018; `lp_penalty`). `target` 0: the zero-centred GP.

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      real: the real batch, [batch, ...].
      fake: the generated batch, real's shape (cast to real's dtype).
      target: the gradient norm aimed at (1: WGAN-GP; 0: zero-centred).
      one_sided: penalize only norms above `target` (WGAN-LP).
      noise: the batch's random numbers (see the module docstring): the weights e are
        noise["interpolation"] (shape [batch]) when given, else drawn here; None: all
        drawn here.

    Returns:
      The penalty, a scalar: the mean over the batch, unweighted.

    Raises:
      ValueError: real and fake differ in shape, `noise` has an unknown key or a wrong
        shape, or the critic does not return one score per example.
      TypeError: `noise` is not a dict.
      hogrod.checks.ArgumentError: a number `target` below 0.
    """
    if isinstance(target, numbers.Real) and not isinstance(target, bool):
        # a norm is >= 0: a negative target is a typo (a larger penalty, a plausible loss)
        checks.nonnegative(target, "target", "gradient_penalty")
    real, fake = _pair(real, fake)
    noise = _noise(noise, "gradient_penalty")
    e = _per_example_weights(noise, real, "gradient_penalty")
    x_hat = e * real + (1.0 - e) * tf.cast(fake, real.dtype)
    if isinstance(target, (int, float)) and target == 0:
        # (||g|| - 0)^2 = ||g||^2, one-sided too: the squared norm itself, whose second
        # derivative at a zero gradient is exact (the safe norm's is 0 there)
        return tf.reduce_mean(squared_input_gradient(critic, x_hat))
    gap = input_gradient_norm(critic, x_hat) - target
    if one_sided:
        gap = tf.nn.relu(gap)
    return tf.reduce_mean(tf.square(gap))


@gin.configurable(denylist=_DATA)
def lp_penalty(critic: Critic, real: TensorLike, fake: TensorLike, target: float = 1.0, *,
               noise: Noise = None) -> tf.Tensor:
    """WGAN-LP (Petzka et al. 2018): the one-sided `gradient_penalty`.

    ``E[max(0, ||grad D(x_hat)|| - target)^2]`` at the same interpolates.

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      real: the real batch, [batch, ...].
      fake: the generated batch, real's shape.
      target: the largest gradient norm not penalized.
      noise: the batch's random numbers, as `gradient_penalty` reads them; None: drawn here.

    Returns:
      The penalty, a scalar: the mean over the batch, unweighted.

    Raises:
      ValueError: as `gradient_penalty`.
      TypeError: `noise` is not a dict.
    """
    return gradient_penalty(critic, real, fake, target=target, one_sided=True, noise=noise)


@gin.configurable(denylist=_DATA)
def r1_penalty(critic: Critic, real: TensorLike, fake: Optional[TensorLike] = None, *,
               noise: Noise = None) -> tf.Tensor:
    """R1 (Mescheder et al. 2018): ``E[||grad D(x)||^2]`` on real data.

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      real: the real batch, [batch, ...].
      fake: the generated batch, unused but checked to have real's shape; None: unchecked.
      noise: the batch's random numbers (unused; its keys are checked); None: none.

    Returns:
      The penalty, a scalar: the mean over the batch, unweighted.

    Raises:
      ValueError: real and fake differ in shape, `noise` has an unknown key, or the critic
        does not return one score per example.
      TypeError: `noise` is not a dict.
    """
    real, _ = _pair(real, fake)
    _noise(noise, "r1_penalty")
    return tf.reduce_mean(squared_input_gradient(critic, real))


@gin.configurable(denylist=_DATA)
def r2_penalty(critic: Critic, real: TensorLike, fake: TensorLike, *,
               noise: Noise = None) -> tf.Tensor:
    """R2: ``E[||grad D(x)||^2]`` on generated data (`fake`).

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      real: the real batch, unused but checked to have fake's shape.
      fake: the generated batch, [batch, ...].
      noise: the batch's random numbers (unused; its keys are checked); None: none.

    Returns:
      The penalty, a scalar: the mean over the batch, unweighted.

    Raises:
      ValueError: real and fake differ in shape, `noise` has an unknown key, or the critic
        does not return one score per example.
      TypeError: `noise` is not a dict.
    """
    _, fake = _pair(real, fake)
    _noise(noise, "r2_penalty")
    return tf.reduce_mean(squared_input_gradient(critic, fake))


@gin.configurable(denylist=_DATA)
def dragan_penalty(critic: Critic, real: TensorLike, fake: Optional[TensorLike] = None,
                   target: float = 1.0, scale: float = 0.5, *, noise: Noise = None) -> tf.Tensor:
    """DRAGAN (Kodali et al. 2017): ``E[(||grad D(x_hat)|| - target)^2]`` near real data.

    At points between real data and a perturbation of it: ``x_hat = x + alpha * scale * p``,
    with p the perturbation at unit scale (``std(x) * U[0, 1]`` per element, see
    `perturbation`) and ``alpha ~ U[0, 1]`` per example.

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      real: the real batch, [batch, ...].
      fake: the generated batch, unused but checked to have real's shape; None: unchecked.
      target: the gradient norm aimed at.
      scale: the perturbation's scale, multiplying p.
      noise: the batch's random numbers: p is noise["perturbation"] (real's shape) and
        alpha noise["interpolation"] (shape [batch]) when given, else drawn here; None:
        all drawn here.

    Returns:
      The penalty, a scalar: the mean over the batch, unweighted.

    Raises:
      ValueError: real and fake differ in shape, `noise` has an unknown key or a wrong
        shape, or the critic does not return one score per example.
      TypeError: `noise` is not a dict.
    """
    real, _ = _pair(real, fake)
    noise = _noise(noise, "dragan_penalty")
    p = noise.get("perturbation")
    if p is None:
        p = perturbation(real)
    else:
        p = tf.convert_to_tensor(p)
        if not p.shape.is_compatible_with(real.shape):
            raise ValueError(f"dragan_penalty: noise['perturbation'] must have the shape of "
                             f"real, {real.shape}, got {p.shape}")
        p = tf.cast(p, real.dtype)
    alpha = _per_example_weights(noise, real, "dragan_penalty")
    x_hat = real + alpha * (scale * p)
    return tf.reduce_mean(tf.square(input_gradient_norm(critic, x_hat) - target))
