"""The GAN losses, as plain gin-configurable functions of the critic's scores.

Every loss has one signature:

    loss(real_scores, fake_scores) -> GanLosses(critic, generator)

- `real_scores`, `fake_scores`: the critic's raw scores (logits, no sigmoid) on a real and a
  generated batch, `[batch]` or `[batch, 1]`;
- `GanLosses.critic`: the scalar the critic minimizes; `GanLosses.generator`: the scalar the
  generator minimizes (its gradient flows through `fake_scores`; `real_scores` enter the
  relativistic generator loss as numbers the generator cannot move).

Both are means over the batch, unweighted; penalties (`hogrod.gan.penalties`) are added by
the trainer with their weights. The critic scores real data high in every loss (the WGAN-GP
trainer's convention). Half-precision scores are reduced in float32; float64 stays float64.

- `wasserstein_loss` (WGAN, Arjovsky et al. 2017): critic ``E D(fake) - E D(real)``,
  generator ``-E D(fake)``;
- `saturating_loss` (the original minimax GAN, Goodfellow et al. 2014): critic
  ``E softplus(-D(real)) + E softplus(D(fake))`` (the binary cross-entropy of sigmoid(D)),
  generator ``E log(1 - sigmoid(D(fake))) = -E softplus(D(fake))``;
- `nonsaturating_loss` (the same critic; generator ``E softplus(-D(fake))``, Goodfellow et al.
  2014's practical choice and StyleGAN2's);
- `relativistic_loss` (RpGAN, Jolicoeur-Martineau 2019; R3GAN, Huang et al. 2024): each real
  example paired with the generated one at the same index: critic
  ``E softplus(D(fake) - D(real))``, generator ``E softplus(D(real) - D(fake))``. R3GAN adds
  R1 and R2, each weighted gamma / 2 (`r1_penalty`, `r2_penalty`, which sum over the input's
  axes as R3GAN does).

A trainer takes a loss by gin reference (``loss = @relativistic_loss``); the Dirac-GAN
(`hogrod.gan.dirac`) takes every one of them.
"""

from typing import NamedTuple

import gin
import tensorflow as tf

from hogrod.types import TensorLike

__all__ = ["GanLosses", "wasserstein_loss", "saturating_loss", "nonsaturating_loss",
           "relativistic_loss"]

_DATA = ["real_scores", "fake_scores"]  # arguments gin must not bind


class GanLosses(NamedTuple):
    """The two players' losses for one pair of batches.

    Attributes:
      critic: the scalar the critic minimizes.
      generator: the scalar the generator minimizes.
    """
    critic: tf.Tensor
    generator: tf.Tensor


def _flat(scores, name, where):
    """Scores as a [batch] tensor; float32 for half precision (reduced in float32)."""
    s = tf.convert_to_tensor(scores)
    if not s.dtype.is_floating:
        raise TypeError(f"{where}: {name} must be floating scores (logits), got dtype "
                        f"{s.dtype.name}")
    if s.shape.rank is not None and (s.shape.rank > 2 or s.shape.rank == 0
                                     or (s.shape.rank == 2 and s.shape[-1] != 1)):
        raise ValueError(f"{where}: {name} must hold one score per example, shape [batch] or "
                         f"[batch, 1], got {s.shape}")
    if s.dtype in (tf.float16, tf.bfloat16):
        s = tf.cast(s, tf.float32)
    return tf.reshape(s, [-1])


def _scores(real_scores, fake_scores, where, paired=False):
    real = _flat(real_scores, "real_scores", where)
    fake = _flat(fake_scores, "fake_scores", where)
    if real.dtype != fake.dtype:
        raise TypeError(f"{where}: real_scores and fake_scores differ in dtype "
                        f"({real.dtype.name}, {fake.dtype.name}); the critic scores both")
    if paired:  # the pairing needs one generated example per real one
        if not real.shape.is_compatible_with(fake.shape):
            raise ValueError(f"{where}: real_scores and fake_scores must have the same batch "
                             f"size (each real example is paired with one generated), got "
                             f"{real.shape[0]} and {fake.shape[0]}")
        if not (real.shape.is_fully_defined() and fake.shape.is_fully_defined()):
            check = tf.debugging.assert_equal(
                tf.shape(real), tf.shape(fake),
                message=f"{where}: real_scores and fake_scores differ in batch size")
            with tf.control_dependencies([check]):
                real = tf.identity(real)
    return real, fake


