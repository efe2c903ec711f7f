"""Curvature operators against the dense oracle `hogrod.hessian` and J^T H_L J."""

import keras
import numpy as np
import tensorflow as tf
from curvature_fixtures import small_problem

import hogrod
from hogrod import curvature
from hogrod.curvature.data import BatchPasses


def test_hessian_operator_over_batch_and_over_dataset_equals_dense_hessian():
    model, loss, (x, y) = small_problem()
    dense = hogrod.hessian(lambda: loss((x, y)), model.trainable_variables).numpy()
    op = curvature.HessianOperator.from_objective(loss, model.trainable_variables, (x, y),
                                                  dtype=tf.float64)
    np.testing.assert_allclose(op.to_dense(), dense, rtol=1e-9, atol=1e-12)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(15)  # 15 + 15 + 10: size-weighted
    op_ds = curvature.HessianOperator.from_objective(loss, model.trainable_variables, data,
                                                     dtype=tf.float64)
    v = np.random.default_rng(1).normal(size=dense.shape[0])
    np.testing.assert_allclose(op_ds.matvec(tf.constant(v)), dense @ v, rtol=1e-9, atol=1e-12)
    assert op_ds.num_matvecs == 1
    # tf.linalg works on it
    assert isinstance(op, tf.linalg.LinearOperator) and op.is_self_adjoint
    # the (model, loss, data) form: a Keras loss's mean, or its sum (reduction "sum")
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    op_keras = curvature.HessianOperator(model, sce, data)
    assert op_keras.dtype == tf.float64
    np.testing.assert_allclose(op_keras.matvec(tf.constant(v)), dense @ v, rtol=1e-9,
                               atol=1e-12)
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum",
                                                        dtype="float64")
    np.testing.assert_allclose(curvature.HessianOperator(model, summed, data).matvec(
        tf.constant(v)), 40 * dense @ v, rtol=1e-9, atol=1e-11)


def test_gauss_newton_operator_equals_jt_h_j_and_is_psd():
    model, loss, (x, y) = small_problem()
    ce = lambda z, b: tf.reduce_mean(  # noqa: E731
        tf.nn.sparse_softmax_cross_entropy_with_logits(b[1], z))
    op = curvature.GaussNewtonOperator.from_output_loss(
        lambda b: model(b[0]), ce, model.trainable_variables, (x, y), dtype=tf.float64)
    G = op.to_dense().numpy()
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(15)
    np.testing.assert_allclose(curvature.GaussNewtonOperator(model, sce, data).to_dense(), G,
                               rtol=1e-9, atol=1e-13)
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
    op = curvature.HessianOperator.from_objective(
        loss, curvature.layer_params(model, model.layers[1].name), batch, dtype=tf.float64)
    n0 = 4 * 6 + 6
    np.testing.assert_allclose(op.to_dense(), dense[n0:, n0:], rtol=1e-9, atol=1e-12)


def test_float32_and_float64_operators_agree():
    model, loss, batch = small_problem()
    v = np.random.default_rng(2).normal(size=51)
    op64 = curvature.HessianOperator.from_objective(loss, model.trainable_variables, batch,
                                                    dtype=tf.float64)
    model32, loss32, (x, y) = small_problem("float32")
    for a, b in zip(model32.trainable_variables, model.trainable_variables):
        a.assign(tf.cast(b, tf.float32))
    op32 = curvature.HessianOperator.from_objective(loss32, model32.trainable_variables,
                                                    (tf.cast(x, tf.float32), y),
                                                    dtype=tf.float32)
    np.testing.assert_allclose(op32.matvec(tf.constant(v, tf.float32)),
                               op64.matvec(tf.constant(v)), rtol=1e-3, atol=1e-5)


def test_bad_arguments_are_named_at_construction():
    import pytest
    model, loss, batch = small_problem()
    vs = model.trainable_variables
    with pytest.raises(ValueError, match="HessianOperator.from_objective: data is None"):
        curvature.HessianOperator.from_objective(loss, vs, None, dtype=tf.float64)
    with pytest.raises(ValueError, match="GaussNewtonOperator.from_output_loss: data is None"):
        curvature.GaussNewtonOperator.from_output_loss(lambda b: model(b[0]),
                                                       lambda z, b: tf.reduce_sum(z), vs, None)
    with pytest.raises(ValueError, match=r"data holds None \(flattened part\(s\) \[1\] of 2\)"):
        curvature.HessianOperator.from_objective(loss, vs, (batch[0], None), dtype=tf.float64)
    with pytest.raises(ValueError, match="HessianOperator.from_objective: params is empty"):
        curvature.HessianOperator.from_objective(loss, [], batch, dtype=tf.float64)
    with pytest.raises(TypeError, match=r"HessianOperator.from_objective: params\[0\] must be "
                                        r"a tf.Variable"):
        curvature.HessianOperator.from_objective(loss, [np.ones(3)], batch, dtype=tf.float64)
    with pytest.raises(ValueError, match="HessianOperator.from_objective: mode must be"):
        curvature.HessianOperator.from_objective(loss, vs, batch, dtype=tf.float64,
                                                 mode="forward")
    with pytest.raises(ValueError, match="dtype must be a floating dtype"):
        curvature.HessianOperator.from_objective(loss, vs, batch, dtype=tf.int32)
    with pytest.raises(TypeError, match="GaussNewtonOperator.from_output_loss: output_loss must "
                                        "be a callable"):
        curvature.GaussNewtonOperator.from_output_loss(lambda b: model(b[0]), "mse", vs, batch)
    with pytest.raises(TypeError, match="GaussNewtonOperator: loss must be a callable"):
        curvature.GaussNewtonOperator(model, "mse", batch)
    with pytest.raises(TypeError, match="HessianOperator: the loss computes in float32 but the "
                                        "model's weights are float64; build the loss with "
                                        "dtype='float64'"):
        curvature.HessianOperator(model, keras.losses.MeanSquaredError(), batch)


def test_batch_passes_take_every_batch_once_per_pass_from_one_iterator():
    data = tf.data.Dataset.range(5).batch(2)  # [0 1], [2 3], [4]
    passes = BatchPasses(data, None, "test")
    whole = [[0, 1], [2, 3], [4]]
    for _ in range(2):
        assert [b.numpy().tolist() for b in passes] == whole
    for batch in passes:  # a pass left unfinished is skipped to its end
        break
    assert [b.numpy().tolist() for b in passes] == whole
    unknown = data.filter(lambda b: True)  # unknown cardinality: a fresh iterator per pass
    unknown_passes = BatchPasses(unknown, None, "test")
    assert [[b.numpy().tolist() for b in unknown_passes] for _ in range(2)] == [whole, whole]
