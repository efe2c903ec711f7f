"""Batched rollouts of a policy on a meta-batch of tasks, as one compiled loop.

`rollout(env, policy, tasks, seed, batch, horizon)` runs `batch` episodes of every task
of `tasks` (a task tree with a leading task axis, from `env.sample_tasks`) for `horizon`
steps in one `tf.while_loop` over time: the policy is evaluated on every task's
observations at once (a shared set of parameters, or one per task through
`hogrod.taskmap.vectorized_map`), the environment stepped per task by the same map. Every
task's draws come from its own seed (`fold_in(seed, task index)`, or a seed given per
task), so a task's trajectories do not depend on which other tasks share its meta-batch or
on how a meta-batch is split over replicas. Called eagerly, the loop is compiled once per
policy, environment and sizes (and traced again only for new shapes).

The trajectories are constants: a rollout differentiates nothing (parameters enter under
`tf.stop_gradient`); log-probabilities to differentiate are recomputed from the
observations and actions under a tape (`policy.distribution(obs, params).log_prob(actions)`).
`Trajectories.log_probs` are the behaviour policy's, the "old" log-probabilities of an
importance ratio.
"""

import weakref
from typing import NamedTuple, Optional, Union

import keras
import tensorflow as tf

from hogrod import checks, taskmap
from hogrod.types import Params, Seed, Tree

__all__ = ["Trajectories", "rollout", "policy_distribution", "task_seeds"]


class Trajectories(NamedTuple):
    """A batch of episodes of every task, `[tasks, batch, T, ...]` tensors.

    Attributes:
      observations: `[tasks, batch, T, observation_dim]` observations the actions were
        taken at (step t's observation is the one before action t).
      actions: `[tasks, batch, T, ...]` the actions drawn (unclipped for continuous ones).
      log_probs: `[tasks, batch, T]` the behaviour policy's log-probabilities of the
        actions (constants).
      rewards: `[tasks, batch, T]` rewards, the environment's dtype.
      mask: `[tasks, batch, T]` 1 up to and including the step an episode ends (its `done`
        or the horizon's last step), 0 after; the rewards' dtype.
    """

    observations: tf.Tensor
    actions: tf.Tensor
    log_probs: tf.Tensor
    rewards: tf.Tensor
    mask: tf.Tensor


def task_seeds(seed: Union[Seed, tf.Tensor], n: int, where: str) -> tf.Tensor:
    """Each task's seed of a rollout: one given per task, or ``fold_in(seed, i)`` for task i.

    Args:
      seed: an int >= 0 or a `[2]` integer tensor, or `[n, 2]` integer seeds (returned).
      n: the number of tasks.
      where: the caller's name, for the error message.

    Returns:
      `[n, 2]` int64 seeds.

    Raises:
      ArgumentError: a seed of another kind or shape.
    """
    if isinstance(seed, (tf.Tensor, tf.Variable)) and seed.shape.rank == 2:
        s = tf.convert_to_tensor(seed)
        if not s.dtype.is_integer or s.shape[-1] != 2:
            raise checks.ArgumentError(f"{where}: seed must be an int, a [2] integer tensor or "
                                       f"[tasks, 2] integer seeds, got {checks.describe(s)}")
        return tf.cast(s, tf.int64)
    s = checks.stateless_seed(seed, "seed", where)
    return tf.map_fn(lambda i: tf.random.experimental.stateless_fold_in(s, i),
                     tf.range(n, dtype=tf.int64), fn_output_signature=tf.int64)


def _per_task(fn, n, *args):
    """`fn(*row_i)` for every task i, stacked, by a Python loop over the (static) task
    count: stateless draws with one seed per task do not vectorize."""
    return tf.stack([fn(*[a[i] for a in args]) for i in range(n)])


