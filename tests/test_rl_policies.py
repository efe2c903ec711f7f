"""hogrod.rl's policies and distributions in float64. Oracles: closed-form log-probabilities,
entropies and KLs (numpy), sample frequencies and moments within a few standard errors (fixed
seeds), functional calls against the policy's own call; every bad action's error."""

import math

import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import checks, models, rl

F64 = tf.float64


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_categorical_against_closed_forms():
    rng = np.random.default_rng(0)
    lp, lq = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    p, q = softmax(lp), softmax(lq)
    d, e = rl.Categorical(tf.constant(lp)), rl.Categorical(tf.constant(lq))
    actions = rng.integers(0, 4, size=(2, 3))
    want = np.log(np.take_along_axis(p, actions[..., None], -1))[..., 0]
    np.testing.assert_allclose(d.log_prob(actions), want, rtol=1e-12)
    np.testing.assert_allclose(d.log_prob(tf.constant(actions, tf.int64)), want, rtol=1e-12)
    np.testing.assert_allclose(d.entropy(), -(p * np.log(p)).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(d.kl(e), (p * (np.log(p) - np.log(q))).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(d.kl(d), 0, atol=1e-15)
    # sampling: frequencies within 5 standard errors, deterministic per seed
    big = rl.Categorical(tf.constant(np.tile(lp[0, 0], (4000, 1))))
    draws = big.sample(7).numpy()
    assert draws.dtype == np.int32 and draws.shape == (4000,)
    freq = np.bincount(draws, minlength=4) / 4000
    assert np.all(np.abs(freq - p[0, 0]) < 5 * np.sqrt(p[0, 0] * (1 - p[0, 0]) / 4000))
    np.testing.assert_array_equal(big.sample(7), draws)
    assert not np.array_equal(big.sample(8), draws)
    assert big.sample(tf.constant([7, 0], tf.int64)).numpy().tolist() == draws.tolist()


def test_categorical_with_masked_logits_is_finite_in_value_and_gradient():
    """A -inf logit (an impossible action, a common action mask) has probability 0: it
    adds nothing to the entropy or the KL, and the possible actions' log-probabilities
    are those of the softmax over the others, their gradients finite."""
    lp = np.array([[0.3, -np.inf, 1.2], [-np.inf, 0.5, -0.7]])
    lq = np.array([[0.1, -np.inf, -0.4], [0.2, 0.4, 0.0]])
    actions = np.array([2, 1])
    logits = tf.Variable(lp)
    with tf.GradientTape() as tape:
        d = rl.Categorical(logits)
        out = [d.log_prob(actions), d.entropy(), d.kl(rl.Categorical(tf.constant(lq)))]
        total = sum(tf.reduce_sum(o) for o in out)
    possible = [np.array([0, 2]), np.array([1, 2])]
    p = [softmax(lp[i, k]) for i, k in enumerate(possible)]
    q = [softmax(lq[i][np.isfinite(lq[i])]) for i in range(2)]
    np.testing.assert_allclose(out[0], [np.log(p[0][1]), np.log(p[1][0])], rtol=1e-12)
    np.testing.assert_allclose(out[1], [-(x * np.log(x)).sum() for x in p], rtol=1e-12)
    kl_1 = (p[1] * (np.log(p[1]) - np.log(softmax(lq[1])[[1, 2]]))).sum()
    np.testing.assert_allclose(out[2], [(p[0] * (np.log(p[0]) - np.log(q[0]))).sum(), kl_1],
                               rtol=1e-12)
    grad = tape.gradient(total, logits).numpy()
    assert np.all(np.isfinite(grad)), grad


def test_diagonal_gaussian_against_closed_forms():
    rng = np.random.default_rng(1)
    m1, m2 = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    s1, s2 = rng.normal(size=(5, 2)) * 0.3, rng.normal(size=(5, 2)) * 0.3
    d = rl.DiagonalGaussian(tf.constant(m1), tf.constant(s1))
    e = rl.DiagonalGaussian(tf.constant(m2), tf.constant(s2))
    a = rng.normal(size=(5, 2))
    sd1, sd2 = np.exp(s1), np.exp(s2)
    want = (-0.5 * ((a - m1) / sd1) ** 2 - np.log(sd1) - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(d.log_prob(a), want, rtol=1e-12)
    np.testing.assert_allclose(d.entropy(), (0.5 * np.log(2 * np.pi * np.e * sd1 ** 2)).sum(-1),
                               rtol=1e-12)
    kl = (np.log(sd2 / sd1) + (sd1 ** 2 + (m1 - m2) ** 2) / (2 * sd2 ** 2) - 0.5).sum(-1)
    np.testing.assert_allclose(d.kl(e), kl, rtol=1e-12)
    big = rl.DiagonalGaussian(tf.constant(np.tile(m1[:1], (20000, 1))),
                              tf.constant(np.tile(s1[:1], (20000, 1))))
    x = big.sample(3).numpy()
    assert np.all(np.abs(x.mean(0) - m1[0]) < 5 * sd1[0] / np.sqrt(20000))
    assert np.all(np.abs(x.std(0) / sd1[0] - 1) < 5 / np.sqrt(2 * 20000))
    np.testing.assert_array_equal(big.sample(3), x)


def policies():
    gaussian = rl.GaussianPolicy(models.dense_net((3, 8, 2), dtype="float64"), 2, init_std=0.5,
                                 dtype="float64")
    categorical = rl.CategoricalPolicy(models.dense_net((3, 8, 4), dtype="float64"), 4,
                                       dtype="float64")
    for p in (gaussian, categorical):
        p.build((None, 3))
    return gaussian, categorical


def test_policies_substitute_parameters_and_differentiate_through_them():
    gaussian, categorical = policies()
    obs = tf.constant(np.random.default_rng(2).normal(size=(6, 3)))
    d = gaussian.distribution(obs)
    np.testing.assert_allclose(d.log_std, np.full((6, 2), math.log(0.5)), rtol=1e-12)
    for policy in (gaussian, categorical):
        params = hogrod.trainable_values(policy)
        own, substituted = policy.distribution(obs), policy.distribution(obs, params)
        for a, b in zip(own, substituted):
            np.testing.assert_array_equal(a, b)
        shifted = [p + 0.1 for p in params]
        actions = own.sample(4)
        with tf.GradientTape() as tape:
            tape.watch(shifted)
            value = tf.reduce_sum(policy.distribution(obs, shifted).log_prob(actions))
        grads = tape.gradient(value, shifted)
        assert all(g is not None for g in grads)
        # the derivative along a direction against a central difference
        v = [tf.ones_like(p) for p in params]
        h = 1e-6
        f = lambda s: float(tf.reduce_sum(  # noqa: E731
            policy.distribution(obs, [p + s * u for p, u in zip(shifted, v)]).log_prob(actions)))
        np.testing.assert_allclose(sum(float(tf.reduce_sum(g)) for g in grads),
                                   (f(h) - f(-h)) / (2 * h), rtol=1e-6)


def test_bad_actions_and_arguments_are_named():
    gaussian, categorical = policies()
    obs = tf.zeros([6, 3], F64)
    c, g = categorical.distribution(obs), gaussian.distribution(obs)
    bad = [
        (lambda: c.log_prob(tf.constant([0, 1, 2, 3, 4, 0])), r"actions must lie in 0\.\.3"),
        (lambda: c.log_prob(tf.constant([0, 1, 2, 3, -1, 0])), r"actions must lie in 0\.\.3"),
        (lambda: c.log_prob(tf.zeros([6, 1], tf.int32)), "actions must have shape"),
        (lambda: c.log_prob(tf.zeros([6], F64)), "integer dtype"),
        (lambda: g.log_prob(tf.zeros([6, 3], F64)), "actions has shape"),
        (lambda: g.log_prob(tf.zeros([6, 2], tf.float32)), "actions has dtype"),
        (lambda: g.log_prob(tf.zeros([6, 2], tf.int32)), "actions must have a floating"),
        (lambda: c.kl(g), "other must be a Categorical"),
        (lambda: g.kl(rl.DiagonalGaussian(tf.zeros([5, 2], F64), tf.zeros([5, 2], F64))),
         "other is"),
        (lambda: c.sample(-1), "seed"),
        (lambda: c.sample(tf.constant([1.0, 2.0])), "seed"),
        (lambda: rl.CategoricalPolicy(models.dense_net((3, 4)), 1), "num_actions"),
        (lambda: rl.GaussianPolicy(lambda x: x, 2), "network must be a Keras"),
        (lambda: rl.GaussianPolicy(models.dense_net((3, 4)), 2, init_std=0.0), "init_std"),
        (lambda: gaussian.distribution(obs, [tf.zeros([2], F64)]), "functional_call"),
    ]
    for call, pattern in bad:
        with pytest.raises((checks.ArgumentError, ValueError), match=pattern):
            call()
    wrong_head = rl.CategoricalPolicy(models.dense_net((3, 5), dtype="float64"), 4)
    with pytest.raises(checks.ArgumentError, match="num_actions = 4"):
        wrong_head(obs)
    compiled = tf.function(lambda a: c.log_prob(a))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"actions must lie in 0\.\.3"):
        compiled(tf.constant([0, 1, 2, 3, 4, 0]))


def test_distributions_cross_compiled_boundaries_and_trace_once():
    gaussian, _ = policies()

    @tf.function
    def frozen_kl(obs, params):
        old = tf.nest.map_structure(tf.stop_gradient, gaussian.distribution(obs))
        return tf.reduce_mean(gaussian.distribution(obs, params).kl(old))

    params = hogrod.trainable_values(gaussian)
    for shift in (0.0, 0.1):
        obs = tf.constant(np.full((4, 3), shift))
        assert abs(float(frozen_kl(obs, params))) < 1e-15
    assert frozen_kl.experimental_get_tracing_count() == 1
    # log_std + 0.1 everywhere: KL = d (0.1 - (1 - exp(-0.2)) / 2) per state (means unchanged)
    moved = [p + 0.1 if v.path.endswith("log_std") else p
             for p, v in zip(params, gaussian.trainable_variables)]
    np.testing.assert_allclose(float(frozen_kl(obs, moved)),
                               2 * (-0.1 + 0.5 * (np.exp(0.2) - 1)), rtol=1e-12)
