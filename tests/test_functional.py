"""functional_call: equals the model's own call, never mutates it, threads state, and lets an
outer tape differentiate through substitute weights."""

import hypothesis
import hypothesis.strategies as st
import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod


def bn_dropout_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.BatchNormalization(momentum=0.5),
        keras.layers.Dropout(0.5, seed=3),
        keras.layers.Dense(3),
    ])
    return model


def snapshot(model):
    return [v.numpy().copy() for v in model.variables]


def test_outputs_equal_model_call_in_inference_mode():
    model = bn_dropout_model()
    x = tf.random.stateless_normal((16, 5), seed=(0, 0))
    params = hogrod.trainable_values(model)
    np.testing.assert_allclose(hogrod.functional_call(model, params, x), model(x), rtol=1e-6)


def test_training_mode_matches_model_call_does_not_mutate_and_state_advances():
    model = bn_dropout_model()
    x = tf.random.stateless_normal((16, 5), seed=(1, 0))
    before = snapshot(model)
    state0 = hogrod.model_state(model)
    out, state1 = hogrod.functional_call(model, hogrod.trainable_values(model), x,
                                         training=True, state=state0)
    # The model was not touched.
    for b, v in zip(before, model.variables):
        np.testing.assert_array_equal(b, v.numpy())
    # The returned state advanced: BN moving statistics moved, the dropout seed moved.
    assert len(state1) == len(state0)
    for s0, s1 in zip(state0, state1):
        assert not np.array_equal(s0, s1)
    # The model's own (mutating) call from the same state gives the same outputs and state.
    expected = model(x, training=True)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    for s1, v in zip(state1, model.non_trainable_variables):
        np.testing.assert_allclose(s1, v.numpy(), rtol=1e-6)


def test_gradient_through_substitute_weights_equals_gradient_wrt_variables():
    model = bn_dropout_model()
    x = tf.random.stateless_normal((16, 5), seed=(2, 0))
    params = hogrod.trainable_values(model)
    _, g_params = hogrod.value_and_grad(
        lambda: tf.reduce_sum(hogrod.functional_call(model, params, x) ** 2), params)
    _, g_vars = hogrod.value_and_grad(lambda: tf.reduce_sum(model(x) ** 2),
                                      model.trainable_variables)
    for a, b in zip(g_params, g_vars):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_second_order_through_one_sgd_step_matches_finite_differences():
    """The MAML pattern: d/dw L(w - a dL/dw) through functional_call, against float64 FD."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((2,), dtype="float64"), keras.layers.Dense(3, activation="tanh",
                                                                     dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    x = tf.random.stateless_normal((8, 2), seed=(3, 0), dtype=tf.float64)
    y = tf.sin(x[:, :1])
    lr = 0.1

    def meta_loss(params):
        inner = lambda: tf.reduce_mean((hogrod.functional_call(model, params, x) - y) ** 2)  # noqa
        g = hogrod.grad(inner, params)
        fast = [p - lr * gi for p, gi in zip(params, g)]
        return tf.reduce_mean((hogrod.functional_call(model, fast, x + 1.0) - y) ** 2)

    params = hogrod.trainable_values(model)
    _, meta_grad = hogrod.value_and_grad(lambda: meta_loss(params), params)
    k = 0  # check every entry of the first kernel
    base = params[k].numpy()
    eps = 1e-6
    for idx in np.ndindex(base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += eps
        minus[idx] -= eps
        f = lambda w: float(meta_loss([tf.constant(w)] + params[1:]))  # noqa: E731
        fd = (f(plus) - f(minus)) / (2 * eps)
        np.testing.assert_allclose(meta_grad[k].numpy()[idx], fd, rtol=1e-5, atol=1e-9)


@hypothesis.settings(max_examples=5)
@hypothesis.given(widths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
                  batch=st.integers(1, 5))
def test_random_mlps_equal_own_call_in_tf_function(widths, batch):
    layers = [keras.Input((3,))] + [keras.layers.Dense(w, activation="tanh") for w in widths]
    model = keras.Sequential(layers)
    x = tf.random.stateless_normal((batch, 3), seed=(batch, len(widths)))
    params = [p * 2.0 for p in hogrod.trainable_values(model)]
    run = tf.function(lambda ps, x: hogrod.functional_call(model, ps, x))
    got = run(params, x)
    for var, p in zip(model.trainable_variables, params):
        var.assign(p)
    np.testing.assert_allclose(got, model(x), rtol=1e-5, atol=1e-6)
    run(params, x + 1.0)
    assert run.experimental_get_tracing_count() == 1


def test_wrong_params_name_the_layer_and_variable():
    model = bn_dropout_model()
    x = tf.zeros((2, 5))
    params = hogrod.trainable_values(model)
    with pytest.raises(ValueError, match="6 trainable variables"):
        hogrod.functional_call(model, params[:-1], x)
    bad = list(params)
    bad[2] = tf.zeros([7])
    with pytest.raises(ValueError, match=r"batch_normalization\w*/gamma"):
        hogrod.functional_call(model, bad, x)
    with pytest.raises(ValueError, match="non-trainable"):
        hogrod.functional_call(model, params, x, state=hogrod.model_state(model)[:1])


def test_unbuilt_model_is_a_clear_error():
    model = keras.Sequential([keras.layers.Dense(2)], name="not_built")
    with pytest.raises(ValueError, match="not_built"):
        hogrod.functional_call(model, [], tf.zeros((1, 3)))


def test_params_of_another_dtype_or_not_tensors_are_named():
    """Keras would cast them silently: an integer tensor loses its gradient, float64 its
    precision."""
    model = bn_dropout_model()
    x = tf.zeros((2, 5))
    params = hogrod.trainable_values(model)
    for bad, message in [(tf.cast(params[0], tf.int32), "has dtype int32 but variable"),
                         (tf.cast(params[0], tf.float64), "has dtype float64 but variable"),
                         (None, "must be a tensor or a numpy array, got NoneType")]:
        with pytest.raises(TypeError, match=rf"trainable tensor 0 .*{message}"):
            hogrod.functional_call(model, [bad] + params[1:], x)
    # numpy arrays are constants (no gradient flows through them anyway): accepted
    out = hogrod.functional_call(model, [p.numpy() for p in params], x)
    np.testing.assert_allclose(out, hogrod.functional_call(model, params, x), rtol=1e-6)


def test_float64_input_to_a_float64_model_behind_a_float32_input_is_refused():
    """Keras casts inputs to the Input's dtype: float64 data would be rounded to float32."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, dtype="float64")])
    x = tf.constant([[0.1, 0.2]], tf.float64)
    with pytest.raises(TypeError, match=r"keras.Input\(\.\.\., dtype='float64'\)"):
        hogrod.functional_call(model, hogrod.trainable_values(model), x)
    hogrod.functional_call(model, hogrod.trainable_values(model), tf.cast(x, tf.float32))
    exact = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    w = hogrod.trainable_values(exact)
    np.testing.assert_allclose(hogrod.functional_call(exact, w, x).numpy(),
                               x.numpy() @ w[0].numpy() + w[1].numpy(), rtol=1e-14)


