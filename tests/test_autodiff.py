"""The autodiff primitives against independent oracles: closed forms, float64 central
finite differences, and the other autodiff mode."""

import hypothesis
import hypothesis.strategies as st
import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod

MODES = ["reverse_over_reverse", "forward_over_reverse", "auto"]


def central_diff_grad(f, x, eps=1e-6):
    """d f / d x for f: R^n -> R (numpy, float64)."""
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        g.flat[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def mlp_loss(w1, b1, w2, x, y):
    h = tf.tanh(tf.matmul(x, w1) + b1)
    return tf.reduce_mean((tf.matmul(h, w2)[:, 0] - y) ** 2)


def random_mlp(rng, n_in, n_hidden, batch, dtype=np.float64):
    w1 = rng.normal(size=(n_in, n_hidden)).astype(dtype)
    b1 = rng.normal(size=(n_hidden,)).astype(dtype)
    w2 = rng.normal(size=(n_hidden, 1)).astype(dtype)
    x = rng.normal(size=(batch, n_in)).astype(dtype)
    y = rng.normal(size=(batch,)).astype(dtype)
    return [w1, b1, w2], x, y


def flat(structure):
    return np.concatenate([np.reshape(np.asarray(t), [-1]) for t in tf.nest.flatten(structure)])


# ----------------------------------------------------------------------------- value_and_grad


def test_value_and_grad_matches_finite_differences_on_mlp():
    rng = np.random.default_rng(0)
    (w1, b1, w2), x, y = random_mlp(rng, 3, 4, 7)
    params = {"w1": tf.Variable(w1), "b1": tf.constant(b1), "w2": tf.Variable(w2)}
    value, grads = hogrod.value_and_grad(
        lambda: mlp_loss(params["w1"], params["b1"], params["w2"], x, y), params)
    assert set(grads) == {"w1", "b1", "w2"}
    sizes = [w1.size, b1.size, w2.size]
    shapes = [w1.shape, b1.shape, w2.shape]

    def f(theta):
        parts = np.split(theta, np.cumsum(sizes)[:-1])
        a, b, c = [p.reshape(s) for p, s in zip(parts, shapes)]
        return float(mlp_loss(a, b, c, x, y))

    theta = np.concatenate([w1.ravel(), b1.ravel(), w2.ravel()])
    np.testing.assert_allclose(value, f(theta), rtol=1e-12)
    expected = central_diff_grad(f, theta)
    got = np.concatenate([np.ravel(grads[k]) for k in ("w1", "b1", "w2")])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)


def test_value_and_grad_unconnected_policies():
    a = tf.Variable([1.0, 2.0], name="used")
    b = tf.Variable(3.0, name="lonely")
    fn = lambda: tf.reduce_sum(a ** 2)  # noqa: E731
    _, (ga, gb) = hogrod.value_and_grad(fn, [a, b])
    np.testing.assert_allclose(ga, [2.0, 4.0])
    np.testing.assert_array_equal(gb, 0.0)
    _, (ga, gb) = hogrod.value_and_grad(fn, [a, b], unconnected="none")
    assert gb is None
    with pytest.raises(ValueError, match="lonely"):
        hogrod.value_and_grad(fn, [a, b], unconnected="raise")
    with pytest.raises(ValueError, match="unconnected"):
        hogrod.value_and_grad(fn, [a, b], unconnected="ignore")


def test_value_and_grad_rejects_non_scalar():
    a = tf.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match="scalar"):
        hogrod.value_and_grad(lambda: a * 2, [a])


def test_value_and_grad_on_keras_variables_equals_tape():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    x = tf.random.stateless_normal((8, 4), seed=(1, 2))
    fn = lambda: tf.reduce_mean(model(x) ** 2)  # noqa: E731
    _, grads = hogrod.value_and_grad(fn, model.trainable_variables)
    with tf.GradientTape() as tape:
        loss = fn()
    expected = tape.gradient(loss, model.trainable_variables)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)


