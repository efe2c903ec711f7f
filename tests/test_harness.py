"""The experiment harness: bindings take effect and land in the operative config; every kind of
bad config is a clear error naming what is wrong; a real binary runs end to end."""

import json
import os
import subprocess
import sys

import pytest

from hogrod import harness
from experiments import hessian_inspect as hi

from conftest import REPO_ROOT

LOGISTIC = "configs/hessian_inspect/logistic.gin"


def test_binding_override_takes_effect_and_lands_in_operative_config(tmp_path):
    out, metrics = harness.run(hi.hessian_inspect, [LOGISTIC],
                               ["hessian_inspect.steps = 20", "hessian_inspect.n_examples = 64"],
                               str(tmp_path))
    assert metrics["steps"] == 20
    operative = (tmp_path / "operative_config.gin").read_text()
    assert "hessian_inspect.steps = 20" in operative
    assert "hessian_inspect.n_examples = 64" in operative
    assert "hessian_inspect.checkpoint_every = 100" in operative  # defaults are recorded too
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 20
    # closed-form oracle for logistic regression, computed by the run itself
    assert metrics["closed_form_rel_err"] < 1e-10
    assert (tmp_path / "hessian.png").stat().st_size > 0
    assert any(f.startswith("events") for f in os.listdir(tmp_path / "train"))


def test_rerun_with_same_output_dir_resumes_from_checkpoint(tmp_path):
    args = ([LOGISTIC], ["hessian_inspect.steps = 30", "hessian_inspect.checkpoint_every = 10",
                         "hessian_inspect.n_examples = 64"])
    _, first = harness.run(hi.hessian_inspect, *args, str(tmp_path))
    _, again = harness.run(hi.hessian_inspect, args[0], args[1][:1] + args[1][2:]
                           + ["hessian_inspect.checkpoint_every = 10"], str(tmp_path))
    assert again["loss"] == first["loss"]  # nothing retrained: restored at step 30
    _, longer = harness.run(hi.hessian_inspect, args[0],
                            ["hessian_inspect.steps = 40", "hessian_inspect.n_examples = 64"],
                            str(tmp_path))
    assert longer["steps"] == 40 and longer["loss"] < first["loss"]


@pytest.mark.parametrize("files,params,expected", [
    ([LOGISTIC], ["no_such_configurable.steps = 3"], "no_such_configurable"),
    ([LOGISTIC], ["hessian_inspect.stepz = 3"], "stepz"),
    (["configs/hessian_inspect/missing.gin"], [], "missing.gin"),
])
def test_bad_config_is_a_clear_error(files, params, expected):
    with pytest.raises(harness.ConfigError, match=expected):
        harness.parse_config(files, params)


def test_error_in_a_gin_file_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("hessian_inspect.steps = 3\nhessian_inspect.lerning_rate = 0.1\n")
    with pytest.raises(harness.ConfigError) as e:
        harness.parse_config([str(bad)], [])
    message = str(e.value)
    assert "lerning_rate" in message and "bad.gin" in message and "2" in message


def test_binary_exits_nonzero_on_bad_binding_and_zero_on_success(tmp_path):
    cmd = [sys.executable, "-m", "experiments.hessian_inspect", f"--gin_file={LOGISTIC}",
           f"--output_dir={tmp_path}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    bad = subprocess.run(cmd + ["--gin_param=hessian_inspect.stepz = 1"], cwd=REPO_ROOT,
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0
    assert "stepz" in bad.stderr
    good = subprocess.run(cmd + ["--gin_param=hessian_inspect.steps = 5"], cwd=REPO_ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0, good.stderr[-2000:]
    assert f"outputs in {tmp_path}" in good.stdout
    assert (tmp_path / "operative_config.gin").exists()


def test_bench_hvp_binary_runs_and_checks_agreement(tmp_path):
    from experiments import bench_hvp
    _, metrics = harness.run(bench_hvp.bench_hvp, ["configs/bench/hvp.gin"],
                             ["bench_hvp.widths = (4, 8, 3)", "bench_hvp.batch = 5",
                              "bench_hvp.repeats = 2", "bench_hvp.warmup = 1"], str(tmp_path))
    assert metrics["ratio_hvp_reverse_over_reverse_over_grad"] > 0
    assert "ms_hvp_forward_over_reverse_xla" in metrics


def test_bench_maml_binary_runs(tmp_path):
    from experiments import bench_maml
    _, metrics = harness.run(bench_maml.bench_maml, ["configs/bench/maml.gin"],
                             ["bench_maml.meta_batch = 2", "bench_maml.rounds = 1",
                              "bench_maml.steps_per_round = 2", "bench_maml.warmup = 1"],
                             str(tmp_path))
    assert metrics["steps_per_s_hogrod"] > 0


def test_a_bad_input_raised_during_the_run_exits_2_with_its_message_alone(tmp_path, capsys):
    from experiments import maml
    code = harness.run_cli(maml.maml_experiment, ["configs/maml/omniglot_5way_1shot.gin"],
                           ["episode_data.data_dir = None"], str(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "episode_data.data_dir" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="episode_data.data_dir"):  # --verbosity=1
        harness.run_cli(maml.maml_experiment, ["configs/maml/omniglot_5way_1shot.gin"],
                        ["episode_data.data_dir = None"], str(tmp_path), show_traceback=True)


def test_history_of_a_resumed_run_stops_at_its_checkpoint_and_metrics_are_updated(tmp_path):
    history = []
    for step in (500, 1000, 1500):  # 1500 was evaluated, then the run was killed
        harness.record_eval(str(tmp_path), history, {"step": step, "loss": step / 1000})
    assert [h["step"] for h in harness.read_history(str(tmp_path), 1000)] == [500, 1000]
    assert harness.read_history(str(tmp_path / "new"), 0) == []
    assert os.listdir(tmp_path / "eval")  # the scalars went to TensorBoard too
    harness.write_metrics(str(tmp_path), {"loss": 1.0, "train_seconds": 12.0})
    harness.write_metrics(str(tmp_path), {"loss": 0.5}, resumed=True)  # trained nothing
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"loss": 0.5,
                                                                   "train_seconds": 12.0}
    harness.write_metrics(str(tmp_path), {"loss": 0.25})  # not a resumed run: replaced
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"loss": 0.25}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
