"""The MAML-RL benchmark runs on a tiny meta-batch: hogrod's meta-gradient and both rollouts
are timed after the agreement check against the float64 meta-gradient; without torch its
side is skipped and its metrics are None (the full run, with torch, is the module
docstring's command)."""

import pytest

from experiments.bench import maml_rl
from hogrod import harness


def test_tiny_run_checks_agreement_and_times_the_meta_gradient_and_both_rollouts(tmp_path):
    pytest.importorskip("gymnasium")
    _, m = harness.run(maml_rl.bench_maml_rl, gin_params=[
        "bench_maml_rl.meta_batch = 2", "bench_maml_rl.batch = 2", "bench_maml_rl.horizon = 3",
        "bench_maml_rl.rounds = 1", "bench_maml_rl.steps_per_round = 1",
        "bench_maml_rl.warmup = 0", "bench_maml_rl.env_rounds = 1"], output_dir=str(tmp_path))
    assert m["steps_per_s_hogrod"] > 0
    assert m["env_steps_per_s_tf"] > 0 and m["env_steps_per_s_gym_sync"] > 0
    assert m["env_ratio_tf_over_gym_sync"] == pytest.approx(
        m["env_steps_per_s_tf"] / m["env_steps_per_s_gym_sync"])
    assert m["grad_rel_err_hogrod_float32"] < 1e-4 and m["grad_condition"] >= 1
    if m["torch"] is None:
        assert m["ratio_hogrod_over_torch_func"] is None
        assert m["grad_rel_err_torch_func_float32"] is None
    else:
        assert m["grad_rel_err_torch_func_float64"] < 1e-12
        assert m["grad_rel_err_torch_func_float32"] < 1e-4
