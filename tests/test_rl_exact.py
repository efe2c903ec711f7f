"""DiCE and Loaded DiCE against the exact derivatives of a small MDP's expected return, in
float64. Oracles: `exact.expected_return` (dynamic programming, checked against a sum over
every trajectory); the estimators' expectations taken exactly by weighting every trajectory
by its probability (gradient, Hessian and a third directional derivative D^3J[u, v, .]);
sampled batches from `TabularMDP` within a few standard errors (fixed seeds); a naive
surrogate whose Hessian is biased, which the same checks reject."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, rl
from hogrod.rl import envs, exact

F64 = tf.float64
S, A, T, GAMMA = 2, 2, 3, 0.9
RNG = np.random.default_rng(0)
P = RNG.dirichlet(np.ones(S), size=(S, A))
R = RNG.normal(size=(S, A))
MU = np.array([0.3, 0.7])
THETA = RNG.normal(size=(S, A))
U, V = RNG.normal(size=(S, A)), RNG.normal(size=(S, A))
BASELINE = RNG.normal(size=(T, S)) * 2.0  # any function of (t, s) is a baseline


def exact_derivatives(objective):
    """Gradient, Hessian and D^3[u, v, .] of objective(theta) by nested tapes."""
    theta = tf.Variable(THETA)
    u, v = tf.constant(U), tf.constant(V)
    with tf.GradientTape() as t3:
        with tf.GradientTape() as t2:
            with tf.GradientTape() as t1:
                j = objective(theta)
            g = t1.gradient(j, theta)
            gu = tf.reduce_sum(g * u)
        hess_u = t2.gradient(gu, theta)
        huv = tf.reduce_sum(hess_u * v)
    third = t3.gradient(huv, theta)
    with tf.GradientTape(persistent=True) as outer:
        with tf.GradientTape() as inner:
            j = objective(theta)
        g = tf.reshape(inner.gradient(j, theta), [-1])
        rows = [g[i] for i in range(S * A)]
    hess = np.stack([outer.gradient(row, theta).numpy().ravel() for row in rows])
    return float(j), g.numpy().reshape(S, A), hess, third.numpy()


def true_return(theta):
    return exact.expected_return(theta, P, R, MU, GAMMA, T)


def trajectories():
    """Every trajectory (s_0, a_0, ..., s_{T-1}, a_{T-1}) and its probability at THETA."""
    pi = np.exp(THETA) / np.exp(THETA).sum(1, keepdims=True)
    out = []
    for choice in itertools.product(range(S), range(A), repeat=T):
        s, a = np.array(choice[0::2]), np.array(choice[1::2])
        prob = MU[s[0]] * np.prod(pi[s, a]) * np.prod(P[s[:-1], a[:-1], s[1:]])
        out.append((s, a, prob))
    return out


def weighted_estimator(kind):
    """objective(theta) = sum over trajectories of p(tau) (held constant) times the
    estimator on tau: its derivatives are the estimator's expected derivatives, exactly."""
    trajs = trajectories()
    s = np.stack([t[0] for t in trajs])
    a = np.stack([t[1] for t in trajs])
    w = len(trajs) * np.array([t[2] for t in trajs])[:, None]
    rewards = R[s, a] * w
    values = BASELINE[np.arange(T)[None, :], s] * w

    def objective(theta):
        log_pi = tf.nn.log_softmax(theta)
        lp = tf.gather_nd(log_pi, np.stack([s, a], -1))
        if kind == "dice":
            return rl.dice_surrogate(lp, rewards, GAMMA)
        if kind == "loaded":
            return rl.dice_surrogate(lp, rewards, GAMMA, values=values)
        if kind == "loaded_gae":
            return rl.dice_surrogate(lp, rewards, GAMMA, values=values, gae_lambda=0.5)
        ret = tf.reduce_sum(rewards * GAMMA ** np.arange(T), axis=1)  # naive surrogate
        return tf.reduce_mean(tf.reduce_sum(lp, 1) * ret)
    return objective


def test_the_dynamic_program_equals_the_sum_over_trajectories():
    total = sum(p * np.sum(GAMMA ** np.arange(T) * R[s, a]) for s, a, p in trajectories())
    assert sum(p for _, _, p in trajectories()) == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(float(true_return(tf.constant(THETA))), total, rtol=1e-13)


def test_dice_and_loaded_dice_are_unbiased_to_the_third_order():
    j, g, h, d3 = exact_derivatives(true_return)
    for kind in ("dice", "loaded"):
        ej, eg, eh, ed3 = exact_derivatives(weighted_estimator(kind))
        np.testing.assert_allclose(ej, j, rtol=1e-12)
        np.testing.assert_allclose(eg, g, rtol=1e-10, atol=1e-12, err_msg=kind)
        np.testing.assert_allclose(eh, h, rtol=1e-10, atol=1e-12, err_msg=kind)
        np.testing.assert_allclose(ed3, d3, rtol=1e-10, atol=1e-12, err_msg=kind)
    # the naive surrogate: the gradient is right, the Hessian is not
    _, ng, nh, _ = exact_derivatives(weighted_estimator("naive"))
    np.testing.assert_allclose(ng, g, rtol=1e-10, atol=1e-12)
    assert np.abs(nh - h).max() > 0.1 * np.abs(h).max()
    # GAE's lambda < 1 with values that are not the true ones: the gradient is biased
    _, bg, _, _ = exact_derivatives(weighted_estimator("loaded_gae"))
    assert np.abs(bg - g).max() > 1e-3


