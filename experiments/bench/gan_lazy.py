"""Benchmark: the cost of R1 at every critic update against lazy R1 (StyleGAN2's).

One step = one critic update (the non-saturating loss and R1 at weight 0.1, as
`configs/gan/twentyfive_gaussians/ns_r1.gin`) and one generator update: `make_gan_step` as
`experiments/gan.py` builds it for the 25 Gaussians (256-wide 3-layer ReLU MLPs, batch 256,
the step's random numbers from the data), compiled as the binary's default. `lazy`: R1 every
16 critic updates, multiplied by 16 (`ns_r1_lazy.gin`); `none`: no R1 (what the regularizer
adds to). Interleaved rounds of 32 steps (two lazy periods) on batches drawn beforehand (the
data pipeline is not timed), medians:

    python -m experiments.bench.gan_lazy --gin_file=experiments/bench/configs/gan_lazy.gin

Reported: steps/s of each, `ratio_lazy_over_every` (the every-step recipe's step time over
the lazy one's) and `r1_share_every` / `r1_share_lazy` (the share of a step's time R1
takes: 1 - none's time over the recipe's).
"""

import gin
import keras
from absl import logging

from experiments.bench.timing import interleaved_rates
from hogrod.models import relu_mlp as mlp
from hogrod import gan, harness

#: the lazy interval and the steps per timed call (a whole number of intervals)
EVERY, STEPS = 16, 32


def gan_steps(critic_penalties, width, depth, batch):
    """A zero-argument callable taking STEPS steps of a fresh GAN (same seed for all)."""
    keras.utils.set_random_seed(0)
    generator = mlp(2, 2, width, depth, "generator")
    critic = mlp(2, 1, width, depth, "critic")
    step = gan.make_gan_step(
        generator, critic, keras.optimizers.Adam(1e-4, beta_1=0.5, beta_2=0.9),
        keras.optimizers.Adam(1e-4, beta_1=0.5, beta_2=0.9), 2, loss=gan.nonsaturating_loss,
        critic_penalties=critic_penalties, n_critic=1)
    data = iter(gan.with_noise(gan.toy_batches("twentyfive_gaussians", batch, 0), 2, 1))
    batches = [(next(data),) for _ in range(STEPS)]

    def run():
        for b in batches:
            logs = step(b)
        return float(logs["loss"])  # waits for the last step
    return run


@gin.configurable
def bench_gan_lazy(output_dir, width: harness.PositiveInt = 256, depth: harness.PositiveInt = 3,
                   batch: harness.PositiveInt = 256, rounds: harness.PositiveInt = 20,
                   warmup: harness.Count = 2):
    """Time the three recipes' steps, interleaved (the module docstring).

    Args:
      output_dir: the run's directory (harness).
      width: the MLPs' width.
      depth: their hidden layers.
      batch: the real batch.
      rounds: the timed rounds of STEPS steps each.
      warmup: untimed calls of each first (the compile).

    Returns:
      The metrics.
    """
    candidates = {"every": gan_steps([(gan.r1_penalty, 0.1, 1)], width, depth, batch),
                  "lazy": gan_steps([(gan.r1_penalty, 0.1, EVERY)], width, depth, batch),
                  "none": gan_steps([], width, depth, batch)}
    rates = {k: STEPS * r for k, r in interleaved_rates(candidates, rounds, 1, warmup).items()}
    m = {f"steps_per_s_{k}": v for k, v in rates.items()}
    m["ratio_lazy_over_every"] = rates["lazy"] / rates["every"]
    for k in ("every", "lazy"):
        m[f"r1_share_{k}"] = 1 - rates[k] / rates["none"]
    for k, v in sorted(m.items()):
        logging.info("%-28s %.4g", k, v)
    return dict(m, width=width, depth=depth, batch=batch, lazy_every=EVERY)


def main():
    """`python -m experiments.bench.gan_lazy` (see the module docstring)."""
    harness.main(bench_gan_lazy)


if __name__ == "__main__":
    main()
