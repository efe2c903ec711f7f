"""hogrod.rl's estimators and returns in float64. Oracles: the derivatives of exp (magic box,
to the fourth order), the closed-form gradient and Hessian of a softmax bandit's expected
reward (the estimator's expectation taken exactly, by weighting every arm by its
probability), numpy loops (returns, GAE) and numpy's least squares (the linear baseline);
every bad input's error."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, rl

F64 = tf.float64


def nested_derivatives(fn, x, order):
    """[d fn/dx, ..., d^order fn/dx^order] of a scalar function of a scalar, by nested tapes."""
    tapes = [tf.GradientTape() for _ in range(order)]
    for t in tapes:
        t.__enter__()
        t.watch(x)
    y = fn(x)
    out = []
    for t in reversed(tapes):
        t.__exit__(None, None, None)
        y = t.gradient(y, x)
        out.append(y)
    return [float(d) for d in out]


def test_magic_box_is_one_and_differentiates_as_exp_to_the_fourth_order():
    x0 = tf.constant(0.7, F64)
    f = lambda x: tf.sin(x) * x ** 2 + 0.3 * x  # noqa: E731
    assert float(rl.magic_box(f(x0))) == 1.0
    boxed = nested_derivatives(lambda x: rl.magic_box(f(x)), x0, 4)
    shifted = nested_derivatives(lambda x: tf.exp(f(x) - float(f(x0))), x0, 4)
    np.testing.assert_allclose(boxed, shifted, rtol=1e-12)
    # linear argument: the k-th derivative of exp(a (x - x0)) at x0 is a**k
    a = 1.3
    np.testing.assert_allclose(nested_derivatives(lambda x: rl.magic_box(a * x), x0, 4),
                               [a, a ** 2, a ** 3, a ** 4], rtol=1e-12)


def bandit_derivatives(objective, logits, rewards):
    """Gradient and Hessian of the estimator's expectation: every arm is one trajectory,
    weighted by K times its probability (held constant), so the batch mean is the exact
    expectation over the arm drawn."""
    k = logits.shape[0]
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            log_pi = tf.nn.log_softmax(logits)
            weight = tf.stop_gradient(k * tf.exp(log_pi))
            value = objective(log_pi[:, None], (weight * rewards)[:, None])
        grad = inner.gradient(value, logits)
    return value, grad, outer.jacobian(grad, logits)


def test_dice_surrogate_on_a_bandit_has_the_closed_form_gradient_and_hessian():
    logits = tf.Variable([0.3, -0.5, 1.1, 0.0], dtype=F64)
    rewards = tf.constant([1.0, -2.0, 0.5, 3.0], F64)
    pi, r = tf.nn.softmax(logits).numpy(), rewards.numpy()
    j = pi @ r
    grad = pi * (r - j)  # dJ/dtheta_j = pi_j (r_j - J)
    eye = np.eye(4)
    hess = (pi[None, :] * (eye - pi[:, None]) * (r - j)[None, :]
            - np.outer(pi, pi * (r - j)))  # d/dtheta_i of pi_j (r_j - J)
    hess = 0.5 * (hess + hess.T)
    for objective in (rl.dice_surrogate,
                      lambda lp, rw: rl.dice_surrogate(lp, rw, values=tf.fill(rw.shape, 0.7 * j)
                                                       * rw / rewards[:, None])):
        value, g, h = bandit_derivatives(objective, logits, rewards)
        np.testing.assert_allclose(float(value), j, rtol=1e-12)
        np.testing.assert_allclose(g.numpy(), grad, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(h.numpy(), hess, rtol=1e-10, atol=1e-12)
    # the naive surrogate log_prob * reward has the right gradient but the wrong Hessian
    naive = lambda lp, rw: tf.reduce_mean(lp * rw)  # noqa: E731
    _, g, h = bandit_derivatives(naive, logits, rewards)
    np.testing.assert_allclose(g.numpy(), grad, rtol=1e-10, atol=1e-12)
    assert np.abs(h.numpy() - hess).max() > 0.05


def numpy_returns(r, gamma, mask):
    out = np.zeros_like(r)
    for b in range(r.shape[0]):
        acc = 0.0
        for t in reversed(range(r.shape[1])):
            acc = r[b, t] * mask[b, t] + gamma * acc
            out[b, t] = acc * mask[b, t]
    return out


def numpy_gae(r, v, gamma, lam, mask):
    out = np.zeros_like(r)
    for b in range(r.shape[0]):
        acc, following = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if mask[b, t]:
                delta = r[b, t] + gamma * following - v[b, t]
                acc = delta + gamma * lam * acc
                following = v[b, t]
            else:
                acc, following = 0.0, 0.0
            out[b, t] = acc * mask[b, t]
    return out


def episodes(seed, batch=5, steps=7):
    rng = np.random.default_rng(seed)
    r, v = rng.normal(size=(batch, steps)), rng.normal(size=(batch, steps))
    lengths = rng.integers(1, steps + 1, size=batch)
    lengths[0] = steps
    mask = (np.arange(steps)[None, :] < lengths[:, None]).astype(np.float64)
    return r, v, mask


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0), (0.99, 0.3)])
def test_returns_and_gae_equal_numpy_loops(gamma, lam):
    r, v, mask = episodes(0)
    ones = np.ones_like(mask)
    for m in (ones, mask):
        np.testing.assert_allclose(rl.discounted_returns(r, gamma, m), numpy_returns(r, gamma, m),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(rl.gae_advantages(r, v, gamma, lam, m),
                                   numpy_gae(r, v, gamma, lam, m), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rl.discounted_returns(r, gamma), numpy_returns(r, gamma, ones),
                               rtol=1e-12)
    # gae_lambda = 1: the return minus the baseline
    np.testing.assert_allclose(rl.gae_advantages(r, v, gamma, 1.0, mask),
                               (numpy_returns(r, gamma, mask) - v) * mask, atol=1e-12)


def test_dice_surrogate_values_and_first_derivatives_with_a_mask():
    r, v, mask = episodes(1)
    rng = np.random.default_rng(2)
    lp = tf.Variable(rng.normal(size=r.shape) - 1.0)
    garbage = np.where(mask > 0, 0.0, np.nan)  # ignored after the end, NaN or not
    gamma = 0.9
    ret = numpy_returns(r, gamma, mask)
    disc = gamma ** np.arange(r.shape[1])
    expected_value = np.mean(ret[:, 0])
    with tf.GradientTape(persistent=True) as tape:
        dice = rl.dice_surrogate(lp, r + garbage, gamma, mask=mask)
        loaded = rl.dice_surrogate(lp, r + garbage, gamma, values=v + garbage, mask=mask,
                                   gae_lambda=0.8)
    np.testing.assert_allclose([float(dice), float(loaded)], [expected_value] * 2, rtol=1e-12)
    # DiCE: d/dlp_t = mean of sum_{k>=t} gamma^k r_k; Loaded: gamma^t A_t
    np.testing.assert_allclose(tape.gradient(dice, lp), disc * ret / r.shape[0], atol=1e-12)
    np.testing.assert_allclose(tape.gradient(loaded, lp),
                               disc * numpy_gae(r, v, gamma, 0.8, mask) / r.shape[0], atol=1e-12)


def test_linear_baseline_equals_numpy_ridge_least_squares():
    rng = np.random.default_rng(3)
    _, _, mask = episodes(4, batch=6, steps=9)
    obs = rng.normal(size=(6, 9, 3)) * 4.0
    obs[0, 0, 0] = 25.0  # clipped to 10
    returns = rng.normal(size=(6, 9))
    baseline = rl.LinearFeatureBaseline(3, dtype="float64")
    coefficients = baseline.fit(obs, returns, mask)
    rows, targets = [], []
    for b in range(6):
        for t in range(9):
            if mask[b, t]:
                s = np.clip(obs[b, t], -10, 10)
                u = t / 100.0
                rows.append(np.concatenate([s, s ** 2, [u, u ** 2, u ** 3, 1.0]]))
                targets.append(returns[b, t])
    f, y = np.array(rows), np.array(targets)
    want = np.linalg.lstsq(f.T @ f + 1e-5 * np.eye(10), f.T @ y, rcond=None)[0]
    np.testing.assert_allclose(coefficients, want, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(baseline.coefficients, want, rtol=1e-7, atol=1e-9)
    predicted = np.einsum("btf,f->bt", baseline.features(obs, mask), want)
    np.testing.assert_allclose(baseline.predict(obs, mask), predicted, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(baseline.predict(obs, mask, coefficients=tf.constant(want)),
                               predicted, rtol=1e-9, atol=1e-9)
    assert np.all(baseline.predict(obs, mask).numpy()[mask == 0] == 0)
    # observations after an episode's end are ignored, NaN included
    spoilt = np.where(mask[..., None] > 0, obs, np.nan)
    np.testing.assert_allclose(baseline.solve(spoilt, returns, mask), want, rtol=1e-7, atol=1e-9)
    # a constant feature column duplicated by a masked-out design: regularization rescues it
    flat = rl.LinearFeatureBaseline(1, dtype="float64")
    c = flat.solve(np.zeros((2, 3, 1)), np.ones((2, 3)))
    assert np.all(np.isfinite(c.numpy()))
    with pytest.raises(checks.ArgumentError, match="finite fit"):
        flat.solve(np.full((2, 3, 1), np.nan), np.ones((2, 3)))


def test_compiled_estimators_trace_once_and_agree_with_eager():
    r, v, mask = episodes(5)
    lp = tf.constant(np.random.default_rng(6).normal(size=r.shape))
    fn = tf.function(lambda lp, r, v, m: rl.dice_surrogate(lp, r, 0.95, v, 0.9, m))
    for shift in (0.0, 1.0):
        np.testing.assert_allclose(fn(lp + shift, r, v, mask),
                                   rl.dice_surrogate(lp + shift, r, 0.95, v, 0.9, mask),
                                   rtol=1e-12)
    assert fn.experimental_get_tracing_count() == 1


def test_bad_inputs_are_named():
    lp = tf.zeros([3, 4], F64)
    r = tf.ones([3, 4], F64)
    bad = [
        (lambda: rl.dice_surrogate(lp, tf.ones([3, 5], F64)), "rewards has shape"),
        (lambda: rl.dice_surrogate(lp, tf.ones([3, 4], tf.float32)), "rewards has dtype"),
        (lambda: rl.dice_surrogate(lp, r, values=tf.ones([4, 4], F64)), "values has shape"),
        (lambda: rl.dice_surrogate(lp, r, mask=tf.ones([3, 3], F64)), "mask has shape"),
        (lambda: rl.dice_surrogate(tf.zeros([3], F64), tf.ones([3], F64)), "log_probs must have rank 2"),
        (lambda: rl.dice_surrogate(tf.zeros([3, 4], tf.int32), r), "log_probs must have a floating"),
        (lambda: rl.dice_surrogate(lp, r, discount=0.0), "discount"),
        (lambda: rl.dice_surrogate(lp, r, discount=1.5), "discount"),
        (lambda: rl.dice_surrogate(lp, r, values=r, gae_lambda=1.2), "gae_lambda"),
        (lambda: rl.dice_surrogate(lp, r, mask=tf.fill([3, 4], tf.constant(0.5, F64))),
         "only 0 and 1"),
        (lambda: rl.dice_surrogate(lp, r, mask=tf.constant([[0, 1, 1, 1]] * 3, F64)),
         "must not increase"),
        (lambda: rl.discounted_returns(r, -0.1), "discount"),
        (lambda: rl.gae_advantages(r, tf.ones([3, 2], F64), 0.9, 0.9), "values has shape"),
        (lambda: rl.magic_box(tf.constant(1)), "x must have a floating"),
        (lambda: rl.LinearFeatureBaseline(2, dtype="float64").fit(np.zeros((3, 4, 3)), r),
         "observations must have shape"),
        (lambda: rl.LinearFeatureBaseline(2).fit(np.zeros((3, 4, 2)), r),
         "observations have dtype"),
        (lambda: rl.LinearFeatureBaseline(0), "observation_dim"),
    ]
    for call, pattern in bad:
        with pytest.raises(checks.ArgumentError, match=pattern):
            call()
    compiled = tf.function(lambda m: rl.dice_surrogate(lp, r, mask=m))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must not increase"):
        compiled(tf.constant([[0, 1, 1, 1]] * 3, F64))


def test_an_empty_batch_is_an_error_naming_the_shape_not_a_nan():
    """No trajectory or no step: the batch mean of nothing would be NaN (or a sum of nothing
    0); eagerly, traced at a known shape, and in a graph at an unknown one."""
    for shape in ([0, 4], [3, 0]):
        lp, r = tf.zeros(shape, F64), tf.ones(shape, F64)
        pattern = rf"dice_surrogate: log_probs has shape \[{shape[0]}, {shape[1]}\]"
        for call in (lambda: rl.dice_surrogate(lp, r, 0.9),
                     lambda: rl.dice_surrogate(lp, r, 0.9, values=r),
                     lambda: tf.function(rl.dice_surrogate, autograph=False)(lp, r, 0.9),
                     lambda: rl.joint_dice_surrogates(lp[..., None], r[..., None], 0.9)):
            with pytest.raises(checks.ArgumentError, match=pattern):
                call()
    spec = tf.TensorSpec([None, None], F64)
    unknown = tf.function(lambda lp, r: rl.dice_surrogate(lp, r, 0.9),
                          input_signature=[spec] * 2)
    assert float(unknown(tf.zeros([2, 3], F64), tf.ones([2, 3], F64))) == pytest.approx(
        1 + 0.9 + 0.81)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"at least one trajectory"):
        unknown(tf.zeros([0, 3], F64), tf.ones([0, 3], F64))


def test_a_meta_batch_of_tasks_maps_returns_baseline_and_objective_without_fallback():
    rng = np.random.default_rng(7)
    lp, r = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    mask = np.stack([episodes(8 + i, batch=4, steps=5)[2] for i in range(3)])
    obs = rng.normal(size=(3, 4, 5, 2))
    baseline = rl.LinearFeatureBaseline(2, dtype="float64")

    def one(lp, r, m, o):
        values = baseline.predict(o, m, baseline.solve(o, rl.discounted_returns(r, 0.9, m), m))
        return rl.dice_surrogate(lp, r, 0.9, values=values, gae_lambda=0.95, mask=m)

    mapped = tf.function(lambda *xs: tf.vectorized_map(lambda x: one(*x), xs,
                                                       fallback_to_while_loop=False))
    np.testing.assert_allclose(mapped(lp, r, mask, obs),
                               [float(one(lp[i], r[i], mask[i], obs[i])) for i in range(3)],
                               rtol=1e-10)


def test_the_fitted_baseline_is_saved_with_a_checkpoint(tmp_path):
    rng = np.random.default_rng(9)
    obs, returns = rng.normal(size=(2, 4, 1)), rng.normal(size=(2, 4))
    baseline = rl.LinearFeatureBaseline(1, dtype="float64")
    fitted = baseline.fit(obs, returns).numpy()
    path = tf.train.Checkpoint(baseline=baseline).save(str(tmp_path / "ckpt"))
    restored = rl.LinearFeatureBaseline(1, dtype="float64")
    tf.train.Checkpoint(baseline=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored.coefficients, fitted)


def test_minus_infinity_after_an_episode_ends_leaves_the_derivatives_finite():
    """-inf log-probabilities (and NaN rewards and values) where the mask is 0: value,
    gradient and Hessian equal those of the same batch with 0 there (masked by tf.where
    before any arithmetic: a product by the mask would make 0 * -inf = NaN)."""
    r, v, mask = episodes(11)
    rng = np.random.default_rng(12)
    clean = np.where(mask > 0, rng.normal(size=r.shape) - 1.0, 0.0)
    spoilt = np.where(mask > 0, clean, -np.inf)
    junk = np.where(mask > 0, 0.0, np.nan)

    def derivatives(log_probs, values):
        lp = tf.Variable(log_probs)
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                value = rl.dice_surrogate(lp, r + junk, 0.9, values=values, gae_lambda=0.9,
                                          mask=mask)
            grad = inner.gradient(value, lp)
        return value.numpy(), grad.numpy(), outer.jacobian(grad, lp).numpy()

    for values in (None, v + junk):
        got = derivatives(spoilt, values)
        want = derivatives(clean, None if values is None else v)
        for g, w in zip(got, want):
            assert np.all(np.isfinite(g))
            np.testing.assert_array_equal(g, w)
