"""PINN building blocks against closed forms and finite differences."""

import dataclasses
import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import pinn
from conftest import bench_config


def pts(n=20, seed=0, low=(-1.0, 0.0), high=(1.0, 1.0)):
    return tf.constant(pinn.sample(pinn.Box(low, high), n, "uniform", seed), tf.float64)


def test_partials_of_known_functions_including_vector_valued():
    def u(x):
        a, t = x[:, 0], x[:, 1]
        return tf.stack([tf.sin(a) * tf.cos(t), a ** 2 * t ** 3], axis=1)

    x = pts()
    d = pinn.partials(u, x, [(), (0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1, 1)])
    a, t = x[:, 0].numpy(), x[:, 1].numpy()
    expect = {
        (0,): [np.cos(a) * np.cos(t), 2 * a * t ** 3],
        (1,): [-np.sin(a) * np.sin(t), 3 * a ** 2 * t ** 2],
        (0, 0): [-np.sin(a) * np.cos(t), 2 * t ** 3],
        (0, 1): [-np.cos(a) * np.sin(t), 6 * a * t ** 2],
        (1, 0): [-np.cos(a) * np.sin(t), 6 * a * t ** 2],
        (1, 1, 1): [np.sin(a) * np.sin(t), 6 * a ** 2 * np.ones_like(t)],
    }
    for key, cols in expect.items():
        np.testing.assert_allclose(d[key], np.stack(cols, 1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pinn.divergence(d, [0, 1]),
                               (np.cos(a) * np.cos(t) + 3 * a ** 2 * t ** 2)[:, None], rtol=1e-10)


def test_partials_of_a_network_match_finite_differences():
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((2,), dtype="float64"),
                            keras.layers.Dense(8, activation="tanh", dtype="float64"),
                            keras.layers.Dense(1, dtype="float64")])
    x = pts(5)
    d = pinn.partials(net, x, [(0,), (1,), (0, 0), (0, 1)])
    h = 1e-4
    e0, e1 = np.array([h, 0.0]), np.array([0.0, h])
    f = lambda z: net(tf.constant(z)).numpy()  # noqa: E731
    xn = x.numpy()
    np.testing.assert_allclose(d[(0,)], (f(xn + e0) - f(xn - e0)) / (2 * h), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d[(1,)], (f(xn + e1) - f(xn - e1)) / (2 * h), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d[(0, 0)], (f(xn + e0) - 2 * f(xn) + f(xn - e0)) / h ** 2,
                               rtol=1e-4, atol=1e-6)
    mixed = (f(xn + e0 + e1) - f(xn + e0 - e1) - f(xn - e0 + e1) + f(xn - e0 - e1)) / (4 * h * h)
    np.testing.assert_allclose(d[(0, 1)], mixed, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("pde,solution,low,high", [
    (pinn.pdes.poisson(dim=2), lambda x: tf.reduce_prod(tf.sin(math.pi * x), 1, keepdims=True),
     (0.0, 0.0), (1.0, 1.0)),
    (pinn.pdes.poisson(dim=3), lambda x: tf.reduce_prod(tf.sin(math.pi * x), 1, keepdims=True),
     (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    (pinn.pdes.heat(alpha=0.5), lambda x: (tf.sin(math.pi * x[:, :1])
                                      * tf.exp(-0.5 * math.pi ** 2 * x[:, 1:])), (0, 0), (1, 1)),
    (pinn.pdes.wave(c=2.0), lambda x: tf.sin(math.pi * x[:, :1]) * tf.cos(2 * math.pi * x[:, 1:]),
     (0, 0), (1, 1)),
    (pinn.pdes.helmholtz(k=3.0), lambda x: tf.reduce_prod(tf.sin(math.pi * x), 1, keepdims=True),
     (-1, -1), (1, 1)),
    # Burgers: u = x / (1 + t) (u_xx = 0, so any viscosity); Allen-Cahn: the stationary
    # front tanh(x sqrt(r / 2d)) (d u_xx = r (u^3 - u))
    (pinn.pdes.burgers(0.03), lambda x: x[:, :1] / (1.0 + x[:, 1:]), (-1, 0), (1, 1)),
    # ... and the viscous travelling wave c - a tanh(a (x - c t) / 2 nu) (u_xx != 0: the
    # viscous term's sign matters), with a fixed and a callable (learned) viscosity
    (pinn.pdes.burgers(0.05), lambda x: 0.3 - 0.5 * tf.tanh(5.0 * (x[:, :1] - 0.3 * x[:, 1:])),
     (-1, 0), (1, 1)),
    (pinn.pdes.burgers(lambda: tf.constant(0.05, tf.float64)),
     lambda x: 0.3 - 0.5 * tf.tanh(5.0 * (x[:, :1] - 0.3 * x[:, 1:])), (-1, 0), (1, 1)),
    (pinn.pdes.allen_cahn(diffusion=0.01, reaction=5.0),
     lambda x: tf.tanh(x[:, :1] * math.sqrt(5.0 / 0.02)) + 0.0 * x[:, 1:], (-1, 0), (1, 1)),
])
def test_residuals_vanish_on_exact_solutions(pde, solution, low, high):
    x = tf.constant(pinn.sample(pinn.Box(low, high), 64, "sobol", 1), tf.float64)
    np.testing.assert_allclose(pinn.residual(pde, solution, x), 0.0, atol=1e-9)
    wrong = lambda x: solution(x) + 0.1 * x[:, :1] ** 3  # noqa: E731  (the check can fail)
    assert np.abs(pinn.residual(pde, wrong, x)).max() > 1e-3


def test_numpy_closed_forms_match_the_tf_solutions():
    x = pinn.sample(pinn.Box((0, 0), (1, 1)), 10, "lhs", 2).astype(np.float64)
    np.testing.assert_allclose(pinn.reference.heat_sine(x, 0.5),
                               np.sin(np.pi * x[:, :1]) * np.exp(-0.5 * np.pi ** 2 * x[:, 1:]))
    np.testing.assert_allclose(pinn.reference.wave_sine(x, 2.0),
                               np.sin(np.pi * x[:, :1]) * np.cos(2 * np.pi * x[:, 1:]))
    np.testing.assert_allclose(pinn.reference.poisson_sine(x),
                               np.prod(np.sin(np.pi * x), 1, keepdims=True))


def test_cole_hopf_reference_satisfies_burgers_initial_and_boundary_conditions():
    nu = 0.01 / math.pi
    xs = np.linspace(-1, 1, 41)
    # just after t = 0 (at t = 0 itself the reference returns the initial condition)
    np.testing.assert_allclose(pinn.burgers_cole_hopf(xs, 0.0 * xs + 1e-8), -np.sin(np.pi * xs),
                               atol=1e-6)
    t = np.linspace(0.05, 1.0, 20)
    np.testing.assert_allclose(pinn.burgers_cole_hopf(np.ones_like(t), t), 0.0, atol=1e-10)
    np.testing.assert_allclose(pinn.burgers_cole_hopf(-np.ones_like(t), t), 0.0, atol=1e-10)
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.9, 0.9, 200)
    t = rng.uniform(0.05, 0.95, 200)
    keep = np.abs(x) > 0.15  # away from the steep front at x = 0 (u_x up to ~1/nu there)
    x, t = x[keep], t[keep]
    u = lambda a, b: pinn.burgers_cole_hopf(a, b, nu)  # noqa: E731
    hx, ht = 1e-4, 1e-4
    u0 = u(x, t)
    u_t = (u(x, t + ht) - u(x, t - ht)) / (2 * ht)
    u_x = (u(x + hx, t) - u(x - hx, t)) / (2 * hx)
    u_xx = (u(x + hx, t) - 2 * u0 + u(x - hx, t)) / hx ** 2
    residual = u_t + u0 * u_x - nu * u_xx
    assert np.abs(residual).max() < 1e-4, np.abs(residual).max()
    # the shock forms: at t = 1 the profile is steep at x = 0
    assert pinn.burgers_cole_hopf(np.array([-0.01]), np.array([1.0]))[0] > 0.5


def test_bad_input_is_named():
    u = lambda x: x[:, :1]  # noqa: E731
    with pytest.raises(ValueError, match="coordinate index 2 .* outside the input dimension 2"):
        pinn.partials(u, pts(3), [(0, 2)])
    with pytest.raises(ValueError, match=r"shape \[batch, dim\]"):
        pinn.partials(u, tf.zeros([3]), [(0,)])
    for bad in [0, "xx"]:  # (0) is 0, not a tuple; names are not indices
        with pytest.raises(ValueError, match=f"tuple of coordinate indices.*{bad!r}"):
            pinn.partials(u, pts(3), [bad])
    with pytest.raises(ValueError, match="residual must have shape"):
        pinn.residual(pinn.PDE([(0,)], lambda x, d: tf.reshape(d[(0,)], [-1])), u, pts(3))
    prob = pinn.problems.heat_problem()
    conds = [fn(4, 0) for _, fn, _ in prob.conditions]
    with pytest.raises(ValueError, match=r"collocation points must have shape \[n, 2\] .* 'heat'"):
        pinn.pinn_loss(prob, u, np.zeros((5, 3), np.float32), conds)
    with pytest.raises(ValueError, match=r"'initial' condition's points .* got \(4, 1\)"):
        pinn.pinn_loss(prob, u, np.zeros((5, 2), np.float32), [conds[0][:, :1], conds[1]])
    with pytest.raises(ValueError, match="method must be one of"):
        pinn.sample(pinn.Box((0,), (1,)), 3, "grid")
    with pytest.raises(ValueError, match="low < high"):
        pinn.Box((0, 1), (1, 0))


@pytest.mark.slow
def test_a_short_training_run_reduces_the_error_well_below_its_start(tmp_path):
    from experiments import pinn as exp
    from hogrod import harness
    small = ["pinn_experiment.width = 16", "pinn_experiment.depth = 2",
             "pinn_experiment.n_collocation = 500", "pinn_experiment.n_condition = 100",
             "pinn_experiment.jit_compile = False"]  # XLA's compiles outweigh its 250 steps
    _, start = harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"], small + [
        "pinn_experiment.adam_steps = 0", "pinn_experiment.lbfgs_maxiter = 0"],
        str(tmp_path / "a"))
    _, end = harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"], small + [
        "pinn_experiment.adam_steps = 100", "pinn_experiment.lbfgs_maxiter = 150",
        "pinn_experiment.error_every = 50"], str(tmp_path / "b"))
    assert end["relative_l2"] < 0.1 * start["relative_l2"]
    curve = end["error_history"]  # [seconds, phase, step, error] at 50, 100 (Adam), L-BFGS
    assert [h[1:3] for h in curve[:2]] == [["adam", 50], ["adam", 100]]
    assert curve[-1][3] == end["relative_l2"] and all(a[0] <= b[0] for a, b in zip(curve, curve[1:]))
    reached = pinn.seconds_to_error(curve, 0.01)  # the benchmark's reading of the curve
    assert reached is None or reached <= curve[-1][0]
    assert end["relative_l2"] < end["relative_l2_after_adam"]  # L-BFGS improved on Adam
    saved_curve = json.loads((tmp_path / "b" / "eval_history.json").read_text())
    steps = [h["step"] for h in saved_curve]  # one step axis: L-BFGS's after Adam's 100
    assert steps == sorted(set(steps)) and steps[-1] == 100 + end["lbfgs_iterations"]
    assert (tmp_path / "b" / "solution.png").exists()
    assert os.listdir(tmp_path / "b" / "eval")  # the error curve in TensorBoard too
    # the finished run, run again: it restores L-BFGS's result instead of redoing L-BFGS,
    # and keeps the first run's timings
    harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"], small + [
        "pinn_experiment.adam_steps = 100", "pinn_experiment.lbfgs_maxiter = 150",
        "pinn_experiment.error_every = 50"], str(tmp_path / "b"))
    saved = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert saved["relative_l2"] == end["relative_l2"]
    assert saved["adam_seconds"] == end["adam_seconds"]
    assert saved["lbfgs_seconds"] == end["lbfgs_seconds"]


