"""Seconds per Adam step of the high-dimensional Poisson PINN (`poisson_nd_problem`): the
randomized Laplacian against the exact one, per dimension.

    python -m experiments.bench.pinn_highdim --dims 10 100 1000 --exact_dims 10 100

The step is `pinn_experiment`'s (tanh MLP, the residual's loss and gradient, Adam), compiled
once; tracing seconds (the first call) are reported apart. The exact Laplacian traces one
backward pass per coordinate, so its graph and tracing time grow with d.
"""

import argparse
import json
import time

import keras
import numpy as np
import tensorflow as tf

from hogrod import pinn, train
from hogrod.pinn import training


def step_seconds(dim, laplacian, points=1000, width=128, depth=3, steps=10, seed=0):
    """(first call seconds: tracing and one step, median seconds per later step)."""
    keras.utils.set_random_seed(seed)
    prob = pinn.poisson_nd_problem(dim=dim, laplacian=laplacian, n_test=10)
    net = keras.Sequential([keras.Input((dim,))] + [
        keras.layers.Dense(width, activation="tanh") for _ in range(depth)]
        + [keras.layers.Dense(1)])
    u = training.solution_fn(prob, net)
    x = tf.constant(pinn.sample(prob.domain, points, "sobol", seed))
    loss_fn = training.pinn_loss(prob, u, x, [])
    step = train.make_train_step(loss_fn, keras.optimizers.Adam(1e-3), net.trainable_variables)
    t0 = time.perf_counter()
    step(None)
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        float(step(None)["loss"])
        times.append(time.perf_counter() - t0)
    return first, float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--exact_dims", type=int, nargs="*", default=[10, 100])
    parser.add_argument("--probes", type=int, default=16)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    rows = []
    for dim in args.dims:
        ops = {f"hutchinson_{args.probes}": lambda: pinn.randomized_laplacian(args.probes)}
        if dim in args.exact_dims:
            ops["exact"] = pinn.exact_laplacian
        for name, op in ops.items():
            first, per_step = step_seconds(dim, op, args.points, steps=args.steps)
            rows.append({"dim": dim, "laplacian": name, "first_call_s": first,
                         "step_s": per_step})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
