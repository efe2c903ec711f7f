"""Curvature tools against dense oracles (`hogrod.hessian`, numpy) and known spectra."""

import keras
import numpy as np
import pytest
import scipy.optimize
import tensorflow as tf

import hogrod
from hogrod import curvature


def small_problem(dtype="float64", n=40, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,), dtype=dtype),
                              keras.layers.Dense(6, activation="tanh", dtype=dtype),
                              keras.layers.Dense(3, dtype=dtype)])
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(n, 4)), dtype)
    y = tf.constant(rng.integers(0, 3, size=n), tf.int32)

    def loss(batch):
        xb, yb = batch
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, model(xb)))
    return model, loss, (x, y)


def known_spectrum(eigenvalues, seed=0):
    n = len(eigenvalues)
    Q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return Q @ np.diag(eigenvalues) @ Q.T


def test_hessian_operator_over_batch_and_over_dataset_equals_dense_hessian():
    model, loss, (x, y) = small_problem()
    dense = hogrod.hessian(lambda: loss((x, y)), model.trainable_variables).numpy()
    op = curvature.HessianOperator(loss, model.trainable_variables, (x, y), tf.float64)
    np.testing.assert_allclose(op.to_dense(), dense, rtol=1e-9, atol=1e-12)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(15)  # 15 + 15 + 10: size-weighted
    op_ds = curvature.HessianOperator(loss, model.trainable_variables, data, tf.float64)
    v = np.random.default_rng(1).normal(size=dense.shape[0])
    np.testing.assert_allclose(op_ds.matvec(tf.constant(v)), dense @ v, rtol=1e-9, atol=1e-12)
    assert op_ds.num_matvecs == 1
    # tf.linalg works on it
    assert isinstance(op, tf.linalg.LinearOperator) and op.is_self_adjoint


def test_gauss_newton_operator_equals_jt_h_j_and_is_psd():
    model, loss, (x, y) = small_problem()
    ce = lambda z, b: tf.reduce_mean(  # noqa: E731
        tf.nn.sparse_softmax_cross_entropy_with_logits(b[1], z))
    op = curvature.GaussNewtonOperator(lambda b: model(b[0]), ce, model.trainable_variables,
                                       (x, y), tf.float64)
    G = op.to_dense().numpy()
    J = np.concatenate([np.reshape(j, (120, -1)) for j in hogrod.jacobian(
        lambda ps: tf.reshape(hogrod.functional_call(model, ps, x), [-1]),
        hogrod.trainable_values(model))], axis=1)
    p = tf.nn.softmax(model(x)).numpy()
    H_L = np.zeros((120, 120))
    for i in range(40):
        H_L[3 * i:3 * i + 3, 3 * i:3 * i + 3] = (np.diag(p[i]) - np.outer(p[i], p[i])) / 40
    np.testing.assert_allclose(G, J.T @ H_L @ J, rtol=1e-8, atol=1e-12)
    assert np.linalg.eigvalsh(G).min() > -1e-10


def test_per_layer_operator_is_the_diagonal_block():
    model, loss, batch = small_problem()
    dense = hogrod.hessian(lambda: loss(batch), model.trainable_variables).numpy()
    op = curvature.HessianOperator(loss, curvature.layer_params(model, model.layers[1].name),
                                   batch, tf.float64)
    n0 = 4 * 6 + 6
    np.testing.assert_allclose(op.to_dense(), dense[n0:, n0:], rtol=1e-9, atol=1e-12)


def test_float32_and_float64_operators_agree():
    model, loss, batch = small_problem()
    v = np.random.default_rng(2).normal(size=51)
    op64 = curvature.HessianOperator(loss, model.trainable_variables, batch, tf.float64)
    model32, loss32, (x, y) = small_problem("float32")
    for a, b in zip(model32.trainable_variables, model.trainable_variables):
        a.assign(tf.cast(b, tf.float32))
    op32 = curvature.HessianOperator(loss32, model32.trainable_variables,
                                     (tf.cast(x, tf.float32), y), tf.float32)
    np.testing.assert_allclose(op32.matvec(tf.constant(v, tf.float32)),
                               op64.matvec(tf.constant(v)), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("method", [curvature.lanczos, curvature.power_iteration])
def test_eigenvalues_of_a_known_spectrum_largest_and_smallest(method):
    spectrum = np.concatenate([[10.0, 7.0, 5.0, 4.0, 3.5], np.linspace(-2.0, 1.0, 55)])
    A = known_spectrum(spectrum)
    vals, vecs, count = method(A, k=5, tol=1e-10, **({"max_iterations": 5000}
                                                      if method is curvature.power_iteration
                                                      else {}))
    np.testing.assert_allclose(vals, [10, 7, 5, 4, 3.5], rtol=1e-6)
    np.testing.assert_allclose(np.abs(np.sum(vecs * (A @ vecs), axis=0)), vals, rtol=1e-6)
    low, _, _ = method(A, k=2, which="smallest", tol=1e-12,
                       **({"max_iterations": 20000} if method is curvature.power_iteration
                          else {}))
    np.testing.assert_allclose(low, [-2.0, spectrum[6]], rtol=1e-4)


def test_lanczos_on_a_model_matches_eigh_and_is_deterministic():
    model, loss, batch = small_problem()
    op = curvature.HessianOperator(loss, model.trainable_variables, batch, tf.float64)
    exact = np.sort(np.linalg.eigvalsh(hogrod.hessian(lambda: loss(batch),
                                                      model.trainable_variables).numpy()))[::-1]
    vals, _, count = curvature.lanczos(op, k=5, tol=1e-10)
    np.testing.assert_allclose(vals, exact[:5], rtol=1e-4)
    assert count <= 51
    again, _, _ = curvature.lanczos(op, k=5, tol=1e-10)
    np.testing.assert_array_equal(vals, again)


def test_k_larger_than_dimension_is_a_clear_error():
    with pytest.raises(ValueError, match="k=7 must be between 1 and the operator's dimension n=5"):
        curvature.lanczos(np.eye(5), k=7)
    with pytest.raises(ValueError, match="k=0"):
        curvature.power_iteration(np.eye(5), k=0)


def test_trace_estimators_within_three_standard_errors_and_deterministic():
    A = known_spectrum(np.concatenate([[50.0, 30.0, 20.0], np.random.default_rng(3).uniform(
        -1, 2, 97)]))
    exact = np.trace(A)
    for fn in (curvature.hutchinson, curvature.hutchpp):
        est, se = fn(A, 90, seed=4)
        assert abs(est - exact) <= 3 * se + 1e-9, (fn.__name__, est, exact, se)
        assert fn(A, 90, seed=4) == (est, se)
    # Hutch++ removes the dominant eigenvalues from the variance.
    assert curvature.hutchpp(A, 90, 4)[1] < curvature.hutchinson(A, 90, 4)[1]


def test_spectral_density_integrates_to_one_and_locates_the_spectrum():
    spectrum = np.concatenate([np.full(30, -1.0), np.full(50, 2.0), [9.0]])
    A = known_spectrum(spectrum)
    grid, density, nodes, weights = curvature.spectral_density(A, num_iterations=20,
                                                               num_runs=10, sigma=0.1)
    np.testing.assert_allclose(np.trapezoid(density, grid), 1.0, rtol=1e-6)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-12)
    mass_near = lambda c: weights[np.abs(nodes - c) < 0.05].sum()  # noqa: E731
    np.testing.assert_allclose(mass_near(2.0), 50 / 81, atol=0.1)
    np.testing.assert_allclose(mass_near(-1.0), 30 / 81, atol=0.1)


