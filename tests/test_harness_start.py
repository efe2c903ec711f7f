"""When a run starts writing: the harness makes the output directory and writes config.gin
only at `harness.started`, once the experiment has built its objects from the bindings and
restored its checkpoint. A binding the library refuses leaves no directory (a resumed run's
as it was), so the corrected command runs; a longer run continues from the checkpoint."""

import json
import os

import gin
import pytest
import tensorflow as tf

from hogrod import harness, train


def snapshot(directory):
    """{relative path: bytes} of every file under `directory`."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files


def run_cli(fn, files, params, out, capsys, allow_config_change=False):
    """`harness.run_cli`'s exit code and stderr."""
    code = harness.run_cli(fn, files, params, str(out), allow_config_change=allow_config_change)
    return code, capsys.readouterr().err


def binaries():
    # the GAN's step a plain tf.function: these runs check the refusals and the directories;
    # XLA's compile of a step taken once was half this test's time
    from experiments import gan as gan_binary, hessian_spectrum, maml_rl
    return {
        # MamlRL refuses the discount, the binary dtype float16 (no float16 eigh in TF)
        "maml_rl": (maml_rl.maml_rl_experiment, ["configs/rl/navigation2d_smoke.gin"],
                    ["maml_rl_experiment.meta_iterations = 0",
                     "maml_rl_experiment.eval_steps = (0,)"],
                    [("maml_rl_experiment.discount = 0.0", "MamlRL: discount must be"),
                     ("maml_rl_experiment.dtype = 'float16'", "maml_rl_experiment: dtype")],
                    "maml_rl_experiment.discount = 0.99"),
        "gan": (gan_binary.gan_experiment, ["configs/gan/eight_gaussians.gin"],
                ["gan_experiment.generator_steps = 1", "gan_experiment.width = 8",
                 "gan_experiment.eval_samples = 16", "make_gan_step.jit_compile = False"],
                [("gan_experiment.dataset = 'nine_gaussians'", "nine_gaussians")],
                "gan_experiment.dataset = 'swiss_roll'"),
        "hessian_spectrum": (hessian_spectrum.hessian_spectrum,
                             ["configs/curvature/inspect_logistic.gin"],
                             ["hessian_spectrum.steps = 2", "hessian_spectrum.n_examples = 16"],
                             [("hessian_spectrum.dtype = 'float16'", "float16")],
                             "hessian_spectrum.dtype = 'float64'"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["maml_rl", "gan", "hessian_spectrum"])
def test_a_binding_the_library_refuses_leaves_no_directory_and_the_corrected_command_runs(
        name, tmp_path, capsys):
    """Then the same binding, continuing the finished run, leaves its directory as it was."""
    fn, files, tiny, refusals, good = binaries()[name]
    out = tmp_path / "run"
    for bad, message in refusals:
        code, err = run_cli(fn, files, tiny + [bad], out, capsys)
        assert code == 2 and message in err and "Traceback" not in err, err
        assert "In call to configurable" not in err  # gin's line with an address: noise
        assert not out.exists()
    code, err = run_cli(fn, files, tiny + [good], out, capsys)
    assert code == 0, err
    assert good.replace(" ", "") in (out / "config.gin").read_text().replace(" ", "")
    before = snapshot(out)
    bad, message = refusals[0]
    code, err = run_cli(fn, files, tiny + [bad], out, capsys, allow_config_change=True)
    assert code == 2 and message in err, err
    key, value = bad.split(" = ")
    assert f"  {key}: " in err and f" -> {value}" in err  # the change named
    assert snapshot(out) == before


@pytest.mark.slow
def test_a_longer_run_continues_from_its_checkpoint_and_records_the_change(tmp_path, capsys):
    """maml on sinusoids: a task_map the algorithm refuses makes no directory; the corrected
    command runs 2 meta-iterations, and 3 with --allow_config_change continue one more step
    from the checkpoint, config.gin and config_changes.txt recording 3."""
    from experiments import maml
    tiny = ["sinusoid_data.eval_tasks = 4", "maml_experiment.eval_steps = (0, 1)",
            "maml_experiment.checkpoint_every = 1",
            "make_train_step.jit_compile = False"]  # XLA's compiles: a third of the time
    args = (maml.maml_experiment, ["configs/maml/sinusoid_maml.gin"])
    code, err = run_cli(*args, tiny + ["maml_experiment.task_map = 'foo'"], tmp_path / "run",
                        capsys)
    assert code == 2 and "task_map must be one of" in err and not (tmp_path / "run").exists()
    _, first = harness.run(*args, tiny + ["maml_experiment.meta_iterations = 2"],
                           str(tmp_path / "run"))
    assert first["meta_iterations"] == 2 and first["train_steps"] == 2
    _, longer = harness.run(*args, tiny + ["maml_experiment.meta_iterations = 3"],
                            str(tmp_path / "run"), allow_config_change=True)
    assert longer["meta_iterations"] == 3 and longer["train_steps"] == 1
    assert "maml_experiment.meta_iterations = 3" in (tmp_path / "run/config.gin").read_text()
    changes = (tmp_path / "run/config_changes.txt").read_text()
    assert "maml_experiment.meta_iterations: 2 -> 3" in changes
    steps = [h["step"] for h in json.loads((tmp_path / "run/eval_history.json").read_text())]
    assert steps == [0, 2, 3]


# The harness's side alone, on experiments that build nothing but a variable.

@gin.configurable
def sized_state(output_dir, n=2):
    """A checkpointed variable of shape [n], as a history sized by the run's length would be.

    Args:
      output_dir: the run's directory.
      n: the variable's size.

    Returns:
      The restored step.
    """
    ckpt = train.Checkpointer(output_dir, history=tf.Variable(tf.zeros([n])))
    start = harness.started(output_dir, ckpt)
    ckpt.save()
    return {"restored": start}


def test_a_checkpoint_the_changed_config_cannot_restore_leaves_the_run_as_it_was(
        tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(sized_state, [], ["sized_state.n = 2"], out, capsys)[0] == 0
    before = snapshot(out)
    code, err = run_cli(sized_state, [], ["sized_state.n = 3"], out, capsys,
                        allow_config_change=True)
    assert code == 2 and "does not match" in err and "Traceback" not in err, err
    assert "changed (old -> new):\n  sized_state.n: 2 -> 3" in err
    assert snapshot(out) == before  # config.gin still n = 2, no config_changes.txt
    code, err = run_cli(sized_state, [], ["sized_state.n = 2"], out, capsys)
    assert code == 0, err  # the original command still continues the run
    assert json.loads((out / "metrics.json").read_text())["restored"] == 0


@gin.configurable
def early_writer(output_dir, call_started=True):
    """Writes a file before `harness.started`.

    Args:
      output_dir: the run's directory.
      call_started: call `harness.started` after writing.
    """
    os.makedirs(output_dir)
    with open(os.path.join(output_dir, "early.txt"), "w") as f:
        f.write("written before the run started")
    if call_started:
        harness.started(output_dir)


@pytest.mark.parametrize("call_started", [True, False])
def test_an_experiment_writing_before_it_started_is_refused(call_started, tmp_path):
    with pytest.raises(RuntimeError, match=r"early_writer wrote to .* before harness\.started"):
        harness.run(early_writer, [], [f"early_writer.call_started = {call_started}"],
                    str(tmp_path / "run"))
    assert not (tmp_path / "run" / "config.gin").exists()


@gin.configurable
def silent(output_dir, fail=False):
    """Writes nothing of its own; with `fail`, a TensorFlow op fails on its input.

    Args:
      output_dir: the run's directory (unused).
      fail: run an op that fails.

    Returns:
      A metric.
    """
    del output_dir
    if fail:
        tf.debugging.check_numerics(tf.constant(float("nan")), "a NaN built from a binding")
    return {"value": 1.0}


def test_an_experiment_writing_nothing_gets_its_directory_after_it_returns(tmp_path):
    _, metrics = harness.run(silent, [], [], str(tmp_path / "run"))
    assert metrics["value"] == 1.0
    assert sorted(os.listdir(tmp_path / "run")) == ["config.gin", "metrics.json",
                                                   "operative_config.gin"]


def test_a_tensorflow_error_before_the_run_started_exits_2_and_writes_nothing(tmp_path, capsys):
    code, err = run_cli(silent, [], ["silent.fail = True"], tmp_path / "run", capsys)
    assert code == 2 and "InvalidArgumentError" in err and "a NaN built from a binding" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_started_refuses_a_directory_outside_the_run_and_outside_a_run_makes_it(tmp_path):
    @gin.configurable
    def elsewhere(output_dir):
        harness.started(os.path.join(output_dir, "..", "other"))

    with pytest.raises(ValueError, match="not the run's output_dir"):
        harness.run(elsewhere, [], [], str(tmp_path / "run"))
    assert harness.started(str(tmp_path / "direct")) == 0  # an experiment called directly
    assert os.listdir(tmp_path / "direct") == []
