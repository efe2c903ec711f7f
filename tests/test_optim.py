"""hogrod.optim against Keras 3's optimizers (same state, several steps, float32 and
float64) and numpy (float64 hyperparameters exact), hyperparameter derivatives against
float64 central differences, finite derivatives at a zero gradient, tf.function against
eager, bad input; and meta.adapt with an inner optimizer (inner sgd == plain MAML, inner
Adam == Keras Adam steps, its meta-gradient against central differences)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import meta, optim

# Values float32 represents exactly: Keras rounds Python floats through float32 even for
# float64 variables, hogrod does not, so only these make the float64 comparison exact.
LR, B1, B2, EPS, RHO, MOM, WD = 2.0**-7, 0.875, 0.9990234375, 2.0**-20, 0.875, 0.5, 0.25

CASES = {
    "sgd": (lambda: optim.sgd(LR), lambda: keras.optimizers.SGD(LR)),
    "sgd_momentum": (lambda: optim.sgd(LR, momentum=MOM),
                     lambda: keras.optimizers.SGD(LR, momentum=MOM)),
    "sgd_nesterov": (lambda: optim.sgd(LR, momentum=MOM, nesterov=True),
                     lambda: keras.optimizers.SGD(LR, momentum=MOM, nesterov=True)),
    "adam": (lambda: optim.adam(LR, B1, B2, EPS),
             lambda: keras.optimizers.Adam(LR, beta_1=B1, beta_2=B2, epsilon=EPS)),
    "adamw": (lambda: optim.adamw(LR, B1, B2, EPS, weight_decay=WD),
              lambda: keras.optimizers.AdamW(LR, weight_decay=WD, beta_1=B1, beta_2=B2,
                                             epsilon=EPS)),
    "rmsprop": (lambda: optim.rmsprop(LR, RHO, eps=EPS),
                lambda: keras.optimizers.RMSprop(LR, rho=RHO, epsilon=EPS)),
    "rmsprop_momentum": (lambda: optim.rmsprop(LR, RHO, momentum=MOM, eps=EPS),
                         lambda: keras.optimizers.RMSprop(LR, rho=RHO, momentum=MOM,
                                                          epsilon=EPS)),
}


def arrays(seed, dtype):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(dtype) for s in [(3, 2), (2,)]]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_three_steps_match_keras(case, dtype, tol):
    make, make_keras = CASES[case]
    params0 = arrays(0, dtype)
    kvars = [keras.Variable(p, dtype=dtype.__name__) for p in params0]
    kopt = make_keras()
    opt = make()
    params = {"w": tf.constant(params0[0]), "b": tf.constant(params0[1])}  # a dict works
    state = opt.init(params)
    for step in range(3):
        grads = arrays(10 + step, dtype)
        kopt.apply([tf.constant(g) for g in grads], kvars)
        params, state = opt.update({"w": tf.constant(grads[0]), "b": tf.constant(grads[1])},
                                   state, params)
        for mine, theirs in zip([params["w"], params["b"]], kvars):
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=tol, atol=tol)
    assert int(state.count) == 3


def _objective(opt, state, params, grads):
    """A scalar of the update's outputs (new params and every float state buffer)."""
    new_params, new_state = opt.update(grads, state, params)
    out = [tf.reduce_sum(w * x) for w, x in zip([1.0, -0.7], new_params)]
    for i, buf in enumerate(tf.nest.flatten(new_state)[1:]):  # [0] is the count
        out.append((0.3 + 0.1 * i) * tf.reduce_sum(tf.sin(buf)))
    return tf.add_n(out)


HYPER = {  # optimizer, hyperparameter -> builder from that hyperparameter's value
    ("sgd", "learning_rate"): lambda h: optim.sgd(h, momentum=0.5, nesterov=True),
    ("sgd", "momentum"): lambda h: optim.sgd(0.1, momentum=h, nesterov=True),
    ("adam", "learning_rate"): lambda h: optim.adam(h, 0.8, 0.95, 1e-3),
    ("adam", "b1"): lambda h: optim.adam(0.1, h, 0.95, 1e-3),
    ("adam", "b2"): lambda h: optim.adam(0.1, 0.8, h, 1e-3),
    ("adam", "eps"): lambda h: optim.adam(0.1, 0.8, 0.95, h),
    ("adamw", "weight_decay"): lambda h: optim.adamw(0.1, 0.8, 0.95, 1e-3, weight_decay=h),
    ("adamw", "learning_rate"): lambda h: optim.adamw(h, 0.8, 0.95, 1e-3, weight_decay=0.3),
    ("rmsprop", "learning_rate"): lambda h: optim.rmsprop(h, 0.8, 0.5, 1e-3),
    ("rmsprop", "rho"): lambda h: optim.rmsprop(0.1, h, 0.5, 1e-3),
    ("rmsprop", "momentum"): lambda h: optim.rmsprop(0.1, 0.8, h, 1e-3),
    ("rmsprop", "eps"): lambda h: optim.rmsprop(0.1, 0.8, 0.5, h),
}
VALUES = {"learning_rate": 0.1, "momentum": 0.5, "b1": 0.8, "b2": 0.95, "eps": 1e-3,
          "rho": 0.8, "weight_decay": 0.3}


