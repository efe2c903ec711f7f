"""A GAN on the toy 2-D distributions, its loss and regularizers by gin reference, with mode
metrics.

    python -m experiments.gan --gin_file=configs/gan/twentyfive_gaussians/rpgan_r1_r2.gin
    python -m experiments.gan --gin_file=configs/gan/eight_gaussians.gin \
        --gin_param="make_gan_step.critic_penalties = [(@r1_penalty, 0.1, 1)]"

The recipes (`configs/gan/twentyfive_gaussians/`): WGAN-GP, non-saturating + R1 and RpGAN +
R1 + R2, each plain, with consistency regularization (`_cr`: bCR, `consistency_penalty`
with the augmentation `jitter`) and with a spectrally normalized critic (`_sn`); the loss,
the penalties with their weights and lazy intervals, and `n_critic` are bindings of
`make_gan_step` and `gan_experiment` (see `hogrod.gan.trainer`).

Every `eval_every` generator steps: modes covered, high-quality %, reverse KL on
`eval_samples` generated points (metrics.json keeps the history), and a PNG of real and
generated samples over the critic's contours; once more where the run stops (its last step
or `time_limit_s`). TensorBoard events and checkpoints (a re-run with the same --output_dir
resumes, drawing what an uninterrupted run would: the step's random numbers come with the
data, `gan.with_noise`) as every hogrod run.
"""

import os
import time

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod.models import relu_mlp as mlp
from hogrod import distribute, gan, harness, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@gin.configurable(denylist=["x"])
def jitter(x, scale: harness.Positive = 0.02):
    """bCR's augmentation for 2-D points: ``x + scale * N(0, I)``, drawn in the step.

    The default is about the 25 Gaussians' mode std (0.05 / 2.828). Drawn inside the step,
    so a resumed run draws other numbers than an uninterrupted one (the same distribution).
    """
    return x + tf.constant(scale, x.dtype) * tf.random.normal(tf.shape(x), dtype=x.dtype)


def critic_model(width, depth, spectral_norm):
    """The critic: `relu_mlp`'s, each Dense layer spectrally normalized if asked."""
    if not spectral_norm:
        return mlp(2, 1, width, depth, "critic")
    wrap = gan.SpectralNormalization
    layers = [keras.Input((2,))]
    layers += [wrap(keras.layers.Dense(width, activation="relu")) for _ in range(depth)]
    layers += [wrap(keras.layers.Dense(1))]
    return keras.Sequential(layers, name="critic")


