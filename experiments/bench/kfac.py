"""Benchmark: the K-FAC step's cost on the deep autoencoder, against an Adam step and
against kfac-jax's K-FAC step on the same network, weights and batch.

The network: Hinton and Salakhutdinov's MNIST autoencoder 784-1000-500-250-30-250-500-1000-784,
tanh (the 30-wide code layer linear), sigmoid cross-entropy on the logits
(`BinaryCrossentropy(from_logits=True)`), float32, one batch of pixels in [0, 1].

1. Agreement: one hogrod `kfac` step and one kfac-jax step (empirical Fisher, fixed damping
   and rate, no momentum, adaptive rate, momentum and damping off) from the same weights
   on the same batch give the same update: each float32 update against hogrod's float64
   one, within float32's rounding of that computation (`peers.Reference`). kfac-jax's
   `fisher_empirical` normalizes its G factor by N^2, not N (its block_diagonal.py says
   why), a factor N below hogrod's (the mean of the examples' gradient outer products):
   with damping / N and rate / N its step is the same step, which is what it is given.
2. Speed: hogrod's compiled train step with Adam, with `kfac` (one Monte Carlo label per
   example, fixed damping) recomputing its inverses every step and never (after the
   first), timed in interleaved rounds; kfac-jax's step in the same two settings
   (`fisher_gradients`), timed in its own process right after. Reported: medians and the
   ratios K-FAC / Adam and hogrod / kfac-jax.

kfac-jax 0.0.8 needs jax 0.9.0: `kfac_jax_python` is that environment's python
(`kfac_jax_peer.py` runs there); empty, the peer is skipped.

    python -m experiments.bench.kfac --gin_file=experiments/bench/configs/kfac.gin \
        --gin_param='bench_kfac.kfac_jax_python = "/path/to/kfac-jax-venv/bin/python"'
"""

import json
import os
import subprocess
import tempfile

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.peers import Reference
from experiments.bench.timing import interleaved_samples
from hogrod import harness, second_order, train
from hogrod.curvature.data import batch_loss

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kfac_jax_peer.py")


def autoencoder(widths, code, seed, dtype="float32"):
    """Dense layers of `widths`, tanh except after layer `code` (linear) and the last."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((widths[0],), dtype=dtype)]
    for i, w in enumerate(widths[1:]):
        linear = i in (code, len(widths) - 2)
        layers.append(keras.layers.Dense(w, activation=None if linear else "tanh",
                                         dtype=dtype))
    return keras.Sequential(layers)


def make_step(model, optimizer, loss, jit_compile):
    def objective(batch):
        return batch_loss(loss, batch[1], model(batch[0], training=True))
    return train.make_train_step(objective, optimizer, model.trainable_variables,
                                 jit_compile=jit_compile)


def hogrod_update(widths, code, seed, x, lr, damping, decay, jit_compile, weights=None,
                  dtype="float32"):
    """The weights after one hogrod K-FAC step (empirical Fisher, fixed damping and rate, no
    momentum) on the batch (x, x), from the seeded weights or `weights`, in `dtype`."""
    model = autoencoder(widths, code, seed, dtype)
    for v, w in zip(model.trainable_variables, weights or ()):
        v.assign(w)
    loss = keras.losses.BinaryCrossentropy(from_logits=True, dtype=dtype)
    opt = second_order.kfac(model, loss, learning_rate=lr, damping=damping, decay=decay,
                            momentum=0.0, inverse_every=1, fisher="empirical",
                            adapt_damping=False)
    make_step(model, opt, loss, jit_compile)((tf.constant(x), tf.constant(x)))
    return [v.numpy() for v in model.trainable_variables]


def float64_update(widths, code, seed, lr, damping, decay):
    """`fn64(inputs)`: hogrod's K-FAC step (new weights minus old) in float64 at inputs =
    weights (model order), x: the agreement check's reference."""
    def fn64(inputs):
        weights, x = inputs[:-1], inputs[-1]
        new = hogrod_update(widths, code, seed, x, lr, damping, decay, False, weights,
                            "float64")
        return [a - w for a, w in zip(new, weights)]
    return fn64


