"""Time to reach 1e-2 and 1e-3 relative L2 error on Burgers: hogrod against DeepXDE's example.

DeepXDE's Burgers example (examples/pinn_forward/Burgers.py): FNN 2-20-20-20-1, tanh,
Glorot normal; 2,540 domain, 80 boundary and 160 initial random points, soft conditions;
Adam 1e-3 for 15,000 iterations, then L-BFGS (TensorFlow Probability's, DeepXDE's
TensorFlow backend). It runs here as written (t in [0, 1] so that the reference grid is the
same), in chunks of `error_every` Adam iterations with the error measured between chunks
(not timed); its L-BFGS is one graph call, so it runs with doubling iteration budgets
(500, 1,000, 2,000, ...), each from the weights Adam left, until the error is below the
last threshold or the budget reaches the example's 15,000.

hogrod runs the `experiments/pinn.py` binary twice, each in its own process as a user runs
it: with DeepXDE's setup (same net, point counts and schedule; Sobol points) and with its
own Burgers config (`configs/pinn/burgers.gin`: Raissi's 8 x 20 net, 10,000 points, hard
conditions, Adam 2,000 then scipy L-BFGS). Both record the error every `error_every`
steps/iterations (their `error_history`); the times to the thresholds are read off those
curves here (`pinn.seconds_to_error`). The error is against the Cole-Hopf reference on the
256 x 100 grid.

    python -m experiments.bench.pinn_convergence \
        --gin_file=experiments/bench/configs/pinn_convergence.gin

Reported: training seconds to each threshold (None: not reached), final errors, and the
ratios DeepXDE seconds / hogrod seconds. DeepXDE's time to a threshold reached in L-BFGS is
that of the first budget that reaches it, within a factor 2 of the iterations it needed:
the metrics give the previous budget's time too (`deepxde_lower_seconds_to_<t>`).
"""

import os
import time

import gin
import numpy as np
from absl import logging

from experiments.bench import peers
from experiments.bench.runs import run_pinn_binary
from hogrod import harness, pinn


def deepxde_setup(adam_steps, lbfgs_maxiter):
    """experiments/pinn.py bindings for DeepXDE's example setup and schedule."""
    return ["pinn_experiment.problem = @burgers_problem",
            "burgers_problem.hard_constraints = False",
            "pinn_experiment.width = 20", "pinn_experiment.depth = 3",
            "pinn_experiment.n_collocation = 2540", "pinn_experiment.n_condition = 160",
            f"pinn_experiment.adam_steps = {adam_steps}", "pinn_experiment.adam_lr = 1e-3",
            f"pinn_experiment.lbfgs_maxiter = {lbfgs_maxiter}"]


def deepxde_run(adam_steps, lbfgs_maxiter, error_every, thresholds, seed,
                first_lbfgs_budget=500):
    os.environ.setdefault("DDE_BACKEND", "tensorflow")
    try:
        import deepxde as dde
    except Exception as e:  # not installed (the `bench` extra), or another backend configured
        logging.warning("deepxde unavailable (%s): no DeepXDE baseline", e)
        return None
    dde.config.set_random_seed(seed)
    problem = pinn.problems.burgers_problem()
    grid, ref = problem.grid, problem.reference(problem.grid)

    def error():
        pred = model.predict(grid)
        return float(np.linalg.norm(pred - ref) / np.linalg.norm(ref))

    data = peers.deepxde_burgers_data(dde, 2540, 80, 160)
    # DeepXDE's "Glorot normal" string gives every hidden layer the same weights under Keras 3
    model = dde.Model(data, dde.nn.FNN([2] + [20] * 3 + [1], "tanh",
                                       peers.deepxde_glorot_normal(seed)))
    model.compile("adam", lr=1e-3)
    history, seconds = [], 0.0
    for done in range(error_every, adam_steps + 1, error_every):
        t0 = time.perf_counter()
        model.train(iterations=error_every, display_every=error_every, verbose=0)
        seconds += time.perf_counter() - t0
        history.append([seconds, "adam", done, error()])
        logging.info("deepxde adam %d: %.1f s, relative L2 %.3e", done, seconds, history[-1][3])
    # DeepXDE's L-BFGS is one graph call with no progress to observe; so run it with doubling
    # iteration budgets, each from the weights Adam left, until the last threshold is
    # reached or the budget hits `lbfgs_maxiter`: a budget's time is what a run stopped
    # there would have taken, and the first budget below a threshold brackets its time.
    after_adam, adam_seconds = model.net.get_weights(), seconds
    budget = first_lbfgs_budget
    while True:
        budget = min(budget, lbfgs_maxiter)
        model.net.set_weights(after_adam)
        dde.optimizers.config.set_LBFGS_options(maxiter=budget)
        model.compile("L-BFGS")
        t0 = time.perf_counter()
        model.train(verbose=0)
        history.append([adam_seconds + time.perf_counter() - t0, "lbfgs", budget, error()])
        logging.info("deepxde L-BFGS budget %d: %.1f s, relative L2 %.3e", budget,
                     history[-1][0], history[-1][3])
        if history[-1][3] <= min(thresholds) or budget >= lbfgs_maxiter:
            break
        budget *= 2
    seconds = history[-1][0]
    history.append([seconds, "end", budget, history[-1][3]])
    return {"relative_l2": history[-1][3], "total_seconds": seconds, "error_history": history,
            **{f"seconds_to_{t:g}": pinn.seconds_to_error(history, t) for t in thresholds}}


