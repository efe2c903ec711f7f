"""`skip_zero_curvature`: the same second-order gradients without the zeros TensorFlow
carries back through a piecewise-linear network's forward pass."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import train


def _net(layers):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input([3], dtype="float64")] + layers)


def _dense(activation):
    return [keras.layers.Dense(6, activation=activation, dtype="float64") for _ in range(3)] + [
        keras.layers.Dense(1, dtype="float64")]


def _pooled():
    return [keras.layers.Reshape([3, 1, 1], dtype="float64"),
            keras.layers.Conv2D(4, (2, 1), padding="same", activation="relu", dtype="float64"),
            keras.layers.MaxPooling2D((2, 1), padding="same", dtype="float64"),
            keras.layers.Flatten(dtype="float64"),
            keras.layers.Dense(1, dtype="float64")]


NETS = {"relu": lambda: _dense("relu"), "leaky_relu": lambda: _dense("leaky_relu"),
        "relu6": lambda: _dense("relu6"), "maxpool": _pooled}


def _penalty(model, x):
    """A gradient penalty: the mean of (||d model / d x_i||^2 - 1)^2 over the examples (the
    squared norm: a dead ReLU network's zero gradient has no NaN derivative)."""
    with tf.GradientTape() as inner:
        inner.watch(x)
        y = tf.reduce_sum(model(x))
    g = inner.gradient(y, x)
    return tf.reduce_mean(tf.square(tf.reduce_sum(tf.square(g), axis=1) - 1))


def _gradient(model, x, skip):
    with tf.GradientTape() as outer:
        loss = _penalty(model, x)
    if skip:
        with hogrod.skip_zero_curvature():
            return outer.gradient(loss, model.trainable_variables)
    return outer.gradient(loss, model.trainable_variables)


def _x():
    return tf.constant(np.random.default_rng(0).normal(size=(5, 3)) * 2.0)


PRODUCTS = ("MatMul", "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput")


def _products(fn, x):
    graph = tf.function(fn).get_concrete_function(x).graph.as_graph_def()
    ops = collections.Counter(n.op for n in graph.node)
    return sum(ops[kind] for kind in PRODUCTS)


@pytest.mark.parametrize("net", sorted(NETS))
def test_the_gradients_equal_tensorflows_and_central_differences(net):
    model, x = _net(NETS[net]()), _x()
    default, skipped = _gradient(model, x, False), _gradient(model, x, True)
    compiled = tf.function(lambda x: _gradient(model, x, True))(x)
    for d, s, c in zip(default, skipped, compiled):
        assert (s is None) == (c is None)
        if s is None:  # its only path went through the zeros: unconnected now
            assert d is None or not np.any(d.numpy())
        else:
            np.testing.assert_allclose(s.numpy(), d.numpy(), rtol=1e-14, atol=1e-15)
            np.testing.assert_allclose(c.numpy(), d.numpy(), rtol=1e-14, atol=1e-15)
    kernel = model.trainable_variables[0]  # central differences on its first three entries
    h = 1e-6
    for i in range(3):
        index = np.unravel_index(i, kernel.shape)
        values = []
        for sign in (1, -1):
            w = kernel.numpy().copy()
            w[index] += sign * h
            kernel.assign(w)
            values.append(float(_penalty(model, x)))
            w[index] -= sign * h
            kernel.assign(w)
        np.testing.assert_allclose(skipped[0].numpy()[index], (values[0] - values[1]) / (2 * h),
                                   rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("net", ["relu", "maxpool"])
def test_no_products_of_zeros_and_tensorflows_gradients_restored(net):
    model, x = _net(NETS[net]()), _x()
    default = _products(lambda x: _gradient(model, x, False), x)
    skipped = _products(lambda x: _gradient(model, x, True), x)
    # the zeros' products back through the forward pass, on the default path
    assert skipped < default, (default, skipped)
    assert _products(lambda x: _gradient(model, x, False), x) == default  # restored on exit
    with pytest.raises(RuntimeError, match="inside"):
        with hogrod.skip_zero_curvature():
            with hogrod.skip_zero_curvature():  # nested
                raise RuntimeError("inside")
    assert _products(lambda x: _gradient(model, x, False), x) == default  # and on an error


def test_make_train_step_differentiates_without_the_zeros():
    model, x = _net(_dense("relu")), _x()
    step = train.make_train_step(lambda batch: _penalty(model, batch),
                                 keras.optimizers.SGD(0.1), model.trainable_variables,
                                 jit_compile=False)
    products = _products(step.python_function, x)
    assert products == _products(lambda x: _gradient(model, x, True), x)
    assert products < _products(lambda x: _gradient(model, x, False), x)

