"""PINNacle Burgers 1d-C: DeepXDE vanilla against hogrod vanilla in the same protocol, and
hogrod's seconds per Adam step per PINNacle case with and without XLA.

DeepXDE (TensorFlow backend, DDE_BACKEND=tensorflow) runs PINNacle's Burgers1D as PINNacle
builds it: x in [-1, 1], t in [0, 1], u(x, 0) = -sin(pi x), u(+-1, t) = 0, soft conditions,
`dde.data.TimePDE` with 8,192 domain, 2,048 boundary and 2,048 initial Hammersley points, a
5 x 100 tanh FNN (Glorot normal), Adam 1e-3. hogrod runs `experiments/pinn.py` with
`configs/pinn/pinnacle/burgers1d_c.gin` (the same protocol) in its own process. Both stop
after `iterations` Adam steps (PINNacle: 20,000) with the same seed index, and both are
scored by PINNacle's L2RE on the reference file's points (`hogrod.pinn.l2re`).

Seconds per step leave out tracing: DeepXDE's from `iterations` steps timed after a
warm-up of `warmup` steps; hogrod's from the binary's own training clock (its
`error_history`, evaluations not counted) from Adam step n1 to the last one it records: the
Burgers run with n1 = iterations / 10, and one run of (n1, n2) = `timing_steps` (n2 + n1
steps) per case in `timing_cases` with `pinn_experiment.jit_compile` False and True.

    python -m experiments.bench.pinnacle_deepxde --gin_file=configs/bench/pinnacle_deepxde.gin
"""

import json
import os
import subprocess
import sys
import time

import gin
import numpy as np
from absl import logging

from experiments import models
from hogrod import harness, pinn

PINNACLE_CONFIGS = "configs/pinn/pinnacle"


def deepxde_burgers1d(iterations, seed, warmup=10, n_domain=8192, n_boundary=2048,
                      n_initial=2048):
    """(L2RE after `iterations` Adam steps, seconds per step) of DeepXDE vanilla."""
    os.environ.setdefault("DDE_BACKEND", "tensorflow")
    import deepxde as dde
    if dde.backend.backend_name != "tensorflow":
        raise ValueError(f"DeepXDE's backend is {dde.backend.backend_name}: set "
                         "DDE_BACKEND=tensorflow")

    dde.config.set_random_seed(seed)
    data = models.deepxde_burgers_data(dde, n_domain, n_boundary, n_initial,
                                       train_distribution="Hammersley")
    model = dde.Model(data, dde.nn.FNN([2] + [100] * 5 + [1], "tanh", "Glorot normal"))
    model.compile("adam", lr=1e-3)
    model.train(iterations=warmup, display_every=max(warmup, 1), verbose=0)
    t0 = time.perf_counter()
    model.train(iterations=iterations - warmup, display_every=iterations, verbose=0)
    seconds = time.perf_counter() - t0
    prob = pinn.pinnacle.pinnacle_burgers1d()
    pred = model.predict(prob.grid.astype(np.float32))
    return pinn.l2re(prob.reference(prob.grid), pred), seconds / (iterations - warmup)


def run_pinn_binary(gin_files, gin_params, output_dir):
    """`python -m experiments.pinn` with these configs in its own process, as a user runs
    it (binaries do not import each other: `tests/test_configs.py`); its metrics."""
    argv = ([sys.executable, "-m", "experiments.pinn"] + [f"--gin_file={f}" for f in gin_files]
            + [f"--gin_param={p}" for p in gin_params]
            + [f"--output_dir={os.path.abspath(output_dir)}"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [harness.REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=harness.REPO_ROOT)
    if out.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited with code {out.returncode}:\n"
                           f"{out.stderr[-3000:]}")
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return json.load(f)


def _seconds_per_step(metrics, n1):
    """Seconds per Adam step between step n1 and the last step on the binary's curve
    (training clock, evaluations not counted; the curve leaves out the final step)."""
    clock = {int(step): seconds for seconds, phase, step, _ in metrics["error_history"]
             if phase == "adam"}
    last = max(clock, default=0)
    if n1 not in clock or last <= n1:
        raise ValueError(f"the run's error_history needs Adam step {n1} and a later one, got "
                         f"{sorted(clock)}")
    return (clock[last] - clock[n1]) / (last - n1)


def hogrod_run(case, steps, error_every, output_dir, params=()):
    return run_pinn_binary([f"{PINNACLE_CONFIGS}/{case}.gin"],
                           [f"pinn_experiment.adam_steps = {steps}",
                            f"pinn_experiment.error_every = {error_every}",
                            "pinn_experiment.checkpoint_every = 1000000"] + list(params),
                           output_dir)


@gin.configurable
def bench_pinnacle_deepxde(output_dir, iterations=1000, seed=0, warmup=10,
                           timing_cases=("burgers1d_c", "poisson2d_c", "wave1d_c"),
                           timing_steps=(5, 25), protocol_steps=20000):
    if iterations <= warmup:
        raise ValueError(f"bench_pinnacle_deepxde.iterations ({iterations}) must exceed "
                         f"bench_pinnacle_deepxde.warmup ({warmup})")
    n1, n2 = timing_steps
    if not 0 < n1 < n2 or n2 % n1:
        raise ValueError("bench_pinnacle_deepxde.timing_steps must be (n1, n2), 0 < n1 < n2, "
                         f"n2 a multiple of n1, got {timing_steps}")
    if iterations % 10:
        raise ValueError(f"bench_pinnacle_deepxde.iterations ({iterations}) must be a "
                         "multiple of 10 (hogrod's clock is read every iterations / 10 steps)")
    m = {}
    if iterations:
        m["deepxde_l2re"], m["deepxde_s_per_step"] = deepxde_burgers1d(iterations, seed,
                                                                         warmup)
        logging.info("deepxde: l2re %.4g, %.4g s per step", m["deepxde_l2re"],
                     m["deepxde_s_per_step"])
        h = hogrod_run("burgers1d_c", iterations, iterations // 10,
                       os.path.join(output_dir, "hogrod_burgers1d_c"),
                       [f"pinn_experiment.seed = {seed}"])
        m["hogrod_l2re"] = h["l2re"]
        m["hogrod_s_per_step"] = _seconds_per_step(h, iterations // 10)
        logging.info("hogrod: l2re %.4g, %.4g s per step", m["hogrod_l2re"],
                     m["hogrod_s_per_step"])
    for case in timing_cases:
        for jit in (False, True):
            h = hogrod_run(case, n2 + n1, n1, os.path.join(output_dir, f"{case}_jit{int(jit)}"),
                           [f"pinn_experiment.jit_compile = {jit}"])
            s = _seconds_per_step(h, n1)
            m[f"hogrod_s_per_step_{case}{'_xla' if jit else ''}"] = s
            m[f"hogrod_protocol_hours_{case}{'_xla' if jit else ''}"] = s * protocol_steps / 3600
            logging.info("%s jit_compile=%s: %.3f s per step", case, jit, s)
    for k, v in sorted(m.items()):
        print(f"{k:45s} {v:.4g}")
    return dict(m, iterations=iterations, seed=seed)


def main():
    """`python -m experiments.bench.pinnacle_deepxde` (see the module docstring)."""
    harness.main(bench_pinnacle_deepxde)


if __name__ == "__main__":
    main()
