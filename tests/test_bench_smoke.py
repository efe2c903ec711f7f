"""Every benchmark binary under experiments/bench/ runs to completion from its smoke config
(`experiments/bench/configs/<name>_smoke.gin`: the full config with small sizes), as a
newcomer runs it from the repository root, its agreement checks included. A peer that is
installed here (the `bench` extra) takes part and its ratio is reported; one that is not
leaves hogrod's side running and its metrics None. kfac-jax lives in its own environment
(jax 0.9.0, `experiments/bench/kfac_jax_peer.py`): its side runs when the environment
variable KFAC_JAX_PYTHON names that environment's python, else hogrod's K-FAC and Adam steps
run alone (the binary logs it)."""

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
    "pinn": {"deepxde": "ratio_hogrod_over_deepxde_tf", "jax": "ratio_hogrod_over_jax"},
    "wgan_gp": {"torch": "ratio_over_torch"},
}


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


@pytest.mark.slow
@pytest.mark.parametrize("config", SMOKES, ids=lambda c: os.path.basename(c)[:-4])
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