# ----------------------------------------------------------------------------- hvp


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_hvp_quadratic_closed_form(mode, dtype):
    rng = np.random.default_rng(1)
    A = tf.constant(rng.normal(size=(5, 5)), dtype)
    w = tf.Variable(rng.normal(size=(5,)), dtype=dtype)
    v = tf.constant(rng.normal(size=(5,)), dtype)
    fn = lambda: tf.tensordot(w, tf.linalg.matvec(A, w), 1)  # noqa: E731
    got = hogrod.hvp(fn, w, v, mode=mode)
    assert got.dtype == dtype
    expected = tf.linalg.matvec(A + tf.transpose(A), v)
    tol = 1e-5 if dtype == tf.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", MODES)
def test_hvp_linear_regression_closed_form(mode):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(20, 4))
    y = rng.normal(size=(20,))
    w = tf.Variable(rng.normal(size=(4,)))
    v = rng.normal(size=(4,))
    fn = lambda: tf.reduce_mean((tf.linalg.matvec(X, w) - y) ** 2)  # noqa: E731
    got = hogrod.hvp(fn, [w], [tf.constant(v)], mode=mode)[0]
    np.testing.assert_allclose(got, 2 * X.T @ X @ v / 20, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_hvp_logistic_regression_closed_form(mode):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 3))
    t = rng.integers(0, 2, size=30).astype(np.float64)
    w = tf.Variable(rng.normal(size=(3,)))
    v = rng.normal(size=(3,))

    def fn():
        logits = tf.linalg.matvec(X, w)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=t, logits=logits))

    p = 1 / (1 + np.exp(-X @ w.numpy()))
    H = X.T @ np.diag(p * (1 - p)) @ X / 30
    got = hogrod.hvp(fn, w, tf.constant(v), mode=mode)
    np.testing.assert_allclose(got, H @ v, rtol=1e-10)
    np.testing.assert_allclose(hogrod.hessian(fn, w), H, rtol=1e-10)


@hypothesis.given(n_in=st.integers(1, 4), n_hidden=st.integers(1, 5), batch=st.integers(1, 6),
                  seed=st.integers(0, 2**16), compiled=st.booleans())
