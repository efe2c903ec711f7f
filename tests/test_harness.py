"""The experiment harness: bindings take effect and land in the operative config; every kind of
bad config is a clear error naming what is wrong; a real binary runs end to end."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from hogrod import bindings, harness, train
from experiments import hessian_spectrum as hs

from conftest import REPO_ROOT, bench_config

LOGISTIC = "configs/curvature/inspect_logistic.gin"


def test_binding_override_takes_effect_and_lands_in_operative_config(tmp_path):
    out, metrics = harness.run(hs.hessian_spectrum, [LOGISTIC],
                               ["hessian_spectrum.steps = 20", "hessian_spectrum.n_examples = 64"],
                               str(tmp_path))
    assert metrics["steps"] == 20
    operative = (tmp_path / "operative_config.gin").read_text()
    assert "hessian_spectrum.steps = 20" in operative
    assert "hessian_spectrum.n_examples = 64" in operative
    assert "hessian_spectrum.checkpoint_every = 100" in operative  # defaults are recorded too
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 20
    # closed-form oracle for logistic regression, computed by the run itself
    assert metrics["closed_form_rel_err"] < 1e-10
    # and each HVP mode against the dense Hessian, in float64
    assert metrics["hvp_rel_err_forward_over_reverse"] < 1e-10
    assert metrics["hvp_rel_err_reverse_over_reverse"] < 1e-10
    assert (tmp_path / "hessian.png").stat().st_size > 0
    assert any(f.startswith("events") for f in os.listdir(tmp_path / "train"))


def test_rerun_with_same_output_dir_resumes_from_checkpoint(tmp_path):
    args = ([LOGISTIC], ["hessian_spectrum.steps = 30", "hessian_spectrum.checkpoint_every = 10",
                         "hessian_spectrum.n_examples = 64"])
    _, first = harness.run(hs.hessian_spectrum, *args, str(tmp_path))
    assert first["train_steps"] == 30 and first["train_steps_per_s"] > 0
    assert first["wall_seconds"] > 0
    _, again = harness.run(hs.hessian_spectrum, args[0], args[1][:1] + args[1][2:]
                           + ["hessian_spectrum.checkpoint_every = 10"], str(tmp_path))
    assert again["loss"] == first["loss"]  # nothing retrained: restored at step 30
    record = {name: (tmp_path / name).read_bytes()
              for name in ("config.gin", "metrics.json", "hessian.png")}
    longer = ([LOGISTIC], ["hessian_spectrum.steps = 40", "hessian_spectrum.n_examples = 64"])
    # another config is refused before anything is written, naming each binding that differs
    with pytest.raises(harness.ConfigError) as e:
        harness.run(hs.hessian_spectrum, *longer, str(tmp_path))
    assert "hessian_spectrum.steps: 30 -> 40" in str(e.value)
    assert "hessian_spectrum.checkpoint_every: 10 -> (not bound" in str(e.value)
    assert "--allow_config_change" in str(e.value)
    assert record == {name: (tmp_path / name).read_bytes() for name in record}
    _, longer = harness.run(hs.hessian_spectrum, *longer, str(tmp_path), allow_config_change=True)
    assert longer["steps"] == 40 and longer["loss"] < first["loss"]
    assert longer["train_steps"] == 10  # this invocation's steps
    assert "hessian_spectrum.steps = 40" in (tmp_path / "config.gin").read_text()
    assert "hessian_spectrum.steps: 30 -> 40" in (tmp_path / "config_changes.txt").read_text()


def test_a_changed_config_exits_2_from_the_command_line(tmp_path, capsys):
    (tmp_path / "config.gin").write_text("maml.inner_lr = 0.01\n")  # as a finished run left it
    from experiments import maml
    code = harness.run_cli(maml.maml_experiment, ["configs/maml/sinusoid_maml.gin"],
                           ["maml.inner_lr = 0.1"], str(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "maml.inner_lr: 0.01 -> 0.1" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == ["config.gin"]


def test_config_changes_name_each_binding_scope_and_macro_that_differs():
    old = ("maml.inner_lr = 0.01\nmaml.inner_steps = 1\neval/maml.inner_steps = 1\n"
           "N_WAY = 5\nx.y = @maml\n")
    new = ("maml.inner_lr = 0.1\nmaml.inner_steps = 1\neval/maml.inner_steps = 3\n"
           "N_WAY = 20\nx.y = @maml()\nz.w = 'a'\n")
    changes = bindings.config_changes(old, new)
    assert changes == [("N_WAY", "5", "20"), ("eval/maml.inner_steps", "1", "3"),
                       ("maml.inner_lr", "0.01", "0.1"), ("x.y", "@maml", "@maml()"),
                       ("z.w", None, "'a'")]
    assert bindings.format_changes(changes[3:]) == ("  x.y: @maml -> @maml()\n"
                                                    "  z.w: (not bound: the default) -> 'a'")
    assert bindings.config_changes(new, new) == []


@pytest.mark.parametrize("text", ["maml.inner_lr = (0.01\n", "maml.inner_lr 0.01\n"])
def test_an_unreadable_config_of_an_earlier_run_exits_2_naming_it(text, tmp_path, capsys):
    """An unclosed bracket (a tokenizer error, not a SyntaxError) too."""
    (tmp_path / "config.gin").write_text(text)
    from experiments import maml
    code = harness.run_cli(maml.maml_experiment, ["configs/maml/sinusoid_maml.gin"], [],
                           str(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "cannot read" in err and "config.gin" in err, err
    assert "Traceback" not in err and os.listdir(tmp_path) == ["config.gin"]


def test_gin_files_resolve_from_any_directory(tmp_path, monkeypatch):
    """The shipped-relative path, the repository's configs/ form and a user's own file that
    includes a shipped config, from another directory, with the repository root on sys.path
    (then the root's `configs` link is a namespace package, on which gin's package reader
    raises instead of trying the next search path)."""
    from experiments import maml  # noqa: F401  (registers maml_experiment, which they bind)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(REPO_ROOT)
    (tmp_path / "mine.gin").write_text("include 'configs/maml/sinusoid_maml.gin'\n"
                                       "maml.inner_lr = 0.02\n")
    for path in ("maml/sinusoid_maml.gin", "configs/maml/sinusoid_maml.gin", "mine.gin"):
        harness.parse_config([path], [])
        config = harness.gin.config_str()
        assert "maml_experiment.algorithm = @maml" in config  # from the included files
        assert "maml.inner_lr = " + ("0.02" if path == "mine.gin" else "0.01") in config
    assert harness.resolve_gin_file("maml/sinusoid_maml.gin").startswith(bindings.CONFIG_DIR)
    with pytest.raises(harness.ConfigError, match="maml/nope.gin"):
        harness.parse_config(["maml/nope.gin"], [])


def test_no_config_for_a_required_binding_exits_2_naming_it_and_writes_nothing(tmp_path, capsys):
    from experiments import maml
    out = tmp_path / "run"
    code = harness.run_cli(maml.maml_experiment, [], [], str(out))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "maml_experiment.algorithm" in err
    assert "maml/sinusoid_maml.gin" in err and "maml/omniglot_5way_1shot.gin" in err
    assert "maml/algorithms/maml.gin" not in err  # fragments are not listed
    assert not out.exists()


@pytest.mark.parametrize("binding,expected", [
    ("maml_experiment.meta_iterations = 2,000", ["maml_experiment.meta_iterations = 2,000",
                                                 "without thousands separators: 2000"]),
    ("mlp.activation = relu", ["mlp.activation = relu", "quotes ('relu')"]),
    ("maml_experiment.seed 3", ["maml_experiment.seed 3", "configurable.parameter = value"]),
    ("maml.inner_lr = (0.1", ["maml.inner_lr = (0.1", "unclosed"]),
])
def test_a_malformed_binding_is_named_with_what_to_change(binding, expected):
    with pytest.raises(harness.ConfigError) as e:
        harness.parse_config(["configs/maml/sinusoid_maml.gin"], [binding])
    for text in expected:
        assert text in str(e.value)


@pytest.mark.parametrize("files,params,expected", [
    ([LOGISTIC], ["no_such_configurable.steps = 3"], "no_such_configurable"),
    ([LOGISTIC], ["hessian_spectrum.stepz = 3"], "stepz"),
    (["configs/curvature/missing.gin"], [], "missing.gin"),
])
def test_bad_config_is_a_clear_error(files, params, expected):
    with pytest.raises(harness.ConfigError, match=expected):
        harness.parse_config(files, params)


def test_error_in_a_gin_file_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("hessian_spectrum.steps = 3\nhessian_spectrum.lerning_rate = 0.1\n")
    with pytest.raises(harness.ConfigError) as e:
        harness.parse_config([str(bad)], [])
    message = str(e.value)
    assert "lerning_rate" in message and "bad.gin" in message and "2" in message
    bad.write_text("hessian_spectrum.steps = (3\n")  # the tokenizer's error, not a SyntaxError
    with pytest.raises(harness.ConfigError, match="bad.gin ends inside an unclosed bracket"):
        harness.parse_config([str(bad)], [])


def test_importing_hogrod_defines_no_flags_and_a_binary_exits_2_on_a_bad_binding(tmp_path):
    """Only a binary's `harness.main` defines --gin_file etc.: a program that imports hogrod
    keeps those names free (it may define its own --output_dir). The same process then runs
    a binary as `python -m` does, with a misspelt binding: it exits with code 2, names the
    binding, and creates no output directory. (One process: each costs a TensorFlow import.)"""
    argv = ["experiments.hessian_spectrum", f"--gin_file={LOGISTIC}",
            f"--output_dir={tmp_path / 'bad'}", "--gin_param=hessian_spectrum.stepz = 1"]
    script = ("import hogrod, hogrod.harness, hogrod.train, hogrod.meta, hogrod.gan, "
              "hogrod.pinn, hogrod.curvature, hogrod.distribute, hogrod.linalg, hogrod.tree; "
              "from absl import flags; "
              "print(sorted({'gin_file', 'gin_param', 'output_dir', 'allow_config_change'} "
              "& set(flags.FLAGS)), flush=True); "
              f"import runpy, sys; sys.argv = {argv!r}; "
              "runpy.run_module('experiments.hessian_spectrum', run_name='__main__', "
              "alter_sys=True)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.stdout.strip().splitlines()[0] == "[]", (done.stdout, done.stderr[-2000:])
    assert done.returncode == 2, done.stderr[-2000:]
    assert "stepz" in done.stderr
    assert not (tmp_path / "bad").exists()


def test_main_defines_its_flags_once_and_refuses_a_clashing_one():
    from absl import flags
    values = flags.FlagValues()
    harness.define_flags(values)
    harness.define_flags(values)  # a second binary or test in the same process
    values(["prog", "--gin_file=a.gin", "--gin_file=b.gin", "--gin_param=x.y = 1",
            "--output_dir=out", "--allow_config_change"])
    assert (values.gin_file, values.gin_param, values.output_dir, values.allow_config_change
            ) == (["a.gin", "b.gin"], ["x.y = 1"], "out", True)
    clash = flags.FlagValues()
    flags.DEFINE_string("gin_file", None, "the program's own", flag_values=clash)
    with pytest.raises(flags.DuplicateFlagError, match="--gin_file.*string.*multi string"):
        harness.define_flags(clash)


def test_every_console_command_names_an_experiment_module():
    """Every console command of pyproject's [project.scripts] names an existing module of
    `hogrod.experiments` (experiments/). tests/test_wheel.py runs one, installed, from
    another directory (progress at INFO shows there, TensorFlow's start-up noise does not)."""
    import tomllib
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["hogrod-hessian-spectrum"] == "hogrod.experiments.hessian_spectrum:main"
    assert "hogrod-maml" in scripts
    for target in scripts.values():
        module = target.split(":")[0]
        assert module.startswith("hogrod.experiments.")
        assert os.path.exists(os.path.join(REPO_ROOT, "experiments", module.split(".")[2] + ".py"))


def test_bench_hvp_binary_runs_and_checks_agreement(tmp_path):
    from experiments.bench import hvp
    _, metrics = harness.run(hvp.bench_hvp, [bench_config("hvp")],
                             ["bench_hvp.widths = (4, 8, 3)", "bench_hvp.batch = 5",
                              "bench_hvp.repeats = 2", "bench_hvp.warmup = 1"], str(tmp_path))
    assert metrics["ratio_hvp_reverse_over_reverse_over_grad"] > 0
    assert "ms_hvp_forward_over_reverse_xla" in metrics


def test_bench_maml_binary_runs(tmp_path):
    from experiments.bench import maml as bench_maml
    _, metrics = harness.run(bench_maml.bench_maml, [bench_config("maml")],
                             ["bench_maml.meta_batch = 2", "bench_maml.rounds = 1",
                              "bench_maml.steps_per_round = 2", "bench_maml.warmup = 1"],
                             str(tmp_path))
    assert metrics["steps_per_s_hogrod"] > 0


def test_a_bad_input_raised_during_the_run_exits_2_with_its_message_alone(tmp_path, capsys,
                                                                          monkeypatch):
    from experiments import maml
    monkeypatch.delenv("HOGROD_DATA", raising=False)  # no data: data_dir None is an error
    code = harness.run_cli(maml.maml_experiment, ["configs/maml/omniglot_5way_1shot.gin"],
                           ["episode_data.data_dir = None"], str(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "episode_data.data_dir" in err and "Traceback" not in err
    assert "HOGROD_DATA" in err
    with pytest.raises(ValueError, match="episode_data.data_dir"):  # --verbosity=1
        harness.run_cli(maml.maml_experiment, ["configs/maml/omniglot_5way_1shot.gin"],
                        ["episode_data.data_dir = None"], str(tmp_path), show_traceback=True)


def test_history_of_a_resumed_run_stops_at_its_checkpoint_and_metrics_are_updated(tmp_path):
    history = []
    for step in (500, 1000, 1500):  # 1500 was evaluated, then the run was killed
        train.record_eval(str(tmp_path), history, {"step": step, "loss": step / 1000})
    assert [h["step"] for h in train.read_history(str(tmp_path), 1000)] == [500, 1000]
    assert train.read_history(str(tmp_path / "new"), 0) == []
    assert os.listdir(tmp_path / "eval")  # the scalars went to TensorBoard too
    harness.write_metrics(str(tmp_path), {"loss": 1.0, "train_seconds": 12.0})
    harness.write_metrics(str(tmp_path), {"loss": 0.5}, resumed=True)  # trained nothing
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"loss": 0.5,
                                                                   "train_seconds": 12.0}
    harness.write_metrics(str(tmp_path), {"loss": 0.25})  # not a resumed run: replaced
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"loss": 0.25}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def _eval_scalars(eval_dir):
    """{(step, name): value} of the TensorBoard scalars in a run's eval/ folder."""
    out = {}
    for name in os.listdir(eval_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(eval_dir, name)):
            for v in event.summary.value:
                out[event.step, v.tag] = float(tf.make_ndarray(v.tensor))
    return out


def test_eval_scalars_go_to_the_run_that_recorded_them(tmp_path, monkeypatch):
    """Two runs naming the same relative output_dir from two working directories each get
    their own scalars (a writer cached by path wrote the second run's into the first's)."""
    for run, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / run).mkdir()
        monkeypatch.chdir(tmp_path / run)
        history = train.read_history("out", 0)
        for step in (10, 20):
            train.record_eval("out", history, {"step": step, "loss": value * step})
        with pytest.raises(ValueError, match="record_eval: history is that of"):
            train.record_eval(str(tmp_path / "elsewhere"), history, {"step": 30})
    for run, value in (("a", 1.0), ("b", 2.0)):
        eval_dir = tmp_path / run / "out" / "eval"
        assert len(os.listdir(eval_dir)) == 1  # the history's one writer
        assert _eval_scalars(eval_dir) == {(10, "loss"): 10 * value, (20, "loss"): 20 * value}


