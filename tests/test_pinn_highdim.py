"""The high-dimensional Poisson problem: its closed-form source against autodiff, its
randomized residual against the exact one, its ball sampling against the uniform law."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod import pinn
from conftest import bench_config

DIM = 4


def points(n, dim=DIM, seed=1):
    return tf.constant(pinn.sample(pinn.Disk(np.zeros(dim), 1.0), n, "sobol", seed,
                                   dtype=np.float64))


def coefficients(dim=DIM, seed=0):
    return np.random.default_rng(seed).standard_normal(dim - 1)  # the problem's c_i


def test_residual_vanishes_on_the_analytic_solution():
    """The hand-derived Laplacian against reverse-over-reverse autodiff, float64."""
    prob = pinn.problems.poisson_nd_problem(dim=DIM, laplacian=pinn.pdes.exact_laplacian,
                                            n_test=10)
    x, c = points(30), coefficients()
    solution = lambda z: pinn.problems.two_body_solution(z, c)  # noqa: E731
    np.testing.assert_allclose(pinn.residual(prob.pde, solution, x), 0.0, atol=1e-12)
    wrong = lambda z: pinn.problems.two_body_solution(z, c + 0.1)  # noqa: E731
    assert np.abs(pinn.residual(prob.pde, wrong, x)).max() > 1e-2
    np.testing.assert_allclose(prob.reference(x.numpy()), solution(x).numpy(), rtol=1e-15)
    assert prob.transform(x, tf.ones([30, 1], tf.float64)).shape == (30, 1)


def test_randomized_residual_is_unbiased_with_a_new_seed_each_step():
    """The mean of the compiled randomized residual over calls matches the exact one within
    5 standard errors (its spread over the calls); one trace for every call."""
    exact = pinn.problems.poisson_nd_problem(dim=DIM, laplacian=pinn.pdes.exact_laplacian,
                                             n_test=10)
    random = pinn.problems.poisson_nd_problem(
        dim=DIM, n_test=10, laplacian=lambda: pinn.pdes.randomized_laplacian(num_probes=4))
    x, c = points(12), coefficients()
    wrong = lambda z: pinn.problems.two_body_solution(z, c + 1.0)  # noqa: E731
    step = tf.function(lambda: pinn.residual(random.pde, wrong, x))
    draws = np.stack([step().numpy() for _ in range(100)])
    assert step.experimental_get_tracing_count() == 1
    assert np.all(draws.std(axis=0) > 0)  # new probes at every call
    se = draws.std(axis=0, ddof=1) / np.sqrt(len(draws))
    target = pinn.residual(exact.pde, wrong, x).numpy()
    assert np.all(np.abs(draws.mean(axis=0) - target) < 5 * se)
    assert np.abs(target).max() > 10 * se.max()  # a test that can fail


def test_points_are_uniform_in_a_high_dimensional_ball():
    """|x| <= 1, and r^d ~ Uniform(0, 1) for uniform points in the d-ball (mean 1/2, sd
    1/sqrt(12 n)); the directions are centred."""
    x = points(4000, dim=50, seed=3).numpy()
    r = np.linalg.norm(x, axis=1)
    assert r.max() <= 1.0 + 1e-12
    assert abs(np.mean(r ** 50) - 0.5) < 4 / np.sqrt(12 * 4000)
    assert np.abs(x.mean(axis=0)).max() < 5 / np.sqrt(50 * 4000)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"laplacian": "hutchinson"}, TypeError, "poisson_nd_problem.laplacian"),
    ({"laplacian": lambda: 3}, TypeError, "poisson_nd_problem.laplacian"),
    ({"laplacian": lambda: pinn.pdes.randomized_laplacian(method="sdgd")}, ValueError,
     "randomized_laplacian.method"),
    ({"laplacian": lambda: pinn.pdes.randomized_laplacian(num_probes=0)}, ValueError,
     "randomized_laplacian.num_probes"),
    ({"dim": 1}, ValueError, "poisson_nd_problem.dim"),
])
def test_bad_bindings_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        pinn.problems.poisson_nd_problem(**{"n_test": 10, **kwargs})


def test_the_highdim_benchmark_times_both_laplacians_and_their_ratio(tmp_path):
    from experiments.bench import pinn_highdim
    from hogrod import harness
    _, m = harness.run(pinn_highdim.bench_pinn_highdim, [bench_config("pinn_highdim")], [
        "bench_pinn_highdim.dims = (3,)", "bench_pinn_highdim.exact_dims = (3,)",
        "bench_pinn_highdim.points = 16", "bench_pinn_highdim.steps = 1",
        "bench_pinn_highdim.probes = 2"], str(tmp_path))
    assert m["d3_exact_over_randomized"] == m["d3_exact_step_s"] / m["d3_hutchinson_2_step_s"]
    assert m["d3_exact_first_call_s"] > 0


def test_fresh_points_change_every_k_steps_and_the_step_traces_once():
    """`pinn_experiment.resample_every`: the batches change exactly at multiples of k (a
    resumed stream gives the points the first run had), stay in the ball, and one compiled
    train step takes them all with a single trace (on the cheap advection problem, whose
    inflow condition's points are resampled too; its loss is deterministic, so the loss
    changes between steps only through the points)."""
    import keras
    from experiments import pinn as exp
    from hogrod import train
    ball = pinn.problems.poisson_nd_problem(dim=DIM, n_test=10)
    strategy = tf.distribute.get_strategy()
    stream = exp.fresh_batches(strategy, ball, 8, 4, "sobol", 0, tf.float32, every=2)
    pts = [next(stream)[0].numpy() for _ in range(6)]
    for i in range(5):
        assert np.array_equal(pts[i], pts[i + 1]) == (i % 2 == 0), i
    assert np.linalg.norm(np.concatenate(pts), axis=1).max() <= 1.0 + 1e-6
    resumed = exp.fresh_batches(strategy, ball, 8, 4, "sobol", 0, tf.float32, every=2,
                                start=3)
    np.testing.assert_array_equal(next(resumed)[0].numpy(), pts[3])
    prob = pinn.problems.advection_problem(grid_shape=(3, 3))
    net = exp.tanh_mlp(2, 4, 1, "float32")
    points, cond = exp.collocation(prob, 8, 4, "sobol", 0, tf.float32)
    loss_fn = pinn.pinn_loss(prob, pinn.solution_fn(prob, net), points, cond)
    step = train.make_train_step(loss_fn, keras.optimizers.Adam(0.0), net.trainable_variables)
    stream = exp.fresh_batches(strategy, prob, 8, 4, "sobol", 0, tf.float32, every=1)
    logs = [step(next(stream)) for _ in range(4)]
    assert step.experimental_get_tracing_count() == 1
    for name in ("residual", "inflow"):  # lr 0: only the points move the terms
        assert len({float(log[name]) for log in logs}) == 4, name


def test_residual_on_conditions_appends_every_condition_point_as_deepxde_does():
    """Oracle: the plain draw's collocation points followed by its condition points (DeepXDE's
    `PDE`/`TimePDE` fit the residual on `train_x_all`: domain, boundary and initial points);
    the fresh-point stream draws the same set."""
    from experiments import pinn as exp
    prob = pinn.problems.advection_problem(grid_shape=(3, 3))
    plain, cond = exp.collocation(prob, 8, {"inflow": 5}, "sobol", 0, tf.float64)
    points, cond_too = exp.collocation(prob, 8, {"inflow": 5}, "sobol", 0,
                                       tf.float64, residual_on_conditions=True)
    np.testing.assert_array_equal(points.numpy(),
                                  np.concatenate([plain.numpy()] + [c.numpy() for c in cond]))
    for a, b in zip(cond, cond_too):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    stream = exp.fresh_batches(tf.distribute.get_strategy(), prob, 8, 4, "sobol", 0,
                               tf.float64, every=1, residual_on_conditions=True)
    assert next(stream)[0].shape[0] == 8 + 4
    with pytest.raises(ValueError, match="pinn_experiment.residual_on_conditions"):
        exp.collocation(prob, 8, 4, "sobol", 0, tf.float64, residual_on_conditions="yes")


@pytest.mark.parametrize("kwargs,match", [
    ({"resample_every": 0}, "pinn_experiment.resample_every"),
    ({"resample_every": 1, "weighting": lambda *a, **k: pinn.Weighting()},
     "pinn_experiment.weighting = None"),
])
def test_bad_resampling_bindings_are_clear_errors(tmp_path, kwargs, match):
    from experiments import pinn as exp
    problem = lambda: pinn.problems.poisson_nd_problem(dim=DIM, n_test=10)  # noqa: E731
    with pytest.raises(ValueError, match=match):
        exp.pinn_experiment(str(tmp_path), problem=problem, width=4, depth=1, n_collocation=8,
                            adam_steps=1, lbfgs_maxiter=0, **kwargs)
