"""Inverse-HVPs against numpy.linalg.solve; influence against leave-one-out retraining."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from curvature_fixtures import fit_logistic, known_spectrum, logistic_problem

from hogrod import curvature


def test_conjugate_gradient_lissa_and_the_singular_case():
    A = known_spectrum(np.linspace(0.5, 4.0, 30))
    b = np.random.default_rng(5).normal(size=30)
    x, _ = curvature.conjugate_gradient(A, b, damping=0.1)
    np.testing.assert_allclose(x, np.linalg.solve(A + 0.1 * np.eye(30), b), rtol=1e-7)
    lx = curvature.lissa(A, b, damping=0.1, scale=5.0, maxiter=400)
    np.testing.assert_allclose(lx, np.linalg.solve(A + 0.1 * np.eye(30), b), rtol=1e-5)
    singular = known_spectrum(np.concatenate([np.zeros(5), np.linspace(1, 2, 25)]))
    with pytest.raises(ValueError, match="singular or indefinite; add damping"):
        curvature.conjugate_gradient(singular, np.random.default_rng(6).normal(size=30))
    with pytest.raises(ValueError, match="lissa diverged"):
        curvature.lissa(A, b, scale=1.0, maxiter=400)


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