class Killed(Exception):
    """Stands in for a kill."""


def test_a_run_stopped_during_lbfgs_resumes_its_error_curve_and_clock(tmp_path, monkeypatch):
    from experiments import pinn as exp
    from hogrod import harness
    params = ["pinn_experiment.width = 16", "pinn_experiment.depth = 2",
              "pinn_experiment.n_collocation = 500", "pinn_experiment.n_condition = 100",
              "pinn_experiment.adam_steps = 60", "pinn_experiment.lbfgs_maxiter = 40",
              "pinn_experiment.error_every = 30", "pinn_experiment.checkpoint_every = 30",
              # plain tf.functions: the XLA compiles of the step and of L-BFGS, in both
              # runs, were most of this test's time; it checks the curve and the clock
              "pinn_experiment.jit_compile = False"]

    def killed(*args, **kwargs):
        raise Killed
    monkeypatch.setattr(exp.training, "lbfgs", killed)
    with pytest.raises(Killed):
        harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"], params, str(tmp_path))
    monkeypatch.undo()
    _, m = harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"], params, str(tmp_path))
    curve = m["error_history"]  # the Adam points of the stopped run, then this run's L-BFGS
    assert [h[1:3] for h in curve[:2]] == [["adam", 30], ["adam", 60]] and curve[-1][1] == "end"
    assert all(a[0] <= b[0] for a, b in zip(curve, curve[1:]))  # one clock across the stop
    assert m["adam_seconds"] >= curve[1][0] and abs(m["total_seconds"] - curve[-1][0]) < 0.05
    assert m["relative_l2"] < m["relative_l2_after_adam"]
    with pytest.raises(ValueError, match="holds a finished run"):  # more Adam after L-BFGS
        harness.run(exp.pinn_experiment, ["configs/pinn/heat.gin"],
                    params + ["pinn_experiment.adam_steps = 90"], str(tmp_path),
                    allow_config_change=True)  # else the harness refuses the new count


