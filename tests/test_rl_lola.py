"""LOLA-DiCE on the iterated prisoner's dilemma, in float64. Oracles: the exact LOLA
gradient of a short game, from its closed-form expected return (the memory-one Markov
chain over the 5 joint states, propagated exactly) differentiated by nested tapes,
against the library's machinery on every joint trajectory weighted by its probability
(the exact expectation of the DiCE surrogates, whose derivatives of every order are
exact); sampled batches within a few standard errors; numpy games; every error naming
the agent whose parameters a surrogate ignores; the value baseline's term and fit against
numpy."""

import itertools
import json
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


def exact_lola(theta, inner_steps, inner_lr, sign=1.0, stop=False):
    """The LOLA gradients of the exact values by nested tapes, written independently."""
    theta = [tf.constant(theta[0]), tf.constant(theta[1])]
    grads = []
    for i in range(2):
        j = 1 - i
        with tf.GradientTape() as outer:
            outer.watch(theta[i])
            phi = theta[j]
            for _ in range(inner_steps):
                with tf.GradientTape() as inner:
                    inner.watch(phi)
                    pair = [theta[i], phi] if i == 0 else [phi, theta[i]]
                    value = exact_values(*pair)[j]
                step = inner.gradient(value, phi)
                phi = phi + sign * inner_lr * (tf.stop_gradient(step) if stop else step)
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


VALUE_HEADS = np.random.default_rng(1).normal(size=(2, 6)) - 2.0


def enumerated_surrogates(baseline):
    """The exact expected DiCE surrogates: every game weighted by N times its probability
    (held constant), so the batch mean is the expectation; `seed` is unused. With the value
    baseline, arbitrary value heads (any baseline leaves every expectation unchanged)."""
    def surrogates(params, seed):
        del seed
        log_probs = rl.ipd_log_probs(params, STATES, ACTIONS)
        weight = tf.stop_gradient(len(STATES) * tf.exp(tf.reduce_sum(log_probs, [1, 2])))
        weight = weight[:, None, None]
        values = (weight * rl.ipd_values(VALUE_HEADS, STATES)) if baseline == "value" else None
        return rl.joint_dice_surrogates(log_probs, weight * REWARDS, GAMMA, baseline, values)
    return surrogates


@pytest.mark.parametrize("baseline", ["none", "value"])
@pytest.mark.parametrize("inner_steps", [0, 2])
def test_lola_gradients_on_every_game_equal_the_exact_lola_gradients(inner_steps, baseline):
    """Also with the DiCE authors' value baseline: its term is 0 in value and in the
    expectation of every derivative (the LOLA gradient takes second and third ones)."""
    grads, values = rl.lola_dice_gradients(enumerated_surrogates(baseline), list(THETA), 0,
                                           inner_steps, INNER)
    np.testing.assert_allclose(values, exact_values(*THETA), rtol=1e-12)
    want = exact_lola(THETA, inner_steps, INNER)
    np.testing.assert_allclose(np.stack(grads), want, rtol=1e-10, atol=1e-12)
    if inner_steps:  # the look-ahead changes the gradient; a wrong step is caught
        for wrong in (exact_lola(THETA, inner_steps, INNER, sign=-1.0),
                      exact_lola(THETA, inner_steps, INNER, stop=True),
                      exact_lola(THETA, 0, INNER)):
            assert np.abs(want - wrong).max() > 1e-3


BATCH = 1024
ENV = rl.IteratedPrisonersDilemma(T, dtype="float64")


def sampled_surrogates(params, seed):
    games = rl.sample_ipd(ENV, params, seed, BATCH)
    return rl.joint_dice_surrogates(rl.ipd_log_probs(params, games.states, games.actions),
                                    games.rewards, GAMMA)


PARAMS = rl.LolaParams(tf.constant(THETA), tf.constant(VALUE_HEADS))


@pytest.fixture(scope="module")
def update():
    """One look-ahead step, the batch-mean baseline; outer rate 1: the step is the gradient."""
    return rl.make_lola_update(ENV, BATCH, GAMMA, 1, INNER, 1.0)


