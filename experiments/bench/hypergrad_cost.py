"""Benchmark: the cost of a hypergradient at equal accuracy, implicit (CG) against unrolled.

Ridge regression with per-feature penalties exp(s_i) (inner: 0.5 ||A w - b||^2 + 0.5 sum_i
exp(s_i) w_i^2; outer: validation MSE; float64; A's singular values log-spaced so the inner
Hessian's condition number is about `condition`), whose exact hypergradient is
-e^s * w* * H^{-1} grad_w L_out(w*) (numpy). Both methods solve the inner problem by
gradient descent at 1/L from w = 0:

- unrolled(K): K GD steps, differentiated. Its error at every K is computed first by an
  independent float64 numpy recursion (forward mode: J_{k+1} = (I - lr H) J_k -
  lr diag(e^s w_k)); the smallest K <= maxiter (the most inner steps tried) whose error is
  <= the target is taken from it, and `hogrod.hypergrad.unrolled` is run at K and K - 1 to
  confirm (its error agrees with the recursion's; `unrolled_oracle_max_rel_diff`).
- implicit(N, CG): N GD steps, not differentiated, then CG on H v = grad L_out. N is the
  smallest with the exact-solve implicit error <= target / 2 (numpy), the CG tolerance
  target / 10; the library's error is measured and must be <= target.

Counts (deterministic, by the methods' structure):
- inner gradients: unrolled K (its forward pass); implicit N + 2 (the solve and its check of
  the gradient norm at w_0 and w_N);
- HVPs: unrolled K (the backward pass through each GD step is one product with the inner
  Hessian, and with the mixed partial d^2 L / dw ds, which on this problem is a diagonal
  scaling); implicit: CG's iterations (read from `linalg.cg`'s info in the compiled call)
  + 1 (the product with the mixed partial).

Seconds: each method as a `tf.function`, timed in interleaved rounds (`timing`), reported
also as a ratio over the floor measured in the same rounds: one GD step of the inner
problem (a compiled loop of `maxiter` steps, divided by `maxiter`).

Memory: on a larger problem (`memory_features`, `memory_train`), for K in `memory_steps`,
unrolled(K) and implicit(N = K inner steps, CG), each in a fresh process: the rise of the
peak resident set (ru_maxrss) over one compiled call, measured after tracing it and after a
warm-up call doing the same K GD steps undifferentiated; as MB and as ratios over implicit
at the smallest K (the floor, measured in the same run). (The allocator's own counter,
`tf.config.experimental.get_memory_info("CPU:0")`, does not see this loop's small
per-step tensors on CPU: it reported 0 for every K.)

    python -m experiments.bench.hypergrad_cost \
        --gin_file=experiments/bench/configs/hypergrad_cost.gin
"""

import json
import os
import resource
import subprocess
import sys

import gin
import numpy as np
import tensorflow as tf

from experiments.bench import timing
from experiments.bench.peers import ridge_exact_hypergradient, ridge_hyperproblem, ridge_objectives
from hogrod import harness, hypergrad, linalg, optim


def _outer_grad(av, bv, w):
    return 2 * av.T @ (av @ w - bv) / len(bv)


def _error_curves(a, b, av, bv, s, h, lr, exact, maxiter):
    """Relative errors, for K = 0..maxiter, of unrolled(K) and of the implicit formula
    at w_K with an exact solve (numpy, float64)."""
    es, atb = np.exp(s), a.T @ b
    w, jac = np.zeros_like(s), np.zeros((len(s), len(s)))  # jac = dw_k / ds
    unrolled, implicit = [], []
    norm = np.linalg.norm(exact)
    for _ in range(maxiter + 1):
        g_out = _outer_grad(av, bv, w)
        unrolled.append(np.linalg.norm(jac.T @ g_out - exact) / norm)
        implicit.append(np.linalg.norm(-es * w * np.linalg.solve(h, g_out) - exact) / norm)
        jac = jac - lr * (h @ jac) - lr * np.diag(es * w)
        w = w - lr * (h @ w - atb)
    return np.array(unrolled), np.array(implicit)


def _first_below(errors, target):
    """Smallest K with errors[K] <= target and every later one too (None: none)."""
    above = np.nonzero(errors > target)[0]
    k = 0 if len(above) == 0 else above[-1] + 1
    return int(k) if k < len(errors) else None


