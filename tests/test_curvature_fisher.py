"""Fisher operators, curvature diagonals and per-example gradients against independent
oracles: the Gauss-Newton operator, J^T H J with hogrod's Jacobian, numpy loops over
examples, Keras's own losses, the closed-form variance of Hutchinson's estimator."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from curvature_fixtures import small_problem

import hogrod
from hogrod import curvature, distribute

SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
MSE = keras.losses.MeanSquaredError(dtype="float64")
N = 12


def problem(n=N, dtype="float64"):
    model, _, (x, y) = small_problem(dtype, n=n)
    return model, (x, y)


def head_model(model, activation, dtype="float64"):
    """The same network with `activation` on its output (probabilities instead of logits)."""
    out = keras.Sequential([keras.Input((4,), dtype=dtype),
                            keras.layers.Dense(6, activation="tanh", dtype=dtype),
                            keras.layers.Dense(3, activation=activation, dtype=dtype)])
    for a, b in zip(out.trainable_variables, model.trainable_variables):
        a.assign(b)
    return out


def jacobian(model, x):
    """[N * C, n] d model(x) / d params, by hogrod.jacobian (the oracle's own path)."""
    n = int(x.shape[0])
    return np.concatenate([np.reshape(j, (n * 3, -1)) for j in hogrod.jacobian(
        lambda ps: tf.reshape(hogrod.functional_call(model, ps, x), [-1]),
        hogrod.trainable_values(model))], axis=1)


def block_diag(blocks):
    n, c, _ = blocks.shape
    out = np.zeros((n * c, n * c))
    for i in range(n):
        out[c * i:c * i + c, c * i:c * i + c] = blocks[i]
    return out


def dense(op):
    return op.to_dense().numpy()


def test_type2_equals_gauss_newton_operator_and_jt_h_j_for_each_loss():
    model, (x, y) = problem()
    F = dense(curvature.FisherOperator(model, SCE, (x, y)))
    keras64 = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    G = dense(curvature.GaussNewtonOperator(model, keras64, (x, y)))
    np.testing.assert_allclose(F, G, rtol=1e-10, atol=1e-14)
    J = jacobian(model, x)
    z = model(x).numpy()
    # MSE: H = 2 / (N C) I
    F = dense(curvature.FisherOperator(model, MSE, (x, z + 1)))
    np.testing.assert_allclose(F, 2 / (N * 3) * J.T @ J, rtol=1e-10, atol=1e-14)
    # BCE on logits: H = diag(p (1 - p)) / (N C); reduction "sum" drops the 1/N
    p = 1 / (1 + np.exp(-z))
    F = dense(curvature.FisherOperator(model, keras.losses.BinaryCrossentropy(
        from_logits=True, reduction="sum", dtype="float64"), (x, (z > 0).astype("float64"))))
    H = np.diag((p * (1 - p)).ravel()) / 3
    np.testing.assert_allclose(F, J.T @ H @ J, rtol=1e-10, atol=1e-14)


def test_type2_on_probabilities_equals_type2_on_logits():
    """The Fisher does not depend on how the output distribution is parametrized: a softmax
    (sigmoid) head under from_logits=False gives the logits model's Fisher."""
    model, (x, y) = problem()
    onehot = tf.one_hot(y, 3, dtype=tf.float64)
    for loss, probs, activation, labels in [
            (keras.losses.CategoricalCrossentropy(from_logits=True, dtype="float64"),
             keras.losses.CategoricalCrossentropy(dtype="float64"), "softmax", onehot),
            (keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64"),
             keras.losses.SparseCategoricalCrossentropy(dtype="float64"), "softmax", y),
            (keras.losses.BinaryCrossentropy(from_logits=True, dtype="float64"),
             keras.losses.BinaryCrossentropy(dtype="float64"), "sigmoid", onehot)]:
        F = dense(curvature.FisherOperator(model, loss, (x, labels)))
        Fp = dense(curvature.FisherOperator(head_model(model, activation), probs, (x, labels)))
        np.testing.assert_allclose(Fp, F, rtol=1e-8, atol=1e-13)
        np.testing.assert_allclose(curvature.gauss_newton_diagonal(
            head_model(model, activation), probs, (x, labels)), np.diag(F), rtol=1e-8,
            atol=1e-13)


def test_per_example_losses_equal_keras_losses():
    model, (x, y) = problem()
    z = model(x)
    onehot = tf.one_hot(y, 3, dtype=tf.float64)
    p = tf.nn.softmax(z)
    from hogrod.curvature.likelihood import likelihood_of
    for cls, kw, out, labels in [
            (keras.losses.MeanSquaredError, {}, z, z + 0.3),
            (keras.losses.SparseCategoricalCrossentropy, {"from_logits": True}, z, y),
            (keras.losses.SparseCategoricalCrossentropy, {}, p, y[:, None]),
            (keras.losses.CategoricalCrossentropy, {"from_logits": True}, z, onehot),
            (keras.losses.CategoricalCrossentropy, {}, p, onehot),
            (keras.losses.BinaryCrossentropy, {"from_logits": True}, z, onehot),
            (keras.losses.BinaryCrossentropy, {}, tf.sigmoid(z), onehot)]:
        lik, _ = likelihood_of(cls(**kw), "test")
        oracle = cls(reduction="none", dtype="float64", **kw)(labels, out)
        np.testing.assert_allclose(lik.per_example(labels, out), oracle, rtol=1e-6,
                                   err_msg=cls.__name__)  # Keras clips probabilities at 1e-7


def test_empirical_fisher_equals_a_loop_over_examples():
    model, (x, y) = problem()
    keras64 = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    rows = []
    for i in range(N):
        with tf.GradientTape() as tape:
            value = keras64(y[i:i + 1], model(x[i:i + 1]))
        rows.append(np.concatenate([np.ravel(g) for g in tape.gradient(
            value, model.trainable_variables)]))
    g = np.stack(rows)
    E = dense(curvature.FisherOperator(model, SCE, (x, y), "empirical"))
    np.testing.assert_allclose(E, g.T @ g / N, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(curvature.per_example_gradients(model, SCE, x, y, batch_size=5),
                               g, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(curvature.per_example_gradient_norms(model, SCE, x, y),
                               np.linalg.norm(g, axis=1), rtol=1e-10)
    per_example = lambda t, o: keras64.__class__(  # noqa: E731  a plain per-example callable
        from_logits=True, reduction="none", dtype="float64")(t, o)
    np.testing.assert_allclose(curvature.per_example_gradients(model, per_example, x, y), g,
                               rtol=1e-10, atol=1e-14)
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum",
                                                        dtype="float64")
    np.testing.assert_allclose(dense(curvature.FisherOperator(model, summed, (x, y),
                                                              "empirical")),
                               g.T @ g, rtol=1e-10, atol=1e-14)
    # over a data set of uneven batches: the same mean
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(5)
    np.testing.assert_allclose(dense(curvature.FisherOperator(model, SCE, ds, "empirical")),
                               E, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("loss", [SCE, MSE,
                                  keras.losses.BinaryCrossentropy(from_logits=True,
                                                                  dtype="float64")],
                         ids=["sce", "mse", "bce"])
def test_mc_fisher_converges_to_type2_like_one_over_sqrt_samples(loss):
    model, (x, y) = problem()
    labels = y if loss is SCE else tf.one_hot(y, 3, dtype=tf.float64)
    exact = curvature.gauss_newton_diagonal(model, loss, (x, labels))
    F = dense(curvature.FisherOperator(model, loss, (x, labels)))
    errors, ses = [], []
    for samples in (10, 1000):
        est, se = curvature.mc_fisher_diagonal(model, loss, (x, labels), samples, seed=1)
        M = dense(curvature.FisherOperator(model, loss, (x, labels), "mc", samples, seed=1))
        np.testing.assert_allclose(est, np.diag(M), rtol=1e-9, atol=1e-14)  # same draws
        zscore = (est - exact) / se
        assert np.mean(np.abs(zscore) < 3) > 0.9, zscore  # unbiased, honest error bars
        assert np.mean(zscore ** 2) < 2.5
        errors.append(np.linalg.norm(M - F))
        ses.append(np.linalg.norm(se))
    ratio = errors[1] / errors[0]  # predicted sqrt(10 / 1000) = 0.1
    assert 0.03 < ratio < 0.3, ratio
    assert 0.07 < ses[1] / ses[0] < 0.14


def test_exact_diagonal_equals_diagonal_of_dense_gauss_newton():
    model, (x, y) = problem()
    for loss, labels in [(SCE, y), (MSE, model(x)),
                         (keras.losses.BinaryCrossentropy(from_logits=True, dtype="float64"),
                          tf.one_hot(y, 3, dtype=tf.float64))]:
        G = dense(curvature.FisherOperator(model, loss, (x, labels)))
        np.testing.assert_allclose(curvature.gauss_newton_diagonal(model, loss, (x, labels)),
                                   np.diag(G), rtol=1e-10, atol=1e-14)
    # one layer's variables: the diagonal block (what a last-layer Laplace uses)
    head = curvature.layer_params(model, model.layers[1].name)
    n0 = 4 * 6 + 6
    full = dense(curvature.FisherOperator(model, SCE, (x, y)))
    np.testing.assert_allclose(dense(curvature.FisherOperator(model, SCE, (x, y), params=head)),
                               full[n0:, n0:], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(curvature.gauss_newton_diagonal(model, SCE, (x, y), params=head),
                               np.diag(full)[n0:], rtol=1e-10, atol=1e-14)
    # MSE on a linear model: the Gauss-Newton matrix is the Hessian (hogrod.hessian)
    lin = keras.Sequential([keras.Input((4,), dtype="float64"),
                            keras.layers.Dense(2, dtype="float64")])
    t = tf.constant(np.random.default_rng(0).normal(size=(N, 2)))
    H = hogrod.hessian(lambda: tf.reduce_mean(tf.square(lin(x) - t)), lin.trainable_variables)
    ds = tf.data.Dataset.from_tensor_slices((x, t)).batch(5)
    np.testing.assert_allclose(curvature.gauss_newton_diagonal(
        lin, MSE, ds), np.diag(H), rtol=1e-10, atol=1e-14)


def test_hutchinson_diagonal_is_within_its_standard_error_and_the_error_is_honest():
    model, (x, y) = problem()
    op = curvature.FisherOperator(model, SCE, (x, y))
    A = dense(op)
    est, se = curvature.hutchinson_diagonal(op, num_samples=200, seed=0)
    assert op.num_matvecs == len(A) + 200
    # the variance of one sample's entry i is sum_{j != i} A_ij^2 (Rademacher z)
    predicted = np.sqrt((np.sum(A ** 2, 1) - np.diag(A) ** 2) / 200)
    live = predicted > 1e-8 * np.abs(A).max()
    np.testing.assert_allclose(se[live], predicted[live], rtol=0.3)
    zscore = (est - np.diag(A))[live] / se[live]
    assert np.mean(np.abs(zscore) < 3) > 0.9 and np.mean(zscore ** 2) < 2.0, zscore
    # any tf.linalg.LinearOperator (no matvec_flat): the same estimate from the same seed
    est2, _ = curvature.hutchinson_diagonal(tf.linalg.LinearOperatorFullMatrix(A), 200, seed=0)
    np.testing.assert_allclose(est2, est, rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="hutchinson_diagonal: num_samples must be"):
        curvature.hutchinson_diagonal(op, num_samples=1)


def test_float32_and_float64_agree():
    model, (x, y) = problem()
    model32, _ = problem(dtype="float32")
    sce32 = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for a, b in zip(model32.trainable_variables, model.trainable_variables):
        a.assign(tf.cast(b, tf.float32))
    v = np.random.default_rng(2).normal(size=51)
    for fisher in ("type2", "mc", "empirical"):
        op64 = curvature.FisherOperator(model, SCE, (x, y), fisher, mc_samples=3)
        op32 = curvature.FisherOperator(model32, sce32, (tf.cast(x, tf.float32), y), fisher,
                                        mc_samples=3)
        assert op32.dtype == tf.float32 and op64.dtype == tf.float64
        np.testing.assert_allclose(op32.matvec(tf.constant(v, tf.float32)),
                                   op64.matvec(tf.constant(v)), rtol=1e-3, atol=1e-5)
    x32 = tf.cast(x, tf.float32)
    np.testing.assert_allclose(curvature.per_example_gradients(model32, sce32, x32, y),
                               curvature.per_example_gradients(model, SCE, x, y), atol=1e-5)
    np.testing.assert_allclose(curvature.gauss_newton_diagonal(model32, sce32, (x32, y)),
                               curvature.gauss_newton_diagonal(model, SCE, (x, y)), atol=1e-6)


def test_mirrored_strategy_equals_one_device():
    """Three products, each a pass over three batches of different sizes (6, 6, 4) split
    over the replicas, all equal one device's operator on the whole data as one batch:
    every pass takes every batch once."""
    _, (x, y) = problem(n=16)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(6)
    vs = tf.constant(np.random.default_rng(3).normal(size=(51, 3)))

    def products(strategy, fisher, data=data):
        with strategy.scope():
            model, _ = problem(n=16)
        op = curvature.FisherOperator(model, SCE, data, fisher,
                                      strategy=None if data is x_y else strategy)
        out = op.matmul(vs).numpy()
        assert op.num_matvecs == 3
        return out
    x_y = (x, y)
    mirrored = distribute.make_strategy("mirrored")
    assert mirrored.num_replicas_in_sync == 2
    one = tf.distribute.get_strategy()
    for fisher in ("type2", "empirical"):
        whole = products(one, fisher, x_y)
        np.testing.assert_allclose(products(mirrored, fisher), whole, rtol=1e-10, atol=1e-14)


def test_bad_inputs_are_named():
    model, (x, y) = problem()
    with pytest.raises(ValueError, match="FisherOperator: cannot sample labels from or take "
                                         "the Fisher of loss Huber"):
        curvature.FisherOperator(model, keras.losses.Huber(), (x, y))
    with pytest.raises(TypeError, match="FisherOperator: loss must be a Keras loss object"):
        curvature.FisherOperator(model, lambda t, z: z, (x, y))
    class MyMSE(keras.losses.MeanSquaredError):
        pass
    with pytest.raises(ValueError, match="loss MyMSE"):  # a subclass may compute otherwise
        curvature.FisherOperator(model, MyMSE(), (x, y))
    with pytest.raises(ValueError, match="FisherOperator: fisher must be one of"):
        curvature.FisherOperator(model, SCE, (x, y), fisher="type1")
    with pytest.raises(ValueError, match="FisherOperator: mc_samples must be an integer >= 1"):
        curvature.FisherOperator(model, SCE, (x, y), fisher="mc", mc_samples=0)
    with pytest.raises(ValueError, match="mc_fisher_diagonal: mc_samples must be an integer"):
        curvature.mc_fisher_diagonal(model, SCE, (x, y), mc_samples=1)
    with pytest.raises(ValueError, match="label_smoothing=0.1"):
        curvature.FisherOperator(model, keras.losses.CategoricalCrossentropy(
            label_smoothing=0.1, dtype="float64"), (x, y))
    with pytest.raises(ValueError, match="reduction='none'"):
        curvature.FisherOperator(model, keras.losses.MeanSquaredError(reduction="none",
                                                                          dtype="float64"),
                                 (x, y))
    with pytest.raises(TypeError, match=r"FisherOperator: params\[0\] must be a variable"):
        curvature.FisherOperator(model, SCE, (x, y), params=[tf.ones([3], tf.float64)])
    with pytest.raises(ValueError, match="FisherOperator: data must be one"):
        curvature.FisherOperator(model, SCE, x)
    with pytest.raises(ValueError, match="FisherOperator: data is None"):
        curvature.FisherOperator(model, SCE, None)
    one = keras.Sequential([keras.Input((4,), dtype="float64"),
                            keras.layers.Dense(1, dtype="float64")])
    with pytest.raises(ValueError, match="SparseCategoricalCrossentropy needs class scores"):
        curvature.FisherOperator(one, SCE, (x, y)).matvec(tf.ones([5], tf.float64))
    with pytest.raises(ValueError, match="per-example losses of shape \\[batch\\]"):
        curvature.per_example_gradients(model, lambda t, z: tf.reduce_mean(z), x, y)