def policy_distribution(policy: keras.Model, observations: tf.Tensor,
                        params: Optional[Params] = None) -> Tree:
    """`policy.distribution` at observations with any leading axes (`[..., observation_dim]`),
    evaluated on them flattened to `[-1, observation_dim]` (a network's Input takes rank 2)
    and reshaped back.

    Args:
      policy: a built policy with `distribution(observations, params)`.
      observations: `[..., observation_dim]` observations.
      params: None (the policy's variables) or tensors for `policy.trainable_variables`.

    Returns:
      The distribution (a `Categorical` or `DiagonalGaussian`), its fields shaped
      `[..., n]`.
    """
    obs = tf.convert_to_tensor(observations)
    flat = policy.distribution(tf.reshape(obs, [-1, obs.shape[-1]]), params)
    lead = tf.shape(obs)[:-1]
    return type(flat)(*[tf.reshape(f, tf.concat([lead, tf.shape(f)[1:]], 0)) for f in flat])


def rollout(env: object, policy: keras.Model, tasks: Tree, seed: Union[Seed, tf.Tensor],
            batch: int, horizon: Optional[int] = None, params: Optional[Params] = None,
            per_task_params: bool = False) -> Trajectories:
    """`batch` episodes of `horizon` steps of every task, sampled from `policy`.

    At each step every task's policy distribution is evaluated on its observations and an
    action drawn from it with that task's seed for the step; the environment steps every
    task; an episode's mask falls to 0 after the step whose `done` is True (the
    environment keeps stepping it; those steps are masked). The last step of the horizon
    ends every episode whether or not the environment says so.

    Args:
      env: an environment of `hogrod.rl` (`reset(task, seed, batch)`, `step(task, state,
        action)`, `horizon`).
      policy: a built `CategoricalPolicy` or `GaussianPolicy` (anything with
        `distribution(observations, params)`).
      tasks: a task tree with a leading task axis (`env.sample_tasks(seed, n)`).
      seed: an int >= 0 or a `[2]` integer tensor (task i draws from ``fold_in(seed, i)``),
        or `[tasks, 2]` integer seeds, one per task.
      batch: episodes per task, an int >= 1.
      horizon: steps per episode, an int >= 1; None: `env.horizon`.
      params: None (the policy's variables), tensors for `policy.trainable_variables` in
        their order shared by every task, or with `per_task_params` one leading task axis
        on each (adapted parameters per task). Used under `tf.stop_gradient`.
      per_task_params: whether `params` has a leading task axis.

    Returns:
      The `Trajectories`, every field `[tasks, batch, horizon, ...]`.

    Raises:
      ArgumentError: a bad seed, batch or horizon, `tasks` without a common static leading
        axis,
        `params` per task without parameters, or a policy whose distribution has another
        dtype than the environment's observations.
    """
    where = "rollout"
    batch = checks.integer(batch, "batch", where, 1)
    horizon = checks.integer(env.horizon if horizon is None else horizon, "horizon", where, 1)
    leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tasks)]
    if not leaves or any(t.shape.rank is None or t.shape.rank < 1 for t in leaves):
        raise checks.ArgumentError(f"{where}: tasks must be a task tree with a leading task "
                                   f"axis (env.sample_tasks), got {checks.describe(tasks)}")
    tasks = tf.nest.pack_sequence_as(tasks, leaves)
    n = leaves[0].shape[0]
    if n is None or any(t.shape[0] != n for t in leaves):
        raise checks.ArgumentError(f"{where}: tasks must share one static leading task axis, "
                                   f"got {checks.describe(tasks)}")
    seeds = task_seeds(seed, n, where)
    if per_task_params and params is None:
        raise checks.ArgumentError(f"{where}: per_task_params=True needs params")
    if params is not None:
        params = [tf.stop_gradient(tf.convert_to_tensor(p)) for p in params]
    if tf.executing_eagerly():  # one compiled loop, traced once per shape
        return _compiled(env, policy, batch, horizon, per_task_params)(tasks, seeds, params)
    return _rollout(env, policy, tasks, seeds, batch, horizon, params, per_task_params)