@gin.configurable(denylist=_DATA)
def wasserstein_loss(real_scores: TensorLike, fake_scores: TensorLike) -> GanLosses:
    """WGAN: the critic minimizes ``E D(fake) - E D(real)``, the generator ``-E D(fake)``.

    Args:
      real_scores: the critic's scores on the real batch, [batch] or [batch, 1].
      fake_scores: its scores on the generated batch, [batch'] or [batch', 1].

    Returns:
      `GanLosses(critic, generator)`, scalars of the scores' dtype (float32 for half).

    Raises:
      ValueError: a score tensor is not one score per example.
      TypeError: the scores are not floating, or differ in dtype.
    """
    real, fake = _scores(real_scores, fake_scores, "wasserstein_loss")
    mean_fake = tf.reduce_mean(fake)
    return GanLosses(mean_fake - tf.reduce_mean(real), -mean_fake)


def _critic_cross_entropy(real, fake):
    # -log sigmoid(D(real)) - log(1 - sigmoid(D(fake))), in the stable softplus form
    return tf.reduce_mean(tf.nn.softplus(-real)) + tf.reduce_mean(tf.nn.softplus(fake))


@gin.configurable(denylist=_DATA)
def saturating_loss(real_scores: TensorLike, fake_scores: TensorLike) -> GanLosses:
    """The original minimax GAN: the generator minimizes ``E log(1 - sigmoid(D(fake)))``.

    The critic minimizes the cross-entropy ``E softplus(-D(real)) + E softplus(D(fake))``; the
    generator ``-E softplus(D(fake))``, whose gradient vanishes where the critic rejects
    the generated samples confidently (hence "saturating"). The Dirac-GAN's unregularized
    game (`hogrod.gan.dirac`) is this loss.

    Args:
      real_scores: the critic's scores (logits) on the real batch, [batch] or [batch, 1].
      fake_scores: its scores on the generated batch, [batch'] or [batch', 1].

    Returns:
      `GanLosses(critic, generator)`, scalars of the scores' dtype (float32 for half).

    Raises:
      ValueError: a score tensor is not one score per example.
      TypeError: the scores are not floating, or differ in dtype.
    """
    real, fake = _scores(real_scores, fake_scores, "saturating_loss")
    return GanLosses(_critic_cross_entropy(real, fake),
                     -tf.reduce_mean(tf.nn.softplus(fake)))


@gin.configurable(denylist=_DATA)
def nonsaturating_loss(real_scores: TensorLike, fake_scores: TensorLike) -> GanLosses:
    """The non-saturating GAN: the generator minimizes ``E softplus(-D(fake))``.

    That is ``-E log sigmoid(D(fake))``; the critic minimizes the cross-entropy
    ``E softplus(-D(real)) + E softplus(D(fake))`` as in `saturating_loss` (StyleGAN2's
    losses, with R1 on the critic: `r1_penalty` weighted gamma / 2).

    Args:
      real_scores: the critic's scores (logits) on the real batch, [batch] or [batch, 1].
      fake_scores: its scores on the generated batch, [batch'] or [batch', 1].

    Returns:
      `GanLosses(critic, generator)`, scalars of the scores' dtype (float32 for half).

    Raises:
      ValueError: a score tensor is not one score per example.
      TypeError: the scores are not floating, or differ in dtype.
    """
    real, fake = _scores(real_scores, fake_scores, "nonsaturating_loss")
    return GanLosses(_critic_cross_entropy(real, fake),
                     tf.reduce_mean(tf.nn.softplus(-fake)))


@gin.configurable(denylist=_DATA)
def relativistic_loss(real_scores: TensorLike, fake_scores: TensorLike) -> GanLosses:
    """RpGAN's relativistic pairing loss (R3GAN's loss, with R1 + R2 added by the trainer).

    Example i of the real batch is paired with example i of the generated batch: the critic
    minimizes ``E softplus(D(fake_i) - D(real_i))`` (it wants each real example scored above
    its generated partner), the generator ``E softplus(D(real_i) - D(fake_i))``. The
    generator's loss depends on the real scores: a trainer runs the critic on the real batch
    in the generator step too (R3GAN does).

    Args:
      real_scores: the critic's scores (logits) on the real batch, [batch] or [batch, 1].
      fake_scores: its scores on the generated batch, the same batch size.

    Returns:
      `GanLosses(critic, generator)`, scalars of the scores' dtype (float32 for half).

    Raises:
      ValueError: a score tensor is not one score per example, or the batch sizes differ.
      TypeError: the scores are not floating, or differ in dtype.
    """
    real, fake = _scores(real_scores, fake_scores, "relativistic_loss", paired=True)
    margin = fake - real  # the generated example's score relative to its real partner
    return GanLosses(tf.reduce_mean(tf.nn.softplus(margin)),
                     tf.reduce_mean(tf.nn.softplus(-margin)))
