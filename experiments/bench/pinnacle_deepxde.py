"""PINNacle Burgers 1d-C, Poisson 2d-C and Wave 1d-C: DeepXDE vanilla against hogrod vanilla
in the same protocol, seed for seed, and hogrod's seconds per Adam step per PINNacle case
with and without XLA.

DeepXDE (TensorFlow backend, DDE_BACKEND=tensorflow) runs each case as PINNacle builds it
(`experiments.bench.peers.deepxde_burgers_data`, `deepxde_poisson2d_classic_data`,
`deepxde_wave1d_data`: PINNacle's src/pde/ definitions, soft conditions, Hammersley points),
a 5 x 100 tanh FNN (Glorot normal), Adam 1e-3. hogrod runs `experiments/pinn.py` with
`configs/pinn/pinnacle/<case>.gin` (the same protocol) in its own process. Before DeepXDE
trains, `peers.check_deepxde_peer` checks that its problem is hogrod's: the same domain,
point counts (those of the case's config), condition targets and (Wave) solution; a
mismatch is an error naming the config. Both stop after `iterations` Adam steps (PINNacle:
20,000) with the same seed, and both are scored by PINNacle's L2RE on the case's
evaluation points (`hogrod.pinn.l2re`). Per case: each side's mean and spread (sample
standard deviation, min, max) over `seeds` of the L2RE and the seconds per step, and
whether the two L2REs agree within seed spread (`runs.agree_within_spread`).

Seconds per step leave out tracing: DeepXDE's from the steps after a warm-up of `warmup`
steps; hogrod's from the binary's own training clock (its `error_history`, evaluations not
counted) from Adam step n1 = iterations / 10 to the last one it records; and one run of
(n1, n2) = `timing_steps` (n2 + n1 steps) per case in `timing_cases` with
`pinn_experiment.jit_compile` False and True.

Finished runs are kept (`<output_dir>/<case>/seed<k>/`): a re-run with the same output_dir
resumes where it stopped.

    python -m experiments.bench.pinnacle_deepxde \
        --gin_file=experiments/bench/configs/pinnacle_deepxde.gin
"""

import json
import os
import time

import gin
import numpy as np
from absl import logging

from experiments.bench import peers
from experiments.bench import runs
from hogrod import harness, pinn, train

PINNACLE_CONFIGS = "configs/pinn/pinnacle"


def _burgers(dde, n_collocation, n_condition):
    return peers.deepxde_burgers_data(dde, n_collocation, n_condition["boundary"],
                                       n_condition["initial"], train_distribution="Hammersley")


def _poisson(dde, n_collocation, n_condition):
    return peers.deepxde_poisson2d_classic_data(dde, n_collocation,
                                                 sum(n_condition.values()))


def _wave(dde, n_collocation, n_condition):
    return peers.deepxde_wave1d_data(dde, n_collocation, sum(n_condition.values()))


# case: (DeepXDE data builder, hogrod problem factory, [(hogrod term, sign)] in DeepXDE's
# condition order, DeepXDE's closed-form solution or None)
PEERS = {
    "burgers1d_c": (_burgers, pinn.pinnacle.pinnacle_burgers1d,
                    [("boundary", 1), ("initial", 1)], None),
    "poisson2d_c": (_poisson, pinn.pinnacle.pinnacle_poisson2d_classic,
                    [("rectangle", 1), ("circles", 1)], None),
    "wave1d_c": (_wave, pinn.pinnacle.pinnacle_wave1d,
                 [("initial_velocity", -1), ("initial", 1), ("boundary", 1)],
                 peers.pinnacle_wave1d_ref_sol),
}


def case_config(case):
    """`configs/pinn/pinnacle/<case>.gin`'s bindings, its includes' first."""
    def read(path):
        with open(os.path.join(harness.REPO_ROOT, path)) as f:
            text = f.read()
        out = {}
        for line in text.splitlines():
            if line.startswith("include "):
                out.update(read(line.split(None, 1)[1].strip().strip("'\"")))
        out.update(runs.config_bindings(text))
        return out
    return read(f"{PINNACLE_CONFIGS}/{case}.gin")


