"""The WGAN-GP trainer on the training-loop toolkit.

`make_wgan_gp_step` builds two compiled steps with `hogrod.train.make_train_step`: the
critic step (generator forward, critic on real and fake, the penalty's inner tape, the
outer tape, the update: one `tf.function`) and the generator step. One call of the
returned `step(real_batches)` runs `n_critic` critic steps, each on its own fresh real
batch, then one generator step. Lazy regularization (StyleGAN2) computes the penalty only
every `lazy_every` critic steps and multiplies it by `lazy_every`.

The penalty is a function passed by reference (`make_wgan_gp_step.penalty =
@r1_penalty`; see `hogrod.gan.penalties` for the one signature they share).

A batch is the real samples, or a dict {"real": x, "z": latent codes, ...the penalty's
noise: "interpolation", "perturbation"} that carries the step's random numbers with the
data (`with_noise`); every key but "real" and "z" is passed to the penalty as `noise`.
Under a tf.distribute strategy every replica then draws nothing itself, and the
distributed step equals the single-device one exactly (otherwise each replica samples its
own numbers: the same distribution, other numbers).
"""

import inspect
from typing import Any, Callable, Iterator, Optional, Sequence

import gin
import keras
import tensorflow as tf

from hogrod import checks, train
from hogrod.gan import lazy, penalties
from hogrod.types import Batch

__all__ = ["make_wgan_gp_step", "grouped", "with_noise"]


def _checked_penalty(penalty: Optional[Callable[..., tf.Tensor]],
                     where: str = "make_wgan_gp_step.penalty"
                     ) -> Optional[Callable[..., tf.Tensor]]:
    """`penalty` if it is None (no penalty) or a callable that takes `(critic, real, fake, *,
    noise)` (see `hogrod.gan.penalties`); else an error naming the binding."""
    if penalty is None:
        return None
    if not callable(penalty):
        raise checks.ArgumentError(
            f"{where} must be a penalty function or None, got {type(penalty).__name__} "
            f"{penalty!r}; bind one by reference, e.g. {where} = @gradient_penalty")
    try:
        signature = inspect.signature(penalty)
    except (TypeError, ValueError):  # a builtin or extension: nothing to check
        return penalty
    try:
        signature.bind("critic", "real", "fake", noise={})
    except TypeError as e:
        raise TypeError(f"{where}: {getattr(penalty, '__name__', penalty)!s} must take "
                        f"(critic, real, fake, *, noise) (see hogrod.gan.penalties): {e}") from None
    return penalty


# half precision is reduced in float32; float64 stays float64
def _scores(critic: keras.Model, x: tf.Tensor) -> tf.Tensor:
    s = critic(x, training=True)
    if s.dtype in (tf.float16, tf.bfloat16):
        s = tf.cast(s, tf.float32)
    return tf.reshape(s, [-1])