def test_conjugate_gradient_lissa_and_the_singular_case():
    A = known_spectrum(np.linspace(0.5, 4.0, 30))
    b = np.random.default_rng(5).normal(size=30)
    x, _ = curvature.conjugate_gradient(A, b, damping=0.1)
    np.testing.assert_allclose(x, np.linalg.solve(A + 0.1 * np.eye(30), b), rtol=1e-7)
    lx = curvature.lissa(A, b, damping=0.1, scale=5.0, depth=400)
    np.testing.assert_allclose(lx, np.linalg.solve(A + 0.1 * np.eye(30), b), rtol=1e-5)
    singular = known_spectrum(np.concatenate([np.zeros(5), np.linspace(1, 2, 25)]))
    with pytest.raises(ValueError, match="singular or indefinite; add damping"):
        curvature.conjugate_gradient(singular, np.random.default_rng(6).normal(size=30))
    with pytest.raises(ValueError, match="lissa diverged"):
        curvature.lissa(A, b, scale=1.0, depth=400)


def logistic_problem(n=60, d=4, l2=0.05, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = (x @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0).astype(np.float64)
    return x, y, l2


def fit_logistic(x, y, l2, w0=None):
    def f(w):
        z = x @ w
        p = 1 / (1 + np.exp(-z))
        loss = np.mean(np.logaddexp(0, z) - y * z) + 0.5 * l2 * w @ w
        return loss, x.T @ (p - y) / len(y) + l2 * w
    return scipy.optimize.minimize(f, np.zeros(x.shape[1]) if w0 is None else w0, jac=True,
                                   method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 0}).x


def test_influence_matches_leave_one_out_retraining():
    x, y, l2 = logistic_problem()
    w = fit_logistic(x, y, l2)
    model = keras.Sequential([keras.Input((4,), dtype="float64"),
                              keras.layers.Dense(1, use_bias=False, dtype="float64")])
    model.trainable_variables[0].assign(w[:, None])

    def per_example(yt, logits):
        return (tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(yt, logits.dtype), logits[:, 0])
                + 0.5 * l2 * tf.reduce_sum(model.trainable_variables[0] ** 2))

    x_test, y_test = x[:3] + 0.3, y[:3]
    infl = curvature.influence(model, per_example, (x, y), (x_test, y_test))
    test_loss = lambda w: np.logaddexp(0, x_test @ w) - y_test * (x_test @ w)  # noqa: E731
    actual = np.stack([test_loss(fit_logistic(np.delete(x, i, 0), np.delete(y, i), l2, w))
                       - test_loss(w) for i in range(len(y))], axis=1)
    predicted = -infl / len(y)
    for j in range(3):
        r = np.corrcoef(predicted[j], actual[j])[0, 1]
        assert r >= 0.95, (j, r)


def test_spectrum_and_influence_binaries_check_themselves_against_dense_oracles(tmp_path):
    from experiments import hessian_spectrum, influence
    from hogrod import harness
    _, m = harness.run(hessian_spectrum.hessian_spectrum, ["configs/curvature/spectrum_mlp.gin"],
                       ["hessian_spectrum.hidden = (8,)", "hessian_spectrum.steps = 30",
                        "hessian_spectrum.n_examples = 256", "hessian_spectrum.slq_iterations = 20",
                        "hessian_spectrum.hutchpp_matvecs = 30"], str(tmp_path / "s"))
    assert m["top_eigenvalue_max_rel_err"] < 1e-4
    assert m["trace_error_in_se"] < 3
    np.testing.assert_allclose(m["density_integral"], 1.0, rtol=1e-6)
    assert (tmp_path / "s" / "density.png").exists()
    _, m = harness.run(influence.influence_experiment, ["configs/curvature/influence_logistic.gin"],
                       ["influence_experiment.n_train = 60"], str(tmp_path / "i"))
    assert m["min_pearson"] >= 0.95