def test_inverse_burgers_moves_the_viscosity_toward_the_truth(tmp_path):
    from experiments import pinn as exp
    from hogrod import harness
    _, m = harness.run(exp.pinn_experiment, ["configs/pinn/burgers_inverse.gin"], [
        "pinn_experiment.width = 16", "pinn_experiment.depth = 3",
        "pinn_experiment.n_collocation = 1000", "burgers_inverse_problem.n_observations = 500",
        "pinn_experiment.adam_steps = 100", "pinn_experiment.lbfgs_maxiter = 200",
        "burgers_problem.grid_shape = (64, 20)"], str(tmp_path))
    assert abs(m["viscosity"] - m["viscosity_true"]) < abs(0.05 - m["viscosity_true"])
    # reported generically from the problem's Unknown: the truth is the factory's default
    assert m["viscosity_true"] == 0.01 / math.pi and m["problem"] == "burgers_inverse"
    np.testing.assert_allclose(m["viscosity_rel_err"],
                               abs(m["viscosity"] - 0.01 / math.pi) / (0.01 / math.pi))
    assert m["term_data"] > 0  # the observations are a loss term
    saved = [n for n, _ in tf.train.list_variables(str(tmp_path / "ckpt"))]
    assert any(n.startswith("unknown_viscosity/") for n in saved), saved  # resumes with it