@gin.configurable(denylist=["generator", "critic", "critic_optimizer", "generator_optimizer"])
def make_wgan_gp_step(generator: keras.Model, critic: keras.Model,
                      critic_optimizer: keras.optimizers.Optimizer,
                      generator_optimizer: keras.optimizers.Optimizer, latent_dim: int,
                      penalty: Optional[Callable[..., tf.Tensor]] = penalties.gradient_penalty,
                      penalty_weight: float = 10.0, n_critic: int = 5, lazy_every: int = 1,
                      strategy: Optional[tf.distribute.Strategy] = None
                      ) -> Callable[[Sequence[Batch]], dict[str, tf.Tensor]]:
    """Build the WGAN-GP step: `n_critic` critic updates, then one generator update.

    The critic minimizes ``E[D(fake)] - E[D(real)] + penalty_weight * penalty``, the
    generator ``-E[D(G(z))]``, each with `hogrod.train.make_train_step` (one compiled
    step each, NaN-guarded). Gin-configurable: every argument but the models and the
    optimizers may be bound.

    Args:
      generator: the generator, latent codes [batch, latent_dim] to samples of the real
        batches' shape (cast to their dtype); built (it has trainable variables).
      critic: the critic, a batch to one score per example ([batch] or [batch, 1]);
        built. The Wasserstein terms call it with `training=True`.
      critic_optimizer: the Keras optimizer of the critic's variables; its `iterations`
        count the critic steps (lazy regularization reads it).
      generator_optimizer: the Keras optimizer of the generator's variables.
      latent_dim: the latent codes' width, >= 1; codes are drawn N(0, 1) in the step when
        a batch brings no "z".
      penalty: a function `penalty(critic, real, fake, *, noise) -> scalar` (`hogrod.gan`:
        `gradient_penalty` (WGAN-GP), `lp_penalty`, `r1_penalty`, `r2_penalty`,
        `dragan_penalty`, or your own), by reference in gin (`= @r1_penalty`), or None for
        no penalty. Its hyperparameters are its own gin bindings
        (`gradient_penalty.target = 0.0`).
      penalty_weight: lambda (the paper's 10; the original toy code's 0.1), >= 0.
      n_critic: critic steps per generator step, >= 1.
      lazy_every: compute the penalty every this many critic steps, scaled by it, >= 1
        (1: every step).
      strategy: the `tf.distribute.Strategy` both steps run under; None: the current one.
        The batches are then distributed batches.

    Returns:
      `step(real_batches) -> logs`: `real_batches` a tuple of `n_critic` batches (each the
      real samples, or a dict as `with_noise` gives), one per critic step; the generator
      step takes the last one. The logs are the last critic step's as "critic/<name>"
      ("critic/wasserstein", "critic/penalty", "critic/loss", "critic/grad_norm", ...),
      the generator step's as "generator/<name>", and "loss" (= "critic/loss"). The
      function also carries `critic_step`, `generator_step`, `n_critic` and `penalty`
      as attributes.

    Raises:
      ArgumentError: `penalty` is not callable or None, or a count or weight is out of
        range; the message names the binding.
      TypeError: `penalty` does not take `(critic, real, fake, *, noise)`.
      ValueError: the generator or critic has no trainable variables (not built yet).
    """
    where = "make_wgan_gp_step"
    penalty = _checked_penalty(penalty)
    n_critic = checks.integer(n_critic, "n_critic", where, least=1)
    lazy_every = checks.integer(lazy_every, "lazy_every", where, least=1)
    penalty_weight = checks.nonnegative(penalty_weight, "penalty_weight", where)
    latent_dim = checks.integer(latent_dim, "latent_dim", where, least=1)
    for name, model in (("critic", critic), ("generator", generator)):
        if not model.trainable_variables:
            raise ValueError(f"make_wgan_gp_step: the {name} has no trainable variables; "
                             "build it (call it once on a batch) first")

    def unpack(batch):  # (real, z, noise): z drawn here unless given; noise the other keys
        if not isinstance(batch, dict):
            batch = {"real": batch}
        if "real" not in batch:
            raise ValueError(f"a batch dict needs the key 'real' (and optionally 'z' and the "
                             f"penalty's noise, see with_noise); got keys {sorted(batch)}")
        real = batch["real"]
        z = batch.get("z")
        if z is None:
            z = tf.random.normal([tf.shape(real)[0], latent_dim])
        noise = {k: v for k, v in batch.items() if k not in ("real", "z")}
        return real, z, noise

    def fake_like(real, z):
        return tf.cast(generator(z, training=True), real.dtype)

    def penalty_term(real, fake, noise):
        # one dtype on both branches of the lazy cond: float64 data keeps float64
        dtype = tf.float64 if real.dtype == tf.float64 else tf.float32
        return lazy.lazy_term(lambda: penalty(critic, real, fake, noise=noise),
                              critic_optimizer.iterations, lazy_every, dtype)

    def critic_loss(batch):
        real, z, noise = unpack(batch)
        fake = fake_like(real, z)
        terms = {"wasserstein": tf.reduce_mean(_scores(critic, fake))
                 - tf.reduce_mean(_scores(critic, real))}
        if penalty is not None:
            terms["penalty"] = penalty_term(real, fake, noise)
        return terms

    def generator_loss(batch):
        real, z, _ = unpack(batch)
        return {"generator": -tf.reduce_mean(_scores(critic, fake_like(real, z)))}

    weights = {"penalty": penalty_weight} if penalty is not None else {}
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
    step.penalty = penalty
    return step


def with_noise(dataset: tf.data.Dataset, latent_dim: int, seed: int = 0) -> tf.data.Dataset:
    """Batches of `dataset` with the step's random numbers: the latent codes and the noise.

    The latent codes and every penalty's random numbers (`NOISE_KEYS`: the GP/DRAGAN
    per-example weights and DRAGAN's unit-scale perturbation, whose std is the whole
    batch's) are drawn by tf.data (stateless, from `seed` and the batch index) instead of
    inside the step, so a tf.distribute strategy shards them with the data.

    Args:
      dataset: a dataset of real batches [batch, ...], a float dtype.
      latent_dim: the latent codes' width.
      seed: the integer seed; seeds `seed`, `seed + 1` and `seed + 2` with the batch index
        draw the codes, the interpolation weights and the perturbation.

    Returns:
      A dataset of dicts {"real": the batch, "z": N(0, 1) codes [batch, latent_dim],
      "interpolation": U[0, 1] weights [batch], "perturbation": `perturbation(real)`, the
      real batch's shape}, all in the batch's dtype.
    """
    def add(i, real):
        n = tf.shape(real)[0]
        return {"real": real,
                "z": tf.random.stateless_normal([n, latent_dim], [seed, i], dtype=real.dtype),
                "interpolation": tf.random.stateless_uniform([n], [seed + 1, i], dtype=real.dtype),
                "perturbation": penalties.perturbation(real, [seed + 2, i])}
    return tf.data.Dataset.zip((tf.data.Dataset.counter(), dataset)).map(add)


class grouped:  # noqa: N801  (used like a function: grouped(iterator, n))
    """An iterator of n-tuples of consecutive elements of `iterator`.

    Each tuple holds the fresh real batches of one generator step (`n` = `n_critic`);
    checkpoint the underlying iterator, which this one advances.

    Args:
      iterator: the iterator of batches.
      n: the elements per tuple.
    """

    def __init__(self, iterator: Iterator[Any], n: int) -> None:
        self.iterator, self.n = iterator, n

    def __iter__(self):
        return self

    def __next__(self):
        return tuple(next(self.iterator) for _ in range(self.n))