@pytest.mark.parametrize("key", sorted(HYPER), ids=lambda k: f"{k[0]}-{k[1]}")
def test_hyperparameter_derivative_matches_central_differences(key):
    build = HYPER[key]
    params = [tf.constant(a) for a in arrays(1, np.float64)]
    # A state two steps in, so momentum and bias correction terms are not trivial.
    opt0 = build(VALUES[key[1]])
    state = opt0.init(params)
    for step in range(2):
        params, state = opt0.update([tf.constant(a) for a in arrays(20 + step, np.float64)],
                                    state, params)
    grads = [tf.constant(a) for a in arrays(30, np.float64)]
    h = tf.Variable(VALUES[key[1]], dtype=tf.float64)
    with tf.GradientTape() as tape:
        f = _objective(build(h), state, params, grads)
    auto = tape.gradient(f, h).numpy()
    d = 1e-6 * max(1.0, VALUES[key[1]])
    fd = (_objective(build(VALUES[key[1]] + d), state, params, grads)
          - _objective(build(VALUES[key[1]] - d), state, params, grads)).numpy() / (2 * d)
    np.testing.assert_allclose(auto, fd, rtol=1e-6, atol=1e-9)


def _derivatives_through_update(opt, p, state):
    """d/dp and d2/dp2 of sum(update(grad L(p), state, p)) with L(p) = sum(p^2): zero
    gradient at p = 0."""
    with tf.GradientTape() as outer:
        outer.watch(p)
        with tf.GradientTape() as mid:
            mid.watch(p)
            with tf.GradientTape() as inner:
                inner.watch(p)
                loss = tf.reduce_sum(p * p)
            g = inner.gradient(loss, p)
            new_p, _ = opt.update([g], state, [p])
            f = tf.reduce_sum(new_p[0])
        first = mid.gradient(f, p)
    second = outer.gradient(first, p, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return first, second


ZERO_GRAD = {"sgd": lambda: optim.sgd(0.1, 0.5, True),
             "adam": lambda: optim.adam(0.1, 0.8, 0.95, 1e-3),
             "adamw": lambda: optim.adamw(0.1, 0.8, 0.95, 1e-3, 0.3),
             "rmsprop": lambda: optim.rmsprop(0.1, 0.8, 0.5, 1e-3)}


@pytest.mark.parametrize("name", sorted(ZERO_GRAD))
def test_derivatives_finite_at_zero_gradient_and_first_matches_differences(name):
    opt = ZERO_GRAD[name]()
    p = tf.constant([0.0, 0.0, 0.3], tf.float64)  # zero gradient (and zero state) for two
    state = opt.init([p])
    first, second = _derivatives_through_update(opt, p, state)
    assert np.all(np.isfinite(first.numpy())) and np.all(np.isfinite(second.numpy()))
    # The update is separable; its derivative at a zero gradient exists (see the module
    # docstring): central differences with a step well below eps agree.
    d = 1e-9

    def f(q):
        g = 2.0 * q
        return opt.update([g], state, [q])[0][0].numpy()

    e = np.zeros(3)
    e[:2] = d
    fd = (f(p + e) - f(p - e))[:2] / (2 * d)
    np.testing.assert_allclose(first.numpy()[:2], fd, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ZERO_GRAD))