def sample(seed, batch):
    """`batch` episodes of the MDP under softmax(THETA), from TabularMDP."""
    env = envs.TabularMDP(P, R, MU, horizon=T, dtype="float64")
    task = tf.nest.map_structure(lambda x: x[0], env.sample_tasks(0, 1))
    state, _ = env.reset(task, seed, batch)
    dist = rl.Categorical(tf.constant(THETA))
    states, actions, rewards = [], [], []
    key = tf.constant([seed, 1], tf.int64)
    for t in range(T):
        logits = tf.gather(dist.logits, state["s"])
        key, draw = tf.unstack(tf.random.experimental.stateless_split(key, 2))
        a = rl.Categorical(logits).sample(draw)
        states.append(state["s"])
        actions.append(a)
        state, _, reward, done = env.step(task, state, a)
        rewards.append(reward)
        assert bool(tf.reduce_all(done)) == (t == T - 1)
    return np.stack(states, 1), np.stack(actions, 1), np.stack(rewards, 1)


def test_the_environment_steps_as_numpy_says():
    s, a, r = sample(3, 4000)
    np.testing.assert_array_equal(r, R[s, a])
    # first states ~ MU and transitions ~ P within 5 standard errors
    assert abs(np.mean(s[:, 0] == 1) - MU[1]) < 5 * np.sqrt(MU[1] * MU[0] / 4000)
    sel = (s[:, 0] == 0) & (a[:, 0] == 1)
    frac = np.mean(s[sel, 1] == 1)
    assert abs(frac - P[0, 1, 1]) < 5 * np.sqrt(P[0, 1, 1] * P[0, 1, 0] / sel.sum())
    again = sample(3, 4000)
    np.testing.assert_array_equal(again[0], s)  # stateless: the seed decides everything


def group_estimates(kind, s, a, r, groups):
    """Gradient and Hessian estimates of each of `groups` equal sub-batches."""
    theta = tf.Variable(THETA)
    values = BASELINE[np.arange(T)[None, :], s]
    grads, hessians = [], []
    for s_k, a_k, r_k, v_k in zip(*(np.split(x, groups) for x in (s, a, r, values))):
        with tf.GradientTape(persistent=True) as outer:
            with tf.GradientTape() as inner:
                lp = tf.gather_nd(tf.nn.log_softmax(theta), np.stack([s_k, a_k], -1))
                if kind == "naive":
                    ret = tf.reduce_sum(r_k * GAMMA ** np.arange(T), 1)
                    objective = tf.reduce_mean(tf.reduce_sum(lp, 1) * ret)
                else:
                    objective = rl.dice_surrogate(lp, r_k, GAMMA,
                                                  values=v_k if kind == "loaded" else None)
            g = tf.reshape(inner.gradient(objective, theta), [-1])
            rows = [g[i] for i in range(S * A)]
        grads.append(g.numpy())
        hessians.append(np.concatenate([outer.gradient(row, theta).numpy().ravel()
                                        for row in rows]))
    return np.stack(grads), np.stack(hessians)


def test_sampled_estimates_are_within_their_standard_errors_of_the_exact_derivatives():
    _, g, h, _ = exact_derivatives(true_return)
    s, a, r = sample(11, 4096)
    worst = {}
    for kind in ("dice", "loaded", "naive"):
        eg, eh = group_estimates(kind, s, a, r, groups=16)
        for name, est, want in (("grad", eg, g.ravel()), ("hess", eh, h.ravel())):
            se = est.std(0, ddof=1) / np.sqrt(len(est))
            worst[kind, name] = np.max(np.abs(est.mean(0) - want) / (se + 1e-12))
    for kind in ("dice", "loaded"):
        assert worst[kind, "grad"] < 5 and worst[kind, "hess"] < 5, worst
    assert worst["naive", "grad"] < 5, worst
    assert worst["naive", "hess"] > 10, worst  # the test tells the biased surrogate apart


def test_bad_mdp_arguments_are_named():
    bad = [
        (lambda: envs.TabularMDP(P[:, :, :1], R), "transitions must be"),
        (lambda: envs.TabularMDP(P * 2, R), "probabilities summing to 1"),
        (lambda: envs.TabularMDP(P, R, np.ones(3) / 3), "initial must be"),
        (lambda: envs.TabularMDP(P, R, horizon=0), "horizon"),
        (lambda: exact.expected_return(THETA, P, R, MU, 0.0, T), "discount"),
        (lambda: exact.expected_return(THETA, P, R[:1], MU, GAMMA, T), "rewards has shape"),
        (lambda: exact.expected_return(THETA, P.astype(np.float32), R, MU, GAMMA, T),
         "transitions must be"),
    ]
    for call, pattern in bad:
        with pytest.raises(checks.ArgumentError, match=pattern):
            call()
    env = envs.TabularMDP(P, R, MU, horizon=T, dtype="float64")
    task = tf.nest.map_structure(lambda x: x[0], env.sample_tasks(0, 1))
    state, _ = env.reset(task, 0, 3)
    with pytest.raises(checks.ArgumentError, match=r"action must lie in 0\.\.1"):
        env.step(task, state, tf.constant([0, 2, 1]))
    with pytest.raises(checks.ArgumentError, match="action must be integer"):
        env.step(task, state, tf.constant([0.0, 1.0, 1.0]))
