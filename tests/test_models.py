"""hogrod.models, the backbones and losses of the experiments: each loss against numpy, the
MLP against its own weights applied in numpy, each size checked by name."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, models


def test_losses_agree_with_numpy():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(7, 3))
    logits = tf.constant(z, tf.float64)
    labels = rng.integers(0, 3, size=7)
    log_softmax = z - np.log(np.exp(z).sum(1, keepdims=True))
    np.testing.assert_allclose(models.cross_entropy(tf.constant(labels), logits),
                               -log_softmax[np.arange(7), labels].mean(), rtol=1e-12)
    t = rng.integers(0, 2, size=7)
    p = 1 / (1 + np.exp(-z[:, 0]))
    np.testing.assert_allclose(models.binary_cross_entropy(tf.constant(t), logits[:, :1]),
                               -(t * np.log(p) + (1 - t) * np.log(1 - p)).mean(), rtol=1e-12)
    with pytest.raises(ValueError, match=r"\[batch, 1\]"):
        models.binary_cross_entropy(tf.constant(t), logits)
    y = rng.normal(size=(7, 2))
    np.testing.assert_allclose(models.mse(tf.constant(y), logits[:, :2]),
                               ((y - z[:, :2]) ** 2).mean(), rtol=1e-12)


def test_dense_net_is_the_mlp_its_weights_say():
    net = models.dense_net((3, 5, 4, 2), "tanh", dtype="float64", head_name="head")
    assert net.get_layer("head").units == 2
    assert all(v.dtype == "float64" for v in net.trainable_variables)
    x = np.random.default_rng(1).normal(size=(6, 3))
    w1, b1, w2, b2, w3, b3 = net.get_weights()
    expected = np.tanh(np.tanh(x @ w1 + b1) @ w2 + b2) @ w3 + b3
    np.testing.assert_allclose(net(x).numpy(), expected, rtol=1e-12)
    relu = models.relu_mlp(2, 1, 4, 2, name="critic")
    assert relu.name == "critic" and relu.count_params() == 2 * 4 + 4 + 4 * 4 + 4 + 4 + 1
    for bad in ((3,), (3, 0, 1), (3, 2.5, 1)):
        with pytest.raises(ValueError, match="widths"):
            models.dense_net(bad)


def test_each_backbone_names_a_bad_size_and_builds_the_sizes_it_is_given():
    for build, arg in ((lambda: models.conv4(filters=0), "conv4.filters"),
                       (lambda: models.conv4(n_way=2.5), "conv4.n_way"),
                       (lambda: models.mlp(widths=(40, 0)), r"\[2\]"),
                       (lambda: models.mlp(widths=40), "mlp.widths"),
                       (lambda: models.mlp(init_stddev=-0.01), "mlp.init_stddev"),
                       (lambda: models.relu_mlp(2, 1, 4, -1), "depth"),
                       (lambda: models.relu_mlp(2, 1, 0, 2), "width"),
                       (lambda: models.classifier((8, 8, 1), 3, (4, 0), ()), r"conv_filters\[1\]"),
                       (lambda: models.classifier((8, 8, 1), 0, (), ()), "num_classes")):
        with pytest.raises(checks.ArgumentError, match=arg):
            build()
    net = models.conv4(image_size=16, channels=3, filters=8, n_way=4)
    assert net.output_shape == (None, 4) and net.input_shape == (None, 16, 16, 3)
    assert [layer.filters for layer in net.layers if hasattr(layer, "filters")] == [8] * 4
    head = models.classifier((8, 8, 1), 3, (4,), (5,))
    assert head.get_layer("head").units == 3 and head.get_layer("head").dtype == "float32"
    assert [w.shape for w in models.mlp(input_dim=2, widths=(3,), outputs=1).weights] == [
        (2, 3), (3,), (3, 1), (1,)]
    assert models.relu_mlp(2, 1, 4, 0).count_params() == 2 + 1