def test_hvp_modes_agree_and_match_finite_differences(n_in, n_hidden, batch, seed, compiled):
    rng = np.random.default_rng(seed)
    (w1, b1, w2), x, y = random_mlp(rng, n_in, n_hidden, batch)
    params = [tf.Variable(w1), tf.Variable(b1), tf.Variable(w2)]
    vector = [tf.constant(rng.normal(size=p.shape)) for p in params]
    fn = lambda: mlp_loss(*params, x, y)  # noqa: E731
    wrap = tf.function if compiled else (lambda f: f)
    rr = wrap(lambda v: hogrod.hvp(fn, params, v, mode="reverse_over_reverse"))(vector)
    fr = wrap(lambda v: hogrod.hvp(fn, params, v, mode="forward_over_reverse"))(vector)
    np.testing.assert_allclose(flat(rr), flat(fr), rtol=1e-10, atol=1e-12)
    # Oracle: central differences of the gradient along v (float64).
    eps = 1e-6

    def grad_at(shift):
        for p, w0, v in zip(params, (w1, b1, w2), vector):
            p.assign(w0 + shift * v.numpy())
        return flat(hogrod.grad(fn, params))

    fd = (grad_at(eps) - grad_at(-eps)) / (2 * eps)
    np.testing.assert_allclose(flat(rr), fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_hvp_on_keras_model_matches_dense_hessian(mode):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(4, activation="tanh", dtype="float64"),
                              keras.layers.Dense(2, dtype="float64")])
    x = tf.random.stateless_normal((6, 3), seed=(0, 1), dtype=tf.float64)
    labels = tf.constant([0, 1, 1, 0, 1, 0])

    def fn():
        logits = model(x)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    params = model.trainable_variables
    vector = [tf.random.stateless_normal(p.shape, seed=(i, 7), dtype=tf.float64)
              for i, p in enumerate(params)]
    H = hogrod.hessian(fn, params).numpy()
    n = sum(int(np.prod(p.shape)) for p in params)
    assert H.shape == (n, n)
    np.testing.assert_allclose(H, H.T, atol=1e-12)
    got = hogrod.hvp(fn, params, vector, mode=mode)
    np.testing.assert_allclose(flat(got), H @ flat(vector), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_hvp_in_tf_function_does_not_retrace(mode):
    w = tf.Variable(tf.ones([3], tf.float64))
    A = tf.constant(np.diag([1.0, 2.0, 3.0]))

    @tf.function
    def step(v):
        return hogrod.hvp(lambda: 0.5 * tf.tensordot(w, tf.linalg.matvec(A, w), 1), w, v, mode=mode)

    for k in range(4):
        v = tf.constant([1.0, k, 2.0 * k], tf.float64)
        np.testing.assert_allclose(step(v), [1.0, 2.0 * k, 6.0 * k])
        w.assign_add(tf.ones([3], tf.float64))
    assert step.experimental_get_tracing_count() == 1


def test_hvp_zeros_for_unconnected_and_bad_vector():
    a = tf.Variable([1.0, 2.0])
    b = tf.Variable(1.0, name="b_unused")
    got = hogrod.hvp(lambda: tf.reduce_sum(a ** 3), [a, b], [tf.ones(2), tf.constant(1.0)])
    np.testing.assert_allclose(got[0], [6.0, 12.0])
    np.testing.assert_array_equal(got[1], 0.0)
    with pytest.raises(ValueError, match="shape"):
        hogrod.hvp(lambda: tf.reduce_sum(a ** 3), [a, b], [tf.ones(3), tf.constant(1.0)])
    with pytest.raises(ValueError, match="mode"):
        hogrod.hvp(lambda: tf.reduce_sum(a ** 3), [a], [tf.ones(2)], mode="forward_over_forward")


# ----------------------------------------------------------------------------- hessian


def test_hessian_matches_finite_differences_of_gradient_over_several_params():
    rng = np.random.default_rng(4)
    (w1, b1, w2), x, y = random_mlp(rng, 2, 3, 5)
    params = [tf.Variable(w1), tf.Variable(b1), tf.Variable(w2)]
    fn = lambda: mlp_loss(*params, x, y)  # noqa: E731
    H = hogrod.hessian(fn, params).numpy()
    theta0 = flat([w1, b1, w2])
    n = theta0.size
    fd = np.zeros((n, n))
    eps = 1e-6
    for i in range(n):
        cols = []
        for s in (eps, -eps):
            th = theta0.copy()
            th[i] += s
            parts = np.split(th, np.cumsum([w1.size, b1.size]))
            for p, part in zip(params, parts):
                p.assign(part.reshape(p.shape))
            cols.append(flat(hogrod.grad(fn, params)))
        fd[:, i] = (cols[0] - cols[1]) / (2 * eps)
    np.testing.assert_allclose(H, fd, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- jacobians


def test_jacobian_of_nested_input_is_structured_like_it():
    a, b = tf.constant([1.0, 2.0], tf.float64), tf.constant(3.0, tf.float64)
    J = hogrod.jacobian(lambda xs: tf.stack([xs["a"][0] * xs["b"], xs["a"][1] ** 2]),
                        {"a": a, "b": b})
    np.testing.assert_allclose(J["a"], [[3.0, 0.0], [0.0, 4.0]])
    np.testing.assert_allclose(J["b"], [1.0, 0.0])


def test_jacobian_linear_map_and_finite_differences():
    rng = np.random.default_rng(5)
    M = rng.normal(size=(3, 4))
    x = tf.constant(rng.normal(size=(4,)))
    np.testing.assert_allclose(hogrod.jacobian(lambda x: tf.linalg.matvec(M, x), x), M, rtol=1e-12)
    f = lambda x: tf.stack([tf.sin(x[0]) * x[1], x[2] ** 2, tf.exp(x[3] * x[0])])  # noqa: E731
    J = hogrod.jacobian(f, x).numpy()
    for i in range(3):
        fd = central_diff_grad(lambda z: float(f(tf.constant(z))[i]), x.numpy())
        np.testing.assert_allclose(J[i], fd, rtol=1e-6, atol=1e-9)


def test_batch_jacobian_equals_diagonal_blocks_of_full_jacobian():
    rng = np.random.default_rng(6)
    W = tf.constant(rng.normal(size=(3, 2)))
    x = tf.constant(rng.normal(size=(5, 3)))
    f = lambda x: tf.tanh(tf.matmul(x, W))  # noqa: E731
    bj = hogrod.batch_jacobian(f, x).numpy()
    full = hogrod.jacobian(f, x).numpy()  # [5, 2, 5, 3]
    assert bj.shape == (5, 2, 3)
    for i in range(5):
        np.testing.assert_allclose(bj[i], full[i, :, i, :], rtol=1e-12)
    # closed form: diag(1 - tanh^2) W^T
    t = np.tanh(x.numpy() @ W.numpy())
    np.testing.assert_allclose(bj, (1 - t ** 2)[:, :, None] * W.numpy().T[None], rtol=1e-12)


# ----------------------------------------------------------------------------- derivatives


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_derivatives_polynomial_tower(dtype):
    # x * x * x, not x ** 3: TensorFlow's Pow gradient is 0 * x**-1 = NaN at x = 0 from order 4.
    x = tf.constant([-1.5, 0.0, 2.0], dtype)
    d1, d2, d3, d4 = hogrod.derivatives(lambda x: x * x * x, x, 4)
    xn = x.numpy()
    np.testing.assert_allclose(d1, 3 * xn ** 2, rtol=1e-6)
    np.testing.assert_allclose(d2, 6 * xn, rtol=1e-6)
    np.testing.assert_allclose(d3, [6.0, 6.0, 6.0], rtol=1e-6)
    np.testing.assert_array_equal(d4, 0.0)


def test_derivatives_of_pow_away_from_zero_match_seed_example():
    # The seeds' example: x**3 -> 3x**2 -> 6x.
    d1, d2 = hogrod.derivatives(lambda x: x ** 3, tf.constant(3.0), 2)
    assert float(d1) == 27.0 and float(d2) == 18.0


def test_derivatives_of_sin_cycle_and_inside_tf_function():
    fn = tf.function(lambda x: hogrod.derivatives(tf.sin, x, 4))
    x = tf.constant(np.linspace(-2, 2, 7))
    d = fn(x)
    np.testing.assert_allclose(d[0], np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(d[1], -np.sin(x), atol=1e-12)
    np.testing.assert_allclose(d[2], -np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(d[3], np.sin(x), atol=1e-12)
    fn(x + 1.0)
    assert fn.experimental_get_tracing_count() == 1
    with pytest.raises(ValueError, match="order"):
        hogrod.derivatives(tf.sin, x, 0)


# ----------------------------------------------------------------------------- gnvp


def test_gnvp_equals_dense_jt_h_j():
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(6, 3)))
    labels = tf.constant(rng.integers(0, 4, size=6))
    W = tf.Variable(rng.normal(size=(3, 5)))
    V = tf.Variable(rng.normal(size=(5, 4)))
    model_fn = lambda: tf.matmul(tf.tanh(tf.matmul(x, W)), V)  # noqa: E731
    output_loss = lambda z: tf.reduce_mean(  # noqa: E731
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=z))
    vec = [tf.constant(rng.normal(size=W.shape)), tf.constant(rng.normal(size=V.shape))]
    got = flat(hogrod.gnvp(model_fn, output_loss, [W, V], vec))
    # Oracle: dense J (outputs x params) and dense H_L from the closed form of softmax-CE.
    J = np.concatenate([np.reshape(j, (24, -1)) for j in
                        hogrod.jacobian(lambda ps: model_fn_of(ps, x), [W, V])], axis=1)
    p = tf.nn.softmax(model_fn()).numpy()
    H_L = np.zeros((24, 24))
    for i in range(6):
        blk = (np.diag(p[i]) - np.outer(p[i], p[i])) / 6
        H_L[i * 4:(i + 1) * 4, i * 4:(i + 1) * 4] = blk
    np.testing.assert_allclose(got, J.T @ H_L @ J @ flat(vec), rtol=1e-9, atol=1e-12)


def model_fn_of(ps, x):
    W, V = ps
    return tf.reshape(tf.matmul(tf.tanh(tf.matmul(x, W)), V), [-1])


def test_gnvp_equals_hessian_for_linear_model_with_mse():
    rng = np.random.default_rng(8)
    X = tf.constant(rng.normal(size=(10, 3)))
    y = tf.constant(rng.normal(size=(10, 2)))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype="float64")])
    output_loss = lambda z: tf.reduce_mean((z - y) ** 2)  # noqa: E731
    vec = [tf.constant(rng.normal(size=p.shape)) for p in model.trainable_variables]
    gn = hogrod.gnvp(lambda: model(X), output_loss, model.trainable_variables, vec)
    hv = hogrod.hvp(lambda: output_loss(model(X)), model.trainable_variables, vec)
    np.testing.assert_allclose(flat(gn), flat(hv), rtol=1e-10)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("mode", MODES)