# each (policy, environment, sizes)'s compiled rollout, made once: an eager rollout per
# iteration must not trace anew (tf.vectorized_map would, every call, and TF warn of it)
_COMPILED = weakref.WeakKeyDictionary()


def _compiled(env, policy, batch, horizon, per_task_params):
    fns = _COMPILED.setdefault(policy, {})
    key = (env, batch, horizon, per_task_params)
    if key not in fns:
        # the function holds the policy weakly: a strong reference from the value would keep
        # the key, and the entry, alive for good
        ref = weakref.ref(policy)
        fns[key] = tf.function(lambda tasks, seeds, params: _rollout(
            env, ref(), tasks, seeds, batch, horizon, params, per_task_params),
            autograph=False)
    return fns[key]


def _rollout(env, policy, tasks, seeds, batch, horizon, params, per_task_params):
    """`rollout`'s loop, its arguments checked: `seeds` `[n, 2]`, `params` tensors or None."""
    n = tf.nest.flatten(tasks)[0].shape[0]
    reset_keys, step_keys = tf.unstack(tf.map_fn(
        lambda s: tf.random.experimental.stateless_split(s, 2), seeds), axis=1)

    def distribution(obs):
        if params is None or not per_task_params:
            return policy_distribution(policy, obs, params)
        return type(policy.distribution(obs[0], [p[0] for p in params]))(
            *taskmap.vectorized_map(lambda a: tuple(policy.distribution(a[0], a[1])),
                                    (obs, params)))

    # per-task draws (stateless ops with one seed per task) run as pfor while loops;
    # taskmap.vectorized_map does not report it on every trace
    state, obs = taskmap.vectorized_map(lambda a: env.reset(a[0], a[1], batch),
                                        (tasks, reset_keys))
    probe = distribution(obs)
    if tf.nest.flatten(tuple(probe))[0].dtype != obs.dtype:
        raise checks.ArgumentError(
            "rollout: the policy's distribution has dtype "
            f"{tf.nest.flatten(tuple(probe))[0].dtype.name}, the environment's observations "
            f"{obs.dtype.name}; build both at one dtype")
    dtype = obs.dtype

    def draw(keys, *fields):
        return type(probe)(*fields).sample(keys)

    def body(t, state, obs, alive, arrays):
        dist = distribution(obs)
        keys = tf.map_fn(lambda s: tf.random.experimental.stateless_fold_in(s, tf.cast(
            t, tf.int64)), step_keys)
        action = _per_task(draw, n, keys, *tuple(dist))
        log_prob = dist.log_prob(action)
        state, following, reward, done = taskmap.vectorized_map(
            lambda a: env.step(a[0], a[1], a[2]), (tasks, state, action))
        # a two-agent environment's reward per agent: the mask is per episode
        step_mask = tf.cast(alive, dtype)
        ended = tf.logical_or(done, t + 1 >= horizon)
        values = (obs, action, log_prob, reward, step_mask)
        arrays = [a.write(t, v) for a, v in zip(arrays, values)]
        return t + 1, state, following, tf.logical_and(alive, tf.logical_not(ended)), arrays

    arrays = [tf.TensorArray(d, size=horizon, element_shape=s) for d, s in (
        (dtype, obs.shape), (probe.sample(tf.constant([0, 0], tf.int64)).dtype, None),
        (dtype, None), (dtype, None), (dtype, None))]
    alive = tf.ones(tf.shape(obs)[:2], tf.bool)
    _, _, _, _, arrays = tf.while_loop(
        lambda t, *_: t < horizon, body,
        (tf.constant(0), state, obs, alive, arrays), maximum_iterations=horizon)
    # [T, tasks, batch, ...] -> [tasks, batch, T, ...]
    out = [a.stack() for a in arrays]
    out = [tf.transpose(x, [1, 2, 0] + list(range(3, x.shape.rank))) for x in out]
    return Trajectories(*out)