def test_a_run_leaves_no_bindings_behind(tmp_path):
    """After `run`, a direct call does not see the run's bindings (otherwise a script that
    runs an experiment and then builds its own train step gets the run's loss weights)."""
    import gin

    @gin.configurable
    def probe_experiment(output_dir, value=0):
        from hogrod import train
        step = train.make_train_step(lambda b: {"l2": tf.reduce_sum(v ** 2)},
                                     __import__("keras").optimizers.SGD(0.0), [v])
        return {"value": value, "logs": float(step(tf.zeros([1]))["loss"])}

    v = tf.Variable([1.0, 2.0])
    _, metrics = harness.run(probe_experiment, [],
                             ["probe_experiment.value = 3", "make_train_step.weights = {'l2': 2.0}"],
                             str(tmp_path / "run"))
    assert metrics["value"] == 3 and metrics["logs"] == 10.0  # 2 * (1 + 4)
    from hogrod import train
    step = train.make_train_step(lambda b: {"l2": tf.reduce_sum(v ** 2)},
                                 __import__("keras").optimizers.SGD(0.0), [v])
    assert float(step(tf.zeros([1]))["loss"]) == 5.0  # no weight left from the run


HEAT = ["configs/pinn/heat.gin"]


@pytest.mark.parametrize("binding,expected", [
    ("pinn_experiment.adam_lr = -1.0", "pinn_experiment.adam_lr = -1.0: must be a finite "
                                       "number > 0"),
    ("pinn_experiment.adam_steps = 20.5", "pinn_experiment.adam_steps = 20.5: must be an "
                                          "integer >= 0"),
    ("pinn_experiment.adam_steps = '20'", "pinn_experiment.adam_steps = '20': must be an "
                                          "integer >= 0"),
    ("pinn_experiment.jit_compile = 'yes'", "pinn_experiment.jit_compile = 'yes': must be True "
                                            "or False"),
    ("pinn_experiment.error_every = 0", "pinn_experiment.error_every = 0: must be an integer "
                                        ">= 1 or None"),
    ("make_train_step.accumulation_steps = 2.5", "make_train_step.accumulation_steps = 2.5: "
                                                 "must be an integer"),
    ("make_strategy.logical_cpus = '2'", "make_strategy.logical_cpus = '2': must be an integer "
                                         "or None"),
])
def test_a_wrong_value_or_type_of_a_binding_exits_2_naming_it_before_anything_is_written(
        binding, expected, tmp_path, capsys):
    """Checked against the signatures' annotations (the experiment's and the library
    configurables'), after parsing and before the output directory exists."""
    from experiments import pinn
    out = tmp_path / "run"
    code = harness.run_cli(pinn.pinn_experiment, HEAT, [binding], str(out))
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_macro_is_checked_for_its_value_and_a_string_rate_of_hyperopt_is_refused(tmp_path,
                                                                                   capsys):
    from experiments import hyperopt, pinn
    code = harness.run_cli(pinn.pinn_experiment, HEAT, ["STEPS = 2.5",
                                                        "pinn_experiment.adam_steps = %STEPS"],
                           str(tmp_path / "a"))
    assert code == 2 and "pinn_experiment.adam_steps = 2.5" in capsys.readouterr().err
    code = harness.run_cli(hyperopt.hyperopt_experiment, ["configs/hyperopt/digits_one_step.gin"],
                           ["hyperopt_experiment.outer_lr = '0.05'"], str(tmp_path / "b"))
    err = capsys.readouterr().err
    assert code == 2 and "hyperopt_experiment.outer_lr = '0.05': must be a finite number > 0" \
        in err and "Traceback" not in err
    assert not os.listdir(tmp_path)