def run_peer(python, weights, x, code, lr, damping, decay, rounds, warmup):
    """kfac-jax's update and step times, from its own environment (`kfac_jax_peer.py`)."""
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {f"{'wb'[i % 2]}{i // 2}": w for i, w in enumerate(weights)}
        np.savez(os.path.join(tmp, "in.npz"), x=x, **arrays)
        n = len(x)  # kfac-jax's empirical G is hogrod's / N: the same step (module docstring)
        cmd = [python, PEER, os.path.join(tmp, "in.npz"), tmp, "--lr", repr(lr), "--damping",
               repr(damping), "--agree_lr", repr(lr / n), "--agree_damping", repr(damping / n),
               "--decay", repr(decay), "--code", str(code), "--rounds",
               str(rounds), "--warmup", str(warmup)]
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"kfac-jax peer failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
        update = np.load(os.path.join(tmp, "update.npz"))
        new = [update[k] for i in range(len(weights) // 2) for k in (f"w{i}", f"b{i}")]
        with open(os.path.join(tmp, "times.json")) as f:
            return new, json.load(f)


@gin.configurable
def bench_kfac(output_dir, widths: tuple[harness.PositiveInt, ...] = (
        784, 1000, 500, 250, 30, 250, 500, 1000, 784), code: harness.Count = 3,
        batch: harness.PositiveInt = 1000, learning_rate: float = 0.1,
        damping: float = 1e-2, decay: float = 0.95, rounds: harness.PositiveInt = 20,
        warmup: harness.Count = 3, jit_compile: bool = False,
        kfac_jax_python: str = "", seed: harness.Count = 0):
    """Check hogrod's K-FAC step against kfac-jax's, then time both and Adam's step.

    Returns:
      The metrics: the agreement, median step milliseconds and their ratios.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(batch, widths[0])).astype(np.float32)
    weights = [v.numpy() for v in autoencoder(widths, code, seed).trainable_variables]
    metrics = {"batch": batch, "widths": list(widths), "tensorflow": tf.__version__}
    ours = hogrod_update(widths, code, seed, x, learning_rate, damping, decay, jit_compile)
    sides = {"hogrod": [a - w for a, w in zip(ours, weights)]}
    peer_times = {}
    if kfac_jax_python:
        theirs, peer = run_peer(kfac_jax_python, weights, x, code, learning_rate, damping,
                                decay, rounds, warmup)
        sides["kfac_jax"] = [b - w for b, w in zip(theirs, weights)]
        metrics.update(jax=peer["jax"], kfac_jax=peer["kfac_jax"])
        peer_times = {f"kfac_jax_{k}": float(np.median(v)) for k, v in peer["seconds"].items()}
    else:
        logging.warning("bench_kfac.kfac_jax_python unset: no kfac-jax agreement or timing")
    # agreement before speed: each float32 step against hogrod's float64 step
    ref = Reference(float64_update(widths, code, seed, learning_rate, damping, decay),
                    weights + [x])
    metrics.update({f"update_rel_err_{k}": v for k, v in
                    ref.check(sides, "float32", "the K-FAC update").items()},
                   update_condition=ref.condition)
    candidates = {}
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    batch_xy = (tf.constant(x), tf.constant(x))
    for name, make_opt in (
            ("adam", lambda m: keras.optimizers.Adam(1e-3)),
            ("kfac_with_inverse", lambda m: second_order.kfac(
                m, loss, learning_rate=learning_rate, damping=damping, decay=decay,
                inverse_every=1, fisher="mc", adapt_damping=False)),
            ("kfac_without_inverse", lambda m: second_order.kfac(
                m, loss, learning_rate=learning_rate, damping=damping, decay=decay,
                inverse_every=10 ** 9, fisher="mc", adapt_damping=False))):
        model = autoencoder(widths, code, seed)
        step = make_step(model, make_opt(model), loss, jit_compile)
        candidates[name] = lambda step=step: step(batch_xy)["loss"].numpy()
    samples = interleaved_samples(candidates, rounds, 1, warmup)
    seconds = {k: float(np.median(1 / np.asarray(v))) for k, v in samples.items()}
    seconds.update(peer_times)
    metrics.update({f"ms_{k}": 1e3 * v for k, v in seconds.items()})
    for which in ("with_inverse", "without_inverse"):
        metrics[f"ratio_kfac_{which}_over_adam"] = seconds[f"kfac_{which}"] / seconds["adam"]
        if f"kfac_jax_{which}" in seconds:
            metrics[f"ratio_kfac_{which}_over_kfac_jax"] = (
                seconds[f"kfac_{which}"] / seconds[f"kfac_jax_{which}"])
    for k in sorted(metrics):
        print(f"{k:45s} {metrics[k]:.4g}" if isinstance(metrics[k], float) else
              f"{k:45s} {metrics[k]}")
    return metrics


def main():
    """`python -m experiments.bench.kfac` (see the module docstring)."""
    harness.main(bench_kfac)


if __name__ == "__main__":
    main()