def test_sampled_lola_gradients_agree_with_the_exact_ones_within_their_standard_error(update):
    """The compiled update's gradient from sampled games, averaged over seeds, within 4
    standard errors of the exact LOLA gradient; its returns near the exact values."""
    runs = [update(PARAMS, tf.constant([k, 7], tf.int64)) for k in range(12)]
    grads = np.stack([p.policy.numpy() - THETA for p, _ in runs])
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


def test_surrogates_that_ignore_an_agents_parameters_are_errors_naming_it():
    def surrogates_with(log_probs_of):
        def surrogates(params, seed):
            del seed
            return rl.joint_dice_surrogates(log_probs_of(params), REWARDS, GAMMA)
        return surrogates

    frozen1 = surrogates_with(lambda p: rl.ipd_log_probs([p[0], tf.stop_gradient(p[1])],
                                                         STATES, ACTIONS))
    frozen0 = surrogates_with(lambda p: rl.ipd_log_probs([tf.stop_gradient(p[0]), p[1]],
                                                         STATES, ACTIONS))

    def separate(params, seed):
        """Each agent's surrogate blind to the other's parameters (stopped gradients)."""
        return tf.stack([frozen1(params, seed)[0], frozen0(params, seed)[1]])

    theta = list(THETA)
    cases = [(frozen1, 1, "agent 1's surrogate does not depend on agent 1's parameters"),
             (frozen0, 0, "agent 0's surrogate does not depend on agent 0's parameters"),
             (frozen1, 0, "agent 1's surrogate does not depend on agent 1's parameters"),
             (separate, 1, "agent 1's look-ahead does not depend on agent 0's parameters")]
    for surrogates, inner_steps, message in cases:
        with pytest.raises(ValueError, match=message):
            rl.lola_dice_gradients(surrogates, theta, 0, inner_steps, INNER)
    with pytest.raises(ValueError, match="agent 1's look-ahead does not depend on agent 0"):
        tf.function(lambda: rl.lola_dice_gradients(separate, theta, 0, 1, INNER),
                    autograph=False)()
    env = rl.IteratedPrisonersDilemma(2, dtype="float64")
    bad = [
        (lambda: rl.lola_dice_gradients(separate, theta[:1], 0, 1, INNER), "two agents"),
        (lambda: rl.lola_dice_gradients(separate, theta, 0, -1, INNER), "inner_steps"),
        (lambda: rl.lola_dice_gradients(separate, theta, 0, 1, 0.0), "inner_lr"),
        (lambda: rl.lola_dice_gradients(None, theta, 0, 1, INNER), "surrogates"),
        (lambda: rl.lola_dice_gradients(lambda p, s: separate(p, s)[0], theta, 0, 1, INNER),
         r"surrogates must return a floating \[2\] tensor"),
        (lambda: rl.sample_ipd(env, [tf.zeros([4], F64)] * 2, 0, 2), r"shape \[5\]"),
        (lambda: rl.sample_ipd(env, [tf.zeros([5])] * 2, 0, 2), "params have dtype"),
        (lambda: rl.ipd_log_probs(theta, STATES, ACTIONS[:, :2]), "states have shape"),
        (lambda: rl.ipd_log_probs(theta, STATES[..., 0], ACTIONS), "states must be"),
        (lambda: rl.joint_dice_surrogates(REWARDS, REWARDS, GAMMA, "mean"), "baseline"),
        (lambda: rl.joint_dice_surrogates(REWARDS, REWARDS, GAMMA, "value"),
         "values must be given with baseline 'value'"),
        (lambda: rl.joint_dice_surrogates(REWARDS, REWARDS, GAMMA, values=REWARDS),
         "values must be given with baseline 'value' and only then"),
        (lambda: rl.joint_dice_surrogates(REWARDS, REWARDS, GAMMA, "value", REWARDS[:2]),
         "values has shape"),
        (lambda: rl.ipd_values(VALUE_HEADS[:, :5], STATES), r"value must be \[2, 6\]"),
        (lambda: rl.fit_ipd_values(VALUE_HEADS, STATES, REWARDS[:, :0], GAMMA, 0.1, 4, 0),
         "non-empty shape"),
        (lambda: rl.fit_ipd_values(VALUE_HEADS, STATES, REWARDS, GAMMA, 0.0, 4, 0), "lr"),
        (lambda: rl.fit_ipd_values(VALUE_HEADS, STATES, REWARDS, GAMMA, 0.1, 0, 0),
         "minibatch"),
        (lambda: rl.make_lola_update(env, 4, 0.9, 1, 0.3, 0.2, "value", value_epochs=0),
         "value_epochs"),
        (lambda: rl.make_lola_update(env, 4, 0.0, 1, 0.3, 0.2), "discount"),
        (lambda: rl.make_lola_update(env, 4, 0.9, 1, 0.3, 0.2, order="alternating"),
         "order must be one of"),
        (lambda: rl.make_lola_update(rl.Navigation2D(), 4, 0.9, 1, 0.3, 0.2), "env must be"),
    ]
    for call, pattern in bad:
        with pytest.raises(checks.ArgumentError, match=pattern):
            call()