def test_lbfgs_minimizes_an_objective_as_make_train_step_does():
    """The objective kind: a scalar or {term: scalar}, "monitor/..." terms not minimized;
    closed-form minimizers of float64 quadratics."""
    w = tf.Variable([0.0, 0.0], dtype=tf.float64)
    target = tf.constant([1.0, 2.0], tf.float64)
    value, _, _ = pinn.lbfgs(lambda b: {"fit": tf.reduce_sum((w - target) ** 2),
                                        "monitor/norm": 1e3 * tf.reduce_sum(w ** 2)}, [w])
    np.testing.assert_allclose(w.numpy(), [1.0, 2.0], atol=1e-6)
    assert value < 1e-10  # the monitor term (5e3 here) is not part of the value
    pinn.lbfgs(lambda b: tf.reduce_sum((w - 3.0) ** 2), [w])
    np.testing.assert_allclose(w.numpy(), [3.0, 3.0], atol=1e-6)


def test_annealing_weights_move_to_the_balancing_ratio():
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="tanh"),
                            keras.layers.Dense(1)])
    prob = pinn.problems.heat_problem()
    points = tf.constant(pinn.sample(prob.domain, 64, "sobol", 0))
    conds = [tf.constant(fn(32, i)) for i, (_, fn, _) in enumerate(prob.conditions)]
    terms = pinn.pinn_loss(prob, net, points, conds)
    weights, update = pinn.weighting.annealing_weights(terms, net.trainable_variables,
                                             ["initial", "boundary"], alpha=0.0)
    got = update()
    import hogrod
    t = terms()
    # the residual u_t - a u_xx does not depend on the output bias: hogrod.grad gives zeros
    top = max(float(tf.reduce_max(tf.abs(g))) for g in hogrod.grad(
        lambda: terms()["residual"], net.trainable_variables))
    for name in ("initial", "boundary"):
        g = np.concatenate([np.abs(x.numpy()).ravel() for x in hogrod.grad(
            lambda: terms()[name], net.trainable_variables)])
        np.testing.assert_allclose(float(got[name]), top / g.mean(), rtol=1e-4)
    weighted = pinn.pinn_loss(prob, net, points, conds, weights)()
    np.testing.assert_allclose(float(weighted["initial"]),
                               float(got["initial"]) * float(t["initial"]), rtol=1e-5)


