"""hogrod.hypergrad against ridge regression's closed form and float64 central differences.

Inner: 0.5 ||A w - b||^2 + 0.5 sum_i exp(s_i) w_i^2 (s: per-feature log penalties); outer:
the validation MSE. w*(s) = (A^T A + diag e^s)^{-1} A^T b and, with v = H^{-1} grad_w L_out,
dL_out/ds_i = -e^{s_i} w*_i v_i (all in numpy float64: independent of the code under test).
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from hogrod import hypergrad, optim

D = 4


@pytest.fixture(scope="module")
def ridge():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20, D)) / np.sqrt(20)
    b = rng.normal(size=20)
    av = rng.normal(size=(15, D)) / np.sqrt(15)
    bv = rng.normal(size=15)
    s = np.log(rng.uniform(0.2, 1.0, size=D))
    return a, b, av, bv, s


def _losses(a, b, av, bv):
    a_, b_, av_, bv_ = (tf.constant(x) for x in (a, b, av, bv))

    def inner(w, s):
        r = tf.linalg.matvec(a_, w["w"]) - b_
        return 0.5 * tf.reduce_sum(r * r) + 0.5 * tf.reduce_sum(tf.exp(s) * w["w"] ** 2)

    def outer(w, s):
        r = tf.linalg.matvec(av_, w["w"]) - bv_
        return tf.reduce_mean(r * r)

    return inner, outer


def _np_outer(av, bv, w):
    return np.mean((av @ w - bv) ** 2)


def _exact(ridge):
    a, b, av, bv, s = ridge
    h = a.T @ a + np.diag(np.exp(s))
    w = np.linalg.solve(h, a.T @ b)
    v = np.linalg.solve(h, 2 * av.T @ (av @ w - bv) / len(bv))
    return -np.exp(s) * w * v, w


def _np_unrolled(ridge, s, lr, w0, steps):
    a, b = ridge[:2]
    h = a.T @ a + np.diag(np.exp(s))
    w = w0.copy()
    for _ in range(steps):
        w = w - lr * (h @ w - a.T @ b)
    return w


def _central(f, s, eps=1e-5):
    g = np.zeros_like(s)
    for i in range(len(s)):
        e = np.zeros_like(s)
        e[i] = eps
        g[i] = (f(s + e) - f(s - e)) / (2 * eps)
    return g


def _run(ridge, method, w0=None):
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    w0 = np.zeros(D) if w0 is None else w0
    return hypergrad.hypergradient(inner, outer, {"w": tf.constant(w0)}, tf.constant(s),
                                   method)


def _rel(x, y):
    return np.linalg.norm(np.asarray(x) - y) / np.linalg.norm(y)


def _lr(ridge):
    a, s = ridge[0], ridge[4]
    return 1.0 / np.linalg.eigvalsh(a.T @ a + np.diag(np.exp(s)))[-1]


def test_implicit_cg_is_exact(ridge):
    exact, w = _exact(ridge)
    out = _run(ridge, hypergrad.implicit(optim.sgd(_lr(ridge)), 300, solve="cg", tol=1e-12,
                                         inner_tol=1e-12))
    assert _rel(out.grads, exact) < 1e-10
    np.testing.assert_allclose(out.params["w"], w, rtol=1e-10)
    np.testing.assert_allclose(out.value, _np_outer(*ridge[2:4], w), rtol=1e-12)


def test_unrolled_is_the_derivative_of_the_unrolled_map_and_converges(ridge):
    a, b, av, bv, s = ridge
    lr = 0.3 * _lr(ridge)
    exact, _ = _exact(ridge)
    errors = []
    for k in (5, 15, 45):
        out = _run(ridge, hypergrad.unrolled(optim.sgd(lr), k))
        fd = _central(lambda t: _np_outer(av, bv, _np_unrolled(ridge, t, lr, np.zeros(D), k)),
                      s)
        assert _rel(out.grads, fd) < 1e-7, k
        errors.append(_rel(out.grads, exact))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-2, errors


def test_truncated_unrolled_differentiates_only_the_last_steps(ridge):
    a, b, av, bv, s = ridge
    lr, k, t = 0.3 * _lr(ridge), 12, 4
    w_frozen = _np_unrolled(ridge, s, lr, np.zeros(D), k - t)
    fd = _central(lambda u: _np_outer(av, bv, _np_unrolled(ridge, u, lr, w_frozen, t)), s)
    out = _run(ridge, hypergrad.unrolled(optim.sgd(lr), k, truncate=t))
    assert _rel(out.grads, fd) < 1e-7
    full = _run(ridge, hypergrad.unrolled(optim.sgd(lr), k))
    assert _rel(out.grads, full.grads) > 1e-3  # the truncation changes the answer
    np.testing.assert_allclose(out.value, full.value, rtol=1e-12)


def test_implicit_neumann_converges_with_its_steps(ridge):
    exact, _ = _exact(ridge)
    lr = _lr(ridge)
    errors = []
    for steps in (2, 8, 32):
        out = _run(ridge, hypergrad.implicit(optim.sgd(lr), 300, inner_tol=1e-12,
                                             solve=hypergrad.neumann_series(steps, step=lr)))
        errors.append(_rel(out.grads, exact))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-3, errors


def test_neumann_series_is_its_closed_form(ridge):
    """step * sum_{k=0}^{steps} (I - step H)^k v in numpy, through the implicit formula."""
    a, b, av, bv, s = ridge
    lr, steps = _lr(ridge), 7
    h = a.T @ a + np.diag(np.exp(s))
    w = np.linalg.solve(h, a.T @ b)
    m = np.eye(D) - lr * h
    series = lr * sum(np.linalg.matrix_power(m, k) for k in range(steps + 1))
    expected = -np.exp(s) * w * (series @ (2 * av.T @ (av @ w - bv) / len(bv)))
    out = _run(ridge, hypergrad.implicit(optim.sgd(lr), 300, inner_tol=1e-12,
                                         solve=hypergrad.neumann_series(steps, step=lr)))
    np.testing.assert_allclose(out.grads, expected, rtol=1e-10)


def test_one_step_closed_form(ridge):
    a, b, av, bv, s = ridge
    lr = 0.5 * _lr(ridge)
    w0 = np.random.default_rng(1).normal(size=D)
    out = _run(ridge, hypergrad.one_step(optim.sgd(lr)), w0=w0)
    w1 = _np_unrolled(ridge, s, lr, w0, 1)
    # w1 = w0 - lr (H(s) w0 - A^T b): dw1/ds_i = -lr e^{s_i} w0_i e_i
    expected = 2 * av.T @ (av @ w1 - bv) / len(bv) * (-lr * np.exp(s) * w0)
    np.testing.assert_allclose(out.grads, expected, rtol=1e-12)
    np.testing.assert_allclose(out.params["w"], w1, rtol=1e-12)


@pytest.mark.parametrize("name", ["unrolled", "implicit", "one_step"])
def test_tf_function_equals_eager(ridge, name):
    lr = _lr(ridge)
    method = {"unrolled": hypergrad.unrolled(optim.sgd(lr), 10, truncate=6),
              "implicit": hypergrad.implicit(optim.sgd(lr), 300, inner_tol=1e-12),
              "one_step": hypergrad.one_step(optim.sgd(lr))}[name]
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    w0 = {"w": tf.constant(np.ones(D))}
    fn = tf.function(lambda h: hypergrad.hypergradient(inner, outer, w0, h, method))
    eager = hypergrad.hypergradient(inner, outer, w0, tf.constant(s), method)
    graph = fn(tf.constant(s))
    np.testing.assert_allclose(graph.grads, eager.grads, rtol=1e-12)
    np.testing.assert_allclose(graph.value, eager.value, rtol=1e-12)


@pytest.mark.parametrize("method", ["unrolled", "implicit"])
def test_hyperparameter_of_the_outer_loss_only(ridge, method):
    """hyperparams (s, c) with outer c * L_out: d/dc = L_out, d/ds = c * the ridge one."""
    exact, w = _exact(ridge)
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    lr = _lr(ridge)
    m = (hypergrad.unrolled(optim.sgd(lr), 300) if method == "unrolled" else
         hypergrad.implicit(optim.sgd(lr), 300, inner_tol=1e-12, tol=1e-12))
    out = hypergrad.hypergradient(lambda w, h: inner(w, h["s"]),
                                  lambda w, h: h["c"] * outer(w, h["s"]),
                                  {"w": tf.zeros(D, tf.float64)},
                                  {"s": tf.constant(s), "c": tf.constant(3.0, tf.float64)}, m)
    np.testing.assert_allclose(out.grads["c"], _np_outer(av, bv, w), rtol=1e-10)
    assert _rel(out.grads["s"], 3.0 * exact) < 1e-10


def test_variable_hyperparams(ridge):
    exact, _ = _exact(ridge)
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    out = hypergrad.hypergradient(inner, outer, {"w": tf.zeros(D, tf.float64)},
                                  tf.Variable(s),
                                  hypergrad.implicit(optim.sgd(_lr(ridge)), 300, tol=1e-12,
                                                     inner_tol=1e-12))
    assert _rel(out.grads, exact) < 1e-10


def test_errors(ridge):
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    p, h = {"w": tf.zeros(D, tf.float64)}, tf.constant(s)
    sgd = optim.sgd(0.1)
    with pytest.raises(TypeError, match="method must be built"):
        hypergrad.hypergradient(inner, outer, p, h, "implicit")
    with pytest.raises(TypeError, match="outer_objective must be a callable"):
        hypergrad.hypergradient(inner, None, p, h, hypergrad.one_step(sgd))
    with pytest.raises(TypeError, match="hyperparams must be a tensor"):
        hypergrad.hypergradient(inner, outer, p, 0.5, hypergrad.one_step(sgd))
    with pytest.raises(ValueError, match="truncate=5 must be <= steps=3"):
        hypergrad.unrolled(sgd, 3, truncate=5)
    with pytest.raises(ValueError, match="steps must be an int"):
        hypergrad.unrolled(sgd, 0)
    with pytest.raises(TypeError, match="optimizer must be a hogrod.optim"):
        hypergrad.one_step(0.1)
    with pytest.raises(ValueError, match="solve must be one of"):
        hypergrad.implicit(sgd, 10, solve="lu")
    with pytest.raises(ValueError, match="inner_tol"):
        hypergrad.implicit(sgd, 10, inner_tol=0.0)
    with pytest.raises(ValueError, match="steps"):
        hypergrad.neumann_series(-1)
    with pytest.raises(ValueError, match="did not reach"):
        hypergrad.hypergradient(inner, outer, p, h, hypergrad.implicit(sgd, 2))
    with pytest.raises(ValueError, match="does not depend on hyperparams\\[1\\]"):
        hypergrad.hypergradient(lambda w, s: inner(w, s[0]), lambda w, s: outer(w, s[0]), p,
                                [h, tf.constant(1.0, tf.float64)], hypergrad.one_step(sgd))
    for method in (hypergrad.unrolled(sgd, 3), hypergrad.implicit(optim.sgd(_lr(ridge)), 300)):
        with pytest.raises(ValueError, match="does not depend on"):
            hypergrad.hypergradient(lambda w, s: inner(w, s[0]), lambda w, s: outer(w, s[0]),
                                    p, [h, tf.constant(1.0, tf.float64)], method)
    with pytest.raises(ValueError, match="inner_objective must return a scalar"):
        hypergrad.hypergradient(lambda w, s: w["w"], outer, p, h, hypergrad.one_step(sgd))


def test_an_unused_hyperparameter_is_named_by_its_key(ridge):
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    for method in (hypergrad.one_step(optim.sgd(0.1)),
                   hypergrad.implicit(optim.sgd(_lr(ridge)), 300, inner_tol=1e-12)):
        with pytest.raises(ValueError, match=r"does not depend on hyperparams\['unused'\]: "):
            hypergrad.hypergradient(lambda w, h: inner(w, h["s"]), lambda w, h: outer(w, h["s"]),
                                    {"w": tf.zeros(D, tf.float64)},
                                    {"s": tf.constant(s), "unused": tf.constant(1.0, tf.float64)},
                                    method)


def _methods(ridge):
    lr = _lr(ridge)
    return {"unrolled": hypergrad.unrolled(optim.sgd(lr), 20),
            "implicit": hypergrad.implicit(optim.sgd(lr), 300, inner_tol=1e-12),
            "one_step": hypergrad.one_step(optim.sgd(lr))}


@pytest.mark.parametrize("name", ["unrolled", "implicit", "one_step"])
def test_non_finite_data_is_named_never_a_nan_or_a_wrong_cause(ridge, name):
    """NaN in the inner objective's data: named, eagerly and compiled (not "the inner solve
    did not reach inner_tol", not a NaN hypergradient); NaN in a hyperparameter and in the
    outer objective's data, each named."""
    a, b, av, bv, s = ridge
    method = _methods(ridge)[name]
    p = {"w": tf.zeros(D, tf.float64)}
    inner, outer = _losses(a, np.where(np.arange(len(b)) == 3, np.nan, b), av, bv)
    with pytest.raises(ValueError, match=r"inner_objective\(params, hyperparams\) is not finite "
                                         "at the given params"):
        hypergrad.hypergradient(inner, outer, p, tf.constant(s), method)
    compiled = tf.function(lambda h: hypergrad.hypergradient(inner, outer, p, h, method).grads)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"inner_objective\(params, hyperparams\) is not finite"):
        compiled(tf.constant(s))
    inner, outer = _losses(a, b, av, bv)
    with pytest.raises(ValueError, match=r"hyperparams\['s'\] holds NaN or inf"):
        hypergrad.hypergradient(lambda w, h: inner(w, h["s"]), lambda w, h: outer(w, h["s"]), p,
                                {"s": tf.constant(np.where(np.arange(D) == 1, np.nan, s))},
                                method)
    _, outer = _losses(a, b, av, np.where(np.arange(len(bv)) == 0, np.inf, bv))
    with pytest.raises(ValueError, match="outer_objective is not finite at the inner solution"):
        hypergrad.hypergradient(inner, outer, p, tf.constant(s), method)


