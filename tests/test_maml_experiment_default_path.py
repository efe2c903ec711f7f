"""The MAML binary's fast path (its default, the meta-step one XLA computation, with five
meta-steps per compiled call) against its plain path (`make_train_step.jit_compile = False`, one step per
call): the same meta-steps, to float32 rounding. Oracle: the plain path."""

import logging

import pytest

from hogrod import harness

SHORT = ["maml_experiment.meta_iterations = 13", "maml_experiment.eval_every = 5",
         "maml_experiment.checkpoint_every = 13", "sinusoid_data.eval_tasks = 4",
         "maml_experiment.eval_steps = (0, 1)"]


@pytest.mark.slow  # two runs of the binary
def test_the_default_meta_steps_equal_the_plain_ones(tmp_path, caplog):
    from experiments import maml as exp
    with caplog.at_level(logging.INFO):
        _, fast = harness.run(exp.maml_experiment, ["configs/maml/sinusoid_maml.gin"],
                              SHORT + ["maml_experiment.steps_per_execution = 5"],
                              str(tmp_path / "default"))
    assert any("compiled with XLA" in r.getMessage() for r in caplog.records)
    _, plain = harness.run(exp.maml_experiment, ["configs/maml/sinusoid_maml.gin"], SHORT + [
        "make_train_step.jit_compile = False", "maml_experiment.steps_per_execution = 1"],
        str(tmp_path / "plain"))
    assert fast["meta_iterations"] == plain["meta_iterations"] == 13
    for k in ("final_train_loss", "final_train_grad_norm", "loss_after_1"):
        assert fast[k] == pytest.approx(plain[k], rel=1e-4), k
