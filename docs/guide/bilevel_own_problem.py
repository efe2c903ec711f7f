"""Bilevel optimization on your own problem: a differentiable optimizer in your own training
loop, implicit differentiation of your own solver, and the hypergradient of your own
regularizer.

    python docs/guide/bilevel_own_problem.py            # full size
    python docs/guide/bilevel_own_problem.py --quick    # small (HOGROD_GUIDE_QUICK=1 too)

Three parts, each checked against an oracle that does not use the function under test:

(a) `hogrod.optim.adam` inside your own loop: the validation loss after K unrolled Adam
    steps of a small Keras regressor, differentiated in Adam's (log) learning rate, against
    float64 central differences of the same K-step loss; one step against Keras's Adam.
(b) `hogrod.implicit.custom_root` on your own Newton solver of an L2-regularized logistic
    regression: the solution's derivative in the regularization strength and in the data
    against central differences of the solver; a solver stopped short is refused.
(c) `hogrod.hypergrad.hypergradient` of a per-feature L2 penalty on ridge regression, by
    the three methods: implicit against the closed form, unrolled against central
    differences of a numpy unroll, one_step against its own closed form.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
from hogrod import hypergrad, implicit, optim  # noqa: E402


def _rel(a, b):
    a, b = np.ravel(np.asarray(a, np.float64)), np.ravel(np.asarray(b, np.float64))
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


# ---- (a) a differentiable optimizer in your own training loop ------------------------------

def make_regressor(width):
    return keras.Sequential([keras.Input((1,), dtype="float64"),
                             keras.layers.Dense(width, activation="tanh", dtype="float64"),
                             keras.layers.Dense(1, dtype="float64")])


def learn_the_learning_rate(quick):
    """d validation loss after K Adam steps / d log(learning rate), through the K steps."""
    rng = np.random.default_rng(0)
    steps, width, n = (4, 4, 16) if quick else (20, 16, 64)
    x = tf.constant(rng.uniform(-2, 2, size=(n, 1)))
    y = tf.sin(2 * x)
    x_val = tf.constant(rng.uniform(-2, 2, size=(n, 1)))
    y_val = tf.sin(2 * x_val)
    keras.utils.set_random_seed(0)
    model = make_regressor(width)
    w0 = hogrod.trainable_values(model)

    def mse(weights, xs, ys):
        return tf.reduce_mean(tf.square(hogrod.functional_call(model, weights, xs) - ys))

    # the rate as a trainable variable: value = exp(log_lr) (any real log_lr is valid)
    opt, (log_lr,) = optim.learnable(optim.adam(0.05), tf.float64, names=["learning_rate"])

    @tf.function(autograph=False)
    def value_and_hypergrad():
        """Your own loop: K Adam steps from w0, then the validation loss; the tape sees
        every step."""
        with tf.GradientTape() as tape:
            weights, state = w0, opt.init(w0)
            for _ in range(steps):                 # unrolled at trace time: K is small
                grads = hogrod.grad(lambda: mse(weights, x, y), weights)
                weights, state = opt.update(grads, state, weights)
            value = mse(weights, x_val, y_val)
        return value, tape.gradient(value, log_lr)

    value, d_log_lr = value_and_hypergrad()

    # oracle: float64 central differences of the unrolled loss in log(learning rate)
    eps, start = 1e-5, log_lr.numpy()
    log_lr.assign(start + eps)
    plus = float(value_and_hypergrad()[0])
    log_lr.assign(start - eps)
    minus = float(value_and_hypergrad()[0])
    log_lr.assign(start)
    fd = (plus - minus) / (2 * eps)
    assert abs(float(d_log_lr) - fd) <= 1e-6 * abs(fd) + 1e-10, (float(d_log_lr), fd)

    # a few outer steps on the rate lower the unrolled validation loss
    before = float(value)
    for _ in range(3 if quick else 20):
        log_lr.assign_sub(0.5 * value_and_hypergrad()[1])
    after = float(value_and_hypergrad()[0])
    assert after < before, (before, after)

    # one step of hogrod.optim.adam is Keras's Adam (exactly, for float32-exact settings)
    lr, b1, b2, eps32 = 2.0**-5, 0.875, 0.9990234375, 2.0**-20
    grads = hogrod.grad(lambda: mse(w0, x, y), w0)
    mine, _ = optim.adam(lr, b1, b2, eps32).update(grads, optim.adam(lr).init(w0), w0)
    kvars = [keras.Variable(w.numpy(), dtype="float64") for w in w0]
    keras.optimizers.Adam(lr, beta_1=b1, beta_2=b2, epsilon=eps32).apply(grads, kvars)
    assert max(_rel(m, k.numpy()) for m, k in zip(mine, kvars)) < 1e-12
    return {"lr_before": float(np.exp(start)), "lr_after": float(np.exp(log_lr.numpy())),
            "val_before": before, "val_after": after, "d_log_lr": float(d_log_lr), "fd": fd}


# ---- (b) custom_root on your own solver -----------------------------------------------------

def logistic_data(n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = (x @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0).astype(np.float64)
    return tf.constant(x), tf.constant(y)


def logistic_gradient(w, x, y, lam):
    """F(w, x, y, lam): the gradient of mean logistic loss + lam/2 |w|^2, zero at the fit."""
    p = tf.sigmoid(tf.linalg.matvec(x, w))
    return tf.linalg.matvec(x, p - y, transpose_a=True) / tf.cast(tf.shape(x)[0], w.dtype) + (
        lam * w)


NEWTON_STEPS = 10  # quadratic convergence: rounding level well before this


def newton(w, x, y, lam, iterations):
    """Your own solver (nothing in it is differentiated): Newton's method."""
    n = tf.cast(tf.shape(x)[0], w.dtype)
    for _ in range(iterations):
        p = tf.sigmoid(tf.linalg.matvec(x, w))
        hess = tf.matmul(x * (p * (1 - p))[:, None], x, transpose_a=True) / n + lam * tf.eye(
            w.shape[0], dtype=w.dtype)
        w = w - tf.linalg.solve(hess, logistic_gradient(w, x, y, lam)[:, None])[:, 0]
    return w