def test_every_shipped_config_fits_the_annotations():
    """The annotations refuse no value a shipped config binds."""
    import glob
    import importlib
    for path in glob.glob(os.path.join(REPO_ROOT, "experiments", "**", "*.py"), recursive=True):
        name = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
        if not name.endswith("__init__"):
            importlib.import_module(name)
    configs = glob.glob(os.path.join(bindings.CONFIG_DIR, "**", "*.gin"), recursive=True)
    assert len(configs) > 50
    try:
        for path in configs:
            harness.parse_config([path], [])
            bindings.check_values()
    finally:
        harness.gin.clear_config()


def test_includes_resolve_from_another_directory_without_gin_logging(tmp_path, monkeypatch,
                                                                       caplog):
    """gin's package reader, asked first for an include it cannot find, logs (an error
    'Path not found' when the folder is no package); the harness resolves includes itself."""
    import logging
    from experiments import pinn  # noqa: F401  (registers pinn_experiment)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.DEBUG):
        harness.parse_config(["pinn/heat.gin"], [])
    assert "pinn_experiment.width = 32" in harness.gin.config_str()  # heat.gin over base.gin
    assert "pinn_experiment.sampling = 'sobol'" in harness.gin.config_str()  # from base.gin
    assert not [r for r in caplog.records if r.name.startswith("gin") or "gin" in r.pathname]
    (tmp_path / "loop.gin").write_text("include 'loop.gin'\n")
    with pytest.raises(harness.ConfigError, match="loop.gin includes itself"):
        harness.parse_config(["loop.gin"], [])
    (tmp_path / "gone.gin").write_text("\n\ninclude 'nope/gone.gin'\n")
    with pytest.raises(harness.ConfigError, match=r"nope/gone.gin.*included in .*gone.gin, line 3"):
        harness.parse_config(["gone.gin"], [])
    harness.gin.clear_config()


