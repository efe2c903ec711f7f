"""Shared problems for the curvature tests: a tiny Keras classifier, matrices with known
spectra, and an L2 logistic regression fitted by scipy (the leave-one-out oracle)."""

import keras
import numpy as np
import scipy.optimize
import tensorflow as tf


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