def test_tf_function_equals_eager_without_retracing(name):
    lr = tf.Variable(0.1, dtype=tf.float64)
    opt = {"sgd": lambda: optim.sgd(lr, 0.5, True), "adam": lambda: optim.adam(lr),
           "adamw": lambda: optim.adamw(lr), "rmsprop": lambda: optim.rmsprop(lr, 0.8, 0.5)
           }[name]()
    params = [tf.constant(a) for a in arrays(2, np.float64)]
    grads = [tf.constant(a) for a in arrays(3, np.float64)]
    compiled = tf.function(opt.update)
    state = opt.init(params)
    for value in [0.1, 0.05]:
        lr.assign(value)
        eager = opt.update(grads, state, params)
        graph = compiled(grads, state, params)
        for a, b in zip(tf.nest.flatten(eager), tf.nest.flatten(graph)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-14)
        state = eager[1]
    assert compiled.experimental_get_tracing_count() == 1


def test_bad_input_names_the_argument():
    params = [tf.zeros([2], tf.float64), tf.zeros([3], tf.float64)]
    opt = optim.adam(0.1)
    state = opt.init(params)
    with pytest.raises(ValueError, match="grads"):
        opt.update([tf.zeros([2], tf.float64)], state, params)
    with pytest.raises(ValueError, match="state.nu"):
        opt.update(params, state._replace(nu=[tf.zeros([2], tf.float64)]), params)
    with pytest.raises(TypeError, match="state"):
        opt.update(params, optim.sgd(0.1).init(params), params)
    with pytest.raises(TypeError, match="learning_rate"):
        optim.adam(tf.constant(0.1, tf.float32)).update(params, state, params)
    for make, name in [(lambda: optim.sgd(-0.1), "learning_rate"),
                       (lambda: optim.sgd(0.1, momentum=1.5), "momentum"),
                       (lambda: optim.adam(0.1, b1=1.0), "b1"),
                       (lambda: optim.adam(0.1, b2=-0.1), "b2"),
                       (lambda: optim.adam(0.1, eps=0.0), "eps"),
                       (lambda: optim.adamw(0.1, weight_decay=-1.0), "weight_decay"),
                       (lambda: optim.rmsprop(0.1, rho=2.0), "rho"),
                       (lambda: optim.rmsprop(0.1, momentum=-0.5), "momentum"),
                       (lambda: optim.rmsprop(float("nan")), "learning_rate")]:
        with pytest.raises(ValueError, match=name):
            make()


def test_float64_hyperparameters_are_exact_against_numpy():
    """Python floats float32 cannot represent (0.1, 0.9, 0.999, 1e-7) are applied exactly:
    two Adam and RMSProp steps equal numpy's float64 formulas."""
    p0, g0, g1 = arrays(4, np.float64)[0], arrays(5, np.float64)[0], arrays(6, np.float64)[0]
    lr, b1, b2, eps, rho, mom = 0.1, 0.9, 0.999, 1e-7, 0.9, 0.3
    p, m, v = p0.copy(), 0 * p0, 0 * p0
    q, nu, k = p0.copy(), 0 * p0, 0 * p0
    for t, g in enumerate([g0, g1], start=1):
        m = m + (g - m) * (1 - b1)
        v = v + (g * g - v) * (1 - b2)
        p = p - m * (lr * np.sqrt(1 - b2**t) / (1 - b1**t)) / (np.sqrt(v) + eps)
        nu = rho * nu + (1 - rho) * g * g
        k = mom * k + lr * g / np.sqrt(nu + eps)
        q = q - k
    for opt, want in [(optim.adam(lr, b1, b2, eps), p), (optim.rmsprop(lr, rho, mom, eps), q)]:
        params = [tf.constant(p0)]
        state = opt.init(params)
        for g in [g0, g1]:
            params, state = opt.update([tf.constant(g)], state, params)
        np.testing.assert_allclose(params[0].numpy(), want, rtol=1e-14, atol=1e-15)


# ---- hogrod.meta.adapt with an inner optimizer --------------------------------------------

def _linear_task():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    rng = np.random.default_rng(7)
    xs, xq = rng.normal(size=(6, 2)), rng.normal(size=(5, 2))
    w = rng.normal(size=(2, 1))
    return model, (tf.constant(xs), tf.constant(xs @ w + 0.1)), (xq, xq @ w - 0.2)


def _mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def _meta_loss_and_grad(model, support, query, **adapt_kwargs):
    with tf.GradientTape() as tape:
        fast = meta.adapt(model, _mse, support, inner_steps=3, **adapt_kwargs)
        loss = _mse(query[1], model_call(model, fast, query[0]))
    return loss, tape.gradient(loss, model.trainable_variables)