@pytest.mark.parametrize("line,dropped", [
    (b"I0000 00:00:1795647407.785531    7838 service.cc:153] XLA service 0x7f0e5c0505d0 "
     b"initialized for platform Host (this does not guarantee that XLA will be used). Devices:",
     True),
    (b"I0000 00:00:1795647407.785572    7838 service.cc:161]   StreamExecutor [0]: Host, "
     b"Default Version", True),
    (b"I0000 00:00:1795647408.376174    7838 device_compiler.h:208] Compiled cluster using XLA!"
     b"  This line is logged at most once for the lifetime of the process.", True),
    (b"I0000 00:00:1795647407.839011    7838 dump_mlir_util.cc:269] disabling MLIR crash "
     b"reproducer, set env var `MLIR_CRASH_REPRODUCER_DIRECTORY` to enable.", True),
    (b"W0000 00:00:1795648189.939685   15466 util.cc:123] Not handling type DT_DOUBLE", True),
    (b"E0000 00:00:1795648189.939685   15466 cuda_executor.cc:1228] INTERNAL: CUDA error: "
     b"Failed call to cuInit: UNKNOWN ERROR (303)", not os.path.exists("/proc/driver/nvidia")),
    (b"E0000 00:00:1795648189.939685   15466 util.cc:123] Not handling type DT_DOUBLE", False),
    (b"W0000 00:00:1795648189.939685   15466 op_level_cost_estimator.cc:699] Error in "
     b"PredictCost() for the op: goo.gle/debugstr    op: \"Softmax\"", True),
    (b"I1125 22:56:38.858859 139701808331648 harness.py:436] service.cc:153] XLA service 0x1 "
     b"initialized for platform", False),
])
def test_the_binaries_drop_native_notices_and_pass_everything_else(line, dropped):
    from hogrod import stderr_filter
    assert bool(stderr_filter.NOISE.match(line)) == dropped