@pytest.mark.slow
def test_bench_binary_checks_agreement_and_runs(tmp_path):
    from experiments.bench import pinn as bench_pinn
    from hogrod import harness
    _, m = harness.run(bench_pinn.bench_pinn, [bench_config("pinn")],
                       ["bench_pinn.points = 64", "bench_pinn.depth = 2", "bench_pinn.rounds = 1",
                        "bench_pinn.calls_per_round = 1", "bench_pinn.warmup = 1"], str(tmp_path))
    assert m["evals_per_s_hogrod"] > 0 and m["evals_per_s_hogrod_plain"] > 0
    # the default (one XLA computation) and the plain tf.function: the same gradient
    assert max(m["grad_rel_err_hogrod"], m["grad_rel_err_hogrod_plain"]) < 1e-4
    # the hand-written Taylor-mode jet is an independent derivation of the same gradient
    assert m["grad_rel_err_taylor_mode"] < 1e-4 and m["evals_per_s_taylor_mode"] > 0
    # the operator jet (3 channels, hand-written backward) is another derivation of it
    assert max(m[f"grad_rel_err_{k}"] for k in ("hogrod_jet", "hogrod_jet_xla",
                                                "hogrod_jet_tape", "hogrod_jet_rows_xla",
                                                "taylor_mode_fused")) < 1e-5
    # the floor is the evaluation's products alone: the whole evaluation takes longer
    assert m["matmul_floor_ms"] > 0 and m["floor_ratio_over_hogrod"] > 1


@pytest.mark.slow
def test_convergence_benchmark_records_error_curves(tmp_path):
    from experiments.bench import pinn_convergence as bench
    from hogrod import harness
    _, m = harness.run(bench.bench_pinn_convergence, [bench_config("pinn_convergence")], [
        "bench_pinn_convergence.dde_adam_steps = 40",
        "bench_pinn_convergence.dde_lbfgs_maxiter = 20",
        "bench_pinn_convergence.error_every = 20",
        "bench_pinn_convergence.hogrod_runs = ('deepxde_setup',)"], str(tmp_path))
    curve = m["histories"]["hogrod_deepxde_setup"]
    assert [h[2] for h in curve[:2]] == [20, 40] and curve[-1][1] == "end"
    assert m["hogrod_deepxde_setup_relative_l2"] < curve[0][3]  # training reduced the error


