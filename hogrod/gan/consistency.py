"""Balanced consistency regularization (bCR; Zhang et al. 2020, Zhao et al. 2021), a critic
penalty in the penalties' one signature.

    consistency_penalty(critic, real, fake, *, noise=None, augment=..., fake_weight=1.0)

is ``E ||D(x) - D(T(x))||^2`` on the real batch plus `fake_weight` times the same on the
generated batch, with `T` the user's augmentation (`augment`, bound by gin: ``
consistency_penalty.augment = @my_flip``). The critic's scores are its raw outputs (the
layer before any sigmoid), as in both papers.

Conventions, and where they differ from the papers' code:

- both scores are differentiated (the papers' Algorithm 1); implementations that stop the
  gradient of D(x) give a gradient half as large on a symmetric augmentation;
- the squared difference is per example, then the mean over the batch; `torch.nn.MSELoss`
  on [batch, 1] scores is the same, on wider outputs it would also average over them;
- the penalty returns real + `fake_weight` x fake, unweighted (the papers' lambda_real =
  lambda_fake = 10: the trainer's weight 10 and `fake_weight` 1); `fake_weight` 0 is CR-GAN's
  original real-only penalty;
- `augment` draws its own random numbers (a `tf.random` op, or a stateless op seeded as
  you like): under a tf.distribute strategy each replica then draws its own, the same
  distribution as one device with other numbers. An augmentation must keep the batch's
  shape and dtype (checked: the error names the binding).

zCR (Zhao et al. 2021) perturbs the latent code instead: its generator-side term is
`hogrod.gan.latent_consistency_penalty`.
"""

from typing import Callable, Optional

import gin
import tensorflow as tf

from hogrod import checks
from hogrod.gan.penalties import Critic, Noise, _noise, _pair
from hogrod.types import TensorLike

__all__ = ["consistency_penalty"]

# an augmentation T: a batch to a batch of the same shape and dtype
Augmentation = Callable[[tf.Tensor], tf.Tensor]


def _augmented(augment: Augmentation, x: tf.Tensor) -> tf.Tensor:
    """T(x), checked to keep x's shape and dtype (the error names the binding)."""
    where = "consistency_penalty.augment"
    out = tf.convert_to_tensor(augment(x))
    if out.dtype != x.dtype:
        raise checks.ArgumentError(f"{where}: the augmentation must keep the batch's dtype "
                                   f"{x.dtype.name}, got {out.dtype.name}")
    if not out.shape.is_compatible_with(x.shape):
        raise checks.ArgumentError(f"{where}: the augmentation must keep the batch's shape "
                                   f"{x.shape.as_list()}, got {out.shape.as_list()}")
    if not (out.shape.is_fully_defined() and x.shape.is_fully_defined()):
        check = tf.debugging.assert_equal(tf.shape(out), tf.shape(x), message=(
            f"{where}: the augmentation must keep the batch's shape"))
        with tf.control_dependencies([check]):
            out = tf.identity(out)
    return out


def _scores(critic, x):
    s = tf.convert_to_tensor(critic(x))
    if s.dtype in (tf.float16, tf.bfloat16):  # mixed precision: reduce in float32
        s = tf.cast(s, tf.float32)
    if s.shape.rank is not None and (s.shape.rank > 2 or (s.shape.rank == 2 and s.shape[-1] != 1)):
        raise ValueError(f"consistency_penalty: the critic must return one score per example "
                         f"([batch] or [batch, 1]), got shape {s.shape}")
    return tf.reshape(s, [-1])


def _inconsistency(critic, augment, x):
    """E_i (D(x)_i - D(T(x))_i)^2."""
    return tf.reduce_mean(tf.square(_scores(critic, x) - _scores(critic, _augmented(augment, x))))


@gin.configurable(denylist=["critic", "real", "fake", "noise"])
def consistency_penalty(critic: Critic, real: TensorLike, fake: Optional[TensorLike] = None,
                        augment: Optional[Augmentation] = None, fake_weight: float = 1.0, *,
                        noise: Noise = None) -> tf.Tensor:
    """bCR: ``E ||D(x) - D(T(x))||^2`` on real data + `fake_weight` times it on generated data.

    Args:
      critic: a callable from a batch to one score per example ([batch] or [batch, 1]).
      real: the real batch, [batch, ...].
      fake: the generated batch, real's shape; None: real data only (`fake_weight` must
        then be 0).
      augment: the augmentation T, ``augment(x) -> x'`` of x's shape and dtype (random or
        not); required (bind ``consistency_penalty.augment = @your_augmentation``).
      fake_weight: the generated batch's term relative to the real one's, >= 0 (bCR: 1;
        CR-GAN: 0).
      noise: the batch's random numbers for the other penalties (unused; its keys are
        checked against `NOISE_KEYS`); None: none.

    Returns:
      The penalty, a scalar (the scores' dtype; float32 for half precision): the means over
      the batch, unweighted.

    Raises:
      ArgumentError: `augment` is missing or not callable, changes the batch's shape or
        dtype, or `fake_weight` is negative, or is positive without a `fake` batch.
      ValueError: real and fake differ in shape, `noise` has an unknown key, or the critic
        does not return one score per example.
      TypeError: `noise` is not a dict.
    """
    where = "consistency_penalty"
    if augment is None:
        raise checks.ArgumentError(f"{where}: augment is required: bind "
                                   f"{where}.augment = @your_augmentation (x -> x', same shape)")
    checks.function(augment, "augment", where, "augment(x) -> x'")
    fake_weight = checks.nonnegative(fake_weight, "fake_weight", where)
    real, fake = _pair(real, fake)
    _noise(noise, where)
    value = _inconsistency(critic, augment, real)
    if fake_weight == 0.0:
        return value
    if fake is None:
        raise checks.ArgumentError(f"{where}: fake_weight is {fake_weight} but no fake batch "
                                   "was given; pass fake, or bind fake_weight = 0.0")
    fake_term = _inconsistency(critic, augment, tf.cast(fake, real.dtype))
    return value + tf.constant(fake_weight, value.dtype) * fake_term
