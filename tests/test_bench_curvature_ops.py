"""The curvature-operator benchmark runs on a tiny MLP and reports every operator against the
one gradient measured in the same rounds (the full-size run is in RESULTS.md)."""

from experiments.bench import curvature_ops


def test_every_operator_is_timed_against_the_gradient(tmp_path):
    results = curvature_ops.bench_curvature_ops(str(tmp_path), widths=(6, 5, 3), batch=8,
                                                rounds=1)
    for name in curvature_ops.PUBLISHED:
        assert results[f"{name}_over_gradient"] > 0, name
        assert results[f"{name}_curvlinops"] == curvature_ops.PUBLISHED[name]
    assert results["n_params"] == 6 * 5 + 5 + 5 * 3 + 3