def differentiate_own_solver(quick):
    n, d = (40, 3) if quick else (400, 10)
    x, y = logistic_data(n, d, seed=1)
    lam = tf.constant(0.1, tf.float64)
    init = tf.zeros(d, tf.float64)

    @implicit.custom_root(logistic_gradient)            # solve="cg": F's Jacobian is SPD
    def fit(init, x, y, lam):
        return newton(init, x, y, lam, NEWTON_STEPS)

    with tf.GradientTape() as tape:
        tape.watch([x, lam])
        w = fit(init, x, y, lam)
        loss_of_w = tf.reduce_sum(tf.sin(w))            # any scalar of the solution
    dloss_dlam, dloss_dx = (g.numpy() for g in tape.gradient(loss_of_w, [lam, x]))

    # oracle 1: the implicit function theorem in closed form, dw/dlam = -(hessian)^{-1} w
    p = tf.sigmoid(tf.linalg.matvec(x, w)).numpy()
    hess = (x.numpy().T * p * (1 - p)) @ x.numpy() / n + float(lam) * np.eye(d)
    dw_dlam = -np.linalg.solve(hess, w.numpy())
    assert _rel(dloss_dlam, np.cos(w.numpy()) @ dw_dlam) < 1e-8
    # oracle 2: central differences of the solver itself (Newton: converged to rounding)
    eps = 1e-6

    def loss_at(x, lam):
        return float(tf.reduce_sum(tf.sin(newton(init, x, y, lam, NEWTON_STEPS))))

    fd = (loss_at(x, lam + eps) - loss_at(x, lam - eps)) / (2 * eps)
    assert abs(dloss_dlam - fd) <= 1e-6 * abs(fd), (dloss_dlam, fd)
    dx = tf.constant(np.random.default_rng(2).normal(size=(n, d)))
    fd_x = (loss_at(x + eps * dx, lam) - loss_at(x - eps * dx, lam)) / (2 * eps)
    assert abs(np.sum(dloss_dx * dx.numpy()) - fd_x) <= 1e-6 * abs(fd_x), fd_x

    # a solver that stops short is refused: its implicit gradient would be silently wrong
    short = implicit.custom_root(logistic_gradient)(
        lambda init, x, y, lam: newton(init, x, y, lam, iterations=1))
    try:
        short(init, x, y, lam)
    except ValueError as e:
        assert "logistic_gradient" in str(e), e
    else:
        raise AssertionError("custom_root accepted a solver that did not reach a root")
    return {"w": w.numpy(), "dw_dlam": dw_dlam, "dloss_dlam": float(dloss_dlam)}


# ---- (c) the hypergradient of your own regularizer ------------------------------------------

def ridge_problem(n_train, n_val, d, seed):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=d) * (rng.uniform(size=d) < 0.5)   # half the features matter
    a, av = rng.normal(size=(n_train, d)), rng.normal(size=(n_val, d))
    b = a @ w_true + 0.5 * rng.normal(size=n_train)
    bv = av @ w_true + 0.5 * rng.normal(size=n_val)
    return a, b, av, bv


