"""Every benchmark binary under experiments/bench/ runs to completion from its smoke config
(`experiments/bench/configs/<name>_smoke.gin`: the full config with small sizes), as a
newcomer runs it from the repository root, its agreement checks included:
`python -m experiments.bench.<binary> --gin_file=experiments/bench/configs/<name>_smoke.gin`.
The suite runs here the smokes of the binaries no other test runs; each other binary is run
small by the test named in OWN_TEST (the suite's 10 minutes hold one run per binary, not
two), or by hand (BY_HAND, with the reason). A peer that is installed here (the `bench` extra) takes part and its ratio is
reported; one that is not leaves hogrod's side running and its metrics None. kfac-jax lives
in its own environment (jax 0.9.0, `experiments/bench/kfac_jax_peer.py`): its side runs when
the environment variable KFAC_JAX_PYTHON names that environment's python, else hogrod's
K-FAC and Adam steps run alone (the binary logs it)."""

import glob
import importlib
import importlib.util
import os
import re

import pytest

from conftest import REPO_ROOT
from hogrod import harness

BENCH = os.path.join(REPO_ROOT, "experiments", "bench")
SMOKES = sorted(glob.glob(os.path.join(BENCH, "configs", "*_smoke.gin")))
# {benchmark: {peer module: a metric it reports when that peer is installed}}
PEER_METRICS = {
    "maml": {"jax": "ratio_hogrod_over_jax", "torch": "ratio_hogrod_over_torch_func"},
    "maml_omniglot": {"jax": "ratio_hogrod_over_jax",
                      "torch": "ratio_hogrod_over_torch_func"},
    "maml_rl": {"torch": "ratio_hogrod_over_torch_func"},
    "hvp": {"jax": "ratio_jax_hvp_over_hvp_default"},
    "pes": {"jax": "ratio_hogrod_over_jax"},
    "pinn": {"deepxde": "ratio_hogrod_over_deepxde_tf", "jax": "ratio_hogrod_over_jax"},
    "wgan_gp": {"torch": "ratio_over_torch"},
}


# {smoke config: the test that runs its binary small instead of the smoke}
OWN_TEST = {
    "curvature_ops": ("tests/test_bench_curvature_ops.py",
        "test_every_operator_is_timed_against_the_gradient"),
    "hvp": ("tests/test_harness.py",
        "test_bench_hvp_binary_runs_and_checks_agreement"),
    "hypergrad_cost": ("tests/test_bench_hypergrad_cost.py",
        "test_cost_binary_reports_smallest_k_and_consistent_counts"),
    "hypergrad_ridge": ("tests/test_hypergrad.py",
        "test_bench_binary_smoke"),
    "maml": ("tests/test_harness.py",
        "test_bench_maml_binary_runs"),
    "maml_rl": ("tests/test_bench_maml_rl.py",
        "test_tiny_run_checks_agreement_and_times_the_meta_gradient_and_both_rollouts"),
    "navigation2d_baselines": ("tests/test_bench_navigation2d_baselines.py",
        "test_every_policy_and_seed_runs_once_and_the_summary_is_the_t_interval"),
    "newton_cg": ("tests/test_second_order_hf.py",
        "test_newton_cg_on_rosenbrock_reaches_the_target_in_fewer_hvps_than_scipy"),
    "pinn": ("tests/test_pinn.py",
        "test_bench_binary_checks_agreement_and_runs"),
    "pinn_convergence": ("tests/test_pinn.py",
        "test_convergence_benchmark_records_error_curves"),
    "pinn_highdim": ("tests/test_pinn_highdim.py",
        "test_the_highdim_benchmark_times_both_laplacians_and_their_ratio"),
    "pinnacle_table": ("tests/test_pinnacle_table.py",
        "test_table_aggregates_finished_runs"),
    "scaling": ("tests/test_scale_out.py",
        "test_scaling_benchmark_measures_each_replica_count_in_its_own_process"),
    "wgan_gp": ("tests/test_gan.py",
        "test_bench_binary_runs"),
}
# {smoke config: why the suite does not run it} (run by hand, with the command above)
BY_HAND = {"pinnacle_deepxde": "a process per case, seed and side; 373 s on 2 cores"}
IN_SUITE = [c for c in SMOKES
            if os.path.basename(c)[:-len("_smoke.gin")] not in {**OWN_TEST, **BY_HAND}]


def binaries():
    """{name: the experiment function} of every benchmark binary (`harness.main(fn)`)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(BENCH, "*.py"))):
        with open(path) as f:
            found = re.search(r"harness\.main\((\w+)\)", f.read())
        if found:
            out[os.path.basename(path)[:-3]] = found.group(1)
    return out


def binary_of(config):
    """The binary a smoke config runs: the longest binary name its own name starts with."""
    name = os.path.basename(config)[:-len("_smoke.gin")]
    return max((b for b in binaries() if name == b or name.startswith(b + "_")), key=len)


def test_every_benchmark_binary_has_a_smoke_config():
    assert len(binaries()) >= 19
    assert sorted(set(binaries()) - {binary_of(c) for c in SMOKES}) == []
    # each smoke config is its full config with small sizes: it includes it
    for config in SMOKES:
        full = os.path.basename(config).replace("_smoke", "")
        with open(config) as f:
            assert f"include 'experiments/bench/configs/{full}'" in f.read(), config
    assert set(BY_HAND) <= {os.path.basename(c)[:-len("_smoke.gin")] for c in SMOKES}
    # the others' tests exist and run their binary
    for name, (path, function) in OWN_TEST.items():
        test = f"{path}::{function}"
        with open(os.path.join(REPO_ROOT, path)) as f:
            text = f.read()
        assert f"def {function}(" in text, test
        assert binary_of(os.path.join(BENCH, "configs", name + "_smoke.gin")) in text, test


@pytest.mark.slow
@pytest.mark.parametrize("config", IN_SUITE, ids=lambda c: os.path.basename(c)[:-4])
def test_the_smoke_run_completes(config, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # where a benchmark runs: its configs' includes start there
    name = os.path.basename(config)[:-len("_smoke.gin")]
    binary = binary_of(config)
    module = importlib.import_module(f"experiments.bench.{binary}")
    params = []
    if binary == "kfac" and os.environ.get("KFAC_JAX_PYTHON"):
        params.append(f"bench_kfac.kfac_jax_python = '{os.environ['KFAC_JAX_PYTHON']}'")
    _, metrics = harness.run(getattr(module, binaries()[binary]), [config], params,
                             str(tmp_path / "run"))
    assert metrics and metrics["wall_seconds"] > 0
    for peer, key in PEER_METRICS.get(name, {}).items():
        if importlib.util.find_spec(peer) is not None:
            assert metrics[key] > 0, (name, peer)
        else:
            assert metrics.get(key) is None, (name, peer)
