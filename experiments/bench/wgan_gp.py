"""Benchmark: WGAN-GP critic steps/s, compiled (hogrod) vs a plain eager TF2 step vs PyTorch.

One critic step = generator forward, critic on real and fake, the gradient penalty's
inner gradient, the outer gradient and the Adam update (hogrod's: `make_gan_step`'s single
critic update, `step.critic_step`, a plain `tf.function` with its guard and logs, its random
numbers from the data as `gan.with_noise` gives them); the same MLPs (2-512-512-512-1
critic, 2-512-512-512-2 generator) and batch (256) in all three. The eager step is the
straightforward hand-written TF2 code; the PyTorch step uses `torch.autograd.grad(...,
create_graph=True)` (the `bench` extra). Interleaved rounds, medians:

    python -m experiments.bench.wgan_gp --gin_file=experiments/bench/configs/wgan_gp.gin

Targets: >= 5x the eager step, >= 1.5x PyTorch.

The matmul floor says how far any TensorFlow step could go. Per hidden-to-hidden layer a
critic step needs 11 [batch, width] x [width, width] products, however it is written:
the generator's forward (1), the critic's forwards on real, fake and interpolates (3), the
inner backward to the interpolates (1), the outer backward through the real and fake
forwards (weights and inputs: 4) and through the inner backward (2); ReLU's second
derivative is zero, so nothing flows back through the interpolates' forward. The binary
times 11 x (depth - 1) such products alone (`timing.matmul_floor`) and reports each
baseline's time over that floor: the highest ratio a step doing nothing but those
products would reach on this machine.

Where the operands of one product fit in a core's L2 cache (width 256 on a 1 MiB L2),
TensorFlow's oneDNN kernel runs it on one thread: the chained products then take twice the
independent ones on two cores, and a step reaches the floor only while its graph keeps two
products ready at once.
"""

import gin
import keras
import tensorflow as tf
from absl import logging

from experiments.bench.peers import versions
from experiments.bench.timing import floor_metrics, interleaved_rates, matmul_floor
from hogrod.models import relu_mlp as mlp
from hogrod import gan, harness


def tf_models(width, depth):
    keras.utils.set_random_seed(0)
    return mlp(2, 2, width, depth), mlp(2, 1, width, depth)


def eager_step(width, depth, batch, lam):
    gen, critic = tf_models(width, depth)
    opt = keras.optimizers.Adam(1e-4, beta_1=0.0, beta_2=0.9)
    real = tf.random.normal([batch, 2])

    def step():  # the hand-written TF2 critic step, run eagerly
        z = tf.random.normal([batch, 2])
        with tf.GradientTape() as outer:
            fake = gen(z)
            eps = tf.random.uniform([batch, 1])
            x_hat = eps * real + (1 - eps) * fake
            with tf.GradientTape() as inner:
                inner.watch(x_hat)
                d_hat = critic(x_hat)
            g = inner.gradient(d_hat, x_hat)
            gp = tf.reduce_mean((tf.norm(g, axis=1) - 1.0) ** 2)
            loss = tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(real)) + lam * gp
        grads = outer.gradient(loss, critic.trainable_variables)
        opt.apply_gradients(zip(grads, critic.trainable_variables))
        return float(loss)
    return step


def hogrod_step(width, depth, batch, lam):
    gen, critic = tf_models(width, depth)
    step = gan.make_gan_step(gen, critic, keras.optimizers.Adam(1e-4, beta_1=0.0, beta_2=0.9),
                             keras.optimizers.Adam(1e-4), 2,
                             critic_penalties=[(gan.gradient_penalty, lam, 1)], n_critic=1)
    # the step's random numbers with the data, as the binary gives them (`gan.with_noise`)
    real = tf.random.normal([batch, 2])
    noisy = next(iter(gan.with_noise(tf.data.Dataset.from_tensors(real), 2)))
    return lambda: float(step.critic_step(noisy)["loss"])


def torch_step(width, depth, batch, lam):
    try:
        import torch
    except ImportError:
        logging.warning("torch not installed (pip install -e '.[bench]'): no PyTorch baseline")
        return None
    torch.manual_seed(0)

    def net(i, o):
        layers, d = [], i
        for _ in range(depth):
            layers += [torch.nn.Linear(d, width), torch.nn.ReLU()]
            d = width
        return torch.nn.Sequential(*layers, torch.nn.Linear(d, o))
    gen, critic = net(2, 2), net(2, 1)
    opt = torch.optim.Adam(critic.parameters(), 1e-4, betas=(0.0, 0.9))
    real = torch.randn(batch, 2)

    def step():
        z = torch.randn(batch, 2)
        with torch.no_grad():
            fake = gen(z)
        eps = torch.rand(batch, 1)
        x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
        g, = torch.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
        gp = ((g.norm(dim=1) - 1) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + lam * gp
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


@gin.configurable
def bench_wgan_gp(output_dir, width: harness.PositiveInt = 512, depth: harness.PositiveInt = 3,
                  batch: harness.PositiveInt = 256, lam: harness.NonNegative = 10.0,
                  rounds: harness.PositiveInt = 10, steps_per_round: harness.PositiveInt = 10,
                  warmup: harness.Count = 5):
    runs = {"hogrod_compiled": hogrod_step(width, depth, batch, lam),
            "tf_eager": eager_step(width, depth, batch, lam)}
    t = torch_step(width, depth, batch, lam)
    if t is not None:
        runs["torch"] = t
    products, floor_of = matmul_floor(batch, width, 11 * (depth - 1))
    rates = interleaved_rates(dict(runs, **products), rounds, steps_per_round, warmup)
    floor = floor_of(rates)
    m = {f"critic_steps_per_s_{k}": rates[k] for k in runs}
    m["ratio_over_eager"] = m["critic_steps_per_s_hogrod_compiled"] / m["critic_steps_per_s_tf_eager"]
    if "torch" in runs:
        m["ratio_over_torch"] = m["critic_steps_per_s_hogrod_compiled"] / m["critic_steps_per_s_torch"]
    # over hogrod_compiled: how far the step is from the floor
    m.update(floor_metrics(floor, {k: rates[k] for k in runs}))
    for k, v in sorted(m.items()):
        print(f"{k:40s} {v:.4g}")
    return dict(m, width=width, depth=depth, batch=batch, **versions("torch"))


def main():
    """`python -m experiments.bench.wgan_gp` (see the module docstring)."""
    harness.main(bench_wgan_gp)


if __name__ == "__main__":
    main()
