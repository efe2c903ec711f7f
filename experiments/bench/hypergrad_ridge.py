"""Benchmark: hypergradient methods (`hogrod.hypergrad`) against ridge regression's closed form.

Inner: 0.5 ||A w - b||^2 + 0.5 sum_i exp(s_i) w_i^2 (per-feature log penalties s); outer:
validation MSE; float64. A has singular values log-spaced so that the inner Hessian's
condition number is about `condition`: gradient descent (rate 1/L) needs O(condition)
steps, which is what unrolled differentiation and the Neumann series pay for. The exact
hypergradient is -e^s * w* * H^{-1} grad_w L_out (numpy). Reported: relative errors of
implicit-CG, unrolled (K steps of GD from 0) and implicit-Neumann (`steps` terms after the
first), each method's seconds (a `tf.function`, timed on its second call) and
Hessian-vector products (unrolled: one per step, backpropagated; Neumann: one per term
after the first; CG: its iterations).

    python -m experiments.bench.hypergrad_ridge \
        --gin_file=experiments/bench/configs/hypergrad_ridge.gin
"""

import time

import gin
import numpy as np
import tensorflow as tf

from experiments.bench.peers import ridge_exact_hypergradient, ridge_hyperproblem, ridge_objectives
from hogrod import harness, hypergrad, linalg, optim


def _timed(fn, *args):
    out = fn(*args)  # trace
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


@gin.configurable
def bench_hypergrad_ridge(output_dir, features=20, train=100, validation=50, condition=100.0,
                          unrolled_steps=(10, 30, 100, 300, 1000),
                          neumann_steps=(10, 30, 100, 300), cg_tol=1e-12, seed=0):
    del output_dir  # metrics.json is written by the harness
    a, b, av, bv, s = ridge_hyperproblem(features, train, validation, condition, seed)
    exact, h = ridge_exact_hypergradient(a, b, av, bv, s)
    lr = 1.0 / np.linalg.eigvalsh(h)[-1]
    inner, outer = ridge_objectives(a, b, av, bv)
    w0, s_ = tf.zeros(features, tf.float64), tf.constant(s)

    def measure(method):
        fn = tf.function(lambda h: hypergrad.hypergradient(inner, outer, w0, h, method).grads)
        grads, seconds = _timed(fn, s_)
        return float(np.linalg.norm(grads.numpy() - exact) / np.linalg.norm(exact)), seconds

    # the inner solve of the implicit methods: GD to the optimum (not differentiated)
    inner_steps = int(np.ceil(40 * np.linalg.cond(h)))
    cg_iterations = []

    def cg(matvec, rhs):
        x, info = linalg.cg(matvec, rhs, tol=cg_tol, maxiter=10 * features)
        if tf.executing_eagerly():
            cg_iterations.append(int(info.iterations))
        return x

    implicit_cg = hypergrad.implicit(optim.sgd(lr), inner_steps, solve=cg, inner_tol=1e-11)
    hypergrad.hypergradient(inner, outer, w0, s_, implicit_cg)  # eagerly, to count
    err, seconds = measure(implicit_cg)
    results = {"features": features, "condition": float(np.linalg.cond(h)),
               "implicit_inner_steps": inner_steps, "implicit_cg_rel_err": err,
               "implicit_cg_seconds": seconds, "implicit_cg_hvps": cg_iterations[0]}
    results["unrolled_rel_err"], results["unrolled_seconds"] = {}, {}
    for k in unrolled_steps:
        err, seconds = measure(hypergrad.unrolled(optim.sgd(lr), k))
        results["unrolled_rel_err"][str(k)], results["unrolled_seconds"][str(k)] = err, seconds
    results["neumann_rel_err"], results["neumann_seconds"] = {}, {}
    for steps in neumann_steps:
        err, seconds = measure(hypergrad.implicit(
            optim.sgd(lr), inner_steps, inner_tol=1e-11,
            solve=hypergrad.neumann_series(steps, step=lr)))
        results["neumann_rel_err"][str(steps)], results["neumann_seconds"][str(steps)] = \
            err, seconds
    for key, value in results.items():
        print(f"{key:24s} {value}")
    return results


def main():
    """`python -m experiments.bench.hypergrad_ridge` (see the module docstring)."""
    harness.main(bench_hypergrad_ridge)


if __name__ == "__main__":
    main()
