"""The PES benchmark (`experiments/bench/pes.py`) stops when JAX's estimate is not hogrod's:
its agreement check runs before any timing. Its smoke run is tests/test_bench_smoke.py's."""

import pytest

from conftest import REPO_ROOT
from hogrod import harness


@pytest.mark.slow
def test_a_wrong_sign_in_jax_pes_accumulation_stops_the_binary(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    monkeypatch.chdir(REPO_ROOT)  # where the benchmark runs: its config's include starts there
    from experiments.bench import pes, pes_jax
    # the planted bug: JAX's accumulated perturbation subtracts this truncation's
    monkeypatch.setattr(pes_jax, "accumulate", lambda kept, signed: kept - signed)
    with pytest.raises(AssertionError, match=r"the PES estimate: jax \(float32"):
        harness.run(pes.bench_pes, ["experiments/bench/configs/pes_smoke.gin"], [],
                    str(tmp_path / "run"))
