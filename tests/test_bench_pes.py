"""The PES benchmark (`experiments/bench/pes.py`) stops when an estimate is not the float64
reference's: its agreement check runs before any timing. Its smoke run is
tests/test_bench_smoke.py's."""

import pytest

from conftest import REPO_ROOT
from hogrod import harness
from hogrod.learned import estimators


@pytest.mark.slow
def test_a_wrong_sign_in_the_pes_terms_stops_the_binary(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # where the benchmark runs: its config's include starts there
    from experiments.bench import pes
    terms = estimators._pair_terms
    # the planted bug: each pair's term with the antithetic sign the wrong way round
    monkeypatch.setattr(estimators, "_pair_terms",
                        lambda values, weights, sigma: terms(-values, weights, sigma))
    with pytest.raises(AssertionError, match=r"the PES estimate: hogrod \(float32"):
        harness.run(pes.bench_pes, ["experiments/bench/configs/pes_smoke.gin"], [],
                    str(tmp_path / "run"))