@gin.configurable
def bench_pinn_convergence(output_dir, error_every=500, thresholds=(1e-2, 1e-3),
                           dde_adam_steps=15000, dde_lbfgs_maxiter=15000,
                           hogrod_runs=("deepxde_setup", "burgers_gin"), seed=0):
    """Args:
      hogrod_runs: "deepxde_setup" (DeepXDE's net, points and schedule) and/or "burgers_gin"
        (configs/pinn/burgers.gin). Each is a full `experiments/pinn.py` run, in its own
        process, in `<output_dir>/<name>`, with its own config files there.
      dde_adam_steps, dde_lbfgs_maxiter: the example's schedule (also hogrod's in the
        "deepxde_setup" run).
    """
    results = {}
    for name in hogrod_runs:
        if name not in ("deepxde_setup", "burgers_gin"):
            raise ValueError("bench_pinn_convergence.hogrod_runs holds 'deepxde_setup' and/or "
                             f"'burgers_gin', got {name!r}")
        files = ["configs/pinn/burgers.gin"] if name == "burgers_gin" else ["configs/pinn/base.gin"]
        params = (deepxde_setup(dde_adam_steps, dde_lbfgs_maxiter)
                  if name == "deepxde_setup" else []) + [
            f"pinn_experiment.error_every = {error_every}", f"pinn_experiment.seed = {seed}"]
        harness.started(output_dir)
        r = run_pinn_binary(files, params, os.path.abspath(os.path.join(output_dir, name)))
        results[f"hogrod_{name}"] = dict(r, **{
            f"seconds_to_{t:g}": pinn.seconds_to_error(r["error_history"], t)
            for t in thresholds})
    baseline = deepxde_run(dde_adam_steps, dde_lbfgs_maxiter, error_every, thresholds, seed)
    if baseline is not None:
        results["deepxde"] = baseline
    m = {}
    if baseline is not None:  # the last budget that did not reach each threshold
        for t in thresholds:
            below = [h[0] for h in baseline["error_history"] if h[3] > t]
            m[f"deepxde_lower_seconds_to_{t:g}"] = max(below) if below else 0.0
    for name, r in results.items():
        m[f"{name}_relative_l2"] = r["relative_l2"]
        m[f"{name}_total_seconds"] = r["total_seconds"]
        for t in thresholds:
            m[f"{name}_seconds_to_{t:g}"] = r[f"seconds_to_{t:g}"]
            if baseline is None or name == "deepxde":
                continue
            dde_t, ours = baseline[f"seconds_to_{t:g}"], r[f"seconds_to_{t:g}"]
            if ours:
                m[f"ratio_deepxde_over_{name}_to_{t:g}"] = dde_t / ours if dde_t else None
    for k, v in sorted(m.items()):
        logging.info("%-45s %s", k, v)
    return dict(m, histories={k: r["error_history"] for k, r in results.items()})


def main():
    """`python -m experiments.bench.pinn_convergence` (see the module docstring)."""
    harness.main(bench_pinn_convergence)


if __name__ == "__main__":
    main()