def test_hvp_of_a_non_scalar_function_is_an_error_giving_its_shape(mode):
    a = tf.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match=r"hvp: fn\(\) must return a scalar, got shape \(2,\)"):
        hogrod.hvp(lambda: a ** 3, a, tf.ones(2), mode=mode)
    with pytest.raises(ValueError, match=r"hessian: fn\(\) must return a scalar"):
        hogrod.hessian(lambda: a ** 3, a)
    with pytest.raises(ValueError, match=r"gnvp: output_loss\(z\) must return a scalar"):
        hogrod.gnvp(lambda: a * 2.0, lambda z: z ** 2, a, tf.ones(2))


def test_a_vector_of_the_wrong_structure_gives_counts_and_shapes_not_values():
    big = tf.Variable(tf.fill([50, 40], 1234.5), name="big_kernel")
    b = tf.Variable(tf.zeros([40]))
    fn = lambda: tf.reduce_sum(tf.matmul(tf.ones([1, 50]), big) + b)  # noqa: E731
    for call in (lambda v: hogrod.hvp(fn, [big, b], v),
                 lambda v: hogrod.gnvp(lambda: big * 1.0, tf.reduce_sum, [big, b], v)):
        with pytest.raises(ValueError, match=r"2 parts\) and vector is \[float32\[50, 40\]\] "
                                             r"\(1 parts\)") as info:
            call([tf.ones([50, 40])])
        assert "1234" not in str(info.value) and len(str(info.value)) < 400
    with pytest.raises(ValueError, match=r"vector\[1\] has shape \(3,\) but .*params\[1\]"):
        hogrod.hvp(fn, [big, b], [tf.ones([50, 40]), tf.ones([3])])
    with pytest.raises(ValueError, match="structured like params"):
        hogrod.hvp(fn, {"w": big, "b": b}, {"w": tf.ones([50, 40]), "bias": tf.ones([40])})