def test_the_update_ascends_the_gradients_traced_once(update):
    seed = tf.constant([5, 1], tf.int64)
    new, returns = update(PARAMS, seed)
    again, _ = update(PARAMS, seed)
    np.testing.assert_array_equal(new.policy, again.policy)
    np.testing.assert_array_equal(new.value, PARAMS.value)  # the batch mean fits no values
    update(rl.LolaParams(PARAMS.policy + 0.1, PARAMS.value), tf.constant([6, 1], tf.int64))
    assert update.experimental_get_tracing_count() == 1
    grads, values = rl.lola_dice_gradients(sampled_surrogates, list(THETA), seed, 1, INNER)
    np.testing.assert_allclose(new.policy, THETA + np.stack(grads), rtol=1e-12, atol=1e-14)
    scale = sum(GAMMA ** t for t in range(T))
    np.testing.assert_allclose(returns, values / scale, rtol=1e-13)
    assert np.all((returns.numpy() >= -3) & (returns.numpy() <= 0))


def sequential_gradient_of_agent_1(theta, new0, seed, inner_steps, baseline, heads):
    """Agent 1's gradient in the reference's order, written independently: its batches drawn
    as at the old parameters (batch m at agent 0's parameters after m predicted steps from
    its old ones, with seed row ``inner_steps + 1 + m`` of the split), then its look-ahead
    gradient at agent 0's new parameters `new0` on those batches."""
    rows = tf.random.experimental.stateless_split(seed, 2 * (inner_steps + 1))
    rows = rows[inner_steps + 1:]
    theta0, theta1 = tf.constant(theta[0]), tf.constant(theta[1])

    def surrogates(pair, games):
        log_probs = rl.ipd_log_probs(pair, games.states, games.actions)
        values = rl.ipd_values(heads, games.states) if baseline == "value" else None
        return rl.joint_dice_surrogates(log_probs, games.rewards, GAMMA, baseline, values)

    def step(phi, games):  # agent 0's predicted step, differentiable in agent 1's theta1
        with tf.GradientTape() as tape:
            tape.watch(phi)
            own = surrogates([phi, theta1], games)[0]
        return phi + INNER * tf.convert_to_tensor(tape.gradient(own, phi))

    phi, batches = theta0, []
    for m in range(inner_steps + 1):
        batches.append(rl.sample_ipd(ENV, [phi, theta1], rows[m], 64))
        phi = step(phi, batches[-1]) if m < inner_steps else phi
    with tf.GradientTape() as tape:
        tape.watch(theta1)
        phi = tf.constant(new0)
        for games in batches[:-1]:
            phi = step(phi, games)
        target = surrogates([phi, theta1], batches[-1])[1]
    return tf.convert_to_tensor(tape.gradient(target, theta1)).numpy()