def test_partials_take_no_gradient_inside_a_recording_persistent_tape(monkeypatch):
    """TensorFlow warns (once per process, so the log itself cannot be tested) when a
    persistent tape's gradient is taken inside its context; partials must not do that, so
    the warning never prints and no gradient op is recorded that no later order needs."""
    from tensorflow.python.eager import backprop
    inside = []
    original = backprop.GradientTape.gradient

    def spy(self, *args, **kwargs):
        inside.append(self._persistent and self._recording)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(backprop.GradientTape, "gradient", spy)
    u = lambda x: tf.sin(x[:, :1]) * x[:, 1:] ** 2  # noqa: E731
    x = pts(4)
    d = pinn.partials(u, x, [(0, 1), (1, 1, 1), ()])
    tf.function(lambda x: pinn.partials(u, x, [(0, 0), (1,)]))(x)
    assert inside and not any(inside)
    np.testing.assert_allclose(d[(0, 1)][:, 0], 2 * np.cos(x[:, 0]) * x[:, 1], rtol=1e-12)
    np.testing.assert_array_equal(d[(1, 1, 1)], 0.0)
    with pytest.raises(ValueError, match=r"u_fn\(x\) must have shape \[batch\] or \[batch, m\]"):
        pinn.partials(lambda x: x[:, :, None], x, [(0,)])


def test_every_condition_needs_its_points():
    """Zipping conditions with fewer point sets would silently drop the boundary term."""
    prob = pinn.problems.heat_problem(grid_shape=(5, 5))
    u = lambda x: x[:, :1] * x[:, 1:]  # noqa: E731
    points = pinn.sample(prob.domain, 8, "uniform", 0)
    conds = [fn(4, i) for i, (_, fn, _) in enumerate(prob.conditions)]
    with pytest.raises(ValueError, match=r"one set of points per condition.*no points for "
                                         r"condition\(s\) \['initial', 'boundary'\]"):
        pinn.pinn_loss(prob, u, points, [])
    with pytest.raises(ValueError, match=r"no points for condition\(s\) \['boundary'\]"):
        pinn.pinn_loss(prob, u, points, conds[:1])
    with pytest.raises(ValueError, match=r"got 3: 1 set\(s\) of points beyond them"):
        pinn.pinn_loss(prob, u, points, conds + conds[:1])
    loss_fn = pinn.pinn_loss(prob, u, points, conds)
    terms = loss_fn()
    assert set(terms) == {"residual", "initial", "boundary"}
    # oracle for the boundary term: u = x t is t at x = 1 and 0 at x = 0 (the target is 0)
    xb = conds[1]
    np.testing.assert_allclose(float(terms["boundary"]),
                               np.mean((xb[:, 0] * xb[:, 1]) ** 2), rtol=1e-5)
    with pytest.raises(ValueError, match=r"the batch's condition points .*\['boundary'\]"):
        loss_fn((tf.constant(points), [tf.constant(conds[0])]))


def test_relative_l2_is_normalized_by_the_reference_and_is_a_number_or_none():
    prob = pinn.problems.heat_problem(alpha=0.5, grid_shape=(9, 7))
    ref = prob.reference(prob.grid)

    def u(x):  # 3 u_ref + 0.1: not proportional, so no normalization gives the same number
        return 3.0 * tf.sin(math.pi * x[:, :1]) * tf.exp(-0.5 * math.pi ** 2 * x[:, 1:]) + 0.1
    got = pinn.relative_l2(prob, u, tf.float64)
    assert isinstance(got, float)
    pred = 3.0 * ref + 0.1
    np.testing.assert_allclose(got, np.linalg.norm(pred - ref) / np.linalg.norm(ref), rtol=1e-12)
    np.testing.assert_allclose(pinn.predict_on_grid(prob, u, tf.float64), pred, rtol=1e-12)
    assert pinn.relative_l2(dataclasses.replace(prob, reference=None), u) is None
    with pytest.raises(ValueError, match=r"relative_l2: the solution has shape \(63, 2\)"):
        pinn.relative_l2(prob, lambda x: tf.concat([u(x), u(x)], 1), tf.float64)


