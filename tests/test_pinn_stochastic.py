"""Randomized Laplacians against the exact one (`partials`, reverse-over-reverse): unbiased,
with errors of the size their variance (computed from the exact Hessian) predicts."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import pinn

DIM = 5


@pytest.fixture(scope="module")
def setup():
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((DIM,), dtype="float64"),
                            keras.layers.Dense(12, activation="tanh", dtype="float64"),
                            keras.layers.Dense(12, activation="tanh", dtype="float64"),
                            keras.layers.Dense(1, dtype="float64")])
    x = tf.constant(np.random.default_rng(1).uniform(-1, 1, (300, DIM)))
    d = pinn.partials(net, x, [(i, j) for i in range(DIM) for j in range(i, DIM)])
    hess = np.zeros((300, DIM, DIM))
    for i in range(DIM):
        for j in range(i, DIM):
            hess[:, i, j] = hess[:, j, i] = d[(i, j)].numpy()[:, 0]
    return net, x, hess


def probe_variance(hess, method, k):
    """The variance of the K-probe mean, per point, from the exact Hessian."""
    diag = np.diagonal(hess, axis1=1, axis2=2)
    if method == "stde":  # d H_jj for j uniform, K of d drawn without replacement
        pop = DIM * (diag ** 2).sum(1) - diag.sum(1) ** 2
        return pop / k * (DIM - k) / (DIM - 1)
    off = (hess ** 2).sum((1, 2)) - (diag ** 2).sum(1)  # Rademacher: 2 sum_{i != j} H_ij^2
    return 2 * off / k


@pytest.mark.parametrize("method,probes", [("hutchinson", 4), ("hutchinson", 64),
                                           ("stde", 2), ("stde", 4)])
def test_estimates_are_unbiased_with_the_predicted_error(setup, method, probes):
    net, x, hess = setup
    exact = np.trace(hess, axis1=1, axis2=2)
    np.testing.assert_allclose(pinn.laplacian(pinn.partials(net, x, [(i, i) for i in
                                                                     range(DIM)]),
                                              range(DIM)).numpy()[:, 0], exact, rtol=1e-12)
    est = pinn.stochastic_laplacian(net, x, probes, seed=3, method=method)
    assert est.shape == (300, 1) and est.dtype == tf.float64
    z = (est.numpy()[:, 0] - exact) / np.sqrt(probe_variance(hess, method, probes))
    # 300 independent points: each error within 5 predicted standard errors, and the mean
    # squared standardized error near 1 (the error shrinks as the variance says, 1/sqrt(K))
    assert np.abs(z).max() < 5, np.abs(z).max()
    assert 0.75 < np.mean(z ** 2) < 1.3, np.mean(z ** 2)
    assert abs(np.mean(z)) < 4 / np.sqrt(300)  # no bias: the mean of z is within 4 s.e.


def test_sample_variance_matches_the_rademacher_formula(setup):
    net, x, hess = setup
    samples = pinn.stochastic.laplacian_probes(net, x[:20], 4000, seed=1).numpy()[..., 0]
    np.testing.assert_allclose(samples.var(0), probe_variance(hess[:20], "hutchinson", 1),
                               rtol=0.2)
    se = samples.std(0) / np.sqrt(4000)  # the mean of many probes converges to the exact
    assert np.all(np.abs(samples.mean(0) - np.trace(hess[:20], axis1=1, axis2=2)) < 4.5 * se)


def test_stde_with_every_coordinate_is_exact(setup):
    net, x, hess = setup
    est = pinn.stochastic_laplacian(net, x, DIM, seed=7, method="stde")
    np.testing.assert_allclose(est.numpy()[:, 0], np.trace(hess, axis1=1, axis2=2),
                               rtol=1e-12, atol=1e-12)


def test_seeds_and_a_compiled_step_under_a_parameter_tape(setup):
    net, x, _ = setup
    x = x[:8]

    def loss_grad(lap_fn):
        with tf.GradientTape() as tape:
            lap = lap_fn()
            loss = tf.reduce_mean(lap ** 2)
        return lap, tape.gradient(loss, [v.value for v in net.trainable_variables],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)

    @tf.function
    def step(seed, method):
        return loss_grad(lambda: pinn.stochastic_laplacian(net, x, DIM, seed, method))

    exact, want = loss_grad(lambda: pinn.laplacian(
        pinn.partials(net, x, [(i, i) for i in range(DIM)]), range(DIM)))
    for method in ("stde", "hutchinson"):  # stde with every coordinate: exact
        a, grads = step(tf.constant(0), method)
        if method == "stde":
            np.testing.assert_allclose(a, exact, rtol=1e-12)
            for g, w in zip(grads, want):
                np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)
        else:
            assert not np.allclose(a, step(tf.constant(1), method)[0])  # the seed is used
            np.testing.assert_array_equal(a, step(tf.constant(0), method)[0])
    assert step.experimental_get_tracing_count() == 2  # one per method, none per seed


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_probes=0), "num_probes must be an integer >= 1"),
    (dict(num_probes=2.0), "num_probes must be an integer >= 1"),
    (dict(num_probes=2, method="rademacher"), "method must be one of"),
    (dict(num_probes=DIM + 1, method="stde"), "num_probes = 6 is more"),
    (dict(num_probes=2, seed=1.5), "seed must be an integer"),
])
def test_bad_arguments_are_clear_errors(setup, kwargs, match):
    net, x, _ = setup
    with pytest.raises((ValueError, TypeError), match=match):
        pinn.stochastic_laplacian(net, x, **kwargs)


def test_vector_valued_u_is_an_error(setup):
    _, x, _ = setup
    with pytest.raises(ValueError, match=r"\[batch\] or \[batch, 1\]"):
        pinn.stochastic_laplacian(lambda z: z[:, :2], x, 2)
