"""K-FAC and EK-FAC against the dense Gauss-Newton matrix (`GaussNewtonOperator`) where the
factorization is exact (Eschenhagen et al. 2023), and their factors against numpy by hand."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import curvature

# a Keras loss computes in its own dtype (floatx, float32, unless told): float64 here
MSE = keras.losses.MeanSquaredError(dtype="float64")
CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
CE32 = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def net(input_shape, layers, dtype="float64", seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(input_shape, dtype=dtype)] + layers)


def dense_layers(widths, activation=None, dtype="float64"):
    return [keras.layers.Dense(w, activation=activation, dtype=dtype) for w in widths]


def ggn(model, loss, batch, variables=None):
    op = curvature.GaussNewtonOperator.from_output_loss(
        lambda b: model(b[0]), lambda z, b: tf.reduce_mean(loss(b[1], z)),
        model.trainable_variables if variables is None else variables, batch,
        dtype=model.trainable_variables[0].dtype)
    return op.to_dense().numpy()


def data(shape, n, out, classes=None, seed=1, dtype=tf.float64):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(n,) + shape), dtype)
    if classes:
        return x, tf.constant(rng.integers(0, classes, size=n), tf.int32)
    return x, tf.constant(rng.normal(size=(n,) + out), dtype)


def test_single_dense_layer_batch_of_one_is_exact():
    for loss, y_shape, classes in ((CE, (), 3), (MSE, (3,), None)):
        model = net((4,), dense_layers([3]))
        batch = data((4,), 1, y_shape, classes)
        op = curvature.KFACOperator(model, loss, batch)
        np.testing.assert_allclose(op.to_dense(), ggn(model, loss, batch), rtol=1e-10,
                                   atol=1e-13)


def test_deep_linear_network_with_mse_is_exact_for_any_batch():
    model = net((4,), dense_layers([5, 3, 2]))
    batch = data((4,), 7, (2,))
    dense = ggn(model, MSE, batch)
    blocks = np.zeros_like(dense)  # K-FAC is block-diagonal over layers
    start = 0
    for layer in model.layers:
        size = sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
        blocks[start:start + size, start:start + size] = dense[start:start + size,
                                                               start:start + size]
        start += size
    for approx in ("expand", "reduce"):  # no weight sharing: the same
        op = curvature.KFACOperator(model, MSE, batch, approx=approx)
        np.testing.assert_allclose(op.to_dense(), blocks, rtol=1e-9, atol=1e-12)
    # not exact once the network is not linear
    tanh = net((4,), dense_layers([5], "tanh") + dense_layers([2]))
    op = curvature.KFACOperator(tanh, MSE, batch)
    gap = np.abs(op.to_dense().numpy()[:25, :25] - ggn(tanh, MSE, batch)[:25, :25]).max()
    assert gap > 1e-4


def test_expand_is_exact_in_the_expand_setting():
    """Dense layers over [N, R, d] (a loss term per location): K-FAC-expand is exact for a
    deep linear network with MSE, K-FAC-reduce is not."""
    model = net((3, 4), dense_layers([5, 2]))
    batch = data((3, 4), 4, (3, 2))
    dense = ggn(model, MSE, batch)
    expand = curvature.KFACOperator(model, MSE, batch, approx="expand").to_dense().numpy()
    np.testing.assert_allclose(expand[:25, :25], dense[:25, :25], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(expand[25:, 25:], dense[25:, 25:], rtol=1e-9, atol=1e-12)
    reduce = curvature.KFACOperator(model, MSE, batch, approx="reduce").to_dense().numpy()
    assert np.abs(reduce[:25, :25] - dense[:25, :25]).max() > 1e-3


def test_reduce_is_exact_in_the_reduce_setting():
    """Linear Conv2D, then a global average over locations (one loss term per example):
    K-FAC-reduce is exact with MSE, K-FAC-expand is not."""
    model = net((4, 4, 2), [keras.layers.Conv2D(3, 2, padding="same", dtype="float64"),
                            keras.layers.GlobalAveragePooling2D(dtype="float64"),
                            keras.layers.Dense(2, dtype="float64")])
    batch = data((4, 4, 2), 5, (2,))
    dense = ggn(model, MSE, batch)
    n = 2 * 2 * 2 * 3 + 3
    reduce = curvature.KFACOperator(model, MSE, batch, approx="reduce").to_dense().numpy()
    np.testing.assert_allclose(reduce[:n, :n], dense[:n, :n], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(reduce[n:, n:], dense[n:, n:], rtol=1e-9, atol=1e-12)
    expand = curvature.KFACOperator(model, MSE, batch, approx="expand").to_dense().numpy()
    assert np.abs(expand[:n, :n] - dense[:n, :n]).max() > 1e-4


def softmax_hessians(logits):
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return np.stack([np.diag(q) - np.outer(q, q) for q in p]) / len(p)


def test_dense_factors_match_numpy():
    model = net((4,), dense_layers([5], "tanh") + dense_layers([3]))
    x, y = data((4,), 6, (), 3)
    before = model(x).numpy()
    op = curvature.KFACOperator(model, CE, (x, y))
    # the capture hooks are gone and the model computes what it did
    assert all("call" not in layer.__dict__ for layer in model.layers)
    assert model.layers[0].activation is keras.activations.tanh
    np.testing.assert_array_equal(model(x).numpy(), before)
    W1, b1, W2, b2 = [v.numpy() for v in model.trainable_variables]
    h = np.tanh(x.numpy() @ W1 + b1)
    H = softmax_hessians(h @ W2 + b2)
    a0, a1 = (np.hstack([u, np.ones((6, 1))]) for u in (x.numpy(), h))
    A0, A1 = a0.T @ a0 / 6, a1.T @ a1 / 6
    G1 = H.sum(0)
    G0 = sum(np.diag(1 - h[i] ** 2) @ W2 @ H[i] @ W2.T @ np.diag(1 - h[i] ** 2)
             for i in range(6))
    names = [layer.name for layer in model.layers]
    for name, A, G in ((names[0], A0, G0), (names[1], A1, G1)):
        np.testing.assert_allclose(op.factors[name][0], A, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(op.factors[name][1], G, rtol=1e-9, atol=1e-13)


def test_conv2d_factors_match_numpy():
    """2x2 kernel, stride 1, 'valid', over a 3x3x2 input: 4 locations of 8-long patches,
    flattened into a Dense(2), MSE."""
    model = net((3, 3, 2), [keras.layers.Conv2D(2, 2, activation="tanh", dtype="float64"),
                            keras.layers.Flatten(dtype="float64"),
                            keras.layers.Dense(2, dtype="float64")])
    x, y = data((3, 3, 2), 3, (2,))
    K, c, V, _ = [v.numpy() for v in model.trainable_variables]
    xs = x.numpy()
    patches = np.stack([np.stack([np.append(xs[n, i:i + 2, j:j + 2].reshape(-1), 1.0)
                                  for i in range(2) for j in range(2)]) for n in range(3)])
    s = patches[..., :8] @ K.reshape(8, 2) + c  # [n, r, out]
    # MSE over 2 outputs, mean over 3 examples: per-example Hessian (2 / 2) / 3 I; the Dense
    # maps location r, channel o to output rows V[2 r + o]
    root = np.sqrt(1.0 / 3)
    g = np.stack([[(1 - np.tanh(s[n]) ** 2) * root * V[:, k].reshape(4, 2) for k in range(2)]
                  for n in range(3)])  # [n, column, r, out]
    for approx in ("expand", "reduce"):
        op = curvature.KFACOperator(model, MSE, (x, y), approx=approx)
        A, G = (f.numpy() for f in op.factors[model.layers[0].name])
        if approx == "expand":
            rows = patches.reshape(-1, 9)
            A_ref = rows.T @ rows / 12
            G_ref = np.einsum("ncro,ncrp->op", g, g)
        else:
            mean = patches.mean(1)
            A_ref = mean.T @ mean / 3
            summed = g.sum(2)
            G_ref = np.einsum("nco,ncp->op", summed, summed)
        np.testing.assert_allclose(A, A_ref, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(G, G_ref, rtol=1e-9, atol=1e-13)


def conv_classifier(dtype="float64"):
    return net((4, 4, 1), [keras.layers.Conv2D(2, 3, strides=2, padding="same",
                                               activation="tanh", dtype=dtype),
                           keras.layers.Flatten(dtype=dtype),
                           keras.layers.Dense(3, dtype=dtype)], dtype=dtype)


def test_ekfac_eigenvalues_are_the_exact_diagonal_in_the_kfac_basis():
    model = conv_classifier()
    batch = data((4, 4, 1), 6, (), 3)
    for approx in ("expand", "reduce"):
        op = curvature.EKFACOperator(model, CE, batch, approx=approx)
        for layer in model.layers[::2]:  # the Conv2D (4 locations) and the Dense
            block = ggn(model, CE, batch, curvature.layer_params(model, layer.name))
            _, qa, _, qg = op.eigendecompositions[layer.name]
            Q = np.kron(qa.numpy(), qg.numpy())
            expected = np.diag(Q.T @ block @ Q).reshape(qa.shape[0], qg.shape[0])
            np.testing.assert_allclose(op.corrected_eigenvalues[layer.name], expected,
                                       rtol=1e-9, atol=1e-14)


def test_solve_logdet_and_with_damping_against_numpy():
    model = conv_classifier()
    batch = data((4, 4, 1), 6, (), 3)
    rhs = np.random.default_rng(3).normal(size=(tf.size(tf.concat(
        [tf.reshape(v, [-1]) for v in model.trainable_variables], 0)).numpy(), 2))
    for cls in (curvature.KFACOperator, curvature.EKFACOperator):
        base = cls(model, CE, batch)
        op = base.with_damping(0.3)
        assert op._f is base._f  # shared factors, nothing recomputed
        dense = op.to_dense().numpy()
        np.testing.assert_allclose(dense, base.to_dense().numpy() + 0.3 * np.eye(len(dense)),
                                   rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(dense, dense.T, atol=1e-13)
        np.testing.assert_allclose(op.solve(tf.constant(rhs)), np.linalg.solve(dense, rhs),
                                   rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(op.logdet(), np.linalg.slogdet(dense)[1], rtol=1e-10)
        np.testing.assert_allclose(op.matvec(tf.constant(rhs[:, 0])), dense @ rhs[:, 0],
                                   rtol=1e-10, atol=1e-13)
        # refresh: the factors at new weights, for every operator sharing them, no stale values
        for v in model.trainable_variables:
            v.assign(1.5 * v)
        fresh = cls(model, CE, batch, damping=0.3)
        op.refresh()
        np.testing.assert_allclose(op.to_dense(), fresh.to_dense(), rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(op.solve(tf.constant(rhs)), fresh.solve(tf.constant(rhs)),
                                   rtol=1e-8, atol=1e-10)


def test_empirical_and_mc_fisher_on_one_example():
    model = net((4,), dense_layers([3]))
    x, y = data((4,), 1, (), 3)
    g = np.concatenate([np.reshape(t, [-1]) for t in hogrod.grad(
        lambda: tf.reduce_mean(CE(y, model(x))), model.trainable_variables)])
    op = curvature.KFACOperator(model, CE, (x, y), fisher="empirical")
    np.testing.assert_allclose(op.to_dense(), np.outer(g, g), rtol=1e-10, atol=1e-14)
    # four examples: G = (1/N) sum_n grad_n grad_n^T of the per-example losses, by hand
    x4, y4 = data((4,), 4, (), 3)
    logits = model(x4).numpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    grads = p / p.sum(1, keepdims=True) - np.eye(3)[y4.numpy()]
    G = curvature.KFACOperator(model, CE, (x4, y4), fisher="empirical").factors[
        model.layers[0].name][1]
    np.testing.assert_allclose(G, grads.T @ grads / 4, rtol=1e-10, atol=1e-14)
    # many sampled labels: the MC Fisher approaches the type-2 one
    exact = ggn(model, CE, (x, y))
    mc = curvature.KFACOperator(model, CE, (x, y), fisher="mc", mc_samples=4000).to_dense()
    assert np.abs(mc.numpy() - exact).max() < 0.1 * np.abs(exact).max()


def test_other_layers_diagonal_is_the_exact_diagonal():
    model = net((4,), dense_layers([5], "tanh") + [
        keras.layers.LayerNormalization(dtype="float64")] + dense_layers([3]))
    batch = data((4,), 6, (), 3)
    with pytest.raises(ValueError, match=r"layer '.*' \(LayerNormalization\) has trainable "
                                         r"weights K-FAC cannot factor"):
        curvature.KFACOperator(model, CE, batch)
    op = curvature.KFACOperator(model, CE, batch, other_layers="diagonal")
    dense = ggn(model, CE, batch)
    np.testing.assert_allclose(np.diag(op.to_dense().numpy())[25:35], np.diag(dense)[25:35],
                               rtol=1e-9, atol=1e-14)


def test_float32_agrees_with_float64():
    model64 = conv_classifier()
    x, y = data((4, 4, 1), 6, (), 3)
    model32 = conv_classifier("float32")
    for a, b in zip(model32.trainable_variables, model64.trainable_variables):
        a.assign(tf.cast(b, tf.float32))
    for cls in (curvature.KFACOperator, curvature.EKFACOperator):
        op64 = cls(model64, CE, (x, y), damping=0.1)
        op32 = cls(model32, CE32, (tf.cast(x, tf.float32), y), damping=0.1)
        assert op32.dtype == tf.float32
        v = np.random.default_rng(4).normal(size=op64.shape[0])
        np.testing.assert_allclose(op32.matvec(tf.constant(v, tf.float32)),
                                   op64.matvec(tf.constant(v)), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(op32.solve(tf.constant(v[:, None], tf.float32)),
                                   op64.solve(tf.constant(v[:, None])), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(op32.logdet(), op64.logdet(), rtol=1e-4)


def test_dataset_equals_one_batch():
    model = conv_classifier()
    x, y = data((4, 4, 1), 10, (), 3)
    whole = curvature.EKFACOperator(model, CE, (x, y)).to_dense()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # 4 + 4 + 2: size-weighted
    np.testing.assert_allclose(curvature.EKFACOperator(model, CE, ds).to_dense(), whole,
                               rtol=1e-9, atol=1e-13)


def test_products_equal_the_kronecker_factors_on_every_evaluation_path():
    """The products may run through the rows that built a factor (where fewer than its
    width) and EK-FAC's through the top eigenvectors only: each block equals numpy's
    kron(A, G) + d I and Q diag(S) Q^T + d I from the operator's own factors, as a dense
    matrix (many columns) and as one matvec."""
    cases = [  # K-FAC through G's 4 gradient rows (8 outputs), EK-FAC on G's top 4
               # eigenvectors; a Conv2D's shared locations under "reduce" (all of them kept)
        (net((2,), dense_layers([8])), data((2,), 4, (), 8), "empirical", "expand", ("g",)),
        (conv_classifier(), data((4, 4, 1), 6, (), 3), "type2", "reduce", ("dense", "dense"))]
    for model, batch, fisher, approx, plan in cases:
        ops = [cls(model, CE, batch, fisher=fisher, approx=approx, damping=0.2)
               for cls in (curvature.KFACOperator, curvature.EKFACOperator)]
        assert ops[0]._state("matmul")[1][2:] == plan  # the paths this test is for
        v = np.random.default_rng(5).normal(size=ops[0].shape[0])
        for op in ops:
            dense = op.to_dense().numpy()
            np.testing.assert_allclose(op.matvec(tf.constant(v)), dense @ v, rtol=1e-10,
                                       atol=1e-13)
            start = 0
            for layer in model.layers:
                size = sum(int(np.prod(w.shape)) for w in layer.trainable_variables)
                if not size:
                    continue
                if isinstance(op, curvature.EKFACOperator):
                    _, qa, _, qg = (e.numpy() for e in op.eigendecompositions[layer.name])
                    q = np.kron(qa, qg)
                    block = q @ np.diag(op.corrected_eigenvalues[layer.name].numpy().ravel()) @ q.T
                else:
                    block = np.kron(*(f.numpy() for f in op.factors[layer.name]))
                np.testing.assert_allclose(dense[start:start + size, start:start + size],
                                           block + 0.2 * np.eye(size), rtol=1e-9, atol=1e-12,
                                           err_msg=f"{type(op).__name__} {approx} {layer.name}")
                start += size


def test_bad_arguments_are_named():
    model = net((4,), dense_layers([3]))
    batch = data((4,), 2, (), 3)
    bn = net((4,), [keras.layers.BatchNormalization(dtype="float64")] + dense_layers([3]))
    with pytest.raises(ValueError, match=r"layer 'batch_normalization.*' "
                                         r"\(BatchNormalization\)"):
        curvature.KFACOperator(bn, CE, batch)
    op = curvature.KFACOperator(model, CE, batch)
    with pytest.raises(ValueError, match=r"KFACOperator.solve: needs damping > 0"):
        op.solve(tf.ones([op.shape[0], 1], tf.float64))
    with pytest.raises(ValueError, match=r"EKFACOperator.logdet: needs damping > 0"):
        curvature.EKFACOperator(model, CE, batch).logdet()
    with pytest.raises(ValueError, match=r"KFACOperator: approx must be one of"):
        curvature.KFACOperator(model, CE, batch, approx="mean")
    with pytest.raises(ValueError, match=r"EKFACOperator: fisher must be one of"):
        curvature.EKFACOperator(model, CE, batch, fisher="exact")
    with pytest.raises(ValueError, match=r"KFACOperator: damping must be a finite number >= 0"):
        curvature.KFACOperator(model, CE, batch, damping=-1.0)
    with pytest.raises(ValueError, match=r"KFACOperator: cannot sample labels from.*Huber"):
        curvature.KFACOperator(model, keras.losses.Huber(dtype="float64"), batch, fisher="mc")
    with pytest.raises(TypeError, match=r"the loss computes in float32 but the model's weights "
                                        r"are float64; build the loss with dtype='float64'"):
        curvature.KFACOperator(model, CE32, batch)
    with pytest.raises(ValueError, match=r"KFACOperator: data is None"):
        curvature.KFACOperator(model, CE, None)