def test_a_diverging_inner_optimizer_is_named(ridge):
    """SGD at 100 / L overflows within 400 steps (compiled: the eager loop is slow)."""
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    p = {"w": tf.zeros(D, tf.float64)}
    for method, match in ((hypergrad.unrolled(optim.sgd(100 * _lr(ridge)), 400),
                           "outer_objective is not finite.*diverged"),
                          (hypergrad.implicit(optim.sgd(100 * _lr(ridge)), 400),
                           "the inner solve diverged")):
        fn = tf.function(lambda h: hypergrad.hypergradient(inner, outer, p, h, method).grads)
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            fn(tf.constant(s))


@pytest.mark.parametrize("name", ["unrolled", "implicit", "one_step"])
def test_float32_hyperparameters_with_float64_params_are_named(ridge, name):
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    with pytest.raises(TypeError, match=r"inner_objective failed on hyperparams, a float32 "
                                        r"tensor, with params of float64.*tf\.constant\(x, "
                                        r"tf\.float64\)"):
        hypergrad.hypergradient(inner, outer, {"w": tf.zeros(D, tf.float64)},
                                tf.constant(s, tf.float32), _methods(ridge)[name])


def test_bench_binary_smoke(tmp_path):
    from experiments.bench import hypergrad_ridge
    from hogrod import harness
    _, metrics = harness.run(
        hypergrad_ridge.bench_hypergrad_ridge,
        gin_params=["bench_hypergrad_ridge.features = 4", "bench_hypergrad_ridge.train = 12",
                    "bench_hypergrad_ridge.validation = 8",
                    "bench_hypergrad_ridge.condition = 5.0",
                    "bench_hypergrad_ridge.unrolled_steps = (3, 9)",
                    "bench_hypergrad_ridge.neumann_steps = (2, 6)"],
        output_dir=str(tmp_path))
    assert metrics["implicit_cg_rel_err"] < 1e-8
    with open(os.path.join(tmp_path, "metrics.json")) as f:
        written = json.load(f)
    assert written["unrolled_rel_err"].keys() == {"3", "9"}
    assert written["neumann_rel_err"].keys() == {"2", "6"}
    assert written["unrolled_rel_err"]["9"] < written["unrolled_rel_err"]["3"]


def test_implicit_solves_the_inner_problem_without_inner_hyperparameters(ridge):
    _, w = _exact(ridge)
    a, b, av, bv, s = ridge
    inner, outer = _losses(a, b, av, bv)
    out = hypergrad.hypergradient(lambda w, c: inner(w, tf.constant(s)),
                                  lambda w, c: c * outer(w, tf.constant(s)),
                                  {"w": tf.zeros(D, tf.float64)}, tf.constant(2.0, tf.float64),
                                  hypergrad.implicit(optim.sgd(_lr(ridge)), 300, inner_tol=1e-12))
    np.testing.assert_allclose(out.params["w"], w, rtol=1e-10)
    np.testing.assert_allclose(out.grads, _np_outer(av, bv, w), rtol=1e-10)
