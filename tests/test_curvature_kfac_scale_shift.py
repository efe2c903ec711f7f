"""The scale-and-shift diagonal of K-FAC's normalization layers (other_layers="diagonal")
against per-example tapes (each example alone through the model in inference mode, the
BatchNorm's moving statistics set to its batch's numpy moments), and against the dense
Gauss-Newton diagonal in inference mode, where no layer couples the examples; the
per-example Jacobian path of the other layers against the same."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import curvature
from hogrod.curvature import kfac_capture

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
F64 = dict(dtype="float64")


def sequential(input_shape, layers, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(input_shape, dtype="float64"), *layers])


def randomize(model, seed=2):
    """Weights of the normalization layers away from 1 and 0 (a bug in either shows), and
    the BatchNorms' moving statistics of their own."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, kfac_capture.SCALE_SHIFT):
            for v in layer.trainable_variables:
                v.assign(rng.normal(size=v.shape) + (1.0 if "gamma" in v.path else 0.0))
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(rng.normal(size=layer.moving_mean.shape))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, size=layer.moving_mean.shape))


def per_example_diagonals(model, x, cot):
    """{layer: sum_c,n (d(cot_cn . z_n)/d variables)^2}, example n alone through the model
    in inference mode, each BatchNorm's moving statistics set to its batch moments (numpy)."""
    a = x
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            axes = tuple(i for i in range(a.shape.rank) if i != layer.axis % a.shape.rank)
            layer.moving_mean.assign(np.mean(a.numpy(), axis=axes))
            layer.moving_variance.assign(np.var(a.numpy(), axis=axes))
        a = layer(a, training=False)
    norms = [layer for layer in model.layers if isinstance(layer, kfac_capture.SCALE_SHIFT)]
    variables = [v for layer in norms for v in layer.trainable_variables]
    total = [np.zeros(v.shape) for v in variables]
    for n in range(x.shape[0]):
        with tf.GradientTape(persistent=True) as tape:
            z = model(x[n:n + 1], training=False)
            targets = [tf.reduce_sum(z[0] * cot[c, n]) for c in range(cot.shape[0])]
        for t in targets:
            for i, g in enumerate(tape.gradient(t, variables)):
                total[i] += g.numpy() ** 2
    out, start = {}, 0
    for layer in norms:
        k = len(layer.trainable_variables)
        out[layer.name], start = total[start:start + k], start + k
    return out


def tanh():
    return keras.layers.Activation("tanh", **F64)


# one BatchNorm per model, first: nothing after it couples the examples, so its gradients
# are each example's own with the batch's statistics held fixed
MODELS = {
    "conv": ((4, 4, 2), lambda: [
        keras.layers.Conv2D(2, 2, **F64), keras.layers.BatchNormalization(**F64), tanh(),
        keras.layers.LayerNormalization(axis=[2, 3], **F64),
        keras.layers.GroupNormalization(groups=2, **F64), keras.layers.Flatten(**F64),
        keras.layers.Dense(3, **F64)], [[3], [2, 3], [3]]),
    # Keras keeps LayerNormalization's [1, -1] as [-1, 1] and reshapes its [2, 3] weights
    # onto axes (1, 3) of shape [3, 2]: out of order, left to the per-example Jacobians
    "conv_axis1": ((4, 4, 2), lambda: [
        keras.layers.Conv2D(2, 2, **F64),
        keras.layers.BatchNormalization(axis=1, scale=False, **F64), tanh(),
        keras.layers.LayerNormalization(axis=[1, -1], **F64), keras.layers.Flatten(**F64),
        keras.layers.Dense(3, **F64)], [[1], None]),
    "dense": ((4,), lambda: [
        keras.layers.Dense(5, **F64), keras.layers.BatchNormalization(center=False, **F64),
        tanh(), keras.layers.LayerNormalization(**F64), keras.layers.Dense(3, **F64)],
        [[1], [1]])}


@pytest.mark.parametrize("name", MODELS)
def test_scale_shift_diagonal_is_the_per_example_one(name):
    shape, layers, axes = MODELS[name]
    model = sequential(shape, layers())
    randomize(model)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(4,) + shape))
    cot = tf.constant(rng.normal(size=(2, 4, 3)))  # two cotangent columns
    blocks = kfac_capture.layer_blocks(model, "diagonal", "test")
    out, _ = tf.function(lambda: kfac_capture.layer_statistics(
        lambda: model(x, training=True), blocks, lambda z: cot))()  # the batch's statistics
    norms = [layer for layer in model.layers if isinstance(layer, kfac_capture.SCALE_SHIFT)]
    shapes = {}
    a = x
    for layer in model.layers:
        a = layer(a)
        shapes[layer.name] = a.shape
    assert [kfac_capture.scale_shift_axes(layer, shapes[layer.name],
                                          [v.shape for v in layer.trainable_variables])
            for layer in norms] == axes  # the path each layer takes
    want = per_example_diagonals(model, x, cot)
    for layer in norms:
        assert len(out[layer.name]) == len(want[layer.name]) > 0
        for got, w in zip(out[layer.name], want[layer.name]):
            assert got.shape == w.shape
            np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-14)


class SubclassedDense(keras.layers.Dense):
    """Not exactly a Dense: K-FAC gives it the per-example Jacobian diagonal."""


def test_inference_mode_diagonal_is_the_exact_gauss_newton_diagonal():
    model = sequential((3,), [keras.layers.Dense(4, **F64),
                              keras.layers.BatchNormalization(**F64), tanh(),
                              SubclassedDense(3, **F64), keras.layers.Dense(3, **F64)])
    randomize(model)
    rng = np.random.default_rng(4)
    batch = (tf.constant(rng.normal(size=(6, 3))),
             tf.constant(rng.integers(0, 3, size=6), tf.int32))
    op = curvature.KFACOperator(model, CE, batch, other_layers="diagonal")
    dense = curvature.GaussNewtonOperator.from_output_loss(
        lambda b: model(b[0]), lambda z, b: tf.reduce_mean(CE(b[1], z)),
        model.trainable_variables, batch, dtype=tf.float64).to_dense().numpy()
    got = np.concatenate([np.reshape(d, [-1]) for layer in model.layers[1:4:2]
                          for d in op.diagonals[layer.name]])
    # Dense(4): 16, BatchNorm: 8, SubclassedDense: 15
    np.testing.assert_allclose(got, np.diag(dense)[16:39], rtol=1e-9, atol=1e-14)