NORMALIZATIONS = {
    "batch": lambda: keras.layers.BatchNormalization(dtype="float64"),
    "layer": lambda: keras.layers.LayerNormalization(dtype="float64"),
    "group": lambda: keras.layers.GroupNormalization(groups=2, dtype="float64"),
}


@pytest.mark.parametrize("kind", [*NORMALIZATIONS, "ops.moments"])
def test_normalization_called_directly_has_exact_second_derivatives(kind):
    """A normalization called directly (no `functional_call`) under nested tapes: its
    Hessian-vector products in the input and its own weights equal float64 central
    differences of the gradient. Keras's own statistics (`tf.nn.moments`) stop the mean's
    gradient inside the variance and are 10-20% off here."""
    rng = np.random.default_rng(0)
    x = tf.Variable(rng.normal(size=(6, 4)))
    c = tf.constant(rng.normal(size=(6, 4)))
    if kind == "ops.moments":
        def f():
            mean, variance = keras.ops.moments(x, axes=[0])
            return tf.reduce_sum(c[0] * variance ** 2 + c[1] * mean * variance)
        params = [x]
    else:
        layer = NORMALIZATIONS[kind]()
        layer.build(x.shape)
        for w in layer.trainable_variables:  # away from 1 and 0, so they enter the products
            w.assign(rng.normal(size=w.shape))

        def f():
            return tf.reduce_sum(c * layer(x, training=True) ** 3)
        params = [x, *layer.trainable_variables]
    v = [rng.normal(size=p.shape) for p in params]
    hv = hogrod.hvp(f, params, v)
    base = [p.numpy() for p in params]
    eps, shifted = 1e-5, []
    for sign in (1, -1):
        for p, b, d in zip(params, base, v):
            p.assign(b + sign * eps * d)
        shifted.append([g.numpy() for g in hogrod.grad(f, params)])
    for p, b in zip(params, base):
        p.assign(b)
    for got, plus, minus in zip(hv, *shifted):
        np.testing.assert_allclose(got, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)