def deepxde_vanilla(case, iterations, seed, warmup=10):
    """(L2RE after `iterations` Adam steps, seconds per step) of DeepXDE vanilla on `case`,
    its problem checked against hogrod's first."""
    os.environ.setdefault("DDE_BACKEND", "tensorflow")
    import deepxde as dde
    if dde.backend.backend_name != "tensorflow":
        raise ValueError(f"DeepXDE's backend is {dde.backend.backend_name}: set "
                         "DDE_BACKEND=tensorflow")
    if case not in PEERS:
        raise ValueError(f"bench_pinnacle_deepxde.cases: no DeepXDE peer for {case!r}; "
                         f"there are {sorted(PEERS)}")
    build, factory, terms, solution = PEERS[case]
    config = case_config(case)
    n_collocation = config["pinn_experiment.n_collocation"]
    n_condition = config["pinn_experiment.n_condition"]
    dde.config.set_random_seed(seed)
    data = build(dde, n_collocation, n_condition)
    prob = factory()
    peers.check_deepxde_peer(data, prob, terms, n_collocation, n_condition,
                              f"{PINNACLE_CONFIGS}/{case}.gin", solution=solution, seed=seed)
    dim = prob.domain.dim
    model = dde.Model(data, dde.nn.FNN([dim] + [100] * 5 + [1], "tanh",
                                       peers.deepxde_glorot_normal(seed)))
    model.compile("adam", lr=1e-3)
    model.train(iterations=warmup, display_every=max(warmup, 1), verbose=0)
    t0 = time.perf_counter()
    model.train(iterations=iterations - warmup, display_every=iterations, verbose=0)
    seconds = time.perf_counter() - t0
    pred = model.predict(prob.grid.astype(np.float32))
    return pinn.l2re(prob.reference(prob.grid), pred), seconds / (iterations - warmup)


def hogrod_run(case, steps, error_every, output_dir, params=()):
    params = [f"pinn_experiment.adam_steps = {steps}",
              f"pinn_experiment.error_every = {error_every}",
              "pinn_experiment.checkpoint_every = 1000000"] + list(params)
    done = runs.finished_metrics(output_dir, {"pinn_experiment.adam_steps": steps})
    return done or runs.run_pinn_binary([f"{PINNACLE_CONFIGS}/{case}.gin"], params,
                                        output_dir)


