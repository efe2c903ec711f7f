"""Edge cases of the curvature operators, each against an oracle: the Monte Carlo Fisher
(and MC K-FAC) with many samples against the exact type-2 Fisher (MSE with C = 3 outputs,
cross-entropy on probabilities), EK-FAC influence under either reduction of the loss, one
loss-dtype rule for every operator, and no retracing warnings from building K-FAC
operators."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import curvature

F64 = "float64"


def linear_model(outputs, activation=None, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,), dtype=F64),
                             keras.layers.Dense(outputs, activation=activation, dtype=F64)])


def inputs(n=6, seed=1):
    return tf.constant(np.random.default_rng(seed).normal(size=(n, 3)), tf.float64)


def dense(op):
    return op.to_dense().numpy()


def relative_error(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_mc_fisher_of_mse_with_three_outputs_has_the_exact_fishers_scale():
    """E over labels y ~ N(z, (C/2) I) of the sampled outer products is the type-2 Fisher
    J^T (2/C) I J: with C = 3, a label variance of 1 (or C) would be off by 2/3 (or 3/2)."""
    model, x = linear_model(3), inputs()
    mse = keras.losses.MeanSquaredError(dtype=F64)
    y = model(x) + 0.1
    exact = dense(curvature.FisherOperator(model, mse, (x, y), "type2"))
    mc = dense(curvature.FisherOperator(model, mse, (x, y), "mc", mc_samples=4000, seed=3))
    assert relative_error(mc, exact) < 0.05, relative_error(mc, exact)
    exact_kfac = dense(curvature.KFACOperator(model, mse, (x, y), fisher="type2"))
    mc_kfac = dense(curvature.KFACOperator(model, mse, (x, y), fisher="mc", mc_samples=4000,
                                           seed=3))
    assert relative_error(mc_kfac, exact_kfac) < 0.05, relative_error(mc_kfac, exact_kfac)


def test_mc_fisher_of_cross_entropy_on_probabilities_samples_from_the_probabilities():
    """from_logits=False: labels are drawn from p = z / sum(z), not from softmax(z)."""
    model, x = linear_model(3, "softmax"), inputs()
    y = tf.constant([0, 1, 2, 0, 1, 2])
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=False, dtype=F64)
    exact = dense(curvature.FisherOperator(model, sce, (x, y), "type2"))
    mc = dense(curvature.FisherOperator(model, sce, (x, y), "mc", mc_samples=4000, seed=5))
    assert relative_error(mc, exact) < 0.05, relative_error(mc, exact)
    # one example, one layer: K-FAC's factorization is exact, so MC K-FAC estimates the
    # type-2 Fisher itself (K-FAC's "type2" is the loss Hessian at the true label, which on
    # probabilities is not the Fisher)
    one = (x[:1], y[:1])
    exact_one = dense(curvature.FisherOperator(model, sce, one, "type2"))
    mc_kfac = dense(curvature.KFACOperator(model, sce, one, fisher="mc", mc_samples=4000,
                                           seed=5))
    assert relative_error(mc_kfac, exact_one) < 0.05, relative_error(mc_kfac, exact_one)


def test_ekfac_influence_is_of_the_mean_loss_whatever_the_reduction():
    model, x = linear_model(3), inputs(8)
    y = tf.constant([0, 1, 2, 0, 1, 2, 0, 1])
    mean = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype=F64)
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum",
                                                        dtype=F64)
    train, test = (x, y), (x[:2] + 0.5, y[:2])
    expected = curvature.ekfac_influence(model, mean, train, test, damping=0.1)
    np.testing.assert_allclose(curvature.ekfac_influence(model, summed, train, test,
                                                         damping=0.1),
                               expected, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(curvature.self_influence(
        curvature.ekfac_influence, model, summed, train, damping=0.1),
        curvature.self_influence(curvature.ekfac_influence, model, mean, train, damping=0.1),
        rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("build", [
    lambda m, loss, b: curvature.FisherOperator(m, loss, b),
    lambda m, loss, b: curvature.FisherOperator(m, loss, b, "mc"),
    lambda m, loss, b: curvature.KFACOperator(m, loss, b),
    lambda m, loss, b: curvature.EKFACOperator(m, loss, b),
    lambda m, loss, b: curvature.HessianOperator(m, loss, b),
    lambda m, loss, b: curvature.GaussNewtonOperator(m, loss, b),
    lambda m, loss, b: curvature.gauss_newton_diagonal(m, loss, b),
])
def test_a_float32_loss_on_a_float64_model_is_refused_by_every_operator(build):
    model, x = linear_model(3), inputs()
    with pytest.raises(TypeError, match=r"the loss computes in float32 but the model's weights "
                                        r"are float64; build the loss with dtype='float64'"):
        build(model, keras.losses.MeanSquaredError(), (x, model(x)))


def test_building_kfac_operators_does_not_warn_about_retracing(caplog):
    model, x = linear_model(3), inputs()
    y = tf.constant([0, 1, 2, 0, 1, 2])
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype=F64)
    with caplog.at_level(logging.WARNING):
        for _ in range(6):  # one trace per operator: what is intended, nothing to warn of
            curvature.KFACOperator(model, sce, (x, y))
            curvature.EKFACOperator(model, sce, (x, y), fisher="mc")
    retraced = [r.getMessage() for r in caplog.records if "retracing" in r.getMessage()]
    assert not retraced, retraced[0]
