"""PINN embeddings and architectures against numpy reimplementations of their formulas."""

import math

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod.pinn import networks

F64 = "float64"


def _x(n=7, dim=2, seed=0):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (n, dim))


def _tanh_np(z):
    return np.tanh(z)


def test_fourier_features_match_the_formula_in_float64():
    layer = networks.FourierFeatures(num_features=5, sigma=3.0, seed=4, dtype=F64)
    x = _x(dim=3)
    got = layer(tf.constant(x)).numpy()
    b = 3.0 * np.random.default_rng(4).standard_normal((3, 5))  # Tancik et al.'s B
    z = 2 * np.pi * x @ b
    np.testing.assert_allclose(got, np.concatenate([np.cos(z), np.sin(z)], 1), rtol=1e-13,
                               atol=1e-13)
    assert got.dtype == np.float64 and not layer.trainable_weights
    other = networks.FourierFeatures(num_features=5, sigma=3.0, seed=5, dtype=F64)
    assert not np.allclose(other(tf.constant(x)).numpy(), got)  # the seed is used


def test_periodic_embedding_formula_and_a_network_periodic_to_rounding():
    emb = networks.PeriodicEmbedding({1: 2.0}, harmonics=2, dtype=F64)
    x = _x(dim=3)
    got = emb(tf.constant(x)).numpy()
    a = 2 * np.pi * x[:, 1:2] / 2.0
    expect = np.concatenate([x[:, :1], x[:, 2:], np.cos(a), np.sin(a), np.cos(2 * a),
                             np.sin(2 * a)], 1)
    np.testing.assert_allclose(got, expect, rtol=1e-14, atol=1e-14)

    keras.utils.set_random_seed(0)
    net = networks.modified_mlp(2, 16, 2, embedding=networks.periodic_embedding(
        {0: 0.7}, 3, dtype=F64), dtype=F64)
    x = _x(dim=2)
    u = net(tf.constant(x)).numpy()
    for shift in (0.7, -2.1):
        shifted = net(tf.constant(x + [shift, 0.0])).numpy()
        np.testing.assert_allclose(shifted, u, rtol=0, atol=1e-13)
    assert np.abs(net(tf.constant(x + [0.35, 0.0])).numpy() - u).max() > 1e-3  # not constant
    assert np.abs(net(tf.constant(x + [0.0, 0.7])).numpy() - u).max() > 1e-3  # t not periodic


def test_factorized_dense_equals_a_plain_dense_with_the_product_kernel():
    keras.utils.set_random_seed(1)
    layer = networks.FactorizedDense(6, "tanh", mu=1.0, sigma=0.1, dtype=F64)
    x = _x(dim=3)
    got = layer(tf.constant(x)).numpy()
    v, s, b = layer.v.numpy(), layer.s.numpy(), layer.bias.numpy()
    w = np.diag(np.exp(s)) @ v.T  # the paper's [units, inputs] W = diag(exp(s)) V
    np.testing.assert_allclose(got, np.tanh(x @ w.T + b), rtol=1e-13, atol=1e-13)
    plain = keras.layers.Dense(6, "tanh", dtype=F64)
    plain.build((None, 3))
    plain.set_weights([w.T, b])
    np.testing.assert_allclose(got, plain(tf.constant(x)).numpy(), rtol=1e-13, atol=1e-13)
    assert {v.dtype for v in layer.weights} == {F64}


def test_factorization_scales_are_drawn_from_n_mu_sigma():
    keras.utils.set_random_seed(2)
    layer = networks.FactorizedDense(4000, mu=1.0, sigma=0.5, dtype=F64)
    layer.build((None, 1))
    s = layer.s.numpy()
    assert abs(s.mean() - 1.0) < 5 * 0.5 / math.sqrt(4000)
    assert abs(s.std() - 0.5) < 0.03


def _dense_np(layer, h, act):
    if isinstance(layer, networks.FactorizedDense):
        k, b = layer.kernel.numpy(), layer.bias.numpy()
    else:
        k, b = layer.kernel.numpy(), layer.bias.numpy()
    z = h @ k + b
    return act(z) if act else z


@pytest.mark.parametrize("factorization", [None, (1.0, 0.1)])
def test_modified_mlp_forward_matches_numpy(factorization):
    keras.utils.set_random_seed(3)
    net = networks.modified_mlp(2, 5, 3, activation="tanh", factorization=factorization,
                                embedding=networks.fourier_features, dtype=F64)
    x = _x(dim=2)
    layer = net.get_layer
    h = net.layers[1](tf.constant(x)).numpy()  # the embedding
    u = _dense_np(layer("encoder_u"), h, _tanh_np)
    v = _dense_np(layer("encoder_v"), h, _tanh_np)
    for k in range(1, 4):
        z = _dense_np(layer(f"gate_{k}"), h, _tanh_np)
        h = (1 - z) * u + z * v
    expect = _dense_np(layer("head"), h, None)
    got = net(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-13)
    assert got.dtype == np.float64 and {w.dtype for w in net.weights} == {F64}


def test_mlp_network_in_float64_has_float64_gradients():
    keras.utils.set_random_seed(4)
    net = networks.mlp_network(2, 4, 2, factorization=(1.0, 0.1),
                               embedding=networks.fourier_features, dtype=F64)
    x = tf.constant(_x())
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = net(x)
    assert tape.gradient(y, x).dtype == tf.float64


def test_output_scale_multiplies_the_same_network_exactly_in_float64():
    """mlp_network.output_scale: the scaled network, given the plain one's weights, is the
    plain one's output times the scale (float64; the scale reaches it without float32)."""
    keras.utils.set_random_seed(5)
    plain = networks.mlp_network(3, 4, 2, dtype=F64)
    scaled = networks.mlp_network(3, 4, 2, dtype=F64, output_scale=0.1)
    scaled.set_weights(plain.get_weights())
    x = tf.constant(np.random.default_rng(0).standard_normal((6, 3)))
    got, want = scaled(x).numpy(), 0.1 * plain(x).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_networks_are_selectable_by_gin_reference():
    with gin.unlock_config():
        gin.clear_config()
        gin.parse_config("""
            mlp_network.embedding = @fourier_features
            fourier_features.num_features = 3
            fourier_features.sigma = 2.0
        """)
        try:
            net = gin.get_configurable("mlp_network")(2, 4, 1, dtype=F64)
        finally:
            gin.clear_config()
    assert net.layers[1].num_features == 3 and net.layers[1].sigma == 2.0


@pytest.mark.parametrize("make,match", [
    (lambda: networks.PeriodicEmbedding({2: 1.0})(tf.zeros([1, 2])), "coordinate 2"),
    (lambda: networks.PeriodicEmbedding({0: -1.0}), r"periods\[0\]"),
    (lambda: networks.PeriodicEmbedding([1.0]), "periods must be a non-empty dict"),
    (lambda: networks.FourierFeatures(0), "num_features"),
    (lambda: networks.mlp_network(2, 4, 1, factorization=0.1), "factorization"),
    (lambda: networks.modified_mlp(2, 4, 0), "depth"),
    (lambda: networks.mlp_network(2, 4, 1, output_scale=0.0), "mlp_network.output_scale"),
    (lambda: networks.mlp_network(2, 4, 1, dtype=F64,
                                  embedding=networks.FourierFeatures(dtype="float32")),
     "computes in float32"),
])
def test_bad_arguments_are_clear_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()