def test_the_reference_on_the_grid_is_computed_once_per_problem():
    calls = []

    def reference(x):
        calls.append(len(x))
        return pinn.reference.heat_sine(x, 0.5)
    prob = dataclasses.replace(pinn.problems.heat_problem(alpha=0.5, grid_shape=(9, 7)),
                               reference=reference)
    u = lambda x: tf.sin(x[:, :1]) + x[:, 1:]  # noqa: E731
    first = pinn.relative_l2(prob, u, tf.float64)
    assert pinn.relative_l2(prob, u, tf.float64) == first and calls == [63]
    np.testing.assert_array_equal(prob.reference_on_grid, reference(prob.grid))
    with pytest.raises(ValueError, match="read-only"):
        prob.reference_on_grid[0] = 0.0
    # another problem (another grid) computes its own
    other = dataclasses.replace(prob, grid=prob.grid[:5], grid_shape=None)
    np.testing.assert_array_equal(other.reference_on_grid, reference(prob.grid[:5]))
    assert dataclasses.replace(prob, reference=None).reference_on_grid is None


def test_problems_are_built_with_keywords_and_checked():
    box = pinn.Box((0.0,), (1.0,))
    pde = pinn.PDE([(0, 0)], lambda x, d: d[(0, 0)])
    prob = pinn.Problem(name="line", pde=pde, domain=box)
    assert prob.conditions == () and prob.unknowns == () and prob.data is None
    with pytest.raises(TypeError):  # positional fields would break when a field is added
        pinn.Problem("line", pde, box)
    with pytest.raises(ValueError, match="a PDE is required"):
        pinn.Problem(name="line", domain=box)
    with pytest.raises(ValueError, match="unknowns and pde_with go together"):
        pinn.Problem(name="line", domain=box, unknowns=[pinn.Unknown("k", 1.0)])
    with pytest.raises(ValueError, match=r"grid must be \[n, 1\] points \(n = prod\(grid_shape\)"):
        pinn.Problem(name="line", pde=pde, domain=box, grid=np.zeros((4, 1)), grid_shape=(5,))
    with pytest.raises(ValueError, match=r"data must be Observations\(points \[n, 1\]"):
        pinn.Problem(name="line", pde=pde, domain=box,
                     data=pinn.Observations(np.zeros((3, 2)), np.zeros((3, 1))))
    with pytest.raises(ValueError, match="initial value must be > 0"):
        pinn.Unknown("k", -1.0, positive=True).variable()


def test_an_inverse_problem_reads_its_unknowns_and_fits_its_data():
    prob = pinn.problems.burgers_inverse_problem(n_observations=16, initial=0.05)
    assert [u.name for u in prob.unknowns] == ["viscosity"] and prob.pde is None
    x = pts(32)
    with pytest.raises(ValueError, match="no PDE yet.*bind_unknowns"):  # never the truth
        pinn.pinn_loss(prob, lambda x: x[:, :1], x, [])
    variable = prob.unknowns[0].variable(tf.float64)
    assert variable.dtype == tf.float64  # exp(log 0.05) = 0.05: no float32 on the way
    np.testing.assert_allclose(float(prob.unknowns[0].value(variable)), 0.05, rtol=1e-15)
    with pytest.raises(ValueError, match=r"unknowns \['viscosity'\], got variables for \['nu'\]"):
        pinn.bind_unknowns(prob, {"nu": variable})
    bound = pinn.bind_unknowns(prob, {"viscosity": variable})
    # oracle: the travelling wave c - a tanh(a (x - c t) / 2 nu) solves Burgers with nu
    nu = 0.03
    wave = lambda x: 0.3 - 0.5 * tf.tanh(0.5 * (x[:, :1] - 0.3 * x[:, 1:]) / (2 * nu))  # noqa
    variable.assign(math.log(nu))  # the PDE reads the variable at every evaluation
    np.testing.assert_allclose(pinn.residual(bound.pde, wave, x), 0.0, atol=1e-12)
    variable.assign(math.log(0.05))
    assert np.abs(pinn.residual(bound.pde, wave, x)).max() > 1e-3
    loss_fn = pinn.pinn_loss(bound, wave, x, [])
    assert pinn.term_names(bound) == ["residual", "data"] == list(loss_fn())
    data_x, data_y = prob.data  # the data term against numpy on the observations
    want = np.mean((wave(tf.constant(data_x, tf.float64)).numpy() - data_y) ** 2)
    np.testing.assert_allclose(float(loss_fn()["data"]), want, rtol=1e-12)
    # d residual term / d log nu against float64 central differences
    import hogrod
    got = float(hogrod.grad(lambda: loss_fn()["residual"], [variable])[0])
    h, v0 = 1e-6, float(variable)
    sides = []
    for v in (v0 + h, v0 - h):
        variable.assign(v)
        sides.append(float(loss_fn()["residual"]))
    np.testing.assert_allclose(got, (sides[0] - sides[1]) / (2 * h), rtol=1e-6)
    variable.assign(v0)
    true = 0.01 / math.pi
    assert pinn.unknowns_report(prob, {"viscosity": variable}) == pytest.approx(
        {"viscosity": 0.05, "viscosity_true": true, "viscosity_rel_err": (0.05 - true) / true})


