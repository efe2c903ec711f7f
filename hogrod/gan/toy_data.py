"""Toy 2-D distributions of the WGAN-GP paper, as seeded tf.data streams, and mode metrics.

8 Gaussians on a ring (radius 2, std 0.02, angles 2 pi i / 8), 25 Gaussians on a 5 x 5 grid
(spacing 2, std 0.05, scaled by 1/2.828 as in the original code) and the Swiss roll. Mode
metrics: each generated sample goes to its nearest mode; it is high
quality within 3 standard deviations of it; modes covered are those with at least one
high-quality sample; reverse KL compares the generated and true mode histograms. A
perfect sampler of 2-D isotropic modes scores 1 - exp(-4.5) = 98.9% high quality.
"""

import math
from typing import Optional

import gin
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.types import Seed, TensorLike

__all__ = ["TOY", "modes", "sample_toy", "toy_batches", "mode_metrics"]

TOY = ("eight_gaussians", "twentyfive_gaussians", "swiss_roll")


def modes(name: str) -> Optional[tuple[np.ndarray, float]]:
    """The modes of a toy mixture: their centers and their (isotropic) std.

    Args:
      name: a toy data set, one of `TOY`.

    Returns:
      (centers, std): centers a float64 array [K, 2] (K = 8 or 25), std a float; None for
      the Swiss roll, which has no modes.

    Raises:
      ValueError: `name` is not one of `TOY`.
    """
    if name == "eight_gaussians":
        angles = 2 * np.pi * np.arange(8) / 8
        return 2.0 * np.stack([np.cos(angles), np.sin(angles)], 1), 0.02
    if name == "twentyfive_gaussians":
        g = np.arange(-2, 3) * 2.0
        centers = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
        return centers / 2.828, 0.05 / 2.828
    if name == "swiss_roll":
        return None
    raise ValueError(f"unknown toy data set {name!r}; choose one of {TOY}")


def sample_toy(name: str, n: int, seed: Seed) -> tf.Tensor:
    """Samples of a toy distribution, from a stateless seed: the same seed, the same samples.

    Args:
      name: a toy data set, one of `TOY`.
      n: the number of samples.
      seed: a stateless seed: an int (the seed [seed, 0]) or an integer pair or tensor of
        shape [2].

    Returns:
      A float32 tensor [n, 2].

    Raises:
      ValueError: `name` is not one of `TOY`.
      hogrod.checks.ArgumentError: `seed` is neither.
    """
    seed = checks.stateless_seed(seed, "seed", "sample_toy")
    s = tf.random.experimental.stateless_split(seed, 2)
    if name == "swiss_roll":
        t = 1.5 * math.pi * (1 + 2 * tf.random.stateless_uniform([n], s[0]))
        noise = 0.25 * tf.random.stateless_normal([n, 2], s[1])
        return (tf.stack([t * tf.cos(t), t * tf.sin(t)], 1) + noise) / 7.5
    centers, std = modes(name)
    idx = tf.random.stateless_uniform([n], s[0], 0, len(centers), dtype=tf.int32)
    return (tf.gather(tf.constant(centers, tf.float32), idx)
            + std * tf.random.stateless_normal([n, 2], s[1]))


@gin.configurable
def toy_batches(name: str = "eight_gaussians", batch_size: int = 256,
                seed: int = 0) -> tf.data.Dataset:
    """An infinite, checkpointable stream of fresh batches of a toy distribution.

    Batch i is `sample_toy(name, batch_size, [seed, i])`: the stream is the same for the
    same seed, and a checkpointed iterator resumes where it stopped.

    Args:
      name: a toy data set, one of `TOY`.
      batch_size: the samples per batch.
      seed: the integer seed of the stream.

    Returns:
      A `tf.data.Dataset` of float32 batches [batch_size, 2].

    Raises:
      ValueError: `name` is not one of `TOY`.
    """
    modes(name)  # validates the name
    return tf.data.Dataset.range(2**62).map(
        lambda i: sample_toy(name, batch_size, tf.stack([tf.cast(seed, tf.int64), i])))


def mode_metrics(samples: TensorLike, name: str) -> dict[str, float]:
    """How well samples cover the modes of a toy mixture (see the module docstring).

    Args:
      samples: generated samples [n, 2], compared in float64.
      name: the mixture, "eight_gaussians" or "twentyfive_gaussians".

    Returns:
      {"modes_covered": the modes with at least one high-quality sample (an int),
      "num_modes": K (an int), "high_quality_percent": the percentage of samples within 3
      std of their nearest mode, "reverse_kl": KL(generated mode histogram || uniform)}.

    Raises:
      ValueError: `name` is not a mixture of `TOY` (the Swiss roll has no modes).
    """
    if name == "swiss_roll":
        raise ValueError("mode_metrics: the swiss_roll data set has no modes; name a mixture, "
                         "'eight_gaussians' or 'twentyfive_gaussians'")
    centers, std = modes(name)
    x = np.asarray(samples, np.float64)
    dist = np.linalg.norm(x[:, None] - centers[None], axis=-1)
    nearest = dist.argmin(1)
    hq = dist[np.arange(len(x)), nearest] <= 3 * std
    covered = len(set(nearest[hq]))
    p = np.bincount(nearest, minlength=len(centers)) / len(x)
    q = np.full(len(centers), 1 / len(centers))
    nz = p > 0
    return {"modes_covered": covered, "num_modes": len(centers),
            "high_quality_percent": 100.0 * hq.mean(),
            "reverse_kl": float(np.sum(p[nz] * np.log(p[nz] / q[nz])))}
