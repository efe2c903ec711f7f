"""The MAML-RL benchmark runs on a tiny meta-batch: hogrod's meta-gradient and both rollouts
are timed; without torch its side is skipped and its metrics are None (the full run, with
torch, is the module docstring's command)."""

import numpy as np
import pytest

from experiments.bench import maml_rl
from hogrod import harness


def test_tiny_run_times_the_meta_gradient_and_both_rollouts(tmp_path):
    pytest.importorskip("gymnasium")
    _, m = harness.run(maml_rl.bench_maml_rl, gin_params=[
        "bench_maml_rl.meta_batch = 1", "bench_maml_rl.batch = 2", "bench_maml_rl.horizon = 2",
        "bench_maml_rl.rounds = 1", "bench_maml_rl.steps_per_round = 1",
        "bench_maml_rl.warmup = 0", "bench_maml_rl.env_rounds = 1",
        "bench_maml_rl.check_float64 = False"], output_dir=str(tmp_path))
    assert m["steps_per_s_hogrod"] > 0
    assert m["env_steps_per_s_tf"] > 0 and m["env_steps_per_s_gym_sync"] > 0
    assert m["env_ratio_tf_over_gym_sync"] == pytest.approx(
        m["env_steps_per_s_tf"] / m["env_steps_per_s_gym_sync"])
    if m["torch"] is None:
        assert m["ratio_hogrod_over_torch_func"] is None and m["grad_rel_err_float32"] is None
    else:
        assert m["grad_rel_err_float32"] <= maml_rl.TOLERANCES["float32"]


def test_agreement_check_raises_on_a_transposed_kernel():
    ref = [np.arange(6.0).reshape(2, 3) + 1, np.ones(3)]
    assert maml_rl.relative_error(ref, [a.copy() for a in ref], 0.0, "same") == 0.0
    with pytest.raises(AssertionError, match="shapes differ"):
        maml_rl.relative_error(ref, [ref[0].T, ref[1]], 1.0, "transposed")
    with pytest.raises(AssertionError, match="disagrees"):
        maml_rl.relative_error(ref, [ref[0][::-1], ref[1]], 1e-3, "permuted")
