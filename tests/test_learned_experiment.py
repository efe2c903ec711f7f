"""experiments/learned_optimizer.py end to end on tiny settings: its evaluations against
numpy unrolls of the PES paper's problems (influence balancing's fresh unroll, the toy
regression's surface at grid points), a killed run resumed equal to the uninterrupted one
(theta, the outer optimizer's state, the particles and PES's accumulators, the step, read
from the checkpoints), a changed config refused, a diverged run written with its last
finite theta (exit code 0), a learned optimizer saved and compared with Adam's best rate on
held-out tasks, two logical CPUs equal to one device, bad bindings named before anything
is written."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from experiments import learned_optimizer as exp
from hogrod import harness, learned, train

IB = "configs/learned/influence_balancing_pes_k1.gin"
TOY = "configs/learned/toy_regression_tbptt.gin"
# PES on influence balancing, small: 8 particles, 6 meta-steps, outer Adam (a state to
# restore), checkpoints at 2, 4, 6, evaluations at 0, 3, 6
IB_TINY = ["hogrod.learned.pes.particles = 8", "learned_optimizer_experiment.meta_steps = 6",
           "learned_optimizer_experiment.eval_steps = 50",
           "learned_optimizer_experiment.eval_every = 3",
           "learned_optimizer_experiment.checkpoint_every = 2",
           "learned_optimizer_experiment.outer_optimizer = @outer/hogrod.optim.adam",
           "learned_optimizer_experiment.outer_lr = 0.01"]


def influence_balancing_loss(theta, steps, n=23, positives=10):
    """1/2 (s_0 - 1)^2 after `steps` steps of s <- A s + theta c from the all-ones state
    (google-research persistent_es/influence_balancing.py, in numpy)."""
    a = 0.5 * np.eye(n) + 0.5 * np.eye(n, k=1)
    c = np.r_[np.ones(positives), -np.ones(n - positives)]
    s = np.ones(n)
    for _ in range(steps):
        s = a @ s + theta * c
    return 0.5 * (s[0] - 1.0) ** 2


def toy_regression_mean_loss(theta, steps, horizon):
    """The mean loss over `steps` SGD steps of the PES paper's toy regression from (1, 1),
    the rate linear from exp(theta_0) at step 0 to exp(theta_1) at `horizon`, the gradient
    by hand (numpy)."""
    def loss(x):
        return (np.sqrt(x[0] ** 2 + 5) - np.sqrt(5) + np.sin(x[1]) ** 2 * np.exp(-5 * x[0] ** 2)
                + 0.25 * abs(x[1] - 100))

    def grad(x):
        bump = np.exp(-5 * x[0] ** 2)
        return np.array([x[0] / np.sqrt(x[0] ** 2 + 5) - 10 * x[0] * np.sin(x[1]) ** 2 * bump,
                         np.sin(2 * x[1]) * bump + 0.25 * np.sign(x[1] - 100)])

    x, total = np.array([1.0, 1.0]), 0.0
    for t in range(steps):
        lr = np.exp(theta[0]) * (horizon - t) / horizon + np.exp(theta[1]) * t / horizon
        x = x - lr * (grad(x) + 1e-10 * x)
        total += loss(x)
    return total / steps


def strict_json(path):
    def refuse(name):
        raise ValueError(f"{path} holds {name}, not strict JSON")
    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def checkpoint_values(run_dir):
    """Every variable of the run's latest checkpoint, by name."""
    reader = tf.train.load_checkpoint(os.path.join(run_dir, "ckpt"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "OPTIMIZER_SLOT" not in name and name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


class Killed(Exception):
    """Stands in for a kill."""


def killed_and_resumed(monkeypatch, config, params, run_dir):
    """A run killed while saving step 4's checkpoint (step 3's evaluation written), then
    run again to the end: the metrics of the second invocation."""
    save = train.Checkpointer.save

    def killed_saving_step_4(self):
        if int(self.step) == 4:
            raise Killed
        return save(self)
    monkeypatch.setattr(train.Checkpointer, "save", killed_saving_step_4)
    with pytest.raises(Killed):
        harness.run(exp.learned_optimizer_experiment, config, params, run_dir)
    monkeypatch.undo()
    return harness.run(exp.learned_optimizer_experiment, config, params, run_dir)[1]


@pytest.fixture(scope="module")
def ib_run(tmp_path_factory):
    """The uninterrupted tiny PES run on influence balancing: (its directory, metrics)."""
    return harness.run(exp.learned_optimizer_experiment, [IB], IB_TINY,
                       str(tmp_path_factory.mktemp("ib") / "whole"))


def test_influence_balancing_evaluates_resumes_exactly_and_refuses_a_changed_config(
        ib_run, tmp_path, monkeypatch):
    whole, metrics = ib_run
    m = strict_json(os.path.join(whole, "metrics.json"))
    assert m["meta_steps_done"] == 6 and m["diverged"] is False
    assert m["estimator"].startswith("pes(sigma=0.1, particles=8, truncation=1")
    (theta,) = m["theta"]
    assert theta != 0.5 and np.isfinite(theta)
    # the evaluation is the paper's: a fresh 50-step unroll from the all-ones state
    np.testing.assert_allclose(m["eval_loss"], influence_balancing_loss(theta, 50), rtol=1e-12)
    np.testing.assert_allclose(m["theta_error"], abs(theta + 1 / 6), rtol=1e-12)
    history = strict_json(os.path.join(whole, "eval_history.json"))
    assert [h["step"] for h in history] == [0, 3, 6]
    np.testing.assert_allclose(history[0]["eval_loss"], influence_balancing_loss(0.5, 50),
                               rtol=1e-12)
    assert all(np.isfinite(h["meta_loss"]) for h in history[1:])
    for name in ("meta_loss.png", "operative_config.gin", "config.gin"):
        assert os.path.exists(os.path.join(whole, name)), name

    resumed = str(tmp_path / "resumed")
    again = killed_and_resumed(monkeypatch, [IB], IB_TINY, resumed)
    assert again["train_steps"] == 4  # resumed from step 2's checkpoint
    assert again["theta"] == metrics["theta"] and again["eval_loss"] == metrics["eval_loss"]
    # theta, the outer Adam's moments and count, the particles' states, steps and seeds,
    # PES's accumulated perturbations, the meta-step and the meta-loss accumulator
    full, cut = checkpoint_values(whole), checkpoint_values(resumed)
    assert len(full) >= 12 and full.keys() == cut.keys()
    for name in full:
        np.testing.assert_array_equal(cut[name], full[name], err_msg=name)
    assert strict_json(os.path.join(resumed, "eval_history.json")) == history

    with pytest.raises(harness.ConfigError, match=r"pes.sigma: 0.1 -> 0.2"):
        harness.run(exp.learned_optimizer_experiment, [IB],
                    IB_TINY + ["hogrod.learned.pes.sigma = 0.2"], resumed)


def test_a_diverged_run_writes_its_last_finite_theta_and_exits_0(tmp_path):
    """TBPTT (K = 1) at an outer rate of 1e300: the first step, gradient s_0 - 1 = 0.5 at
    the all-ones state, lands theta at 0.5 - 0.5e300; the second's meta-loss overflows, so
    it is not applied."""
    out = str(tmp_path / "run")
    params = ["learned_optimizer_experiment.outer_lr = 1e300",
              "learned_optimizer_experiment.meta_steps = 5",
              "learned_optimizer_experiment.eval_steps = 20"]
    config = ["configs/learned/influence_balancing_tbptt_k1.gin"]
    assert harness.run_cli(exp.learned_optimizer_experiment, config, params, out) == 0
    m = strict_json(os.path.join(out, "metrics.json"))
    assert m["diverged"] is True and m["meta_steps_done"] == 1
    assert m["theta"] == [0.5 - 0.5e300]
    assert m["eval_loss"] is None  # overflowed: null, strict JSON
    assert os.path.exists(os.path.join(out, "meta_loss.png"))
    # run again: it stays where it diverged and re-evaluates
    assert harness.run_cli(exp.learned_optimizer_experiment, config, params, out) == 0
    again = strict_json(os.path.join(out, "metrics.json"))
    assert again["theta"] == m["theta"] and again["meta_steps_done"] == 1
    assert "train_steps" not in again


def test_the_schedule_surface_is_the_full_unroll_objective_and_runs_compare(tmp_path):
    """The surface's values at grid points against a numpy unroll of the toy regression
    (the grid's orientation included); the compare mode draws the paths on it."""
    params = ["HORIZON = 10", "TRUNCATION = 5", "PARTICLES = 2",
              "learned_optimizer_experiment.meta_steps = 2",
              "learned_optimizer_experiment.eval_every = 1",
              "learned_optimizer_experiment.surface = ((-3.0, 1.0), (-2.0, 0.0))",
              "learned_optimizer_experiment.surface_points = 5"]
    out, m = harness.run(exp.learned_optimizer_experiment, [TOY], params, str(tmp_path / "a"))
    np.testing.assert_allclose(m["eval_loss"], toy_regression_mean_loss(m["theta"], 10, 10),
                               rtol=1e-10)
    with np.load(os.path.join(out, "surface.npz")) as z:
        a, b, values = z["a"], z["b"], z["values"]
    np.testing.assert_allclose(a, np.linspace(-3, 1, 5))
    np.testing.assert_allclose(b, np.linspace(-2, 0, 5))
    for i, j in ((0, 0), (1, 3), (4, 2)):  # row i: the second entry's i-th value
        np.testing.assert_allclose(values[i, j], toy_regression_mean_loss((a[j], b[i]), 10, 10),
                                   rtol=1e-10)
    history = strict_json(os.path.join(out, "eval_history.json"))
    assert [len(h["theta"]) for h in history] == [2, 2, 2]
    assert os.path.exists(os.path.join(out, "surface.png"))
    assert exp.plot_compare([out, out], str(tmp_path / "cmp")) == str(tmp_path / "cmp" /
                                                                       "surface.png")
    assert os.path.exists(tmp_path / "cmp" / "surface.png")


@pytest.mark.parametrize("binding, error, match", [
    ("learned_optimizer_experiment.problem = @hogrod.learned.influence_balancing()",
     TypeError, "learned_optimizer_experiment.problem must be an InnerProblem factory"),
    ("learned_optimizer_experiment.estimator = @hogrod.learned.pes",
     TypeError, "learned_optimizer_experiment.estimator must be"),
    ("learned_optimizer_experiment.surface = ((0.0, 1.0), (0.0, 1.0))",
     ValueError, "learned_optimizer_experiment.surface draws a theta of two entries"),
    ("learned_optimizer_experiment.family = @hogrod.learned.digits_mlp()",
     ValueError, "learned_optimizer_experiment.family is bound but"),
    ("learned_optimizer_experiment.init_theta = None",
     ValueError, "bind exactly one of learned_optimizer_experiment.learned"),
    ("learned_optimizer_experiment.baseline_rates = (1e-3,)",
     ValueError, "learned_optimizer_experiment.baseline_rates"),
    ("hogrod.learned.pes.particles = 7", ValueError, "particles must be even"),
    ("learned_optimizer_experiment.task_map = 'parallel'", ValueError,
     "learned_optimizer_experiment.task_map"),
    ("learned_optimizer_experiment.select_every = 2", ValueError,
     "learned_optimizer_experiment.select_every selects a learned optimizer"),
])
def test_bad_bindings_are_named_before_anything_is_written(tmp_path, binding, error, match):
    out = tmp_path / "run"
    with pytest.raises(error, match=match):
        harness.run(exp.learned_optimizer_experiment, [IB], IB_TINY + [binding], str(out))
    assert not out.exists()


@pytest.mark.slow  # tracing the MLP optimizer's unrolls: ~10 s on a quiet machine
def test_a_learned_optimizer_is_saved_and_compared_with_adam_on_heldout_tasks(tmp_path):
    """A tiny MLP optimizer on 2-class digits MLPs: saved as the run's final theta; the
    held-out curves start from the same tasks for every optimizer; Adam's best at N and
    at 2N is the lowest of its rates at each."""
    from hogrod import optim
    params = ["HORIZON = 4", "TRUNCATION = 1", "hogrod.learned.pes.particles = 2",
              "hogrod.learned.digits_mlp.classes = 2",
              "hogrod.learned.digits_mlp.hidden_sizes = (4,)",
              "hogrod.learned.digits_mlp.batch_size = 4",
              "hogrod.learned.mlp_optimizer.hidden_size = 4",
              "hogrod.learned.mlp_optimizer.hidden_layers = 1",
              "hogrod.learned.mlp_optimizer.decays = (0.9,)",
              "hogrod.learned.mlp_optimizer.timescales = ()",
              "learned_optimizer_experiment.meta_steps = 2",
              "learned_optimizer_experiment.baseline_rates = (1e-3, 1e-1)",
              "learned_optimizer_experiment.heldout_tasks = 2",
              "learned_optimizer_experiment.time_limit_s = None",
              # one task at a time: tracing the particles' pfor takes longer than running
              "hogrod.learned.pes.task_map = 'sequential'",
              "learned_optimizer_experiment.task_map = 'sequential'"]
    out, m = harness.run(exp.learned_optimizer_experiment,
                         ["configs/learned/digits_mlp_pes.gin"], params, str(tmp_path / "run"))
    assert m["meta_steps_done"] == 2 and m["heldout_steps"] == [4, 8]
    adam = {float(r): v for r, v in m["heldout_adam_loss"].items()}
    for i in range(2):
        best = min(adam, key=lambda r: adam[r][i])
        assert m["heldout_adam_best_rate"][i] == best
        assert m["heldout_adam_best_loss"][i] == adam[best][i]
        assert m["heldout_learned_below_adam"][i] == (m["heldout_learned_loss"][i] < adam[best][i])
    for name in ("inner_curves.png", "meta_loss.png", "learned_optimizer.npz"):
        assert os.path.exists(os.path.join(out, name)), name
    with np.load(os.path.join(out, "heldout_curves.npz")) as z:
        curves = {k: z[k] for k in z.files}
    assert sorted(curves) == ["adam_0.001", "adam_0.1", "learned"]
    for name, c in curves.items():  # the same two tasks from the same weights
        assert c.shape == (2, 9)
        np.testing.assert_array_equal(c[:, 0], curves["learned"][:, 0])
    np.testing.assert_allclose(adam[0.1], curves["adam_0.1"].mean(0)[[4, 8]], rtol=1e-6)
    family = learned.digits_mlp(classes=2, hidden_sizes=(4,), batch_size=4)
    np.testing.assert_allclose(curves["adam_0.1"], learned.training_curves(  # the held-out tasks
        optim.adam(0.1), family, [0, 1], 8, mode="sequential"), rtol=1e-6)
    lopt = learned.mlp_optimizer(4, 1, (0.9,), step_mult=1e-2, timescales=())  # the config's
    saved = tf.nest.flatten(lopt.load(os.path.join(out, "learned_optimizer.npz")))
    reader = tf.train.load_checkpoint(os.path.join(out, "ckpt"))
    for i, leaf in enumerate(saved):  # theta leads the checkpointed MetaState's leaves
        np.testing.assert_array_equal(
            leaf, reader.get_tensor(f"meta/{i}/.ATTRIBUTES/VARIABLE_VALUE"))


@pytest.mark.slow  # tracing the MLP optimizer's unrolls and validations, three runs
def test_the_run_reports_the_theta_of_the_lowest_validation_loss(tmp_path, monkeypatch):
    """select_every = 1, killed while saving step 4's checkpoint and resumed from step 2's:
    each meta-step's validation loss recorded; the saved optimizer is the theta of the
    lowest (found before the kill: the checkpoint keeps it), whose loss after N steps on the
    validation tasks (held-out split, seeds [i, 1]) recomputed outside the run is the one
    recorded."""
    params = ["HORIZON = 4", "TRUNCATION = 2", "hogrod.learned.pes.particles = 2",
              "hogrod.learned.pes.sigma = 0.5",  # big perturbations and outer steps: the
              "learned_optimizer_experiment.outer_lr = 0.5",  # last theta is not the best
              "hogrod.learned.digits_mlp.classes = 2",
              "hogrod.learned.digits_mlp.hidden_sizes = (4,)",
              "hogrod.learned.digits_mlp.batch_size = 4",
              "hogrod.learned.mlp_optimizer.hidden_layers = 0",
              "hogrod.learned.mlp_optimizer.decays = (0.9,)",
              "hogrod.learned.mlp_optimizer.timescales = ()",
              "learned_optimizer_experiment.meta_steps = 4",
              "learned_optimizer_experiment.checkpoint_every = 2",
              "learned_optimizer_experiment.select_every = 1",
              "learned_optimizer_experiment.validation_tasks = 2",
              "learned_optimizer_experiment.baseline_rates = ()",  # the selection alone
              "learned_optimizer_experiment.time_limit_s = None",
              "hogrod.learned.pes.task_map = 'sequential'",
              "learned_optimizer_experiment.task_map = 'sequential'"]
    config = ["configs/learned/digits_mlp_adam_pes.gin"]
    out = str(tmp_path / "run")
    m = killed_and_resumed(monkeypatch, config, params, out)
    history = strict_json(os.path.join(out, "eval_history.json"))
    losses = {h["step"]: h["validation_loss"] for h in history}
    assert sorted(losses) == [0, 1, 2, 3, 4]
    best = min(losses, key=lambda step: (losses[step], step))
    assert best <= 2, losses  # held by step 2's checkpoint, where the second run starts
    assert m["selected_meta_step"] == best and m["validation_loss"] == losses[best]
    lopt = learned.mlp_optimizer(hidden_layers=0, decays=(0.9,), timescales=(),
                                 adam_learning_rate=1e-2, exp_mult=1.0)  # the config's
    theta = lopt.load(os.path.join(out, "learned_optimizer.npz"))
    family = learned.digits_mlp(classes=2, hidden_sizes=(4,), batch_size=4)
    again = learned.training_curves(lopt.optimizer(theta), family,
                                     tf.constant([[0, 1], [1, 1]], tf.int64), 4,
                                     mode="sequential")[:, -1]
    np.testing.assert_allclose(np.mean(again.numpy()), m["validation_loss"], rtol=1e-6)


def test_adams_best_rate_is_chosen_at_each_horizon_apart():
    """Rate 1e-2 is best at N = 2 and 1e-1 at 2N, though 1e-1's mean is NaN at N (a
    diverged curve is never best where it is not finite)."""
    runs = {"learned": np.array([[3.0, 2.0, 1.0, 0.5, 0.4], [3.0, 2.0, 2.0, 1.5, 0.6]]),
            "adam_0.001": np.array([[3.0, 2.5, 2.0, 1.0, 0.2]] * 2),
            "adam_0.01": np.array([[3.0, 1.0, 0.8, 0.9, 0.9]] * 2),
            "adam_0.1": np.array([[3.0, 1.0, np.nan, 1.0, 0.1], [3.0, 1.0, 0.1, 1.0, 0.1]])}
    m = learned.heldout_summary(runs, (1e-1, 1e-3, 1e-2), 2)  # NaN first: min would keep it
    assert m["heldout_adam_best_rate"] == [1e-2, 1e-1] and m["heldout_steps"] == [2, 4]
    assert m["heldout_adam_best_loss"] == [0.8, 0.1]
    assert m["heldout_learned_loss"] == [1.5, 0.5]
    assert m["heldout_learned_below_adam"] == [False, False]
    assert m["heldout_adam_loss"]["0.1"] == [None, 0.1]  # strict JSON
    np.testing.assert_allclose(m["heldout_learned_stderr"], [0.5, 0.1], rtol=1e-12)


def test_two_logical_cpus_take_the_steps_of_one_device(ib_run, tmp_path):
    """The particles split over two replicas (configs/strategy/mirrored_2cpu.gin): the same
    estimates, so the same theta and evaluation."""
    one = ib_run[1]
    two = harness.run(exp.learned_optimizer_experiment, [IB, "configs/strategy/mirrored_2cpu.gin"],
                      IB_TINY, str(tmp_path / "two"))[1]
    assert two["theta"] == one["theta"] and two["eval_loss"] == one["eval_loss"]
