"""gym_rollout on real gymnasium vector environments, against plain gymnasium loops, `rollout`
and the policy's densities computed in numpy; HalfCheetahTasks' rewards by hand."""

import math

import gymnasium
import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, rl


def _gaussian(obs_dim, action_dim, std, seed=0):
    keras.utils.set_random_seed(seed)
    policy = rl.GaussianPolicy(keras.Sequential([keras.layers.Dense(action_dim,
                                                                    dtype="float64")]),
                               action_dim, init_std=std, dtype="float64")
    policy.build((None, obs_dim))
    return policy


def _reset_seeds(seed, n, batch):
    """The seeds the sub-environments must be reset with: task i's reset key is the first
    half of ``split(fold_in([seed, 0], i))``, its `batch` seeds uniform ints from it."""
    out = []
    for i in range(n):
        key = tf.random.experimental.stateless_split(tf.random.experimental.stateless_fold_in(
            tf.constant([seed, 0], tf.int64), tf.constant(i, tf.int64)), 2)[0]
        out += [int(s) for s in tf.random.stateless_uniform([batch], key, 0, 2**31 - 1,
                                                            dtype=tf.int64)]
    return out


def _replay(make, seeds, actions, clip=None):
    """Each episode on its own environment, reset with its seed and stepped with the
    recorded actions until it ends: `(observations, rewards, infos, length)` lists."""
    out = []
    for s, acts in zip(seeds, actions):
        env = make()
        obs, _ = env.reset(seed=s)
        o, r, infos = [], [], []
        for a in acts:
            o.append(obs)
            # the vector environment gets the actions at its action space's dtype
            a = a.astype(env.action_space.dtype)
            obs, rew, term, trunc, info = env.step(a if clip is None else np.clip(a, *clip))
            r.append(rew)
            infos.append(info)
            if term or trunc:
                break
        out.append((np.array(o), np.array(r), infos, len(r)))
    return out


@pytest.fixture(scope="module")
def pendulum():
    envs = gymnasium.make_vec("Pendulum-v1", num_envs=4, vectorization_mode="sync")
    policy = _gaussian(3, 1, std=4.0)  # wide: many draws beyond the torque bound 2
    return envs, policy, rl.gym_rollout(envs, policy, 2, 5, 2, 5)


