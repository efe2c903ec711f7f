"""The PINN binary's fast path (its default, each Adam step one XLA computation, with ten
steps per compiled call) against its plain path (`pinn_experiment.jit_compile = False`, one step per
call): the same Adam steps in float64, to rounding. Oracle: the plain path."""

import logging

import pytest

from hogrod import harness

SMALL = ["pinn_experiment.width = 8", "pinn_experiment.depth = 2",
         "pinn_experiment.n_collocation = 200", "pinn_experiment.n_condition = 50",
         "pinn_experiment.dtype = 'float64'", "pinn_experiment.adam_steps = 23",
         "pinn_experiment.lbfgs_maxiter = 0", "pinn_experiment.checkpoint_every = 20"]


@pytest.mark.slow  # two runs of the binary
def test_the_default_adam_steps_equal_the_plain_ones_in_float64(tmp_path, caplog):
    from experiments import pinn as exp
    with caplog.at_level(logging.INFO):
        _, fast = harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"],
                              SMALL + ["pinn_experiment.steps_per_execution = 10"],
                              str(tmp_path / "default"))
    assert any("compiled with XLA" in r.getMessage() for r in caplog.records)
    _, plain = harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"], SMALL + [
        "pinn_experiment.jit_compile = False", "pinn_experiment.steps_per_execution = 1"],
        str(tmp_path / "plain"))
    terms = [k for k in plain if k.startswith("term_")] + ["adam_final_loss", "relative_l2"]
    assert len(terms) > 2
    for k in terms:
        assert fast[k] == pytest.approx(plain[k], rel=1e-10), k