@pytest.mark.parametrize("baseline", ["batch_mean", "value"])
def test_the_sequential_order_steps_agent_0_then_agent_1_at_its_new_parameters(baseline):
    """The reference's order: agent 0 as when simultaneous; agent 1's gradient at agent 0's
    updated parameters on the batches drawn before (an independent computation); different
    from the simultaneous step; naive learners (no look-ahead) the same in either order."""
    seed = tf.constant([3, 1], tf.int64)
    steps = {order: rl.make_lola_update(ENV, 64, GAMMA, 1, INNER, 1.0, baseline,
                                        value_epochs=1, value_minibatch=2, order=order)
             for order in ("simultaneous", "sequential")}
    (new, returns), (simultaneous, same) = (steps[o](PARAMS, seed)
                                            for o in ("sequential", "simultaneous"))
    np.testing.assert_array_equal(new.policy[0], simultaneous.policy[0])
    np.testing.assert_array_equal(new.value, simultaneous.value)
    np.testing.assert_array_equal(returns, same)
    want = THETA[1] + sequential_gradient_of_agent_1(THETA, new.policy[0], seed, 1,
                                                     baseline, new.value)
    np.testing.assert_allclose(new.policy[1], want, rtol=1e-11, atol=1e-13)
    # far above the agreement's tolerance: agent 1 reading agent 0's old parameters fails
    assert np.abs(new.policy[1] - simultaneous.policy[1]).max() > 1e-5
    if baseline == "batch_mean":
        naive = [rl.make_lola_update(ENV, 64, GAMMA, 0, INNER, 1.0, order=order)(PARAMS, seed)
                 for order in ("simultaneous", "sequential")]
        np.testing.assert_array_equal(naive[0][0].policy, naive[1][0].policy)


class _Killed(Exception):
    pass


def strict_json(path):
    """The file parsed as strict JSON (NaN and Infinity are errors)."""
    def refuse(name):
        raise ValueError(f"{path} holds {name}, not strict JSON")
    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def test_the_binary_writes_its_outputs_resumes_exactly_and_continues_a_shorter_run(
        tmp_path, monkeypatch):
    """A run killed during its third update resumes from the checkpoint of the second and
    ends as the uninterrupted run (the value heads' fit included); a run of 2 updates
    continued to 4 with allow_config_change ends as the run of 4; another config is
    refused, and no update at all is refused before a directory is made; metrics.json is
    strict JSON."""
    from experiments import lola
    from hogrod import harness

    bindings = ["lola_experiment.updates = 4", "lola_experiment.horizon = 3",
                "lola_experiment.batch = 4", "lola_experiment.inner_steps = 0",
                "lola_experiment.seeds = (0, 1)", "lola_experiment.checkpoint_every = 2",
                "lola_experiment.last = 2", "lola_experiment.value_epochs = 2"]
    config = ["configs/rl/lola_dice.gin"]
    whole, metrics = harness.run(lola.lola_experiment, config, bindings, str(tmp_path / "a"))
    for name in ("metrics.json", "returns.png", "operative_config.gin", "ckpt"):
        assert os.path.exists(os.path.join(whole, name)), name
    assert strict_json(os.path.join(whole, "metrics.json"))["updates_done"] == 4
    json.dumps(metrics, allow_nan=False)
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
    with pytest.raises(harness.ConfigError, match="outer_lr"):
        harness.run(lola.lola_experiment, config,
                    bindings + ["lola_experiment.outer_lr = 0.1"], resumed)

    shorter = str(tmp_path / "c")
    harness.run(lola.lola_experiment, config, bindings + ["lola_experiment.updates = 2"],
                shorter)
    _, longer = harness.run(lola.lola_experiment, config, bindings, shorter,
                            allow_config_change=True)
    assert longer["train_steps"] == 2 and longer["updates_done"] == 4
    for key in ("returns_by_seed", "cooperation_probabilities", "final_returns"):
        np.testing.assert_array_equal(longer[key], metrics[key])
    strict_json(os.path.join(shorter, "metrics.json"))

    for binding, error, refused in (
            ("lola_experiment.updates = 0", harness.ConfigError, "lola_experiment.updates"),
            ("lola_experiment.order = 'alternating'", ValueError,
             "lola_experiment.order must be one of")):
        with pytest.raises(error, match=refused):
            harness.run(lola.lola_experiment, config, bindings + [binding],
                        str(tmp_path / "d"))
        assert not os.path.exists(tmp_path / "d")


