"""The PES paper's problems in hogrod.learned against closed forms (float64).

Oracles: influence balancing's steady state and its optimum theta* = -1/6 in closed form;
the exact gradient of its k-step loss, in numpy (s_k and ds_k/dtheta by recursion), which
PES with K = 1 matches in expectation (within 4.5 standard errors) with the sign that moves
theta toward theta*, while TBPTT with K = 1 equals the numpy one-step gradient, of the other
sign (the paper's Figure 4); the toy regression's loss and one SGD step by numpy, its
schedule's gradient through a whole unroll by float64 central differences.
"""

import gin
import numpy as np
import tensorflow as tf

from hogrod import learned

F64 = tf.float64


def influence_matrices(n=23, positives=10):
    a = 0.5 * np.eye(n) + 0.5 * np.eye(n, k=1)
    c = np.array([1.0] * positives + [-1.0] * (n - positives))
    return a, c


def test_influence_balancing_settles_where_the_closed_form_says():
    assert abs(learned.influence_balancing_optimum() + 1 / 6) < 1e-15
    assert abs(learned.influence_balancing_optimum(n=3, positives=1, diagonal=0.2,
                                                   superdiagonal=0.3)
               - 1 / (1 / 0.8 - 0.3 / 0.8 ** 2 - 0.09 / 0.8 ** 3)) < 1e-12
    problem = learned.influence_balancing()
    at_optimum = learned.evaluate(problem, tf.constant([-1 / 6], F64), 500)
    assert at_optimum.numpy() < 1e-20
    a, c = influence_matrices()
    s = np.ones(23)
    for _ in range(500):
        s = a @ s + 0.5 * c
    np.testing.assert_allclose(learned.evaluate(problem, tf.constant([0.5], F64), 500).numpy(),
                               0.5 * (s[0] - 1) ** 2, rtol=1e-12)
    np.testing.assert_allclose(s[0], -3.0, rtol=1e-12)  # -6 theta: the steady state


def test_pes_with_k1_points_toward_the_optimum_and_tbptt_the_other_way():
    """After 100 truncations of one step from the all-ones state at theta = 0.5, PES's
    estimate matches the exact gradient of the 100-step loss (positive: descent lowers theta
    toward -1/6); TBPTT's is exactly (s_0 - 1) c_0 < 0."""
    problem, theta, steps = learned.influence_balancing(), tf.constant([0.5], F64), 100
    a, c = influence_matrices()
    s, m = np.ones(23), np.zeros(23)
    for _ in range(steps):
        s, m = a @ s + 0.5 * c, a @ m + c
    exact = (s[0] - 1) * m[0]
    assert exact > 20
    estimates = {}
    for name, estimator in (("pes", learned.pes(sigma=0.1, particles=10_000, truncation=1)),
                            ("tbptt", learned.tbptt(particles=1, truncation=1))):
        run = tf.function(lambda t, st, sd, e=estimator: e.estimate(problem, t, st, sd),
                          autograph=False)
        state = estimator.init(problem, theta, 0)
        for k in range(steps):
            estimate, state = run(theta, state, tf.constant([k, 1], tf.int64))
        estimates[name] = estimate
    rows = estimates["pes"].per_particle.numpy()[:, 0]
    mean, se = rows.mean(), rows.std(ddof=1) / np.sqrt(rows.size)
    assert abs(mean - exact) < 4.5 * se, (mean, exact, se)
    assert mean - 4.5 * se > 0
    np.testing.assert_allclose(estimates["tbptt"].grads.numpy(), [(s[0] - 1) * c[0]],
                               rtol=1e-12)
    assert estimates["tbptt"].grads.numpy()[0] < 0
    # the per-particle rows are dense tensors (the gradient of the step's reshape is sparse)
    np.testing.assert_allclose(estimates["tbptt"].per_particle.numpy(), [[(s[0] - 1) * c[0]]],
                               rtol=1e-12)


def numpy_toy_loss(x):
    return (np.sqrt(x[0] ** 2 + 5) - np.sqrt(5) + np.sin(x[1]) ** 2 * np.exp(-5 * x[0] ** 2)
            + 0.25 * abs(x[1] - 100))


def numpy_toy_grad(x):
    e = np.exp(-5 * x[0] ** 2)
    return np.array([x[0] / np.sqrt(x[0] ** 2 + 5) - 10 * x[0] * np.sin(x[1]) ** 2 * e,
                     2 * np.sin(x[1]) * np.cos(x[1]) * e + 0.25 * np.sign(x[1] - 100)])


def test_the_toy_regression_steps_by_its_schedule_and_tbptt_differentiates_it():
    for x in ([1.0, 1.0], [-0.3, 2.5]):
        np.testing.assert_allclose(learned.toy_regression_loss(tf.constant(x, F64)).numpy(),
                                   numpy_toy_loss(np.array(x)), rtol=1e-14)
    horizon, theta = 8, np.array([-1.0, -2.0])
    problem = learned.toy_regression(horizon=horizon, weight_decay=0.01)
    x, t = problem.step(problem.init(tf.constant([0, 0], tf.int64)), tf.constant(theta), ())
    x0 = np.array([1.0, 1.0])
    np.testing.assert_allclose(x.numpy(), x0 - np.exp(-1.0) * (numpy_toy_grad(x0) + 0.01 * x0),
                               rtol=1e-14)
    assert t.numpy() == 1.0

    compiled_value = tf.function(lambda th: learned.evaluate(problem, th, horizon),
                                 autograph=False)

    def value(th):
        return compiled_value(tf.constant(th)).numpy()
    d = 1e-6
    differences = [(value(theta + d * e) - value(theta - d * e)) / (2 * d) for e in np.eye(2)]
    estimator = learned.tbptt(particles=1, truncation=horizon, horizon=horizon)
    state = estimator.init(problem, tf.constant(theta), 0)
    estimate, _ = tf.function(lambda th, st: estimator.estimate(problem, th, st, 0),
                              autograph=False)(tf.constant(theta), state)
    np.testing.assert_allclose(estimate.grads.numpy(), differences, rtol=1e-6)
    np.testing.assert_allclose(estimate.meta_loss.numpy(), value(theta), rtol=1e-13)


def test_estimators_and_problems_are_chosen_by_gin_reference():
    gin.parse_config("""
        hogrod.learned.meta_step.problem = @hogrod.learned.influence_balancing()
        hogrod.learned.meta_step.estimator = @hogrod.learned.pes()
        hogrod.learned.meta_step.outer_lr = 1e-4
        hogrod.learned.pes.sigma = 0.1
        hogrod.learned.pes.particles = 4
        hogrod.learned.pes.truncation = 1
        hogrod.learned.influence_balancing.n = 5
        hogrod.learned.influence_balancing.positives = 2
    """)
    meta = learned.meta_step()
    state = meta.init(tf.constant([0.5], F64), 0)
    assert state.estimator.particles.inner.shape == [4, 5]
    assert state.estimator.accumulated.shape == [4, 1]
