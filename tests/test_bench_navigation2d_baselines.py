"""The 2D-navigation comparison driver with its binary runs replaced by a recorder: one run
per (policy, seed) in its own directory, finished runs kept, the summary against a
hand-computed Student's t interval (t_{0.975, 2} = 4.302652729911275), the Figure 4
ordering both ways. The binary's own parts (no inner step, the oracle's observation, the
time limit) are tested in test_rl_maml.py and test_rl_envs.py."""

import json
import math
import os

import pytest

from experiments.bench import navigation2d_baselines as bench
from hogrod import harness

POLICIES = {"maml": "configs/rl/navigation2d_maml_trpo.gin",
            "pretrained": "configs/rl/navigation2d_pretrained_trpo.gin",
            "random": "configs/rl/navigation2d_random.gin",
            "oracle": "configs/rl/navigation2d_oracle_trpo.gin"}
# the mean return after s steps of (policy, seed): a policy's level plus s and the seed
LEVEL = {"maml": -20.0, "pretrained": -40.0, "random": -60.0, "oracle": -5.0}


def fake_returns(policy, seed, s):
    return LEVEL[policy] + (10.0 * s if policy == "maml" else s) + seed


def recorder(calls):
    def run_binary(module, gin_files, gin_params, output_dir):
        assert module == "experiments.maml_rl"
        (seed,) = [int(p.split("=")[1]) for p in gin_params if p.startswith(
            "maml_rl_experiment.seed")]
        policy = next(k for k, v in POLICIES.items() if gin_files == [v])
        calls.append((policy, seed, output_dir))
        os.makedirs(output_dir, exist_ok=True)
        metrics = {f"return_after_{s}": fake_returns(policy, seed, s) for s in range(4)}
        metrics["meta_iterations"] = 7
        with open(os.path.join(output_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f)
        with open(os.path.join(output_dir, "config.gin"), "w") as f:
            f.write(f"maml_rl_experiment.seed = {seed}\n")
        return metrics
    return run_binary


def test_every_policy_and_seed_runs_once_and_the_summary_is_the_t_interval(tmp_path,
                                                                              monkeypatch):
    calls = []
    monkeypatch.setattr(bench.runs, "run_binary", recorder(calls))
    params = [f"bench_navigation2d_baselines.policies = {POLICIES!r}"]
    _, m = harness.run(bench.bench_navigation2d_baselines, [], params, str(tmp_path))
    assert sorted((p, s) for p, s, _ in calls) == sorted(
        (p, s) for p in POLICIES for s in (0, 1, 2))
    assert {d for _, _, d in calls} == {str(tmp_path / p / f"seed{s}") for p in POLICIES
                                       for s in (0, 1, 2)}
    # seeds 0, 1, 2 add 0, 1, 2: mean +1, sample std 1
    assert "oracle_return_after_1" not in m  # evaluated without adaptation (flat)
    for policy in POLICIES:
        for s in range(1 if policy == "oracle" else 4):
            assert m[f"{policy}_return_after_{s}"] == pytest.approx(
                fake_returns(policy, 1, s), rel=1e-12)
            assert m[f"{policy}_return_after_{s}_ci95"] == pytest.approx(
                4.302652729911275 / math.sqrt(3), rel=1e-9)
    assert m["figure4_ordering"] is True  # -10 + 1 above -37 + 1 and -57 + 1
    assert (tmp_path / "navigation2d_baselines.png").exists()
    # a second run keeps the finished runs
    _, again = harness.run(bench.bench_navigation2d_baselines, [], params, str(tmp_path))
    assert len(calls) == 12
    assert {k: v for k, v in again.items() if k != "wall_seconds"} == {
        k: v for k, v in m.items() if k != "wall_seconds"}


def test_a_finished_run_of_other_bindings_or_not_the_drivers_is_an_error(tmp_path,
                                                                        monkeypatch):
    calls = []
    monkeypatch.setattr(bench.runs, "run_binary", recorder(calls))
    out = str(tmp_path / "maml" / "seed0")
    bench.run_one(out, POLICIES["maml"], ["maml_rl_experiment.seed = 0"])
    assert bench.run_one(out, POLICIES["maml"], ["maml_rl_experiment.seed = 0"]) is not None
    assert len(calls) == 1  # kept
    with pytest.raises(ValueError, match="holds a run of .*meta_iterations = 2"):
        bench.run_one(out, POLICIES["maml"], ["maml_rl_experiment.seed = 0",
                                              "maml_rl_experiment.meta_iterations = 2"])
    os.makedirs(tmp_path / "other")
    with pytest.raises(ValueError, match="without driver.json"):
        bench.run_one(str(tmp_path / "other"), POLICIES["maml"], [])


def test_the_ordering_fails_when_maml_after_one_step_is_below_pretrained_after_three():
    per_seed = {p: [{f"return_after_{s}": fake_returns(p, 0, s) for s in range(4)}
                    | {"meta_iterations": 1}] for p in POLICIES}
    per_seed["maml"][0]["return_after_1"] = -38.0  # pretrained after 3 is -37
    assert bench.summarize(per_seed, (0, 1, 2, 3))["figure4_ordering"] is False
    with pytest.raises(ValueError, match=r"report no return_after_1: their eval_steps must include \(0, 1, 2, 3\)"):
        bench.summarize({"maml": [{"return_after_0": 0.0}]}, (0, 1, 2, 3))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"needs the policies \['random'\]"):
        bench._check({k: v for k, v in POLICIES.items() if k != "random"}, (0,), (0, 1), ())
    with pytest.raises(ValueError, match=r"policies\['maml'\]: gin file not found"):
        bench._check(dict(POLICIES, maml="configs/rl/nothing.gin"), (0,), (0, 1), ())
    bench._check(dict(POLICIES, maml="rl/navigation2d_maml_trpo.gin"), (0,), (0, 1), ())
    for seeds in ((0, 0), (True,), (-1,), 3, (0.5,)):
        with pytest.raises(ValueError, match=r"seeds(\[0\])? must be (distinct integer seeds|an "
                                             r"integer >= 0|a non-empty sequence)"):
            bench._check(POLICIES, seeds, (0, 1, 2, 3), ())
    for steps in (True, 3, (0, 2), (1, 0), (1, 1), (0, 1.0)):
        with pytest.raises(ValueError, match=r"steps(\[1\])? must be (increasing inner-step "
                                             r"counts|an integer >= 0|a non-empty sequence)"):
            bench._check(POLICIES, (0,), steps, ())
    with pytest.raises(ValueError, match="extra_params must be a tuple"):
        bench._check(POLICIES, (0,), (0, 1, 2, 3), "maml_rl_experiment.batch = 2")
    with pytest.raises(ValueError, match="finite"):
        bench.seed_interval([1.0, float("nan")])
