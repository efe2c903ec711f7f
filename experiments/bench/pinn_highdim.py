"""Seconds per Adam step of the high-dimensional Poisson PINN (`poisson_nd_problem`): the
randomized Laplacian against the exact one, per dimension.

    python -m experiments.bench.pinn_highdim --gin_file=experiments/bench/configs/pinn_highdim.gin

The step is `pinn_experiment`'s (tanh MLP, the residual's loss and gradient, Adam), compiled
once; tracing seconds (the first call) are reported apart. The exact Laplacian traces one
backward pass per coordinate, so its graph and tracing time grow with d. Reported per d:
seconds per step and first call for each Laplacian, and the exact over the randomized step
(the ratio, measured in the same run).
"""

import time

import gin
import keras
import numpy as np
import tensorflow as tf

from hogrod import harness, pinn, train
from hogrod.pinn import training


def step_seconds(dim, laplacian, points=1000, width=128, depth=3, steps=10, seed=0):
    """(first call seconds: tracing and one step, median seconds per later step)."""
    keras.utils.set_random_seed(seed)
    prob = pinn.problems.poisson_nd_problem(dim=dim, laplacian=laplacian, n_test=10)
    net = keras.Sequential([keras.Input((dim,))] + [
        keras.layers.Dense(width, activation="tanh") for _ in range(depth)]
        + [keras.layers.Dense(1)])
    u = training.solution_fn(prob, net)
    x = tf.constant(pinn.sample(prob.domain, points, "sobol", seed))
    objective = training.pinn_loss(prob, u, x, [])
    step = train.make_train_step(objective, keras.optimizers.Adam(1e-3), net.trainable_variables)
    t0 = time.perf_counter()
    step(None)
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        float(step(None)["loss"])
        times.append(time.perf_counter() - t0)
    return first, float(np.median(times))


@gin.configurable
def bench_pinn_highdim(output_dir, dims=(10, 100, 1000), exact_dims=(10, 100), probes=16,
                       points=1000, steps=10):
    del output_dir  # metrics.json is written by the harness
    results = {}
    for dim in dims:
        ops = {f"hutchinson_{probes}": lambda: pinn.pdes.randomized_laplacian(probes)}
        if dim in exact_dims:
            ops["exact"] = pinn.pdes.exact_laplacian
        for name, op in ops.items():
            first, per_step = step_seconds(dim, op, points, steps=steps)
            results[f"d{dim}_{name}_step_s"] = per_step
            results[f"d{dim}_{name}_first_call_s"] = first
            print(f"d = {dim}, {name}: {per_step:.3g} s per step, first call {first:.3g} s",
                  flush=True)
        if dim in exact_dims:
            results[f"d{dim}_exact_over_randomized"] = (
                results[f"d{dim}_exact_step_s"] / results[f"d{dim}_hutchinson_{probes}_step_s"])
    return results


def main():
    """`python -m experiments.bench.pinn_highdim` (see the module docstring)."""
    harness.main(bench_pinn_highdim)


if __name__ == "__main__":
    main()
