"""Eigenpairs (Lanczos, power iteration) against known spectra and numpy.linalg.eigh; bad input."""

import numpy as np
import pytest
import tensorflow as tf
from curvature_fixtures import known_spectrum, small_problem

import hogrod
from hogrod import curvature


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_eigenvalues_of_a_known_spectrum_largest_and_smallest(method):
    spectrum = np.concatenate([[10.0, 7.0, 5.0, 4.0, 3.5], np.linspace(-2.0, 1.0, 55)])
    A = known_spectrum(spectrum)
    vals, vecs, count = curvature.top_eigenvalues(
        A, k=5, method=method, tol=1e-10, maxiter=5000 if method == "power" else None)
    np.testing.assert_allclose(vals, [10, 7, 5, 4, 3.5], rtol=1e-6)
    if method == "lanczos":  # the Ritz residual test stops it long before n = 60
        assert count <= 30, count
    np.testing.assert_allclose(np.abs(np.sum(vecs * (A @ vecs), axis=0)), vals, rtol=1e-6)
    low, _, _ = curvature.top_eigenvalues(A, k=2, method=method, which="smallest", tol=1e-12,
                                          maxiter=20000 if method == "power" else None)
    np.testing.assert_allclose(low, [-2.0, spectrum[6]], rtol=1e-4)


def test_lanczos_on_a_model_matches_eigh_and_is_deterministic():
    model, loss, batch = small_problem()
    op = curvature.HessianOperator.from_objective(loss, model.trainable_variables, batch,
                                                  dtype=tf.float64)
    exact = np.sort(np.linalg.eigvalsh(hogrod.hessian(lambda: loss(batch),
                                                      model.trainable_variables).numpy()))[::-1]
    vals, _, count = curvature.top_eigenvalues(op, k=5, tol=1e-10)
    np.testing.assert_allclose(vals, exact[:5], rtol=1e-4)
    assert count <= 51
    again, _, _ = curvature.top_eigenvalues(op, k=5, tol=1e-10)
    np.testing.assert_array_equal(vals, again)


def test_estimators_on_a_float32_operator_match_the_float64_dense_oracle():
    model, loss, (x, y) = small_problem("float32")
    op = curvature.HessianOperator.from_objective(loss, model.trainable_variables, (x, y),
                                                  dtype=tf.float32)
    H = hogrod.hessian(lambda: loss((x, y)), model.trainable_variables).numpy().astype(np.float64)
    exact = np.sort(np.linalg.eigvalsh((H + H.T) / 2))[::-1]
    vals, vecs, _ = curvature.top_eigenvalues(op, k=3, tol=1e-5)
    np.testing.assert_allclose(vals, exact[:3], rtol=1e-3)
    assert vecs.dtype == np.float64 and np.all(np.isfinite(vecs))
    est, se = curvature.hutchpp(op, 51, seed=1)  # 17 sketch vectors: the Hessian has rank ~32
    assert abs(est - np.trace(H)) <= 3 * se + 1e-4 * abs(np.trace(H)), (est, np.trace(H), se)


def test_k_larger_than_dimension_is_a_clear_error():
    with pytest.raises(ValueError, match="top_eigenvalues: k must be an integer >= 1 and <= 5, "
                                         "got 7"):
        curvature.top_eigenvalues(np.eye(5), k=7)
    with pytest.raises(ValueError, match="got 0"):
        curvature.top_eigenvalues(np.eye(5), k=0, method="power")


def test_a_non_finite_product_is_an_error_naming_the_operator_not_a_silent_nan():
    model, loss, batch = small_problem()
    model.trainable_variables[0].assign(tf.fill(model.trainable_variables[0].shape,
                                                tf.constant(np.nan, tf.float64)))
    op = curvature.HessianOperator.from_objective(loss, model.trainable_variables, batch,
                                                  dtype=tf.float64)
    for estimate in (lambda: curvature.top_eigenvalues(op, 2),
                     lambda: curvature.top_eigenvalues(op, 1, method="power"),
                     lambda: curvature.hutchpp(op, 9),
                     lambda: curvature.spectral_density(op, 5, 1),
                     lambda: curvature.conjugate_gradient(op, np.ones(51), damping=1.0)):
        with pytest.raises(FloatingPointError, match="HessianOperator: the product .* not finite"):
            estimate()
    with pytest.raises(ValueError, match=r"square matrix, got shape \(3, 4\)"):
        curvature.top_eigenvalues(np.ones((3, 4)))


@pytest.mark.parametrize("setting", ["api", "environment"])
def test_one_inter_op_thread_is_an_error_naming_the_setting_not_a_hang(monkeypatch, setting):
    """The compiled loop holds the only inter-op thread while its host product waits for
    one to run TensorFlow: the solve would wait forever. (The setting is faked: a process
    has its thread pools once.)"""
    if setting == "api":
        monkeypatch.setattr(tf.config.threading, "get_inter_op_parallelism_threads", lambda: 1)
    else:
        monkeypatch.setattr(tf.config.threading, "get_inter_op_parallelism_threads", lambda: 0)
        monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "1")
    with pytest.raises(RuntimeError, match="TF_NUM_INTEROP_THREADS=1"):
        curvature.top_eigenvalues(np.diag([3.0, 2.0, 1.0]), k=1)