def test_pendulum_matches_gymnasium_and_numpy_densities(pendulum):
    envs, policy, traj = pendulum
    assert all(f.shape[:3] == [2, 2, 5] for f in traj)
    assert [f.dtype for f in traj] == [tf.float64] * 5
    np.testing.assert_array_equal(traj.mask, np.ones([2, 2, 5]))
    obs, act = traj.observations.numpy(), traj.actions.numpy()
    assert np.abs(act).max() > 2.0  # the recorded actions are the unclipped draws
    seeds = _reset_seeds(5, 2, 2)
    for j, (o, r, _, length) in enumerate(_replay(lambda: gymnasium.make("Pendulum-v1"),
                                                  seeds, act.reshape(4, 5, 1))):
        assert length == 5
        np.testing.assert_allclose(obs[j // 2, j % 2], o, rtol=1e-6)  # float32 observations
        np.testing.assert_allclose(traj.rewards[j // 2, j % 2], r, rtol=1e-6)
    kernel, bias = [v.numpy() for v in policy.network.weights]
    std = math.exp(policy.log_std.numpy()[0])
    mean = obs @ kernel + bias
    log_p = -0.5 * (((act - mean) / std) ** 2 + 2 * math.log(std) + math.log(2 * math.pi))
    np.testing.assert_allclose(traj.log_probs, log_p[..., 0], rtol=1e-12)
    # the draws: task i's step t from fold_in(second half of split(fold_in(seed, i)), t)
    for i in range(2):
        key = tf.random.experimental.stateless_split(tf.random.experimental.stateless_fold_in(
            tf.constant([5, 0], tf.int64), tf.constant(i, tf.int64)), 2)[1]
        for t in range(5):
            eps = tf.random.stateless_normal([2, 1], tf.random.experimental.stateless_fold_in(
                key, tf.constant(t, tf.int64)), dtype=tf.float64)
            np.testing.assert_allclose(act[i, :, t], mean[i, :, t] + std * eps, rtol=1e-12)


def test_same_seed_same_episodes_other_seed_others(pendulum):
    envs, policy, traj = pendulum
    again = rl.gym_rollout(envs, policy, 2, 5, 2, 5)
    for a, b in zip(traj, again):
        np.testing.assert_array_equal(a, b)
    other = rl.gym_rollout(envs, policy, 2, 6, 2, 5)
    assert not np.array_equal(traj.observations[:, :, 0], other.observations[:, :, 0])
    assert not np.array_equal(traj.actions, other.actions)
    # one trace of the policy's step for all three rollouts (a meta-iteration's rollouts
    # must not retrace)
    from hogrod.rl.gym import _act_fn
    assert _act_fn(policy, False).experimental_get_tracing_count() == 1


class _Navigation(gymnasium.Env):
    """Navigation2D in numpy, a task-carrying gymnasium environment."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gymnasium.spaces.Box(-0.1, 0.1, (2,), np.float64)

    def __init__(self):
        self.task = {"goal": np.zeros(2)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position = np.zeros(2)
        return self.position.copy(), {}

    def step(self, action):
        self.position = self.position + np.clip(action, -0.1, 0.1)
        distance = np.linalg.norm(self.position - self.task["goal"])
        return self.position.copy(), -distance, bool(distance < 0.01), False, {}


class _HostNavigation:
    """Navigation2D's tasks stepped on the host (`on_host`, `make_envs`): `MamlRL` samples
    with `gym_rollout`."""

    observation_dim = action_dim = 2
    horizon = 3
    on_host = True

    def __init__(self):
        self.graph = rl.Navigation2D(self.horizon, dtype="float64")
        self.made = []

    def sample_tasks(self, seed, n):
        return self.graph.sample_tasks(seed, n)

    def make_envs(self, num_envs):
        self.made.append(gymnasium.vector.SyncVectorEnv([_Navigation] * num_envs))
        return self.made[-1]


def test_maml_rl_samples_on_the_host_as_in_graph():
    """The host path's meta-batch (gym_rollout with shared, then per-task adapted
    parameters, the compiled adaptation between) equals the compiled one's."""
    host_env = _HostNavigation()
    learners = [rl.MamlRL(env, _gaussian(2, 2, std=0.5, seed=1), meta_batch=2, batch=2,
                          inner_lr=0.3) for env in (host_env.graph, host_env)]
    tasks = host_env.sample_tasks(1, 2)
    args = (tasks, tf.range(2, dtype=tf.int64), tf.constant([3, 4], tf.int64),
            [tf.convert_to_tensor(v) for v in learners[0].variables])
    graph = tf.function(learners[0].sample, autograph=False)(*args)
    host = learners[1].sample(*args)
    np.testing.assert_array_equal(host_env.made[0].get_attr("task")[3]["goal"],
                                  tasks["goal"][1])
    for a, b in zip(tf.nest.flatten(graph), tf.nest.flatten(host)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_cartpole_mask_ends_at_termination_and_truncation():
    keras.utils.set_random_seed(0)
    network = keras.Sequential([keras.layers.Dense(2, dtype="float64", kernel_initializer="zeros",
                                                   bias_initializer="zeros")])
    policy = rl.CategoricalPolicy(network, 2, dtype="float64")
    policy.build((None, 4))
    network.weights[1].assign([3.0, -3.0])  # mostly pushes left: the pole falls in ~10 steps
    envs = gymnasium.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    traj = rl.gym_rollout(envs, policy, 1, 2, 2, 16)
    assert traj.actions.dtype == tf.int32
    episodes = _replay(lambda: gymnasium.make("CartPole-v1"), _reset_seeds(2, 1, 2),
                       traj.actions.numpy()[0])
    for b, (o, r, _, length) in enumerate(episodes):
        assert length < 16  # terminated within the horizon
        expected = (np.arange(16) < length).astype(np.float64)
        np.testing.assert_array_equal(traj.mask[0, b], expected)
        np.testing.assert_allclose(traj.observations[0, b, :length], o, rtol=1e-6)
        np.testing.assert_array_equal(traj.rewards[0, b, :length], r)
    logits = traj.observations.numpy() @ network.weights[0].numpy() + network.weights[1].numpy()
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(traj.log_probs, np.take_along_axis(
        log_p, traj.actions.numpy()[..., None], -1)[..., 0], rtol=1e-12)
    truncated = gymnasium.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                                   max_episode_steps=3)
    network.weights[1].assign([0.0, 0.0])
    traj = rl.gym_rollout(truncated, policy, 2, 4, 1, 5)
    np.testing.assert_array_equal(traj.mask, np.tile([1.0, 1.0, 1.0, 0.0, 0.0], [2, 1, 1]))


@pytest.mark.parametrize("kind", rl.HALFCHEETAH_TASKS)
def test_halfcheetah_task_rewards(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings' log to the working directory
    tasks = rl.HalfCheetahTasks(kind, dtype="float64")
    goals = tasks.sample_tasks(4, 2)
    if kind == "velocity":
        assert np.all((goals["goal"] >= 0) & (goals["goal"] <= 2))
    else:
        assert set(np.unique(goals["goal"])) <= {-1.0, 1.0}
    policy = _gaussian(17, 6, std=2.0)
    traj = rl.gym_rollout(tasks.make_envs(2), policy, goals, 1, 1, 3)
    episodes = _replay(lambda: gymnasium.make("HalfCheetah-v5"), _reset_seeds(1, 2, 1),
                       traj.actions.numpy()[:, 0], clip=(-1.0, 1.0))
    for i, (o, _, infos, length) in enumerate(episodes):
        assert length == 3
        np.testing.assert_array_equal(traj.observations[i, 0], o)
        a = np.clip(traj.actions.numpy()[i, 0].astype(np.float32), -1, 1).astype(np.float64)
        assert np.abs(traj.actions.numpy()[i, 0]).max() > 1  # clipped by the wrapper
        v, g = np.array([info["x_velocity"] for info in infos]), float(goals["goal"][i])
        forward = -np.abs(v - g) if kind == "velocity" else g * v
        np.testing.assert_allclose(traj.rewards[i, 0], forward - 0.05 * (a * a).sum(-1),
                                   rtol=1e-12)


def test_bad_input(pendulum):
    envs, policy, _ = pendulum
    with pytest.raises(checks.ArgumentError, match="action space"):
        rl.gym_rollout(envs, _gaussian(3, 2, 1.0), 2, 0, 2, 2)
    categorical = rl.CategoricalPolicy(keras.Sequential([keras.layers.Dense(
        2, dtype="float64")]), 2, dtype="float64")
    categorical.build((None, 3))
    with pytest.raises(checks.ArgumentError, match="action space"):
        rl.gym_rollout(envs, categorical, 2, 0, 2, 2)
    with pytest.raises(checks.ArgumentError, match="batch"):
        rl.gym_rollout(envs, policy, 4, 0, 0, 2)
    with pytest.raises(checks.ArgumentError, match="horizon"):
        rl.gym_rollout(envs, policy, 2, 0, 2, 0)
    with pytest.raises(checks.ArgumentError, match="sub-environments, tasks"):
        rl.gym_rollout(envs, policy, 3, 0, 2, 2)
    with pytest.raises(checks.ArgumentError, match="VectorEnv"):
        rl.gym_rollout(gymnasium.make("Pendulum-v1"), policy, 1, 0, 1, 2)
    with pytest.raises(checks.ArgumentError, match="no `task` attribute"):
        rl.gym_rollout(envs, policy, {"goal": tf.zeros([2])}, 0, 2, 2)
    with pytest.raises(checks.ArgumentError, match="kind"):
        rl.HalfCheetahTasks("backflip")


def test_a_policy_of_more_actions_than_the_space_is_refused_before_any_step():
    """A 3-action policy on CartPole's 2 actions: an error before the first step, whatever
    the policy would draw (here it never draws action 2, so the space itself would never
    complain)."""
    network = keras.Sequential([keras.layers.Dense(3, dtype="float64",
                                                   kernel_initializer="zeros")])
    policy = rl.CategoricalPolicy(network, 3, dtype="float64")
    policy.build((None, 4))
    network.weights[1].assign([0.0, 0.0, -1e9])  # action 2 never drawn
    envs = gymnasium.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(checks.ArgumentError, match=r"actions in 0\.\.2 .* Discrete\(2\)"):
        rl.gym_rollout(envs, policy, 1, 0, 2, 3)