def _counting_cg(tol, maxiter, iterations):
    """`linalg.cg` that writes its iteration count into the variable `iterations` (an
    assignment, so it is recorded inside a tf.function too)."""
    def cg(matvec, rhs):
        x, info = linalg.cg(matvec, rhs, tol=tol, maxiter=maxiter)
        with tf.control_dependencies([iterations.assign(tf.cast(info.iterations, tf.int64))]):
            return tf.identity(x)
    return cg


def _methods(lr, features, k, inner_steps, cg_tol, iterations):
    unrolled = hypergrad.unrolled(optim.sgd(lr), k) if k else None
    # inner_tol 1: GD at 1/L never raises the gradient norm on a quadratic, so the check
    # passes; the accuracy is set by inner_steps (chosen above from the error curve)
    implicit = hypergrad.implicit(optim.sgd(lr), inner_steps, inner_tol=1.0,
                                  solve=_counting_cg(cg_tol, 10 * features, iterations))
    return unrolled, implicit


def _cost_table(a, b, av, bv, s, targets, maxiter, rounds):
    exact, h = ridge_exact_hypergradient(a, b, av, bv, s)
    features = len(s)
    lr = 1.0 / np.linalg.eigvalsh(h)[-1]
    inner, outer = ridge_objectives(a, b, av, bv)
    w0, s_ = tf.zeros(features, tf.float64), tf.constant(s)
    unrolled_err, implicit_err = _error_curves(a, b, av, bv, s, h, lr, exact, maxiter)
    norm = np.linalg.norm(exact)

    def error(fn):
        return float(np.linalg.norm(fn() - exact) / norm)

    rows, candidates, oracle_diff = [], {}, 0.0
    for target in targets:
        row = {"target": target}
        k = _first_below(unrolled_err, target)
        n = _first_below(implicit_err, target / 2)
        if n is None:
            raise ValueError(f"implicit needs more than maxiter={maxiter} inner steps "
                             f"for {target}: raise bench_hypergrad_cost.maxiter")
        iterations = tf.Variable(-1, dtype=tf.int64)
        unrolled, implicit = _methods(lr, features, k, n, target / 10, iterations)
        fn = candidates[f"implicit_{target:g}"] = _compiled(inner, outer, w0, s_, implicit)
        row["implicit_inner_steps"], row["implicit_rel_err"] = n, error(fn)
        cg = row["implicit_cg_iterations"] = int(iterations.numpy())
        row["implicit_hvps"], row["implicit_inner_grads"] = cg + 1, n + 2
        if row["implicit_rel_err"] > target:
            raise RuntimeError(f"implicit with {n} inner steps and CG tol {target / 10} "
                               f"missed {target}: {row['implicit_rel_err']}")
        if k is None:
            row["unrolled_steps"] = None  # does not reach the target within maxiter
        else:
            fn = candidates[f"unrolled_{target:g}"] = _compiled(inner, outer, w0, s_, unrolled)
            err = error(fn)
            oracle_diff = max(oracle_diff, abs(err - unrolled_err[k]) / unrolled_err[k])
            row.update(unrolled_steps=k, unrolled_rel_err=err, unrolled_hvps=k,
                       unrolled_inner_grads=k)
            if k > 0:  # the step before misses the target, in the library too
                row["unrolled_rel_err_one_step_fewer"] = error(_compiled(
                    inner, outer, w0, s_, hypergrad.unrolled(optim.sgd(lr), k - 1))) \
                    if k > 1 else float(unrolled_err[0])
        rows.append(row)

    @tf.function
    def gd_steps():
        w = w0
        for _ in tf.range(maxiter):
            with tf.GradientTape() as tape:
                tape.watch(w)
                loss = inner(w, s_)
            w = w - lr * tape.gradient(loss, w)
        return w[0]

    candidates["floor_gd_steps"] = lambda: gd_steps().numpy()
    rates = timing.interleaved_rates(candidates, rounds)
    step_seconds = 1.0 / (rates["floor_gd_steps"] * maxiter)
    for row in rows:
        for name in ("implicit", "unrolled"):
            key = f"{name}_{row['target']:g}"
            if key in rates:
                row[f"{name}_seconds"] = 1.0 / rates[key]
                row[f"{name}_step_ratio"] = 1.0 / (rates[key] * step_seconds)
    return rows, oracle_diff, step_seconds, float(np.linalg.cond(h))


