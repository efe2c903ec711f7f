"""hogrod.implicit against closed forms: ridge regression x*(lam, b) = (A^T A + lam I)^{-1}
A^T b (d loss/d lam and d loss/d b in float64) for every solve; a linear fixed point
x = M x + c with a non-symmetric contraction M; eagerly, in tf.function, per task in
tf.vectorized_map, per replica under MirroredStrategy; the solver never differentiated;
bad input."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod import distribute, implicit, tree

RNG = np.random.default_rng(0)
A = RNG.normal(size=(8, 5))
B = RNG.normal(size=8)
T = RNG.normal(size=5)
LAM = 0.7


def ridge_f(x, lam, a, b):  # the gradient of 0.5 |a x - b|^2 + 0.5 lam |x|^2
    return tf.linalg.matvec(a, tf.linalg.matvec(a, x) - b, transpose_a=True) + lam * x


def ridge_exact(lam, a, b):
    return tf.linalg.solve(tf.matmul(a, a, transpose_a=True) + lam * tf.eye(5, dtype=a.dtype),
                           tf.linalg.matvec(a, b, transpose_a=True)[:, None])[:, 0]


def ridge_oracle(lam=LAM, a=A, b=B, t=T):
    """Closed form: with H = A^T A + lam I, g = x - t: dL/dlam = -g^T H^{-1} x,
    dL/db = A H^{-1} g."""
    h = a.T @ a + lam * np.eye(a.shape[1])
    x = np.linalg.solve(h, a.T @ b)
    g = x - t
    return -g @ np.linalg.solve(h, x), a @ np.linalg.solve(h, g)


def outer(solver, lam, b, a=A):
    lam, b = tf.constant(lam, tf.float64), tf.constant(b, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([lam, b])
        x = solver(tf.zeros(5, tf.float64), lam, tf.constant(a), b)
        loss = 0.5 * tf.reduce_sum((x - T) ** 2)
    return tape.gradient(loss, [lam, b])


def my_solve(matvec, b):  # a user solve: dense, from matvec on the basis
    n = b.shape[0]
    cols = [matvec(tf.one_hot(i, n, dtype=b.dtype)) for i in range(n)]
    return tf.linalg.solve(tf.stack(cols, 1), b[:, None])[:, 0]


@pytest.mark.parametrize("solve,options,rtol", [
    ("cg", {"tol": 1e-13}, 1e-10), ("dense", {}, 1e-10), ("normal_cg", {"tol": 1e-14}, 1e-10),
    (my_solve, {}, 1e-10), ("neumann", {"step": None, "maxiter": 3000, "tol": 1e-10}, 1e-7)])
def test_ridge_gradient_matches_the_closed_form(solve, options, rtol):
    options = dict(options)
    if "step" in options:  # 1 / lambda_max: the series' spectral radius is < 1
        options["step"] = 1.0 / np.linalg.eigvalsh(A.T @ A + LAM * np.eye(5)).max()
    solver = implicit.custom_root(ridge_f, solve=solve, **options)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))
    d_lam, d_b = outer(solver, LAM, B)
    want_lam, want_b = ridge_oracle()
    np.testing.assert_allclose(d_lam.numpy(), want_lam, rtol=rtol)
    np.testing.assert_allclose(d_b.numpy(), want_b, rtol=rtol)