@pytest.mark.parametrize("mode", MODES)
def test_hvp_accepts_numbers_and_numpy_arrays_at_the_params_dtype(mode):
    w = tf.Variable(0.5, dtype=tf.float64)
    fn = lambda: w ** 4  # noqa: E731  (H = 12 w^2 = 3)
    got = hogrod.hvp(fn, w, 0.1, mode=mode)
    assert got.dtype == tf.float64
    # 0.1 taken at float64, not through float32 (which would be off by ~1.5e-9 relative)
    assert float(got) == 3.0 * 0.1
    v = np.array([0.1, -2.0, 3.0])  # float64 numpy for float32 params: converted
    a = tf.Variable([1.0, 2.0, 3.0])
    got = hogrod.hvp(lambda: tf.reduce_sum(a ** 3), a, v, mode=mode)
    np.testing.assert_allclose(got, 6 * a.numpy() * v, rtol=1e-6)
    assert got.dtype == tf.float32


def test_a_vector_of_another_dtype_is_an_error_naming_both():
    w = tf.Variable([1.0, 2.0], dtype=tf.float64, name="w64")
    for call in (lambda v: hogrod.hvp(lambda: tf.reduce_sum(w ** 3), w, v),
                 lambda v: hogrod.gnvp(lambda: w * 1.0, tf.reduce_sum, w, v)):
        with pytest.raises(TypeError, match=r"vector\[0\] has dtype float32 but w64.* float64"):
            call(tf.ones(2, tf.float32))
        with pytest.raises(TypeError, match=r"vector\[0\] .* must be a tensor, a number"):
            call("ab")