def _seed_run(case, seed, iterations, warmup, output_dir):
    """{deepxde_l2re, deepxde_s_per_step, hogrod_l2re, hogrod_s_per_step} of one seed,
    kept in `<output_dir>/deepxde.json` and the hogrod run's directory."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "deepxde.json")
    r = None
    if os.path.exists(path):
        with open(path) as f:
            r = json.load(f)
        if r.get("iterations") != iterations:
            raise ValueError(f"{path} is a run of {r.get('iterations')} iterations, not "
                             f"{iterations}: remove it or use another output_dir")
    if r is None:
        l2re, s = deepxde_vanilla(case, iterations, seed, warmup)
        r = {"iterations": iterations, "deepxde_l2re": l2re, "deepxde_s_per_step": s}
        train.write_json(path, r)
    h = hogrod_run(case, iterations, iterations // 10, os.path.join(output_dir, "hogrod"),
                   [f"pinn_experiment.seed = {seed}"])
    out = dict(r, hogrod_l2re=h["l2re"],
               hogrod_s_per_step=runs.seconds_per_step(h, iterations // 10))
    out.pop("iterations")
    logging.info("%s seed %d: %s", case, seed, out)
    return out


def summarize(per_seed):
    """{side_quantity: seed_stats} and `agree` (L2RE within seed spread) of one case's
    [{deepxde_l2re, deepxde_s_per_step, hogrod_l2re, hogrod_s_per_step}] per seed."""
    keys = ("deepxde_l2re", "deepxde_s_per_step", "hogrod_l2re", "hogrod_s_per_step")
    out = {k: runs.seed_stats([r[k] for r in per_seed]) for k in keys}
    out["agree"] = runs.agree_within_spread([r["hogrod_l2re"] for r in per_seed],
                                            [r["deepxde_l2re"] for r in per_seed])
    return out


def table(summary):
    """A markdown table of `summarize`'s results per case."""
    def f(s):
        return f"{s['mean']:.3g} +- {s['std']:.2g}"
    rows = ["| case | seeds | hogrod L2RE | DeepXDE L2RE | agree | hogrod s/step | "
            "DeepXDE s/step |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for case, s in summary.items():
        rows.append(f"| {case} | {s['hogrod_l2re']['n']} | {f(s['hogrod_l2re'])} | "
                    f"{f(s['deepxde_l2re'])} | {'yes' if s['agree'] else 'no'} | "
                    f"{f(s['hogrod_s_per_step'])} | {f(s['deepxde_s_per_step'])} |")
    return "\n".join(rows)


@gin.configurable
def bench_pinnacle_deepxde(output_dir, iterations=1000, cases=("burgers1d_c", "poisson2d_c",
                                                                 "wave1d_c"),
                           seeds=(0, 1, 2), warmup=10,
                           timing_cases=("burgers1d_c", "poisson2d_c", "wave1d_c"),
                           timing_steps=(5, 25), protocol_steps=20000):
    if iterations and iterations <= warmup:
        raise ValueError(f"bench_pinnacle_deepxde.iterations ({iterations}) must exceed "
                         f"bench_pinnacle_deepxde.warmup ({warmup})")
    n1, n2 = timing_steps
    if not 0 < n1 < n2 or n2 % n1:
        raise ValueError("bench_pinnacle_deepxde.timing_steps must be (n1, n2), 0 < n1 < n2, "
                         f"n2 a multiple of n1, got {timing_steps}")
    if iterations % 10:
        raise ValueError(f"bench_pinnacle_deepxde.iterations ({iterations}) must be a "
                         "multiple of 10 (hogrod's clock is read every iterations / 10 steps)")
    unknown = [c for c in cases if c not in PEERS]
    if unknown or not cases:
        raise ValueError(f"bench_pinnacle_deepxde.cases: {list(cases)}; DeepXDE peers exist for "
                         f"{sorted(PEERS)}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"bench_pinnacle_deepxde.seeds must be distinct seeds, got {seeds}")
    harness.started(output_dir)
    m = {}
    if iterations:
        per_case, summary = {}, {}
        for case in cases:
            per_case[case] = [_seed_run(case, s, iterations, warmup,
                                        os.path.join(output_dir, case, f"seed{s}"))
                              for s in seeds]
            summary[case] = summarize(per_case[case])
            train.write_json(os.path.join(output_dir, "peers.json"),
                               {"per_seed": per_case, "summary": summary})
        m.update(per_seed=per_case, summary=summary)
        with open(os.path.join(output_dir, "table.md"), "w") as f:
            f.write(table(summary) + "\n")
        print(table(summary))
    for case in timing_cases:
        for jit in (False, True):
            h = hogrod_run(case, n2 + n1, n1, os.path.join(output_dir, f"{case}_jit{int(jit)}"),
                           [f"pinn_experiment.jit_compile = {jit}"])
            s = runs.seconds_per_step(h, n1)
            m[f"hogrod_s_per_step_{case}{'_xla' if jit else ''}"] = s
            m[f"hogrod_protocol_hours_{case}{'_xla' if jit else ''}"] = s * protocol_steps / 3600
            logging.info("%s jit_compile=%s: %.3f s per step", case, jit, s)
            print(f"{case} jit_compile={jit}: {s:.4g} s per step")
    return dict(m, iterations=iterations, seeds=list(seeds))


def main():
    """`python -m experiments.bench.pinnacle_deepxde` (see the module docstring)."""
    harness.main(bench_pinnacle_deepxde)


if __name__ == "__main__":
    main()
