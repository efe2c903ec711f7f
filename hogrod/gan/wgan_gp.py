"""The WGAN-GP trainer on the training-loop toolkit.

`make_wgan_gp_step` builds two compiled steps with `hogrod.train.make_train_step`: the
critic step (generator forward, critic on real and fake, the penalty's inner tape, the
outer tape, the update: one `tf.function`) and the generator step. One call of the
returned `step(real_batches)` runs `n_critic` critic steps, each on its own fresh real
batch, then one generator step. Lazy regularization (StyleGAN2) computes the penalty only
every `lazy_every` critic steps and multiplies it by `lazy_every`.

A batch is the real samples, or a dict {"real": x, "z": latent codes, "interpolation": GP
weights e} that carries the step's random numbers with the data (`with_noise`). Under a
tf.distribute strategy every replica then draws nothing itself, and the distributed step
equals the single-device one exactly (otherwise each replica samples its own z and e: the
same distribution, other numbers).
"""

import gin
import tensorflow as tf

from hogrod import train
from hogrod.gan import penalties

__all__ = ["make_wgan_gp_step", "PENALTIES", "grouped", "with_noise"]

PENALTIES = ("gp", "lp", "r1", "r2", "dragan", "none")


def _penalty(name, critic, real, fake, interpolation=None):
    if name == "gp":
        return penalties.gradient_penalty(critic, real, fake, interpolation=interpolation)
    if name == "lp":
        return penalties.gradient_penalty(critic, real, fake, one_sided=True,
                                          interpolation=interpolation)
    if name == "r1":
        return penalties.r1_penalty(critic, real)
    if name == "r2":
        return penalties.r2_penalty(critic, fake)
    return penalties.dragan_penalty(critic, real)


def _scores(critic, x):
    return tf.reshape(tf.cast(critic(x, training=True), tf.float32), [-1])


@gin.configurable(denylist=["generator", "critic", "critic_optimizer", "generator_optimizer"])
def make_wgan_gp_step(generator, critic, critic_optimizer, generator_optimizer, latent_dim,
                      penalty="gp", penalty_weight=10.0, n_critic=5, lazy_every=1,
                      strategy=None):
    """Returns `step(real_batches) -> logs`; `real_batches` is a tuple of `n_critic` batches.

    Args:
      penalty: "gp" (WGAN-GP), "lp" (one-sided), "r1", "r2", "dragan" or "none".
      penalty_weight: lambda (the paper's 10; the original toy code's 0.1).
      lazy_every: compute the penalty every this many critic steps, scaled by it.
    """
    if penalty not in PENALTIES:
        raise ValueError(f"make_wgan_gp_step.penalty must be one of {PENALTIES}, got {penalty!r}")
    if lazy_every < 1 or n_critic < 1:
        raise ValueError(f"n_critic ({n_critic}) and lazy_every ({lazy_every}) must be >= 1")
    if penalty_weight < 0:
        raise ValueError(f"make_wgan_gp_step.penalty_weight must be >= 0, got {penalty_weight}")
    for name, model in (("critic", critic), ("generator", generator)):
        if not model.trainable_variables:
            raise ValueError(f"make_wgan_gp_step: the {name} has no trainable variables; "
                             "build it (call it once on a batch) first")

    def unpack(batch):  # (real, z, interpolation) with z drawn here unless given
        if not isinstance(batch, dict):
            batch = {"real": batch}
        real = batch["real"]
        z = batch.get("z")
        if z is None:
            z = tf.random.normal([tf.shape(real)[0], latent_dim])
        return real, z, batch.get("interpolation")

    def fake_like(real, z):
        return tf.cast(generator(z, training=True), real.dtype)

    def critic_loss(batch):
        real, z, e = unpack(batch)
        fake = fake_like(real, z)
        terms = {"wasserstein": tf.reduce_mean(_scores(critic, fake))
                 - tf.reduce_mean(_scores(critic, real))}
        if penalty != "none":
            if lazy_every == 1:
                terms["penalty"] = _penalty(penalty, critic, real, fake, e)
            else:
                due = tf.equal(critic_optimizer.iterations % lazy_every, 0)
                terms["penalty"] = tf.cond(
                    due, lambda: lazy_every * _penalty(penalty, critic, real, fake, e),
                    lambda: tf.constant(0.0))
        return terms

    def generator_loss(batch):
        real, z, _ = unpack(batch)
        return {"generator": -tf.reduce_mean(_scores(critic, fake_like(real, z)))}

    weights = {"penalty": penalty_weight} if penalty != "none" else {}
    critic_step = train.make_train_step(critic_loss, critic_optimizer, critic.trainable_variables,
                                        weights=weights, strategy=strategy)
    generator_step = train.make_train_step(generator_loss, generator_optimizer,
                                           generator.trainable_variables, strategy=strategy)

    def step(real_batches):
        if not isinstance(real_batches, (tuple, list)):  # a tensor would be split into rows
            raise TypeError(f"step needs a tuple of {n_critic} real batches (n_critic, e.g. "
                            f"from grouped(iterator, {n_critic})), got "
                            f"{type(real_batches).__name__}")
        if len(real_batches) != n_critic:
            raise ValueError(f"step needs {n_critic} real batches (n_critic), got "
                             f"{len(real_batches)}")
        for real in real_batches:
            logs = critic_step(real)
        out = {f"critic/{k}": v for k, v in logs.items()}
        out.update({f"generator/{k}": v for k, v in generator_step(real_batches[-1]).items()})
        out["loss"] = out["critic/loss"]
        return out

    step.critic_step, step.generator_step, step.n_critic = critic_step, generator_step, n_critic
    return step


def with_noise(dataset, latent_dim, seed=0):
    """Batches of `dataset` as {"real", "z", "interpolation"}: the latent codes and GP
    interpolation weights drawn by tf.data (stateless, from `seed` and the batch index)
    instead of inside the step."""
    def add(i, real):
        n = tf.shape(real)[0]
        return {"real": real,
                "z": tf.random.stateless_normal([n, latent_dim], [seed, i], dtype=real.dtype),
                "interpolation": tf.random.stateless_uniform([n], [seed + 1, i], dtype=real.dtype)}
    return tf.data.Dataset.zip((tf.data.Dataset.counter(), dataset)).map(add)


class grouped:  # noqa: N801  (used like a function: grouped(iterator, n))
    """An iterator of n-tuples of consecutive elements of `iterator` (the fresh real
    batches of one generator step); checkpoint the underlying iterator."""

    def __init__(self, iterator, n):
        self.iterator, self.n = iterator, n

    def __iter__(self):
        return self

    def __next__(self):
        return tuple(next(self.iterator) for _ in range(self.n))
