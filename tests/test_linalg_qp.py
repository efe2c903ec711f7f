"""hogrod.linalg.simplex_qp against scipy's SLSQP and the KKT conditions checked in numpy
(feasibility, stationarity on the free coordinates, nonnegative multipliers on the active
bounds: a certificate of optimality for a convex QP); batched equal to one problem at a
time; the Crammer-Singer dual of a 60-way 1-shot episode in tens of iterations; a problem
never accepted is reported, not returned as solved."""

import numpy as np
import scipy.optimize
import tensorflow as tf

from hogrod import linalg


def problems(batch, n, m, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    x = scale * rng.normal(size=(batch, n, n + 2))
    kernel = x @ np.swapaxes(x, -1, -2) + np.eye(n)
    return kernel, rng.normal(size=(batch, n, m))


def kkt_accept(kernel, linear, radius, tol=1e-10):
    """The caller's certificate, in TF: each candidate's KKT residual against `tol` times
    the problem's scale."""
    kernel, linear = tf.constant(kernel), tf.constant(linear)

    def accept(s):
        g = tf.linalg.matmul(kernel, s) + linear
        free = tf.cast(s > 0, s.dtype)
        level = tf.reduce_sum(free * g, -1, keepdims=True) / tf.reduce_sum(free, -1,
                                                                          keepdims=True)
        residual = (tf.norm(free * (g - level), axis=[-2, -1])
                    + tf.norm((1 - free) * tf.minimum(g - level, 0), axis=[-2, -1])
                    + tf.norm(tf.minimum(s, 0), axis=[-2, -1])
                    + tf.norm(tf.reduce_sum(s, -1) - radius, axis=-1))
        scale = tf.reduce_max(tf.abs(linear), [-2, -1]) + tf.linalg.norm(kernel, axis=[-2, -1])
        return residual <= tol * scale
    return accept


def numpy_kkt(s, kernel, linear, radius, atol):
    g = kernel @ s + linear
    assert np.all(s >= 0)
    np.testing.assert_allclose(s.sum(-1), radius, atol=atol)
    for i in range(len(s)):
        free = s[i] > 0
        level = g[i, free].mean()
        np.testing.assert_allclose(g[i, free], level, atol=atol)
        assert np.all(g[i, ~free] - level >= -atol)  # the bounds' multipliers


def scipy_solution(kernel, linear, radius):
    n, m = linear.shape

    def objective(v):
        s = v.reshape(n, m)
        return 0.5 * np.sum(s * (kernel @ s)) + np.sum(linear * s)

    def jac(v):
        s = v.reshape(n, m)
        return (kernel @ s + linear).ravel()

    rows = np.kron(np.eye(n), np.ones(m))
    res = scipy.optimize.minimize(
        objective, np.full(n * m, radius / m), jac=jac, method="SLSQP",
        bounds=[(0, None)] * (n * m), options={"ftol": 1e-15, "maxiter": 1000},
        constraints=[{"type": "eq", "fun": lambda v: rows @ v - radius, "jac": lambda v: rows}])
    assert res.success, res.message
    return res.x.reshape(n, m)


def solve(kernel, linear, radius, maxiter=100, accept=None):
    accept = accept or kkt_accept(kernel, linear, radius)
    return linalg.simplex_qp(tf.constant(kernel), tf.constant(linear),
                             tf.constant(radius, tf.float64), tf.constant(maxiter), accept)


def test_simplex_qp_matches_scipy_and_satisfies_kkt_batched_and_alone():
    kernel, linear = problems(3, 6, 4, seed=0)
    radius = 0.7
    result = solve(kernel, linear, radius)
    assert result.accepted.numpy().all()
    s = result.solution.numpy()
    for b in range(3):
        numpy_kkt(s[b], kernel[b], linear[b], radius, atol=1e-9)
        np.testing.assert_allclose(s[b], scipy_solution(kernel[b], linear[b], radius),
                                   atol=1e-6)
        alone = solve(kernel[b], linear[b], radius)
        np.testing.assert_allclose(alone.solution.numpy(), s[b], atol=1e-12)
        assert 0 < np.mean(s[b] == 0) < 1  # some bounds active, some not
    # inside tf.function, with its own iteration count
    fn = tf.function(lambda k, q: linalg.simplex_qp(k, q, tf.constant(radius, tf.float64),
                                                    tf.constant(100),
                                                    kkt_accept(kernel, linear, radius)))
    np.testing.assert_allclose(fn(tf.constant(kernel), tf.constant(linear)).solution.numpy(),
                               s, atol=1e-12)


def test_the_crammer_singer_dual_of_a_60_way_episode_takes_tens_of_iterations():
    # MetaOptNet's dual on 60-way 1-shot embeddings of norm ~8 (64-d): its slacks
    # S = c Y - alpha on simplices of radius c, kernel X X^T + I, linear term Y - K c Y
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 64))
    kernel = x @ x.T + np.eye(60)
    y = np.eye(60)
    c = 0.1
    linear = y - kernel @ (c * y)
    result = solve(kernel, linear, c)
    assert bool(result.accepted.numpy().all())
    # 13 with Mehrotra's corrector, 22 without its second-order term
    assert int(result.iterations) <= 16, int(result.iterations)
    numpy_kkt(result.solution.numpy(), kernel, linear, c, atol=1e-8)


def test_a_problem_never_accepted_is_reported_after_maxiter():
    kernel, linear = problems(2, 5, 3, seed=1)
    never = lambda s: tf.zeros(tf.shape(s)[:-2], tf.bool)  # noqa: E731
    result = solve(kernel, linear, 1.0, maxiter=7, accept=never)
    assert not result.accepted.numpy().any() and int(result.iterations) == 7
    # the first problem accepted, the second not: each reported on its own
    accept = kkt_accept(kernel, linear, 1.0)
    first = lambda s: tf.logical_and(accept(s), tf.constant([True, False]))  # noqa: E731
    result = solve(kernel, linear, 1.0, maxiter=40, accept=first)
    np.testing.assert_array_equal(result.accepted.numpy(), [True, False])
    numpy_kkt(result.solution.numpy()[0], kernel[0], linear[0], 1.0, atol=1e-9)
