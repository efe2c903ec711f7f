"""WGAN-GP (or LP, R1, R2, DRAGAN) on the toy 2-D distributions, with mode metrics.

    python -m experiments.wgan_gp --gin_file=configs/wgan_gp/eight_gaussians.gin
    python -m experiments.wgan_gp --gin_file=configs/wgan_gp/twentyfive_gaussians.gin \
        --gin_param="make_wgan_gp_step.penalty = @r1_penalty"

Every `eval_every` generator steps: modes covered, high-quality %, reverse KL on
`eval_samples` generated points (metrics.json keeps the history), and a PNG of real and
generated samples over the critic's contours. TensorBoard events and checkpoints (a
re-run with the same --output_dir resumes) as every hogrod run.
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
def wgan_gp_experiment(output_dir, dataset: str = "eight_gaussians",
                       generator_steps: harness.Count = 20000,
                       batch_size: harness.PositiveInt = 256, latent_dim: harness.PositiveInt = 2,
                       width: harness.PositiveInt = 512, depth: harness.PositiveInt = 3,
                       learning_rate: harness.Positive = 1e-4, beta_1: harness.Fraction = 0.5,
                       beta_2: harness.Fraction = 0.9, n_critic: harness.PositiveInt = 5,
                       linear_decay: bool = False, eval_every: harness.PositiveInt = 2000,
                       eval_samples: harness.PositiveInt = 2500,
                       checkpoint_every: harness.PositiveInt = 2000,
                       generator_ema: harness.Fraction | None = None, seed: harness.Count = 0):
    """Train; evaluate and plot every `eval_every` generator steps; return the last metrics.

    linear_decay: decay both learning rates linearly to 0 over the run (as the WGAN-GP
    paper's CIFAR code), which lets the modes sharpen at the end.
    generator_ema: evaluate an exponential moving average of the generator's weights with
    this decay (e.g. 0.999; Yazici et al. 2019), which averages out the generator's
    oscillation around the modes. None: the generator itself.
    """
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    with strategy.scope():
        generator = mlp(latent_dim, 2, width, depth, "generator")
        critic = mlp(2, 1, width, depth, "critic")
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
    step = gan.make_wgan_gp_step(generator, critic, opt_c, opt_g, latent_dim, n_critic=n_critic,
                                 strategy=strategy)

    @tf.function
    def update_ema():
        for e, v in zip(sampler.trainable_variables, generator.trainable_variables):
            e.assign(generator_ema * e + (1.0 - generator_ema) * v)

    data = iter(distribute.distribute_dataset(strategy,
                                              gan.toy_batches(dataset, batch_size, seed)))
    extra = {"generator_ema": sampler} if generator_ema is not None else {}
    ckpt = train.Checkpointer(output_dir, generator=generator, critic=critic,
                              critic_optimizer=opt_c, generator_optimizer=opt_g, data=data,
                              **extra)
    real = gan.sample_toy(dataset, eval_samples, tf.constant([seed + 10**6, 0], tf.int64)).numpy()
    history = train.read_history(output_dir, harness.started(output_dir, ckpt))
    start = time.perf_counter()

    def evaluate(i, logs=None):
        if generator_ema is not None and logs is not None:
            update_ema()
        if i % eval_every and i != generator_steps:
            return
        fake = sampler(tf.random.stateless_normal([eval_samples, latent_dim], (seed, i))).numpy()
        result = {"step": i, "seconds": time.perf_counter() - start}
        if gan.modes(dataset) is not None:
            result.update(gan.mode_metrics(fake, dataset))
        train.record_eval(output_dir, history, result)
        logging.info("eval at %d: %s", i, {k: round(float(v), 4) for k, v in result.items()})
        plot(os.path.join(output_dir, f"samples_{i:06d}.png"), real, fake, critic,
             f"{dataset}, generator step {i}")

    if not history:
        evaluate(0)  # the untrained generator, for comparison
    stats = {}  # generator steps (each with n_critic critic updates) per second
    train.train_loop(step, gan.grouped(data, step.n_critic), generator_steps, ckpt, output_dir,
                     checkpoint_every=checkpoint_every, log_every=500, callback=evaluate,
                     stats=stats)
    if not stats or not history or history[-1]["step"] != int(ckpt.step):
        evaluate(generator_steps)  # a finished run, run again, re-evaluates (replacing it)
    return dict(history[-1], history=history, **stats)


def main():
    """The console command `hogrod-wgan-gp` (see the module docstring)."""
    harness.main(wgan_gp_experiment)


if __name__ == "__main__":
    main()