def plot(path, real, fake, critic, title):
    lim = max(np.abs(real).max(), 1.0) * 1.3
    g = np.linspace(-lim, lim, 120)
    xx, yy = np.meshgrid(g, g)
    scores = critic(np.stack([xx.ravel(), yy.ravel()], 1).astype(np.float32)).numpy()
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.contour(xx, yy, scores.reshape(xx.shape), levels=20, cmap="viridis", linewidths=0.6)
    ax.scatter(real[:, 0], real[:, 1], s=2, c="orange", label="real")
    ax.scatter(fake[:, 0], fake[:, 1], s=2, c="green", label="generated")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.legend(loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


@gin.configurable
def gan_experiment(output_dir, dataset: str = "eight_gaussians",
                   generator_steps: harness.Count = 20000,
                   batch_size: harness.PositiveInt = 256, latent_dim: harness.PositiveInt = 2,
                   width: harness.PositiveInt = 512, depth: harness.PositiveInt = 3,
                   learning_rate: harness.Positive = 1e-4, beta_1: harness.Fraction = 0.5,
                   beta_2: harness.Fraction = 0.9, n_critic: harness.PositiveInt = 5,
                   linear_decay: bool = False, spectral_norm: bool = False,
                   eval_every: harness.PositiveInt = 2000,
                   eval_samples: harness.PositiveInt = 2500,
                   checkpoint_every: harness.PositiveInt = 2000,
                   generator_ema: harness.Fraction | None = None,
                   time_limit_s: harness.Positive | None = None, seed: harness.Count = 0):
    """Train; evaluate and plot every `eval_every` generator steps; return the last metrics.

    The loss and the penalties are `make_gan_step`'s bindings; `n_critic` is this
    function's (it also sets the critic's learning-rate decay), passed to it.
    linear_decay: decay both learning rates linearly to 0 over `generator_steps` (as the
    WGAN-GP paper's CIFAR code), which lets the modes sharpen at the end.
    spectral_norm: spectrally normalize every layer of the critic
    (`gan.SpectralNormalization`, its power iteration advanced once per critic update).
    generator_ema: evaluate an exponential moving average of the generator's weights with
    this decay (e.g. 0.999; Yazici et al. 2019), which averages out the generator's
    oscillation around the modes. None: the generator itself.
    time_limit_s: stop training (with a checkpoint) once this call's steps have taken
    this many seconds, evaluations excluded, and evaluate; a re-run continues. None: no
    limit.
    """
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    with strategy.scope():
        generator = mlp(latent_dim, 2, width, depth, "generator")
        critic = critic_model(width, depth, spectral_norm)

        def rate(updates):
            return (keras.optimizers.schedules.PolynomialDecay(learning_rate, updates, 0.0)
                    if linear_decay else learning_rate)
        opt_c = keras.optimizers.Adam(rate(generator_steps * n_critic), beta_1=beta_1,
                                      beta_2=beta_2)
        opt_g = keras.optimizers.Adam(rate(generator_steps), beta_1=beta_1, beta_2=beta_2)
        sampler = generator
        if generator_ema is not None:
            sampler = mlp(latent_dim, 2, width, depth, "generator_ema")
            sampler.set_weights(generator.get_weights())
    step = gan.make_gan_step(generator, critic, opt_c, opt_g, latent_dim, n_critic=n_critic,
                             strategy=strategy)

    @tf.function
    def update_ema():
        for e, v in zip(sampler.trainable_variables, generator.trainable_variables):
            e.assign(generator_ema * e + (1.0 - generator_ema) * v)

    batches = gan.with_noise(gan.toy_batches(dataset, batch_size, seed), latent_dim, seed + 1)
    data = iter(distribute.distribute_dataset(strategy, batches))
    extra = {"generator_ema": sampler} if generator_ema is not None else {}
    ckpt = train.Checkpointer(output_dir, generator=generator, critic=critic,
                              critic_optimizer=opt_c, generator_optimizer=opt_g, data=data,
                              generator_penalty_state=step.generator_state, **extra)
    real = gan.sample_toy(dataset, eval_samples, tf.constant([seed + 10**6, 0], tf.int64)).numpy()
    history = train.read_history(output_dir, harness.started(output_dir, ckpt))
    start = time.perf_counter()

    def evaluate(i):
        fake = sampler(tf.random.stateless_normal([eval_samples, latent_dim], (seed, i))).numpy()
        result = {"step": i, "seconds": time.perf_counter() - start}
        if gan.modes(dataset) is not None:
            result.update(gan.mode_metrics(fake, dataset))
        train.record_eval(output_dir, history, result)
        logging.info("eval at %d: %s", i, {k: round(float(v), 4) for k, v in result.items()})
        plot(os.path.join(output_dir, f"samples_{i:06d}.png"), real, fake, critic,
             f"{dataset}, generator step {i}")

    def callback(i, logs):
        if generator_ema is not None:
            update_ema()
        if i % eval_every == 0 and i != generator_steps:
            evaluate(i)

    if not history and ckpt.latest_step() == 0:
        evaluate(0)  # the untrained generator, for comparison
    stats = {}  # generator steps (each with n_critic critic updates) per second
    logs = train.train_loop(step, gan.grouped(data, step.n_critic), generator_steps, ckpt,
                            output_dir, checkpoint_every=checkpoint_every, log_every=500,
                            callback=callback, time_limit_s=time_limit_s, stats=stats)
    # where the run stopped (its last step or the time limit); a finished run, run again,
    # re-evaluates (replacing the evaluation recorded at that step)
    evaluate(int(ckpt.step))
    return dict(history[-1], history=history, generator_steps=int(ckpt.step), **stats,
                **{f"final_train_{k}": v for k, v in logs.items()})


def main():
    """The console command `hogrod-gan` (see the module docstring)."""
    harness.main(gan_experiment)


if __name__ == "__main__":
    main()