def model_call(model, params, x):
    return hogrod.functional_call(model, params, x)


def test_adapt_with_inner_sgd_equals_plain_maml_float64():
    model, support, query = _linear_task()
    lr = 0.05  # not a float32 number
    want_loss, want = _meta_loss_and_grad(model, support, query, inner_lr=lr)
    loss, got = _meta_loss_and_grad(model, support, query, inner_lr=None,
                                    optimizer=optim.sgd(lr))
    np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-12)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)


def test_adapt_with_inner_adam_meta_gradient_matches_central_differences():
    model, support, query = _linear_task()
    opt = optim.adam(0.1, 0.8, 0.95, 1e-3)
    _, got = _meta_loss_and_grad(model, support, query, inner_lr=None, optimizer=opt)
    theta = [v.numpy() for v in model.trainable_variables]

    def loss_at(params):
        fast = meta.adapt(model, _mse, support, None, inner_steps=3, optimizer=opt,
                          params=[tf.constant(p) for p in params])
        return _mse(query[1], model_call(model, fast, query[0])).numpy()

    d = 1e-6
    for k, t in enumerate(theta):
        fd = np.zeros_like(t)
        for idx in np.ndindex(t.shape):
            plus = [p.copy() for p in theta]
            minus = [p.copy() for p in theta]
            plus[k][idx] += d
            minus[k][idx] -= d
            fd[idx] = (loss_at(plus) - loss_at(minus)) / (2 * d)
        np.testing.assert_allclose(got[k].numpy(), fd, rtol=1e-6, atol=1e-9)


def test_adapt_optimizer_bad_input():
    model, support, _ = _linear_task()
    with pytest.raises(ValueError, match="inner_lr"):
        meta.adapt(model, _mse, support, 0.1, optimizer=optim.sgd(0.1))
    with pytest.raises(TypeError, match="optimizer"):
        meta.adapt(model, _mse, support, None, optimizer=keras.optimizers.SGD(0.1))


def test_adapt_with_inner_adam_equals_keras_adam_steps():
    """The fast weights after 3 inner Adam steps equal Keras's Adam on a copy of the
    variables, trained on the same support loss (the state is threaded through the steps)."""
    model, support, _ = _linear_task()
    fast = meta.adapt(model, _mse, support, None, inner_steps=3,
                      optimizer=optim.adam(LR, B1, B2, EPS))
    kvars = [keras.Variable(v.numpy(), dtype="float64") for v in model.trainable_variables]
    kopt = keras.optimizers.Adam(LR, beta_1=B1, beta_2=B2, epsilon=EPS)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = _mse(support[1], model_call(model, [v.value for v in kvars], support[0]))
        kopt.apply(tape.gradient(loss, [v.value for v in kvars]), kvars)
    for a, b in zip(fast, kvars):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)


# ---- learnable hyperparameters ------------------------------------------------------------

LEARNED_AT = {"sgd": dict(learning_rate=0.1, momentum=0.7),
              "adam": dict(learning_rate=0.1, b1=0.8, b2=0.95, eps=1e-3),
              "adamw": dict(learning_rate=0.1, b1=0.8, b2=0.95, eps=1e-3, weight_decay=0.3),
              "rmsprop": dict(learning_rate=0.1, rho=0.8, momentum=0.5, eps=1e-3)}


@pytest.mark.parametrize("name", sorted(LEARNED_AT))
def test_learnable_steps_equal_the_plain_optimizer_at_the_same_values_float64(name):
    """Every default learned hyperparameter (log learning rate, logit b1, b2, rho, sgd's
    momentum, log weight decay) gives, over four steps, the plain optimizer's params and
    state at the same values, to float64 rounding: the parametrization changes how the
    hyperparameters are stored, never the update (bias corrections included)."""
    make = getattr(optim, name)
    plain = make(**LEARNED_AT[name])
    learned, variables = optim.learnable(plain, tf.float64)
    assert len(variables) == len(optim.LEARNED_BY_DEFAULT[name])
    params = mine = [tf.constant(a) for a in arrays(2, np.float64)]
    state, my_state = plain.init(params), learned.init(mine)
    for step in range(4):
        grads = [tf.constant(a) for a in arrays(40 + step, np.float64)]
        params, state = plain.update(grads, state, params)
        mine, my_state = learned.update(grads, my_state, mine)
        for a, b in zip(tf.nest.flatten((mine, my_state)), tf.nest.flatten((params, state))):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)
