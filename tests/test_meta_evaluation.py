"""`meta.evaluate` / `meta.evaluator` against closed forms on a linear model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import meta


def mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def linear_task_batch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 2))
    y = x @ np.array([[1.5], [-0.5]])
    return x, y, tf.constant(x), tf.constant(y)


def linear(w):
    model = keras.Sequential([keras.Input((2,), dtype="float64"), keras.layers.Dense(1, use_bias=False,
                                                                    dtype="float64")])
    model.layers[0].kernel.assign(w)
    return model


def test_each_call_uses_its_own_loss_and_model():
    """Oracle: the unadapted query MSE in numpy. An evaluation cached on the algorithm
    alone returned the first loss's value for a loss 100 times larger."""
    x, y, xt, yt = linear_task_batch()
    w = np.array([[0.3], [0.2]])
    model = linear(w)
    algo = meta.maml(model, mse, inner_lr=0.1)
    tasks = (xt, yt, xt, yt)
    expect = np.mean((x @ w - y) ** 2, axis=(1, 2)).mean()
    first = meta.evaluate(algo, model, mse, tasks, steps=(0,))
    np.testing.assert_allclose(first["loss_after_0"], expect, rtol=1e-12)
    scaled = meta.evaluate(algo, model, lambda a, b: 100.0 * mse(a, b), tasks, steps=(0,))
    np.testing.assert_allclose(scaled["loss_after_0"], 100.0 * expect, rtol=1e-12)
    other = linear(2.0 * w)
    moved = meta.evaluate(meta.maml(other, mse), other, mse, tasks, steps=(0,))
    np.testing.assert_allclose(moved["loss_after_0"],
                               np.mean((x @ (2 * w) - y) ** 2, axis=(1, 2)).mean(), rtol=1e-12)


def test_evaluator_adapts_by_the_closed_form_and_traces_once():
    """One SGD step on a linear least-squares task: w1 = w - lr * 2 X^T (X w - y) / n."""
    x, y, xt, yt = linear_task_batch()
    w = np.array([[0.3], [0.2]])
    model = linear(w)
    ev = meta.evaluator(meta.maml(model, mse, inner_lr=0.05), model, mse, steps=(1,))
    losses = []
    for xi, yi in zip(x, y):
        w1 = w - 0.05 * 2 * xi.T @ (xi @ w - yi) / len(xi)
        losses.append(np.mean((xi @ w1 - yi) ** 2))
    for _ in range(2):
        out = ev((xt, yt, xt, yt))
        np.testing.assert_allclose(out["loss_after_1"], np.mean(losses), rtol=1e-12)
        np.testing.assert_allclose(out["loss_after_1_median"], np.median(losses), rtol=1e-12)


def test_repeated_evaluations_do_not_read_as_retracing(caplog):
    """Each call traces its own functions (the guide's `evaluator` is for periodic use), but
    TensorFlow's retracing warning keyed on one lambda's code object fired by the second
    call of the default three step counts."""
    _, _, xt, yt = linear_task_batch()
    model = linear(np.array([[0.3], [0.2]]))
    algo = meta.maml(model, mse, inner_lr=0.1)
    for _ in range(2):
        meta.evaluate(algo, model, mse, (xt, yt, xt, yt))
    assert "retracing" not in caplog.text


def test_bad_steps_are_named():
    model = linear(np.zeros((2, 1)))
    with pytest.raises(ValueError, match="evaluate: steps"):
        meta.evaluator(meta.maml(model, mse), model, mse, steps=(1.5,))