def test_a_new_equation_is_one_pde_line_and_one_problem_factory():
    """pinn.pdes.advection (one PDE line) and pinn.problems.advection_problem: the exact solution
    sin(pi (x - c t)) zeroes every loss term, the numpy reference agrees with it, and the
    output transform meets the initial condition whatever the network says."""
    c = 0.5
    prob = pinn.problems.advection_problem(c=c, grid_shape=(9, 5))
    exact = lambda x: tf.sin(math.pi * (x[:, :1] - c * x[:, 1:]))  # noqa: E731
    x = tf.constant(pinn.sample(prob.domain, 64, "sobol", 0), tf.float64)
    conds = [tf.constant(fn(16, 1), tf.float64) for _, fn, _ in prob.conditions]
    terms = pinn.pinn_loss(prob, exact, x, conds)()
    assert set(terms) == {"residual", "inflow"}
    for name, value in terms.items():
        assert float(value) < 1e-24, name
    wrong = lambda x: tf.sin(math.pi * (x[:, :1] - 0.6 * x[:, 1:]))  # noqa: E731
    assert float(pinn.pinn_loss(prob, wrong, x, conds)()["residual"]) > 1e-3
    assert pinn.relative_l2(prob, exact, tf.float64) < 1e-12
    x0 = tf.concat([x[:, :1], 0.0 * x[:, 1:]], 1)
    u = pinn.solution_fn(prob, lambda x: 7.0 + x[:, :1] ** 2)
    np.testing.assert_allclose(u(x0), np.sin(np.pi * x0[:, :1]), atol=1e-12)
    with pytest.raises(ValueError, match="advection_problem.c must be > 0"):
        pinn.problems.advection_problem(c=-1.0)


def test_clock_leaves_out_paused_time_and_time_to_error_reads_the_curve(monkeypatch):
    from hogrod.pinn import training
    now = [100.0]
    monkeypatch.setattr(training.time, "perf_counter", lambda: now[0])
    clock = pinn.training.Clock(offset=5.0)  # a resumed run's earlier 5 s
    now[0] += 2.0
    with clock.paused():
        now[0] += 3.0
        assert clock.seconds() == 7.0  # the time the pause began
        with clock.paused():  # nested: counted once
            now[0] += 1.0
    now[0] += 0.5
    assert clock.seconds() == 7.5
    curve = [[1.0, "adam", 10, 0.5], [2.0, "adam", 20, None], [3.0, "lbfgs", 5, 0.009],
             [4.0, "end", 9, 0.0005]]
    assert [pinn.seconds_to_error(curve, t) for t in (0.6, 0.01, 1e-3, 1e-4)] == [
        1.0, 3.0, 4.0, None]
    with pytest.raises(ValueError, match="threshold must be > 0"):
        pinn.seconds_to_error(curve, 0.0)