def test_the_binarys_onednn_int32_notice_is_dropped_from_stderr():
    """hogrod-lola's int32 ops print it on CPUs without AVX-512 kernels for them."""
    from hogrod import stderr_filter
    line = (b"E0000 00:00:1795926229.090281    6544 util.cc:131] oneDNN supports DT_INT32 "
            b"only on platforms with AVX-512. Falling back to the default Eigen-based "
            b"implementation if present.")
    assert stderr_filter.NOISE.match(line)
    assert not stderr_filter.NOISE.match(line.replace(b"util.cc", b"lola.py"))
    assert not stderr_filter.NOISE.match(line.replace(b"oneDNN supports", b"oneDNN refuses"))


def test_the_value_baselines_term_is_zero_with_the_score_gradient_numpy_gives():
    """On sampled games: the value baseline changes no surrogate's value, and its gradient
    is ``-mean_b sum_t discount**t V_i[b, t] d l_t`` (l_t: step t's joint log-probability),
    the score of a sigmoid policy written in numpy."""
    games = rl.sample_ipd(ENV, list(THETA), 3, 16)
    s, a = games.states.numpy(), games.actions.numpy()
    values = rl.ipd_values(VALUE_HEADS, s)
    np.testing.assert_allclose(values, VALUE_HEADS[np.arange(2), s] + VALUE_HEADS[:, 5],
                               rtol=1e-15)
    theta = tf.constant(THETA)
    with tf.GradientTape() as tape:
        tape.watch(theta)
        lp = rl.ipd_log_probs(tf.unstack(theta), s, a)
        both = [rl.joint_dice_surrogates(lp, games.rewards, GAMMA, b, v)
                for b, v in (("value", values), ("none", None))]
        term = both[0] - both[1]
    np.testing.assert_allclose(term, 0.0, atol=1e-13)
    p = 1 / (1 + np.exp(-THETA))  # cooperation probabilities [agent, state]
    score = np.zeros(s.shape + (5,))  # d log p_j(a_t | s_t) / d theta_j[state]
    for j in range(2):
        cooperated = a[..., j] == 0
        slope = np.where(cooperated, 1 - p[j][s[..., j]], -p[j][s[..., j]])
        score[..., j, :] = slope[..., None] * (s[..., j, None] == np.arange(5))
    weights = GAMMA ** np.arange(T)
    want = -np.einsum("t,bti,btjs->ijs", weights, values.numpy(), score) / s.shape[0]
    np.testing.assert_allclose(tape.jacobian(term, theta), want, rtol=1e-10, atol=1e-13)


def numpy_fit(value, s, r, parts, lr):
    """Gradient descent on each agent's mean squared error to its return-to-go, one step per
    part (a list of time steps), written in numpy."""
    returns = np.zeros_like(r)
    running = np.zeros(r.shape[::2])
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + GAMMA * running
        returns[:, t] = running
    v = value.copy()
    for part in parts:
        for i in range(2):
            states = s[:, part, i]
            error = v[i, states] + v[i, 5] - returns[:, part, i]
            grad = np.zeros(6)
            np.add.at(grad, states.ravel(), 2 * error.ravel() / error.size)
            grad[5] = 2 * error.mean()
            v[i] -= lr * grad
    return v


def test_the_value_fit_is_the_references_gradient_descent_in_numpy():
    """One epoch of `fit_ipd_values`: with minibatches of every step, two steps on the whole
    batch; with minibatches of one step, the steps in one of the T! orders, then the whole
    batch."""
    games = rl.sample_ipd(ENV, list(THETA), 4, 8)
    s, r = games.states.numpy(), games.rewards.numpy()
    whole = list(range(T))
    got = rl.fit_ipd_values(VALUE_HEADS, s, r, GAMMA, 0.1, T, 0)
    np.testing.assert_allclose(got, numpy_fit(VALUE_HEADS, s, r, [whole, whole], 0.1),
                               rtol=1e-13)
    orders = set()
    for seed in range(6):
        got = rl.fit_ipd_values(VALUE_HEADS, s, r, GAMMA, 0.3, 1, seed).numpy()
        matches = [order for order in itertools.permutations(range(T))
                   if np.allclose(got, numpy_fit(VALUE_HEADS, s, r,
                                                 [[t] for t in order] + [whole], 0.3),
                                  rtol=1e-13, atol=0)]
        assert len(matches) == 1, matches
        orders.add(matches[0])
    assert len(orders) > 1  # the seed draws the order