def _compiled(inner, outer, w0, s, method):
    fn = tf.function(lambda: hypergrad.hypergradient(inner, outer, w0, s, method).grads)
    return lambda: fn().numpy()


def _max_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def memory_child(spec):
    """In a fresh process: the rise of the peak resident set over one compiled call of
    `spec['method']` ('unrolled' or 'implicit', K = spec['steps']) on the memory problem,
    after tracing it and after a warm-up call of K plain GD steps (the same kernels and
    thread pools, nothing differentiated). Prints it as JSON."""
    a, b, av, bv, s = ridge_hyperproblem(spec["features"], spec["train"], spec["validation"],
                               spec["condition"], spec["seed"])
    _, h = ridge_exact_hypergradient(a, b, av, bv, s)
    lr = 1.0 / np.linalg.eigvalsh(h)[-1]
    inner, outer = ridge_objectives(a, b, av, bv)
    w0, s_ = tf.zeros(len(s), tf.float64), tf.constant(s)
    unrolled, implicit = _methods(lr, len(s), spec["steps"], spec["steps"], 1e-10,
                                  tf.Variable(-1, dtype=tf.int64))
    method = unrolled if spec["method"] == "unrolled" else implicit
    fn = tf.function(lambda: hypergrad.hypergradient(inner, outer, w0, s_, method).grads)
    fn.get_concrete_function()
    opt = optim.sgd(lr)
    warm = tf.function(lambda: hypergrad.hypergradient(  # forward only: no tape
        inner, outer, w0, s_, hypergrad.implicit(opt, spec["steps"], inner_tol=1.0,
                                                solve="dense")).params)
    warm().numpy()
    before = _max_rss_mb()
    fn().numpy()
    print(json.dumps({"rise_mb": _max_rss_mb() - before}))


def _rss_rise_mb(spec):
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys; from experiments.bench.hypergrad_cost "
         "import memory_child; memory_child(json.loads(sys.argv[1]))", json.dumps(spec)],
        capture_output=True, text=True, check=False, cwd=os.getcwd(),
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if out.returncode:
        raise RuntimeError(f"the memory child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rise_mb"]


def _memory_table(steps, **problem):
    table = {k: {f"{m}_mb": _rss_rise_mb(dict(problem, method=m, steps=k))
                 for m in ("unrolled", "implicit")} for k in steps}
    floor = table[steps[0]]["implicit_mb"]
    for row in table.values():  # a problem too small to raise the peak has no ratios
        row["unrolled_over_implicit_first"] = row["unrolled_mb"] / floor if floor else None
        row["implicit_over_implicit_first"] = row["implicit_mb"] / floor if floor else None
    return table


@gin.configurable
def bench_hypergrad_cost(output_dir, features=20, train=100, validation=50, condition=100.0,
                         targets=(1e-2, 1e-4, 1e-6), maxiter=1000, rounds=20,
                         memory_steps=(10, 100, 1000), memory_features=500,
                         memory_train=8000, seed=0):
    del output_dir  # metrics.json is written by the harness
    rows, oracle_diff, step_seconds, cond = _cost_table(
        *ridge_hyperproblem(features, train, validation, condition, seed), targets, maxiter,
        rounds)
    memory = _memory_table(tuple(memory_steps), features=memory_features, train=memory_train,
                           validation=validation, condition=condition,
                           seed=seed) if memory_steps else {}  # () skips it
    metrics = {"condition": cond, "gd_step_floor_seconds": step_seconds,
               "unrolled_oracle_max_rel_diff": oracle_diff}
    for row in rows:
        t = f"{row['target']:g}"
        for key, value in row.items():
            if key != "target":
                metrics[f"{key}_at_{t}"] = value
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()))
    for k, row in memory.items():
        for key, value in row.items():
            metrics[f"memory_{key}_k{k}"] = value
        print(f"K={k}: " + " ".join(f"{key}={v:.3g}" if v is not None else f"{key}=-"
                                    for key, v in row.items()))
    print(f"condition {cond:.1f}; GD step floor {step_seconds:.2e} s; unrolled vs numpy "
          f"recursion {oracle_diff:.1e}")
    return metrics


def main():
    """`python -m experiments.bench.hypergrad_cost` (see the module docstring)."""
    harness.main(bench_hypergrad_cost)


if __name__ == "__main__":
    main()
