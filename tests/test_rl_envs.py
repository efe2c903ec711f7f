"""hogrod.rl's environments in float64 against numpy steps: 2D navigation (clipping, reward,
done), the iterated prisoner's dilemma (payoffs, own-perspective states); tasks mapped by
tf.vectorized_map inside one compiled rollout; every bad action's error."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, rl

F64 = tf.float64


def numpy_navigation_step(position, goal, action):
    position = position + np.clip(action, -0.1, 0.1)
    distance = np.sqrt(((position - goal) ** 2).sum(-1))
    return position, -distance, distance < 0.01


def test_navigation_steps_as_numpy():
    env = rl.Navigation2D(dtype="float64")
    goals = env.sample_tasks(5, 50)["goal"].numpy()
    assert goals.shape == (50, 2) and np.all(np.abs(goals) <= 0.5)
    np.testing.assert_array_equal(env.sample_tasks(5, 50)["goal"], goals)
    task = {"goal": tf.constant(goals[0])}
    state, obs = env.reset(task, 0, 8)
    np.testing.assert_array_equal(obs, np.zeros((8, 2)))
    rng = np.random.default_rng(0)
    position = np.zeros((8, 2))
    for _ in range(12):
        action = rng.normal(size=(8, 2)) * 0.15
        state, obs, reward, done = env.step(task, state, tf.constant(action))
        position, want_reward, want_done = numpy_navigation_step(position, goals[0], action)
        np.testing.assert_allclose(obs, position, rtol=1e-15, atol=1e-15)
        np.testing.assert_allclose(reward, want_reward, rtol=1e-14)
        np.testing.assert_array_equal(done, want_done)
    # one step onto the goal is done
    near = {"goal": tf.constant([0.05, -0.05], F64)}
    state, _ = env.reset(near, 0, 1)
    _, _, reward, done = env.step(near, state, tf.constant([[0.05, -0.05]], F64))
    assert bool(done[0]) and float(reward[0]) > -0.01


def test_the_oracle_observes_its_goal_and_is_rewarded_as_the_plain_task():
    plain, oracle = (rl.Navigation2D(dtype="float64", observe_goal=g) for g in (False, True))
    assert (plain.observation_dim, oracle.observation_dim) == (2, 4)
    task = {"goal": tf.constant([0.3, -0.2], F64)}
    (s1, o1), (s2, o2) = plain.reset(task, 0, 3), oracle.reset(task, 0, 3)
    np.testing.assert_array_equal(o2, np.concatenate([o1, [[0.3, -0.2]] * 3], 1))
    action = tf.constant(np.random.default_rng(1).normal(size=(3, 2)) * 0.1)
    (_, o1, r1, d1), (_, o2, r2, d2) = plain.step(task, s1, action), oracle.step(task, s2,
                                                                                 action)
    np.testing.assert_array_equal(o2, np.concatenate([o1, [[0.3, -0.2]] * 3], 1))
    np.testing.assert_array_equal(r2, r1)
    np.testing.assert_array_equal(d2, d1)
    with pytest.raises(checks.ArgumentError, match="observe_goal must be a bool"):
        rl.Navigation2D(observe_goal="yes")


def test_navigation_is_done_at_the_horizon():
    env = rl.Navigation2D(horizon=3, dtype="float64")
    task = {"goal": tf.constant([0.4, 0.4], F64)}
    state, _ = env.reset(task, 0, 2)
    dones = []
    for _ in range(4):  # far from the goal: only the horizon ends the episode
        state, _, _, done = env.step(task, state, tf.zeros([2, 2], F64))
        dones.append(done.numpy().tolist())
    assert dones == [[False] * 2, [False] * 2, [True] * 2, [True] * 2]


def test_constant_bad_values_are_errors_when_traced_even_under_xla():
    """XLA drops tf.debugging.Assert: a check on constants runs in Python at tracing."""
    ipd = rl.IteratedPrisonersDilemma(horizon=2, dtype="float64")
    game = {"payoffs": tf.constant(ipd.PAYOFFS, F64)}
    bad = [
        (lambda: ipd.step(game, ipd.reset(game, 0, 3)[0], tf.constant([[0, 2]] * 3)),
         r"action must lie in 0\.\.1"),
        (lambda: rl.TabularMDP([[[0.9, 0.2]]] * 2, [[0.0]] * 2, horizon=2,
                               dtype="float64").rewards, "transitions must be probabilities"),
        (lambda: rl.dice_surrogate(tf.zeros([3, 4], F64), tf.ones([3, 4], F64),
                                   mask=np.array([[0.0, 1, 1, 1]] * 3)), "must not increase"),
    ]
    for call, pattern in bad:
        with pytest.raises(checks.ArgumentError, match=pattern):
            tf.function(call, jit_compile=True, autograph=False)()
    # a data-dependent check still runs in a graph without XLA:
    # test_rl.py::test_bad_inputs_are_named (a mask given to a compiled function)


def test_a_meta_batch_of_navigation_tasks_rolls_out_in_one_compiled_step():
    env = rl.Navigation2D(horizon=5, dtype="float64")
    tasks = env.sample_tasks(1, 4)

    @tf.function
    def rollout(tasks):
        def one(task):
            state, _ = env.reset(task, 0, 3)
            total = tf.zeros([3], F64)
            for _ in range(env.horizon):  # toward the goal at full speed
                state, _, reward, _ = env.step(task, state, tf.ones([3, 2], F64) * task["goal"])
                total += reward
            return total
        return tf.vectorized_map(one, tasks)

    totals = rollout(tasks).numpy()
    for i, goal in enumerate(tasks["goal"].numpy()):
        position, total = np.zeros((3, 2)), np.zeros(3)
        for _ in range(5):
            position, reward, _ = numpy_navigation_step(position, goal, np.ones((3, 2)) * goal)
            total += reward
        np.testing.assert_allclose(totals[i], total, rtol=1e-13)


def test_the_prisoners_dilemma_pays_and_observes_as_the_table_says():
    env = rl.IteratedPrisonersDilemma(horizon=3, dtype="float64")
    task = tf.nest.map_structure(lambda x: x[0], env.sample_tasks(0, 2))
    state, obs = env.reset(task, 0, 4)
    np.testing.assert_array_equal(obs.numpy().argmax(-1), np.full((4, 2), 4))
    payoff = {(0, 0): -1, (0, 1): -3, (1, 0): 0, (1, 1): -2}  # own action first
    joint = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    for t in range(3):
        action = np.roll(joint, t, axis=0)
        state, obs, reward, done = env.step(task, state, tf.constant(action, tf.int32))
        want = [[payoff[a, b], payoff[b, a]] for a, b in action]
        np.testing.assert_array_equal(reward, want)
        np.testing.assert_array_equal(obs.numpy().argmax(-1),
                                      np.stack([2 * action[:, 0] + action[:, 1],
                                                2 * action[:, 1] + action[:, 0]], 1))
        assert obs.shape == (4, 2, 5)
        np.testing.assert_array_equal(done, [t == 2] * 4)


def test_bad_actions_are_named():
    nav = rl.Navigation2D(dtype="float64")
    task = {"goal": tf.zeros([2], F64)}
    state, _ = nav.reset(task, 0, 3)
    ipd = rl.IteratedPrisonersDilemma(dtype="float64")
    game = {"payoffs": tf.constant(ipd.PAYOFFS, F64)}
    istate, _ = ipd.reset(game, 0, 3)
    bad = [
        (lambda: nav.step(task, state, tf.zeros([3, 3], F64)), "action must be floating"),
        (lambda: nav.step(task, state, tf.zeros([3, 2], tf.int32)), "action must be floating"),
        (lambda: nav.step(task, state, tf.zeros([3, 2], tf.float32)), "action has dtype"),
        (lambda: ipd.step(game, istate, tf.zeros([3], tf.int32)), "action must be integer"),
        (lambda: ipd.step(game, istate, tf.zeros([3, 2], F64)), "action must be integer"),
        (lambda: ipd.step(game, istate, tf.constant([[0, 2]] * 3)), r"action must lie in 0\.\.1"),
        (lambda: nav.sample_tasks(-1, 2), "seed"),
        (lambda: nav.sample_tasks(0, 0), "n must be"),
        (lambda: rl.Navigation2D(horizon=0), "horizon"),
    ]
    for call, pattern in bad:
        with pytest.raises(checks.ArgumentError, match=pattern):
            call()


def test_tables_given_as_python_numbers_are_exact_in_float64():
    """0.1 read through float32 would be 0.10000000149; a float64 MDP keeps 0.1."""
    mdp = rl.TabularMDP([[[0.9, 0.1]], [[0.3, 0.7]]], [[0.1], [0.7]], [0.3, 0.7],
                        horizon=3, dtype="float64")
    assert mdp.rewards.dtype == tf.float64
    np.testing.assert_array_equal(mdp.rewards.numpy(), [[0.1], [0.7]])
    np.testing.assert_array_equal(mdp.transitions.numpy()[:, 0, 1], [0.1, 0.7])
    np.testing.assert_array_equal(mdp.initial.numpy(), [0.3, 0.7])


def test_latin_hypercube_goals_fill_every_interval_and_each_stays_uniform():
    from scipy import stats
    n = 40
    nav = rl.Navigation2D(dtype="float64", task_sampling="latin_hypercube")
    goals = nav.sample_tasks(3, n)["goal"].numpy()
    for column in goals.T:  # one goal in each of the n intervals of [-0.5, 0.5]
        np.testing.assert_array_equal(np.sort(np.floor((column + 0.5) * n)), np.arange(n))
    # the columns' intervals are permuted independently: not one diagonal
    assert not np.array_equal(np.argsort(goals[:, 0]), np.argsort(goals[:, 1]))
    np.testing.assert_array_equal(nav.sample_tasks(3, n)["goal"], goals)
    # each row is uniform over the seeds (an unpermuted hypercube puts row 0 in [-0.5, -0.45])
    firsts = np.stack([nav.sample_tasks(s, n)["goal"].numpy()[0] for s in range(300)])
    for column in firsts.T:
        assert stats.kstest(column + 0.5, "uniform").pvalue > 1e-3
    # the meta-batch's mean goal varies far less than with independent goals
    iid = rl.Navigation2D(dtype="float64")
    spread = {k: np.std([e.sample_tasks(s, n)["goal"].numpy().mean(0) for s in range(100)])
              for k, e in (("lhs", nav), ("iid", iid))}
    assert spread["lhs"] < 0.1 * spread["iid"]
    # the default is unchanged: independent uniforms from the seed
    np.testing.assert_array_equal(iid.sample_tasks(5, 7)["goal"], tf.random.stateless_uniform(
        [7, 2], [5, 0], tf.constant(-0.5, F64), tf.constant(0.5, F64), dtype=F64))

    velocity = rl.HalfCheetahTasks("velocity", dtype="float64", task_sampling="latin_hypercube")
    v = velocity.sample_tasks(tf.constant([4, 1], tf.int64), n)["goal"].numpy()
    np.testing.assert_array_equal(np.sort(np.floor(v / 2 * n)), np.arange(n))
    direction = rl.HalfCheetahTasks("direction", dtype="float64",
                                    task_sampling="latin_hypercube")
    for s in range(5):
        d = direction.sample_tasks(s, 10)["goal"].numpy()
        assert sorted(d) == [-1.0] * 5 + [1.0] * 5
    for make in (rl.Navigation2D, rl.HalfCheetahTasks):
        with pytest.raises(checks.ArgumentError, match="task_sampling"):
            make(task_sampling="stratified")


def test_an_out_of_range_tabular_action_in_a_graph_fails_with_its_own_message():
    """In a `tf.function` the range check is an assertion the gathers wait for: the error
    names the action's range, not GatherNd's index."""
    mdp = rl.TabularMDP([[[1.0], [1.0]]], [[0.0, 1.0]], horizon=2, dtype="float64")
    task = {k: v[0] for k, v in mdp.sample_tasks(0, 1).items()}
    state, _ = mdp.reset(task, 0, 3)
    step = tf.function(lambda a: mdp.step(task, state, a)[2], autograph=False)
    np.testing.assert_array_equal(step(tf.constant([0, 1, 1])), [0.0, 1.0, 1.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"action must lie in 0\.\.1"):
        step(tf.constant([0, 2, 1]))
