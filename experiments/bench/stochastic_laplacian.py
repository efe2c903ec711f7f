"""Benchmark: one Laplacian of a tanh MLP u: R^d -> R over a batch of points, exact against
the randomized estimators, for d = 10, 100, 1000.

    python -m experiments.bench.stochastic_laplacian \
        --gin_file=experiments/bench/configs/stochastic_laplacian.gin

Candidates, in the same run on the same network and points, interleaved (`timing`):
- "exact": `pinn.partials` of every (i, i), summed by `pinn.laplacian` (one backward pass
  for the gradient, then one per coordinate over it: d passes, each touching the [batch, d]
  input layer, so its cost grows as d^2);
- "hutchinson" and "stde": `pinn.stochastic_laplacian` with `num_probes` probes (for stde,
  min(num_probes, d) coordinates): one forward-over-reverse pass over num_probes x batch
  rows, whose cost grows as d (the input layer).
The floor is u's own forward pass over the batch ("forward", timed in the same rounds): each
candidate is reported in seconds and as its time over the forward pass's. With
`bench_stochastic_laplacian.step = True` every candidate is a training step's derivative
work instead: mean(lap^2) (for "forward", mean(u^2)) and its gradient in the weights. Agreement before
speed: where d <= `check_max_dim`, the exact Laplacian and stde with every coordinate
against the exact one in float64, within float32's rounding (`peers.Reference`).
"""

import time

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.peers import Reference
from experiments.bench.timing import interleaved_rates
from hogrod.models import dense_net
from hogrod import harness, pinn


def make_problem(dim, points, width, depth, seed):
    keras.utils.set_random_seed(seed)
    net = dense_net((dim,) + (width,) * depth + (1,), "tanh")
    x = tf.constant(np.random.default_rng(seed).uniform(-1, 1, (points, dim)), tf.float32)
    return net, x


def as_step(lap_fn, net):
    """The derivative work of a training step on the Laplacian: mean(lap^2) and its
    gradient in the weights."""
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(lap_fn()))
        return tape.gradient(loss, net.trainable_variables)[0]
    return step


def candidates(net, x, num_probes, step, exact):
    dim = x.shape[-1]
    fns = {"forward": lambda: net(x)}
    if exact:
        fns["exact"] = lambda: pinn.laplacian(
            pinn.partials(net, x, [(i, i) for i in range(dim)]), range(dim))
    for method, k in (("hutchinson", num_probes), ("stde", min(num_probes, dim))):
        fns[method] = lambda m=method, k=k: pinn.stochastic_laplacian(net, x, k, seed=0,
                                                                      method=m)
    fns = {name: tf.function(as_step(f, net) if step else f) for name, f in fns.items()}
    return {name: (lambda f=f: f().numpy()) for name, f in fns.items()}


def first_calls(fns):
    """{name: seconds of the first call}: tracing and graph optimization included."""
    out = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        out[name] = time.perf_counter() - t0
    return out


def check(net, x, width, depth):
    """The exact Laplacian and stde with every coordinate (float32), each against the exact
    Laplacian in float64 on the same weights and points (`peers.Reference`): ({"exact",
    "stde_all_coordinates": relative difference}, the reference's condition)."""
    dim = x.shape[-1]
    net64 = dense_net((dim,) + (width,) * depth + (1,), "tanh", dtype="float64")

    def exact(model, points):
        return pinn.laplacian(pinn.partials(model, points, [(i, i) for i in range(dim)]),
                              range(dim))

    def fn64(inputs):
        for v, w in zip(net64.trainable_variables, inputs[:-1]):
            v.assign(w)
        return [exact(net64, tf.constant(inputs[-1])).numpy()]
    ref = Reference(fn64, [v.numpy() for v in net.trainable_variables] + [x.numpy()])
    sides = {"exact": [exact(net, x).numpy()], "stde_all_coordinates": [
        pinn.stochastic_laplacian(net, x, dim, method="stde").numpy()]}
    return ref.check(sides, "float32", f"d = {dim}: the Laplacian"), ref.condition


@gin.configurable
def bench_stochastic_laplacian(output_dir, dims=(10, 100, 1000), points=128, width=64,
                               depth=3, num_probes=16, rounds=5, calls_per_round=1, warmup=2,
                               check_max_dim=100, step=False, exact_max_dim=None, seed=0):
    """step: False times the Laplacian alone; True a training step's derivative work on it
    (mean(lap^2) and its gradient in the weights; "forward" then u's forward and backward).
    exact_max_dim: time the exact Laplacian only up to this d (None: every d); its first
    call (tracing d backward passes) is what grows fastest."""
    metrics = dict(points=points, width=width, depth=depth, num_probes=num_probes, step=step)
    rows = []
    for dim in dims:
        net, x = make_problem(dim, points, width, depth, seed)
        if dim <= check_max_dim:
            errors, metrics[f"d{dim}_condition"] = check(net, x, width, depth)
            metrics.update({f"d{dim}_{k}_rel_err": v for k, v in errors.items()})
        exact = exact_max_dim is None or dim <= exact_max_dim
        fns = candidates(net, x, num_probes, step, exact)
        for k, s in first_calls(fns).items():
            metrics[f"d{dim}_first_call_seconds_{k}"] = s
        sec = {k: 1.0 / r for k, r in interleaved_rates(fns, rounds, calls_per_round,
                                                        warmup).items()}
        for k, s in sec.items():
            metrics[f"d{dim}_seconds_{k}"] = s
            if k != "forward":
                metrics[f"d{dim}_over_forward_{k}"] = s / sec["forward"]
        for k in ("hutchinson", "stde") if exact else ():
            metrics[f"d{dim}_exact_over_{k}"] = sec["exact"] / sec[k]
        rows.append((dim, sec))
        logging.info("d = %d: %s", dim, sec)
    print(f"{'d':>6} {'forward s':>10} " + " ".join(
        f"{k + ' s (x fwd)':>22}" for k in ("exact", "hutchinson", "stde")))
    for dim, sec in rows:
        print(f"{dim:>6} {sec['forward']:10.2e} " + " ".join(
            f"{sec[k]:10.2e} ({sec[k] / sec['forward']:7.1f}x)" if k in sec else f"{'-':>22}"
            for k in ("exact", "hutchinson", "stde")))
    return metrics


def main():
    """`python -m experiments.bench.stochastic_laplacian` (see the module docstring)."""
    harness.main(bench_stochastic_laplacian)


if __name__ == "__main__":
    main()
