"""LOLA-DiCE on the iterated prisoner's dilemma, in float64. Oracles: the exact LOLA
gradient of a short game, from its closed-form expected return (the memory-one Markov
chain over the 5 joint states, propagated exactly) differentiated by nested tapes,
against the library's machinery on every joint trajectory weighted by its probability
(the exact expectation of the DiCE objectives, whose derivatives of every order are
exact); sampled batches within a few standard errors; numpy games; every error naming
the agent whose parameters an objective ignores."""

import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, rl

F64 = tf.float64
T, GAMMA, INNER = 3, 0.9, 0.7
PAYOFF = np.array([[-1.0, -3.0], [0.0, -2.0]])  # own action first
THETA = np.random.default_rng(0).normal(size=(2, 5))
SWAP = np.array([0, 2, 1, 3, 4])  # agent 0's state index -> agent 1's


def exact_values(theta0, theta1):
    """Both agents' expected discounted returns over T rounds: the distribution over the
    joint states (agent 0's perspective) propagated through the memory-one chain."""
    p0 = tf.sigmoid(theta0)  # [5] cooperation probabilities by agent 0's state
    p1 = tf.gather(tf.sigmoid(theta1), SWAP)  # agent 1's, indexed by agent 0's state
    joint = tf.stack([p0 * p1, p0 * (1 - p1), (1 - p0) * p1, (1 - p0) * (1 - p1)], 1)
    r0 = tf.constant(PAYOFF.ravel(), F64)  # joint actions CC, CD, DC, DD
    r1 = tf.constant(PAYOFF.T.ravel(), F64)
    chain = tf.concat([joint, tf.zeros([5, 1], F64)], 1)  # next state = the joint action
    d = tf.one_hot(4, 5, dtype=F64)
    values = tf.zeros([2], F64)
    for t in range(T):
        values += GAMMA ** t * tf.stack([tf.tensordot(d, tf.linalg.matvec(joint, r0), 1),
                                         tf.tensordot(d, tf.linalg.matvec(joint, r1), 1)])
        d = tf.linalg.matvec(chain, d, transpose_a=True)
    return values


def exact_lola(theta, lookahead, inner_rate, sign=1.0, stop=False):
    """The LOLA gradients of the exact values by nested tapes, written independently."""
    theta = [tf.constant(theta[0]), tf.constant(theta[1])]
    grads = []
    for i in range(2):
        j = 1 - i
        with tf.GradientTape() as outer:
            outer.watch(theta[i])
            phi = theta[j]
            for _ in range(lookahead):
                with tf.GradientTape() as inner:
                    inner.watch(phi)
                    pair = [theta[i], phi] if i == 0 else [phi, theta[i]]
                    value = exact_values(*pair)[j]
                step = inner.gradient(value, phi)
                phi = phi + sign * inner_rate * (tf.stop_gradient(step) if stop else step)
            pair = [theta[i], phi] if i == 0 else [phi, theta[i]]
            value = exact_values(*pair)[i]
        grads.append(outer.gradient(value, theta[i]).numpy())
    return np.stack(grads)


