"""The PINNacle table: per case, hogrod's methods (vanilla and best) over seeds, from
`experiments/pinn.py` runs of `configs/pinn/pinnacle/<case><suffix>.gin`.

Each (case, method, seed) is one `python -m experiments.pinn` run in its own process, in
`<output_dir>/<case>/<method>/seed<k>/`, with `pinn_experiment.adam_steps = iterations` and
`pinn_experiment.seed = k` (plus `extra_params`). A run whose metrics.json exists is kept
(checked to be the same iterations and seed), and one stopped midway resumes from its
checkpoint, so the driver can be stopped and started again. It writes `table.json` and
`table.md`: per case and method the mean and spread (sample standard deviation, min, max)
over seeds of the L2RE and of the training seconds (Adam and L-BFGS, evaluation left out),
and the ratio of the first method's mean L2RE to each other's (vanilla / best). Runs that
fail are listed there and make the binary exit with an error after the table is written.

PINNacle's full protocol (10 cases x 2 methods x 3 seeds x 20,000 iterations) is about 100
CPU-hours on 2 cores; with a GPU (or one node of a cluster) it is this one command:

    python -m experiments.bench.pinnacle_table \
        --gin_file=experiments/bench/configs/pinnacle_table.gin
"""

import math
import os

import gin
from absl import logging

from experiments.bench import runs
from hogrod import harness, train

PINNACLE_CONFIGS = "configs/pinn/pinnacle"
CASES = ("burgers1d_c", "poisson2d_c", "poisson2d_cg", "heat2d_ms", "heat2d_lt", "ns2d_c",
         "ns2d_cg", "wave1d_c", "poisson_nd", "heat_nd")


def _check(cases, methods, seeds, iterations):
    if not cases or len(set(cases)) != len(cases):
        raise ValueError(f"pinnacle_table.cases must be distinct case names, got {cases}")
    if not isinstance(methods, dict) or not methods:
        raise ValueError("pinnacle_table.methods must be {label: gin file suffix}, e.g. "
                         f"{{'vanilla': '', 'best': '_best'}}, got {methods!r}")
    for case in cases:
        for suffix in methods.values():
            path = os.path.join(harness.REPO_ROOT, PINNACLE_CONFIGS, f"{case}{suffix}.gin")
            if not os.path.exists(path):
                raise ValueError(f"pinnacle_table: no config {PINNACLE_CONFIGS}/{case}{suffix}"
                                 ".gin (pinnacle_table.cases and pinnacle_table.methods)")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"pinnacle_table.seeds must be distinct seeds, got {seeds}")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"pinnacle_table.iterations must be an integer >= 1, got "
                         f"{iterations!r}")


def run_one(case, suffix, seed, iterations, output_dir, extra_params=()):
    """The metrics of one run: kept if finished, else run (or resumed)."""
    done = runs.finished_metrics(output_dir, {"pinn_experiment.adam_steps": iterations,
                                              "pinn_experiment.seed": seed})
    if done is not None:
        return done
    return runs.run_pinn_binary(
        [f"{PINNACLE_CONFIGS}/{case}{suffix}.gin"],
        [f"pinn_experiment.adam_steps = {iterations}", f"pinn_experiment.seed = {seed}"]
        + list(extra_params), output_dir)


def aggregate(results):
    """{case: {method: {"l2re", "train_seconds": seed_stats}, "ratio": {method: first
    method's mean L2RE / this one's}}} of {case: {method: [metrics per seed]}} (methods in
    order, the first the baseline)."""
    table = {}
    for case, by_method in results.items():
        row, first = {}, None
        for method, per_seed in by_method.items():
            if not per_seed:
                continue
            row[method] = {"l2re": runs.seed_stats([m["l2re"] for m in per_seed]),
                           "train_seconds": runs.seed_stats([m["total_seconds"]
                                                             for m in per_seed])}
            first = first or method
        if first is not None:
            base = row[first]["l2re"]["mean"]
            row["ratio"] = {m: (base / row[m]["l2re"]["mean"] if row[m]["l2re"]["mean"] > 0
                                else math.inf) for m in row if m != first}
        table[case] = row
    return table


def markdown(table, methods):
    """`aggregate`'s table as markdown: L2RE mean +- std (n seeds) per method, the ratios,
    the training seconds' means."""
    names = list(methods)
    head = (["case"] + [f"{m} L2RE" for m in names] + [f"{names[0]}/{m}" for m in names[1:]]
            + [f"{m} s" for m in names])
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def cell(row, m, key, fmt):
        if m not in row:
            return "-"
        s = row[m][key]
        return (f"{s['mean']:{fmt}} +- {s['std']:.2g} ({s['n']})" if key == "l2re"
                else f"{s['mean']:{fmt}}")
    for case, row in table.items():
        cells = ([case] + [cell(row, m, "l2re", ".3g") for m in names]
                 + [f"{row['ratio'][m]:.3g}" if m in row.get("ratio", {}) else "-"
                    for m in names[1:]]
                 + [cell(row, m, "train_seconds", ".0f") for m in names])
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


@gin.configurable
def pinnacle_table(output_dir, cases=CASES, methods=None, seeds=(0, 1, 2), iterations=20000,
                   extra_params=()):
    """Args:
      cases: PINNacle cases (`configs/pinn/pinnacle/<case>.gin`).
      methods: {label: gin file suffix}, the baseline first (None: {'vanilla': '',
        'best': '_best'}).
      seeds, iterations: each run's `pinn_experiment.seed` and `adam_steps`.
      extra_params: further gin bindings for every run (e.g. fewer points for a smoke test).
    """
    methods = {"vanilla": "", "best": "_best"} if methods is None else dict(methods)
    cases, seeds = tuple(cases), tuple(seeds)
    _check(cases, methods, seeds, iterations)
    harness.started(output_dir)
    results, failures = {}, []
    for case in cases:
        results[case] = {}
        for method, suffix in methods.items():
            results[case][method] = []
            for seed in seeds:
                run_dir = os.path.join(output_dir, case, method, f"seed{seed}")
                try:
                    results[case][method].append(
                        run_one(case, suffix, seed, iterations, run_dir, extra_params))
                except RuntimeError as e:
                    failures.append(f"{case} {method} seed {seed}: {str(e)[-500:]}")
                    logging.error("%s", failures[-1])
        _write(output_dir, aggregate(results), methods, failures, iterations, seeds)
    table = aggregate(results)
    print(markdown(table, methods))
    if failures:
        raise RuntimeError(f"{len(failures)} run(s) failed (listed in "
                           f"{output_dir}/table.md):\n" + "\n".join(failures))
    return {"table": table, "iterations": iterations, "seeds": list(seeds)}


def _write(output_dir, table, methods, failures, iterations, seeds):
    train.write_json(os.path.join(output_dir, "table.json"),
                       {"table": table, "methods": methods, "iterations": iterations,
                        "seeds": list(seeds), "failures": failures}, indent=1)
    text = (f"PINNacle table: {iterations} Adam iterations, seeds {list(seeds)}\n\n"
            + markdown(table, methods) + "\n")
    if failures:
        text += "\nFailed runs:\n\n" + "\n".join(f"- {f}" for f in failures) + "\n"
    with open(os.path.join(output_dir, "table.md"), "w") as f:
        f.write(text)


def main():
    """`python -m experiments.bench.pinnacle_table` (see the module docstring)."""
    harness.main(pinnacle_table)


if __name__ == "__main__":
    main()
