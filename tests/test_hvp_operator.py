"""hogrod.autodiff.hvp_operator, the compiled operator form of `hvp`: against float64
central differences of the gradient and the dense Hessian, in both modes, with and without
XLA; traced once and following its variables; the vector checked as `hvp` checks it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import autodiff


def flat(tree):
    return np.concatenate([np.ravel(t.numpy()) for t in tf.nest.flatten(tree)])


def keras_problem():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(4, activation="tanh", dtype="float64"),
                              keras.layers.Dense(2, dtype="float64")])
    x = tf.random.stateless_normal((6, 3), seed=(0, 1), dtype=tf.float64)
    labels = tf.constant([0, 1, 1, 0, 1, 0])
    traces = []

    def fn():
        traces.append(1)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=model(x)))
    return model, fn, traces


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("mode", ["auto", "reverse_over_reverse", "forward_over_reverse"])
def test_the_operator_is_the_dense_hessian_traced_once_following_its_variables(mode,
                                                                              jit_compile):
    model, fn, traces = keras_problem()
    params = model.trainable_variables
    matvec = autodiff.hvp_operator(fn, params, mode=mode, jit_compile=jit_compile)
    traced = len(traces)
    for k in range(3):
        vector = [tf.random.stateless_normal(p.shape, seed=(i, k), dtype=tf.float64)
                  for i, p in enumerate(params)]
        dense = hogrod.hessian(fn, params).numpy()  # at the variables' current values
        np.testing.assert_allclose(flat(matvec(vector)), dense @ flat(vector), rtol=1e-9,
                                   atol=1e-12)
        for p in params:  # the operator reads the variables at each product
            p.assign(p.numpy() * 1.1)
    # hessian traces fn per call eagerly; the operator's own trace was made once, at its
    # construction (and the reverse mode's gradient needs no more)
    assert traced == 1 and len(traces) > 1
    # inside a tf.function too
    np.testing.assert_allclose(flat(tf.function(matvec)(vector)), flat(matvec(vector)),
                               rtol=1e-12)


def test_the_operator_matches_central_differences_of_the_gradient():
    rng = np.random.default_rng(0)
    w = tf.Variable(rng.normal(size=(4, 3)))
    b = tf.Variable(rng.normal(size=(3,)))
    x = tf.constant(rng.normal(size=(5, 4)))

    def fn():
        return tf.reduce_sum(tf.sin(x @ w + b) ** 2)

    params = {"w": w, "b": b}
    vector = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=(3,))}  # numpy: converted
    got = autodiff.hvp_operator(fn, params)(vector)
    h = 1e-6

    def grad_at(t):
        w0, b0 = w.numpy(), b.numpy()
        w.assign(w0 + t * vector["w"])
        b.assign(b0 + t * vector["b"])
        g = hogrod.grad(fn, params)
        w.assign(w0)
        b.assign(b0)
        return flat(g)

    np.testing.assert_allclose(flat(got), (grad_at(h) - grad_at(-h)) / (2 * h), rtol=1e-6,
                               atol=1e-8)


def test_a_vector_unlike_the_params_is_named():
    w = tf.Variable(tf.ones([2, 2], tf.float64))
    b = tf.Variable(tf.ones([2], tf.float64))
    matvec = autodiff.hvp_operator(lambda: tf.reduce_sum(w ** 3) + tf.reduce_sum(b ** 4),
                                   {"w": w, "b": b})
    np.testing.assert_allclose(matvec({"w": tf.ones([2, 2], tf.float64),
                                       "b": tf.ones([2], tf.float64)})["b"].numpy(), [12, 12])
    # keys of the same shapes in another order: an error, never a silent permutation
    with pytest.raises(ValueError, match="vector must be structured like params"):
        matvec({"w": tf.ones([2, 2], tf.float64), "a": tf.ones([2], tf.float64)})
    with pytest.raises(TypeError, match=r"vector\[0\] has dtype float32"):
        matvec({"w": tf.ones([2, 2], tf.float64), "b": tf.ones([2], tf.float32)})
    with pytest.raises(ValueError, match="has shape"):
        matvec({"w": tf.ones([2, 2], tf.float64), "b": tf.ones([3], tf.float64)})
    with pytest.raises(ValueError, match="mode must be"):
        autodiff.hvp_operator(lambda: tf.reduce_sum(w ** 3), w, mode="forward_over_forward")
    with pytest.raises(hogrod.checks.ArgumentError, match="jit_compile"):
        autodiff.hvp_operator(lambda: tf.reduce_sum(w ** 3), w, jit_compile="yes")