def every_game():
    """All 4**T joint action sequences: states, actions, rewards as IPDTrajectories."""
    states, actions, rewards = [], [], []
    for seq in itertools.product(range(4), repeat=T):
        a = np.array([[k // 2, k % 2] for k in seq])
        s = np.concatenate([[[4, 4]], np.stack([2 * a[:, 0] + a[:, 1],
                                                 2 * a[:, 1] + a[:, 0]], 1)[:-1]])
        states.append(s)
        actions.append(a)
        rewards.append(np.stack([PAYOFF[a[:, 0], a[:, 1]], PAYOFF[a[:, 1], a[:, 0]]], 1))
    return np.array(states), np.array(actions), np.array(rewards)


STATES, ACTIONS, REWARDS = every_game()


def enumerated_objectives(params, seed):
    """The exact expected DiCE objectives: every game weighted by N times its probability
    (held constant), so the batch mean is the expectation; `seed` is unused."""
    del seed
    log_probs = rl.ipd_log_probs(params, STATES, ACTIONS)
    weight = tf.stop_gradient(len(STATES) * tf.exp(tf.reduce_sum(log_probs, [1, 2])))
    return rl.joint_dice_surrogates(log_probs, weight[:, None, None] * REWARDS, GAMMA,
                                    baseline="none")


@pytest.mark.parametrize("lookahead", [0, 2])
def test_lola_gradients_on_every_game_equal_the_exact_lola_gradients(lookahead):
    grads, values = rl.lola_dice_gradients(enumerated_objectives, list(THETA), 0, lookahead,
                                           INNER)
    np.testing.assert_allclose(values, exact_values(*THETA), rtol=1e-12)
    want = exact_lola(THETA, lookahead, INNER)
    np.testing.assert_allclose(np.stack(grads), want, rtol=1e-10, atol=1e-12)
    if lookahead:  # the look-ahead changes the gradient; a wrong step is caught
        for wrong in (exact_lola(THETA, lookahead, INNER, sign=-1.0),
                      exact_lola(THETA, lookahead, INNER, stop=True),
                      exact_lola(THETA, 0, INNER)):
            assert np.abs(want - wrong).max() > 1e-3


BATCH = 1024
ENV = rl.IteratedPrisonersDilemma(T, dtype="float64")


def sampled_objectives(params, seed):
    games = rl.sample_ipd(ENV, params, seed, BATCH)
    return rl.joint_dice_surrogates(rl.ipd_log_probs(params, games.states, games.actions),
                                    games.rewards, GAMMA)


@pytest.fixture(scope="module")
def update():
    """One look-ahead step, the batch-mean baseline; outer rate 1: the step is the gradient."""
    return rl.make_lola_update(ENV, BATCH, GAMMA, 1, INNER, 1.0)


def test_sampled_lola_gradients_agree_with_the_exact_ones_within_their_standard_error(update):
    """The compiled update's gradient from sampled games, averaged over seeds, within 4
    standard errors of the exact LOLA gradient; its returns near the exact values."""
    runs = [update(tf.constant(THETA), tf.constant([k, 7], tf.int64)) for k in range(12)]
    grads = np.stack([p.numpy() - THETA for p, _ in runs])
    scale = sum(GAMMA ** t for t in range(T))
    values = np.stack([r.numpy() * scale for _, r in runs])
    error = grads.std(0) / np.sqrt(len(runs))
    want = exact_lola(THETA, 1, INNER)
    assert np.all(np.abs(grads.mean(0) - want) < 4 * error + 1e-4), (grads.mean(0), want, error)
    np.testing.assert_allclose(values.mean(0), exact_values(*THETA), atol=0.05)


def test_games_follow_the_table_and_the_policies():
    env = rl.IteratedPrisonersDilemma(4, dtype="float64")
    theta = [tf.constant([2.0, -2.0, 0.5, 0.0, 1.0], F64), tf.constant([-1.0] * 5, F64)]
    games = rl.sample_ipd(env, theta, 3, 4000)
    s, a, r = (x.numpy() for x in games)
    assert s.shape == a.shape == r.shape == (4000, 4, 2) and r.dtype == np.float64
    np.testing.assert_array_equal(s[:, 0], 4)
    np.testing.assert_array_equal(s[:, 1:, 0], 2 * a[:, :-1, 0] + a[:, :-1, 1])
    np.testing.assert_array_equal(s[:, 1:, 1], 2 * a[:, :-1, 1] + a[:, :-1, 0])
    np.testing.assert_array_equal(r[..., 0], PAYOFF[a[..., 0], a[..., 1]])
    np.testing.assert_array_equal(r[..., 1], PAYOFF[a[..., 1], a[..., 0]])
    for i in range(2):  # cooperation frequency per state within 4 standard errors
        for state in range(5):
            chosen = a[..., i][s[..., i] == state]
            p = 1 / (1 + np.exp(-theta[i].numpy()[state]))
            assert abs(np.mean(chosen == 0) - p) < 4 * np.sqrt(p * (1 - p) / len(chosen))
    np.testing.assert_array_equal(rl.sample_ipd(env, theta, 3, 4000).actions, a)
    lp = rl.ipd_log_probs(theta, s, a).numpy()
    logit = np.stack([theta[i].numpy()[s[..., i]] for i in range(2)], -1)
    np.testing.assert_allclose(lp, -np.log1p(np.exp(np.where(a == 0, -logit, logit))),
                               rtol=1e-13)


def test_objectives_that_ignore_an_agents_parameters_are_errors_naming_it():
    def objectives_with(log_probs_of):
        def objectives(params, seed):
            del seed
            return rl.joint_dice_surrogates(log_probs_of(params), REWARDS, GAMMA)
        return objectives

    frozen1 = objectives_with(lambda p: rl.ipd_log_probs([p[0], tf.stop_gradient(p[1])],
                                                         STATES, ACTIONS))
    frozen0 = objectives_with(lambda p: rl.ipd_log_probs([tf.stop_gradient(p[0]), p[1]],
                                                         STATES, ACTIONS))

    def separate(params, seed):
        """Each agent's objective blind to the other's parameters (stopped gradients)."""
        return tf.stack([frozen1(params, seed)[0], frozen0(params, seed)[1]])

    theta = list(THETA)
    cases = [(frozen1, 1, "agent 1's objective does not depend on agent 1's parameters"),
             (frozen0, 0, "agent 0's objective does not depend on agent 0's parameters"),
             (frozen1, 0, "agent 1's objective does not depend on agent 1's parameters"),
             (separate, 1, "agent 1's look-ahead does not depend on agent 0's parameters")]
    for objectives, lookahead, message in cases:
        with pytest.raises(ValueError, match=message):
            rl.lola_dice_gradients(objectives, theta, 0, lookahead, INNER)
    with pytest.raises(ValueError, match="agent 1's look-ahead does not depend on agent 0"):
        tf.function(lambda: rl.lola_dice_gradients(separate, theta, 0, 1, INNER),
                    autograph=False)()
    env = rl.IteratedPrisonersDilemma(2, dtype="float64")
    bad = [
        (lambda: rl.lola_dice_gradients(separate, theta[:1], 0, 1, INNER), "two agents"),
        (lambda: rl.lola_dice_gradients(separate, theta, 0, -1, INNER), "lookahead"),
        (lambda: rl.lola_dice_gradients(separate, theta, 0, 1, 0.0), "inner_rate"),
        (lambda: rl.lola_dice_gradients(None, theta, 0, 1, INNER), "objectives"),
        (lambda: rl.lola_dice_gradients(lambda p, s: separate(p, s)[0], theta, 0, 1, INNER),
         r"objectives must return a floating \[2\] tensor"),
        (lambda: rl.sample_ipd(env, [tf.zeros([4], F64)] * 2, 0, 2), r"shape \[5\]"),
        (lambda: rl.sample_ipd(env, [tf.zeros([5])] * 2, 0, 2), "params have dtype"),
        (lambda: rl.ipd_log_probs(theta, STATES, ACTIONS[:, :2]), "states have shape"),
        (lambda: rl.ipd_log_probs(theta, STATES[..., 0], ACTIONS), "states must be"),
        (lambda: rl.joint_dice_surrogates(REWARDS, REWARDS, GAMMA, "mean"), "baseline"),
        (lambda: rl.make_lola_update(env, 4, 0.0, 1, 0.3, 0.2), "discount"),
        (lambda: rl.make_lola_update(rl.Navigation2D(), 4, 0.9, 1, 0.3, 0.2), "env must be"),
    ]
    for call, pattern in bad:
        with pytest.raises(checks.ArgumentError, match=pattern):
            call()


def test_the_update_ascends_the_gradients_traced_once(update):
    params, seed = tf.constant(THETA), tf.constant([5, 1], tf.int64)
    new, returns = update(params, seed)
    again, _ = update(params, seed)
    np.testing.assert_array_equal(new, again)
    update(params + 0.1, tf.constant([6, 1], tf.int64))
    assert update.experimental_get_tracing_count() == 1
    grads, values = rl.lola_dice_gradients(sampled_objectives, list(THETA), seed, 1, INNER)
    np.testing.assert_allclose(new, THETA + np.stack(grads), rtol=1e-12, atol=1e-14)
    scale = sum(GAMMA ** t for t in range(T))
    np.testing.assert_allclose(returns, values / scale, rtol=1e-13)
    assert np.all((returns.numpy() >= -3) & (returns.numpy() <= 0))


class _Killed(Exception):
    pass


def test_the_binary_writes_its_outputs_and_resumes_exactly(tmp_path, monkeypatch):
    """A run killed during its third update resumes from the checkpoint of the second and
    ends as the uninterrupted run; another config is refused."""
    from experiments import lola
    from hogrod import harness

    bindings = ["lola_experiment.updates = 4", "lola_experiment.horizon = 3",
                "lola_experiment.batch = 4", "lola_experiment.lookahead = 0",
                "lola_experiment.seeds = (0, 1)", "lola_experiment.checkpoint_every = 2",
                "lola_experiment.last = 2"]
    config = ["configs/rl/lola_dice.gin"]
    whole, metrics = harness.run(lola.lola_experiment, config, bindings, str(tmp_path / "a"))
    for name in ("metrics.json", "returns.png", "operative_config.gin", "ckpt"):
        assert os.path.exists(os.path.join(whole, name)), name
    returns = np.array(metrics["returns_by_seed"])
    assert returns.shape == (2, 4, 2) and np.all((returns >= -3) & (returns <= 0))
    np.testing.assert_allclose(metrics["returns"], returns.mean(0))
    assert metrics["updates_done"] == 4 and 0 <= metrics["cooperating_seeds"] <= 2

    make = rl.make_lola_update

    def killed_after(calls):
        def factory(*args, **kwargs):
            update = make(*args, **kwargs)

            def counted(*xs):
                calls.append(1)
                if len(calls) > 5:  # killed after both seeds' two updates and seed 0's third
                    raise _Killed()
                return update(*xs)
            return counted
        return factory

    monkeypatch.setattr(rl, "make_lola_update", killed_after([]))
    resumed = str(tmp_path / "b")
    with pytest.raises(_Killed):
        harness.run(lola.lola_experiment, config, bindings, resumed)
    monkeypatch.undo()
    _, again = harness.run(lola.lola_experiment, config, bindings, resumed)
    assert again["train_steps"] == 2  # resumed at update 2
    for key in ("returns_by_seed", "cooperation_probabilities", "final_returns"):
        np.testing.assert_array_equal(again[key], metrics[key])
    with pytest.raises(harness.ConfigError, match="outer_rate"):
        harness.run(lola.lola_experiment, config, bindings + ["lola_experiment.outer_rate = 0.1"],
                    resumed)