def tune_own_regularizer(quick):
    n, n_val, d = (20, 20, 4) if quick else (50, 200, 20)
    a, b, av, bv = ridge_problem(n, n_val, d, seed=3)
    A, B, AV, BV = (tf.constant(t) for t in (a, b, av, bv))

    def inner_objective(w, log_lam):                    # your model and your penalty
        r = tf.linalg.matvec(A, w) - B
        return 0.5 * tf.reduce_sum(r * r) + 0.5 * tf.reduce_sum(tf.exp(log_lam) * w * w)

    def outer_objective(w, log_lam):                    # validation error: minimized over h
        r = tf.linalg.matvec(AV, w) - BV
        return tf.reduce_mean(r * r)

    log_lam = np.log(np.full(d, 2.0))
    h_inner = a.T @ a + np.diag(np.exp(log_lam))        # the inner Hessian
    lr = 1.0 / np.linalg.eigvalsh(h_inner)[-1]          # a step size GD converges with
    w0 = np.zeros(d)

    def run(method, params=w0, h=log_lam):
        fn = tf.function(lambda p, h: hypergrad.hypergradient(inner_objective, outer_objective,
                                                              p, h, method), autograph=False)
        return fn(tf.constant(params), tf.constant(h))

    # implicit: the exact hypergradient at the inner optimum (CG on H^{-1} v)
    implicit_method = hypergrad.implicit(optim.sgd(lr), 3000, solve="cg", inner_tol=1e-12,
                                         tol=1e-12)
    tuned = tf.function(lambda h: hypergrad.hypergradient(
        inner_objective, outer_objective, tf.constant(w0), h, implicit_method), autograph=False)
    out = tuned(tf.constant(log_lam))
    w_star = np.linalg.solve(h_inner, a.T @ b)
    v = np.linalg.solve(h_inner, 2 * av.T @ (av @ w_star - bv) / n_val)
    exact = -np.exp(log_lam) * w_star * v               # closed form, d val / d log_lam
    assert _rel(out.grads, exact) < 1e-9 and _rel(out.params, w_star) < 1e-10

    # unrolled: the exact derivative of the loss after K steps (not of the optimum's), here
    # from a nonzero start w_now (e.g. the current inner iterate): at w = 0 the first
    # step would not depend on the penalty. Few steps, far from the optimum, so that every
    # step counts (after many, the first steps' share of the derivative has decayed).
    steps, w_now = 5, 0.5 * w_star

    def np_unrolled_val(h):
        w = w_now.copy()
        hh = a.T @ a + np.diag(np.exp(h))
        for _ in range(steps):
            w = w - lr * (hh @ w - a.T @ b)
        return np.mean((av @ w - bv) ** 2)

    unrolled = run(hypergrad.unrolled(optim.sgd(lr), steps), params=w_now)
    eps = 1e-6
    fd = np.array([(np_unrolled_val(log_lam + eps * e) - np_unrolled_val(log_lam - eps * e))
                   / (2 * eps) for e in np.eye(d)])
    assert _rel(unrolled.grads, fd) < 1e-7, (unrolled.grads.numpy(), fd)
    assert _rel(unrolled.grads, exact) > 1e-3       # not the optimum's hypergradient
    assert abs(float(unrolled.value) - np_unrolled_val(log_lam)) < 1e-10

    # one_step: d/dh of the loss after ONE step from the given params (DARTS, T1-T2)
    one = run(hypergrad.one_step(optim.sgd(lr)), params=w_now)
    w1 = w_now - lr * (h_inner @ w_now - a.T @ b)
    dval_dw1 = 2 * av.T @ (av @ w1 - bv) / n_val
    closed = dval_dw1 * (-lr * np.exp(log_lam) * w_now)  # dw1_j/dlog_lam_j = -lr lam_j w_j
    assert _rel(one.grads, closed) < 1e-10

    # a few hypergradient steps on the penalty lower the validation error at the optimum
    h, first = log_lam, float(out.value)
    for _ in range(3 if quick else 30):
        h = h - 2.0 * tuned(tf.constant(h)).grads.numpy()
    last = float(tuned(tf.constant(h)).value)
    assert last < first, (first, last)
    return {"implicit": out.grads.numpy(), "exact": exact, "unrolled": unrolled.grads.numpy(),
            "one_step": one.grads.numpy(), "val_before": first, "val_after": last}


def main(quick=False):
    a = learn_the_learning_rate(quick)
    b = differentiate_own_solver(quick)
    c = tune_own_regularizer(quick)
    print(f"bilevel: (a) Adam rate {a['lr_before']:.4f} -> {a['lr_after']:.4f}, unrolled "
          f"validation MSE {a['val_before']:.4f} -> {a['val_after']:.4f} (d/dlog lr "
          f"{a['d_log_lr']:.6f}, central differences {a['fd']:.6f}); (b) dw*/dlambda "
          f"{np.round(b['dw_dlam'], 5)}; (c) validation MSE {c['val_before']:.4f} -> "
          f"{c['val_after']:.4f} by tuning the per-feature L2")
    return {"optimizer": a, "solver": b, "regularizer": c}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
