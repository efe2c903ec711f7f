"""`experiments.bench.hypergrad_cost` on a tiny ridge problem: the smallest unrolled K it
reports is the smallest (the library at K reaches the target, at K - 1 it does not), the
library's unrolled error equals an independent numpy forward-mode recursion, implicit
reaches the target with CG iterations within CG's exact-arithmetic bound, and the HVP
counts follow the methods' structure."""

import json

import numpy as np

from hogrod import harness
from conftest import bench_config

TARGETS = (1e-3,)  # one target: each method is traced per target
FEATURES = 6


def test_cost_binary_reports_smallest_k_and_consistent_counts(tmp_path):
    from experiments.bench import hypergrad_cost
    _, m = harness.run(hypergrad_cost.bench_hypergrad_cost, [bench_config("hypergrad_cost")],
                       [f"bench_hypergrad_cost.features = {FEATURES}",
                        "bench_hypergrad_cost.train = 20", "bench_hypergrad_cost.validation = 8",
                        "bench_hypergrad_cost.condition = 10.0",
                        f"bench_hypergrad_cost.targets = {TARGETS}",
                        "bench_hypergrad_cost.maxiter = 200",
                        "bench_hypergrad_cost.rounds = 1",
                        "bench_hypergrad_cost.memory_steps = ()"], str(tmp_path))
    assert m["unrolled_oracle_max_rel_diff"] < 1e-8
    for t in TARGETS:
        k = m[f"unrolled_steps_at_{t:g}"]
        assert 1 < k <= 200 and m[f"unrolled_hvps_at_{t:g}"] == k
        assert m[f"unrolled_rel_err_at_{t:g}"] <= t < m[f"unrolled_rel_err_one_step_fewer_at_{t:g}"]
        cg = m[f"implicit_cg_iterations_at_{t:g}"]
        assert 1 <= cg <= FEATURES and m[f"implicit_hvps_at_{t:g}"] == cg + 1
        assert m[f"implicit_rel_err_at_{t:g}"] <= t
        assert m[f"implicit_inner_grads_at_{t:g}"] == m[f"implicit_inner_steps_at_{t:g}"] + 2
        assert m[f"unrolled_seconds_at_{t:g}"] > 0 and m[f"implicit_step_ratio_at_{t:g}"] > 0


def test_memory_child_reports_a_rise(capsys):
    from experiments.bench import hypergrad_cost
    spec = dict(features=4, train=8, validation=4, condition=10.0, seed=0, steps=3)
    for method in ("unrolled",):
        hypergrad_cost.memory_child(dict(spec, method=method))
        rise = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rise_mb"]
        assert np.isfinite(rise) and rise >= 0
