"""The operator jet (`hogrod.pinn.jet`) against `partials` (reverse-over-reverse) in float64."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod.models import dense_net
from hogrod import pinn
from hogrod.pinn.jet import tanh_mlp_jet

import keras


@pytest.fixture(scope="module")
def net_and_points():
    keras.utils.set_random_seed(3)
    net = dense_net((2, 6, 6, 2), "tanh", dtype="float64")  # two outputs: channels per output
    x = tf.constant(np.random.default_rng(0).uniform(-1.0, 1.0, (9, 2)))
    return net, x


# directions e_x, e_t; L1 = u_t - 0.3 u_xx (Burgers' linear part), L2 = 0.5 u_x + u_xx + 2 u_xt
# - u_tt (a non-symmetric b: its transpose must enter the backward)
DIRS = [[1.0, 0.0], [0.0, 1.0]]
OPS = [([0.0, 1.0], [[-0.3, 0.0], [0.0, 0.0]]), ([0.5, 0.0], [[1.0, 2.0], [0.0, -1.0]])]


def _reference(net, x):
    d = pinn.partials(net, x, [(), (0,), (1,), (0, 0), (0, 1), (1, 1)])
    return (d[()], [d[(0,)], d[(1,)]],
            [d[(1,)] - 0.3 * d[(0, 0)], 0.5 * d[(0,)] + d[(0, 0)] + 2.0 * d[(0, 1)] - d[(1, 1)]])


def _loss(u, us, ls):  # every channel, nonlinearly, so every channel's backward is exercised
    return tf.reduce_mean(tf.square(ls[0] + u * us[0]) + tf.sin(ls[1]) * us[1] + u ** 3)


@pytest.mark.parametrize("fused,points_last", [(True, True), (True, False), (False, True)])
def test_jet_channels_and_parameter_gradient_equal_reverse_over_reverse(net_and_points, fused,
                                                                        points_last):
    net, x = net_and_points
    with tf.GradientTape() as tape:
        u, us, ls = tanh_mlp_jet(net, x, DIRS, OPS, fused=fused, points_last=points_last)
        loss = _loss(u, us, ls)
    grads = tape.gradient(loss, net.trainable_variables)
    with tf.GradientTape() as tape:
        ru, rus, rls = _reference(net, x)
        ref_loss = _loss(ru, rus, rls)
    ref_grads = tape.gradient(ref_loss, net.trainable_variables)
    for got, want in zip([u] + us + ls, [ru] + rus + rls):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_jet_rejects_what_it_cannot_propagate(net_and_points):
    net, x = net_and_points
    with pytest.raises(ValueError, match="length d = 2"):
        tanh_mlp_jet(net, x, [[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"operators\[0\] needs a of length 2 and b of shape"):
        tanh_mlp_jet(net, x, DIRS, [([0.0, 1.0], [[1.0]])])
    with pytest.raises(ValueError, match="activation 'tanh'"):
        tanh_mlp_jet(dense_net((2, 4, 1), "relu"), tf.zeros([3, 2]), DIRS)
    with pytest.raises(ValueError, match=r"x must be \[batch, d\]"):
        tanh_mlp_jet(net, tf.zeros([3]), DIRS)
