"""Rollouts of a policy on a `gymnasium` vector environment, stepped on the host.

`gym_rollout(envs, policy, tasks, seed, batch, horizon)` returns the `Trajectories` of
`rollout` (`[tasks, batch, T, ...]`, the same dtypes and mask) from a Python loop over time
on a `gymnasium.vector.VectorEnv` of ``tasks * batch`` sub-environments (sub-environment j
runs episode ``j % batch`` of task ``j // batch``). Nothing is compiled or distributed but
the policy's step. The draws follow `rollout`'s: task i's seed is ``fold_in(seed, i)`` (or
given per task), split into a reset key and a step key; the action of step t is drawn
statelessly with ``fold_in(step key, t)``, and the sub-environments are reset with integer
seeds drawn from the reset keys, so a seed gives the same episodes bit for bit (a resumed
run repeats its episodes).

Continuous actions are passed unclipped (at the action space's dtype): the environment
clips them (gymnasium's classic control does; `HalfCheetahTasks`' wrapper does), and a
log-probability is the unclipped action's. The policy's actions are checked against the
action space before the first step (a `Categorical` over `n` actions for `Discrete(n)`, a
`DiagonalGaussian` of the `Box`'s shape). `HalfCheetahTasks` is MAML's task distributions on MuJoCo's HalfCheetah
(``HalfCheetah-v5``): a goal velocity or a direction, the reward from the environment's
``info["x_velocity"]``.

`gymnasium` and `mujoco` are the optional extra `rl` (`pip install hogrod[rl]`); they are
imported when an environment is made or rolled out, not with this module.
"""

import functools
import weakref
from typing import Any, Optional, Union

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.rl import envs, policies
from hogrod.rl.rollout import Trajectories, policy_distribution, task_seeds
from hogrod.types import DType, Params, Seed, Tree

__all__ = ["gym_rollout", "HalfCheetahTasks", "HALFCHEETAH_TASKS"]

HALFCHEETAH_TASKS = ("velocity", "direction")


def _gymnasium(where):
    try:
        import gymnasium
    except ImportError as e:  # the optional extra
        raise ImportError(f"{where} needs gymnasium: pip install hogrod[rl]") from e
    return gymnasium