def test_bad_params_are_named_by_every_primitive():
    good = tf.Variable([1.0, 2.0])
    fn = lambda: tf.reduce_sum(good ** 2)  # noqa: E731
    ints = tf.constant([1, 2])
    calls = {
        "value_and_grad": lambda p: hogrod.value_and_grad(fn, p),
        "grad": lambda p: hogrod.grad(fn, p),  # reported as value_and_grad
        "hvp": lambda p: hogrod.hvp(fn, p, tf.nest.map_structure(lambda _: tf.ones(2), p)),
        "hessian": lambda p: hogrod.hessian(fn, p),
        "gnvp": lambda p: hogrod.gnvp(lambda: good * 1.0, tf.reduce_sum, p,
                                      tf.nest.map_structure(lambda _: tf.ones(2), p)),
        "jacobian": lambda p: hogrod.jacobian(lambda x: x, p),
        "batch_jacobian": lambda p: hogrod.batch_jacobian(lambda x: x, p),
    }
    for name, call in calls.items():
        what = "value_and_grad" if name == "grad" else name
        arg = "x" if "jacobian" in name else "params"
        # a numpy array is not a tensor (the gradient would silently be zero or fail in TF)
        with pytest.raises(TypeError, match=rf"{what}: {arg}\[0\] must be a tf.Variable.*ndarray"):
            call(np.ones(2, np.float32))
        # an integer tensor has no gradient: zeros would be a silent wrong answer
        with pytest.raises(TypeError, match=rf"{what}: {arg}\[0\] has dtype int32"):
            call(ints)
        if "jacobian" not in name:
            with pytest.raises(ValueError, match=rf"{what}: params is empty"):
                call([])
    with pytest.raises(ValueError, match="derivatives: order"):
        hogrod.derivatives(tf.sin, tf.ones(2), 1.5)
    with pytest.raises(TypeError, match="derivatives: x.* has dtype int32"):
        hogrod.derivatives(tf.sin, ints, 1)
    with pytest.raises(ValueError, match="derivatives: fn must be elementwise"):
        hogrod.derivatives(tf.reduce_sum, tf.ones(3), 2)
    with pytest.raises(ValueError, match="batch_jacobian: fn.* keep x's batch axis"):
        hogrod.batch_jacobian(tf.reduce_sum, tf.ones([3, 2]))
    with pytest.raises(TypeError, match="batch_jacobian: x must be one tensor"):
        hogrod.batch_jacobian(lambda x: x, [tf.ones([3, 2])])


def test_checks_work_when_traced_with_unknown_sizes():
    w = tf.Variable([1.0, 2.0, 3.0])
    step = tf.function(lambda v: hogrod.hvp(lambda: tf.reduce_sum(w ** 3), w, v))
    step.get_concrete_function(tf.TensorSpec([None]))
    np.testing.assert_allclose(step(tf.ones(3)), 6 * w.numpy())
    with pytest.raises(ValueError, match="vector\\[0\\] has shape"):
        step(tf.ones([2, 3]))
