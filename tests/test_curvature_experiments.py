"""The curvature binaries end to end: each checks itself against its dense oracle."""

import numpy as np


def test_spectrum_and_influence_binaries_check_themselves_against_dense_oracles(tmp_path):
    from experiments import hessian_spectrum, influence
    from hogrod import harness
    _, m = harness.run(hessian_spectrum.hessian_spectrum, ["configs/curvature/spectrum_mlp.gin"],
                       ["hessian_spectrum.hidden = (8,)", "hessian_spectrum.steps = 30",
                        "hessian_spectrum.n_examples = 256", "hessian_spectrum.slq_steps = 20",
                        "hessian_spectrum.hutchpp_matvecs = 30"], str(tmp_path / "s"))
    assert m["top_eigenvalue_max_rel_err"] < 1e-4
    assert m["trace_error_in_se"] < 3
    np.testing.assert_allclose(m["density_integral"], 1.0, rtol=1e-6)
    assert (tmp_path / "s" / "density.png").exists()
    assert max(m["hvp_rel_err_forward_over_reverse"], m["hvp_rel_err_reverse_over_reverse"]) < 1e-4
    assert m["eig_max"] == m["exact_top_eigenvalues"][0] and m["n_params"] == 115
    assert (tmp_path / "s" / "hessian.png").exists()
    _, m = harness.run(influence.influence_experiment, ["configs/curvature/influence_logistic.gin"],
                       ["influence_experiment.n_train = 60"], str(tmp_path / "i"))
    assert m["min_pearson"] >= 0.95