def gym_rollout(envs: Any, policy: keras.Model, tasks: Union[Tree, int],
                seed: Union[Seed, tf.Tensor], batch: int, horizon: int,
                params: Optional[Params] = None, per_task_params: bool = False
                ) -> Trajectories:
    """`batch` episodes of `horizon` steps of every task on a host vector environment.

    Each task's `batch` sub-environments get the task (``envs.set_attr("task", ...)``, one
    row of `tasks` as numpy values per sub-environment) and are reset with seeds drawn from
    the task's reset key; at each step the policy's distribution is evaluated on every
    task's observations (cast to the policy's dtype) and an action drawn with the task's
    key for the step; all sub-environments step at once. An episode's mask falls to 0
    after the step where it terminates or is truncated (what the vector environment does
    after, an automatic reset, is masked); the horizon's last step ends every episode.

    Args:
      envs: a `gymnasium.vector.VectorEnv` with ``num_envs == tasks * batch``, a `Box`
        action space of shape `[action_dim]` for a `GaussianPolicy` or a `Discrete` one
        of `num_actions` for a `CategoricalPolicy`, observations `[observation_dim]`.
      policy: a built policy with `distribution(observations, params)`.
      tasks: a task tree with a leading task axis (`sample_tasks(seed, n)`; every
        sub-environment must have a `task` attribute), or an int n >= 1: n tasks with
        nothing to set (the same environment, n groups of episodes).
      seed: an int >= 0 or a `[2]` integer tensor (task i draws from ``fold_in(seed, i)``),
        or `[tasks, 2]` integer seeds, one per task.
      batch: episodes per task, an int >= 1.
      horizon: steps per episode, an int >= 1.
      params: None (the policy's variables), tensors for `policy.trainable_variables`
        shared by every task, or with `per_task_params` one leading task axis on each.
      per_task_params: whether `params` has a leading task axis.

    Returns:
      The `Trajectories`, every field `[tasks, batch, horizon, ...]`: observations,
      rewards and mask of the policy's dtype, actions int32 (discrete) or of the policy's
      dtype, log-probabilities of the drawn (unclipped) actions.

    Raises:
      ArgumentError: `envs` not a vector environment or not of ``tasks * batch``
        sub-environments, a bad seed, batch or horizon, tasks without one leading axis,
        sub-environments without a `task` attribute, `per_task_params` without `params`,
        or a policy whose actions do not fit the action space.
    """
    where = "gym_rollout"
    gymnasium = _gymnasium(where)
    if not isinstance(envs, gymnasium.vector.VectorEnv):
        raise checks.ArgumentError(f"{where}: envs must be a gymnasium.vector.VectorEnv "
                                   f"(gymnasium.make_vec), got {type(envs).__name__}")
    batch = checks.integer(batch, "batch", where, 1)
    horizon = checks.integer(horizon, "horizon", where, 1)
    if isinstance(tasks, int) and not isinstance(tasks, bool):
        n, rows = checks.integer(tasks, "tasks", where, 1), None
    else:
        leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tasks)]
        n = leaves[0].shape[0] if leaves and leaves[0].shape.rank else None
        if n is None or any(t.shape.rank is None or t.shape.rank < 1 or t.shape[0] != n
                            for t in leaves):
            raise checks.ArgumentError(f"{where}: tasks must be an int or a task tree with "
                                       f"one leading task axis, got {checks.describe(tasks)}")
        rows = [tf.nest.pack_sequence_as(tasks, [t[i].numpy() for t in leaves])
                for i in range(n)]
    if envs.num_envs != n * batch:
        raise checks.ArgumentError(f"{where}: envs has {envs.num_envs} sub-environments, "
                                   f"tasks * batch = {n} * {batch} needs {n * batch}")
    if per_task_params and params is None:
        raise checks.ArgumentError(f"{where}: per_task_params=True needs params")
    if params is not None:
        params = [tf.convert_to_tensor(p) for p in params]
    seeds = task_seeds(seed, n, where)
    reset_keys, step_keys = tf.unstack(tf.map_fn(
        lambda s: tf.random.experimental.stateless_split(s, 2), seeds), axis=1)
    # the sub-environments' reset seeds, ints in [0, 2**31 - 1), batch per task
    env_seeds = [int(s) for key in tf.unstack(reset_keys) for s in tf.random.stateless_uniform(
        [batch], key, 0, 2**31 - 1, dtype=tf.int64)]
    if rows is not None:
        try:
            envs.get_attr("task")
        except AttributeError as e:
            raise checks.ArgumentError(f"{where}: the sub-environments have no `task` "
                                       "attribute to set the tasks on (pass tasks=n)") from e
        envs.set_attr("task", [rows[j // batch] for j in range(n * batch)])
    obs, _ = envs.reset(seed=env_seeds)
    dtype = tf.as_dtype(params[0].dtype if params is not None
                        else policy.trainable_variables[0].dtype)

    act = _act_fn(policy, params is not None and per_task_params)
    space = envs.single_action_space
    out = []
    alive = np.ones(n * batch, bool)
    for t in range(horizon):
        o = tf.reshape(tf.cast(obs, dtype), [n, batch, -1])
        if t == 0:  # before any step: an action out of the space would fail only when drawn
            _check_action_space(policy, o, params, per_task_params, space, gymnasium, where)
        action, log_prob = act(o, step_keys, tf.constant(t, tf.int64), params)
        a = np.reshape(action.numpy(), (n * batch,) + space.shape).astype(space.dtype)
        obs, reward, terminated, truncated, _ = envs.step(a)
        mask = alive.astype(dtype.as_numpy_dtype)
        alive = alive & ~(terminated | truncated | (t + 1 >= horizon))
        out.append((o, action, log_prob, np.reshape(reward, (n, batch)),
                    np.reshape(mask, (n, batch))))
    fields = [tf.stack([tf.cast(step[k], dtype) if k != 1 else step[k] for step in out], 2)
              for k in range(5)]
    return Trajectories(*fields)


# each policy's compiled step, made once: a rollout per meta-iteration must not retrace
# (tracing a step of 40 tasks takes seconds and keeps its graph)
_ACT = weakref.WeakKeyDictionary()


def _act_fn(policy, per_task):
    """The compiled `(observations [n, batch, ...], step keys [n, 2], t, params) ->
    (actions, log-probabilities)` of `policy`, traced once per shape."""
    fns = _ACT.setdefault(policy, {})
    if per_task not in fns:
        def act(observations, step_keys, t, params):
            keys = tf.map_fn(lambda s: tf.random.experimental.stateless_fold_in(s, t),
                             step_keys)
            n = observations.shape[0]
            if not per_task:
                dist = policy_distribution(policy, observations, params)
            else:
                dist = [policy.distribution(observations[i], [p[i] for p in params])
                        for i in range(n)]
                dist = type(dist[0])(*[tf.stack(f) for f in zip(*dist)])
            action = tf.stack([type(dist)(*[f[i] for f in dist]).sample(keys[i])
                               for i in range(n)])
            return action, dist.log_prob(action)
        fns[per_task] = tf.function(act, autograph=False)
    return fns[per_task]


def _check_action_space(policy, observations, params, per_task, space, gymnasium, where):
    """Raises ArgumentError unless the policy's distribution on the first task's
    observations draws actions of `space`: a `Categorical` over `space.n` actions for a
    `Discrete` space, a `DiagonalGaussian` of `space.shape` for a `Box`."""
    first = None if params is None else [p[0] for p in params] if per_task else params
    dist = policy.distribution(observations[0], first)
    if isinstance(dist, policies.Categorical):
        drawn = f"actions in 0..{dist.logits.shape[-1] - 1}"
        fits = (isinstance(space, gymnasium.spaces.Discrete)
                and dist.logits.shape[-1] == int(space.n))
    elif isinstance(dist, policies.DiagonalGaussian):
        drawn = f"continuous actions of shape {dist.mean.shape[-1:].as_list()}"
        fits = (isinstance(space, gymnasium.spaces.Box)
                and tuple(dist.mean.shape[-1:]) == tuple(space.shape))
    else:
        drawn, fits = f"actions of a {type(dist).__name__}", False
    if not fits:
        raise checks.ArgumentError(
            f"{where}: the policy draws {drawn} (its distribution on observations "
            f"{observations.shape[2:].as_list()}), which do not fit the environment's action "
            f"space {space}: give a policy with the space's actions")


class HalfCheetahTasks:
    """MAML's HalfCheetah task distributions (Finn et al. 2017) on ``HalfCheetah-v5``.

    A task is a goal (`{"goal": [n]}`): a velocity uniform in [0, 2] (`kind="velocity"`,
    reward ``-abs(v - goal)`` minus the control cost) or a direction, -1 or 1 with
    probability 1/2 (`kind="direction"`, reward ``goal * v`` minus the control cost), ``v``
    the environment's forward velocity ``info["x_velocity"]``. The control cost is
    ``ctrl_cost_weight * sum(a**2)`` of the action clipped to the action space's bounds
    [-1, 1] (the clipped action is what the simulator gets).

    `MamlRL` steps it on the host (`on_host` is True; `make_envs` makes its vector
    environment); `observation_dim` is 17 (the
    positions without the forward one, and the velocities), `action_dim` 6.

    Args:
      kind: one of `HALFCHEETAH_TASKS`, "velocity" or "direction".
      ctrl_cost_weight: the control cost's weight, >= 0 (0.05, MAML's ``0.5 * 0.1``).
      horizon: the episode length of a rollout, an int >= 1 (200 in MAML).
      dtype: the goals' dtype; None: Keras's floatx.
      task_sampling: how `sample_tasks` draws a meta-batch's goals, one of
        `TASK_SAMPLING`: "independent" (MAML's) or "latin_hypercube" (the velocities
        spread evenly over [0, 2], one in each of `n` equal intervals; the directions as
        close to half and half as `n` allows), each goal still drawn from the same
        distribution. The mean return over a meta-batch then varies far less from one
        meta-batch to the next (a velocity task's return falls with its goal).

    Raises:
      ArgumentError: `kind`, `ctrl_cost_weight`, `horizon` or `task_sampling` out of range.
    """

    observation_dim = 17
    action_dim = 6
    on_host = True

    def __init__(self, kind: str = "velocity", ctrl_cost_weight: float = 0.05,
                 horizon: int = 200, dtype: Optional[DType] = None,
                 task_sampling: str = "independent") -> None:
        where = "HalfCheetahTasks"
        self.kind = checks.choice(kind, HALFCHEETAH_TASKS, "kind", where)
        self.ctrl_cost_weight = checks.nonnegative(ctrl_cost_weight, "ctrl_cost_weight",
                                                   where)
        self.horizon = checks.integer(horizon, "horizon", where, 1)
        self.dtype = tf.as_dtype(dtype or keras.backend.floatx())
        self.task_sampling = checks.choice(task_sampling, envs.TASK_SAMPLING,
                                           "task_sampling", where)

    def sample_tasks(self, seed: Seed, n: int) -> Tree:
        """`n` goals: velocities uniform in [0, 2] or directions -1 or 1, independent or
        from a Latin hypercube (`task_sampling`).

        Args:
          seed: an int >= 0 or a `[2]` integer tensor.
          n: the number of tasks, an int >= 1.

        Returns:
          A dict with `goal` `[n]`.
        """
        where = "HalfCheetahTasks.sample_tasks"
        if isinstance(seed, (tf.Tensor, tf.Variable)):
            s = tf.cast(seed, tf.int64)
            if s.shape != [2]:
                raise checks.ArgumentError(f"{where}: seed must be an int or a [2] integer "
                                           f"tensor, got {checks.describe(seed)}")
        else:
            s = tf.constant([checks.seed(seed, "seed", where), 0], tf.int64)
        n = checks.integer(n, "n", where, 1)
        if self.task_sampling == "independent":
            u = tf.random.stateless_uniform([n], s, dtype=self.dtype)
        else:
            u = envs.latin_hypercube(s, n, 1, self.dtype)[:, 0]
        if self.kind == "velocity":
            return {"goal": 2 * u}
        return {"goal": tf.where(u < 0.5, -tf.ones_like(u), tf.ones_like(u))}

    def reward(self, goal: float, x_velocity: float, action: np.ndarray) -> float:
        """The task's reward of one step.

        Args:
          goal: the task's goal velocity or direction.
          x_velocity: the forward velocity, the environment's ``info["x_velocity"]``.
          action: the `[6]` action the simulator got (clipped).

        Returns:
          The reward, a Python float.
        """
        forward = -abs(x_velocity - goal) if self.kind == "velocity" else goal * x_velocity
        a = np.asarray(action, np.float64)  # a float32 action's cost summed in float64
        return float(forward - self.ctrl_cost_weight * np.sum(a * a))

    def make_envs(self, num_envs: int, **kwargs: Any) -> Any:
        """A `gymnasium.vector.SyncVectorEnv` of `num_envs` task-wrapped HalfCheetahs.

        Args:
          num_envs: the sub-environments, an int >= 1 (``tasks * batch`` of `gym_rollout`).
          **kwargs: passed to ``gymnasium.make("HalfCheetah-v5", ...)``.

        Returns:
          The vector environment; each sub-environment's `task` attribute is its
          `{"goal": ...}` (velocity 1 or direction 1 until set).
        """
        gymnasium = _gymnasium("HalfCheetahTasks.make_envs")
        num_envs = checks.integer(num_envs, "num_envs", "HalfCheetahTasks.make_envs", 1)
        wrapper = _task_wrapper(gymnasium.Wrapper)
        return gymnasium.vector.SyncVectorEnv(
            [lambda: wrapper(gymnasium.make("HalfCheetah-v5", **kwargs), self)] * num_envs)


@functools.cache
def _task_wrapper(base):
    """The wrapper class setting a task's reward, built on `gymnasium.Wrapper` when the
    optional gymnasium is first used."""

    class TaskReward(base):
        def __init__(self, env, tasks):
            super().__init__(env)
            self.tasks, self.task = tasks, {"goal": np.float64(1.0)}

        def step(self, action):
            space = self.env.action_space
            action = np.clip(action, space.low, space.high)
            obs, _, terminated, truncated, info = self.env.step(action)
            reward = self.tasks.reward(float(self.task["goal"]), info["x_velocity"], action)
            return obs, reward, terminated, truncated, info

    return TaskReward
