"""Environments as batched, pure TensorFlow functions, so a meta-batch of tasks rolls out
inside one compiled step.

Every environment has

- `sample_tasks(seed, n)`: a task tree with a leading axis of `n` tasks;
- `reset(task, seed, batch) -> (state, observation)`: `batch` episodes of one task;
- `step(task, state, action) -> (state, observation, reward, done)`, pure: the state
  carries everything the next step needs (a stateless seed where the dynamics are random);
- `horizon`: the number of steps of an episode; `observation_dim`;
- `on_host`: False, these are stepped in the graph by `rollout`. An environment stepped on
  the host instead (`HalfCheetahTasks`, a `gymnasium` simulator) says `on_host = True` and
  has `make_envs(num_envs)`, its vector environment for `gym_rollout`; `MamlRL` reads
  `on_host` (absent: False) to choose.

The functions take one task; map them over a task axis with `tf.vectorized_map`. An
environment keeps stepping an episode after its `done`: the rollout masks what follows.
Continuous actions are clipped by the environment; a policy's log-probability is that of
the unclipped action it drew.

Checks: shapes and dtypes are checked in Python when a step is called or traced; values
(an action's range, a table's probabilities) eagerly, or when traced where they are
constants, and otherwise by a `tf.debugging.Assert` when the graph runs, which XLA
(`jit_compile=True`) drops: under XLA a sampled out-of-range action is not caught.
"""

from typing import Optional

import keras
import tensorflow as tf

from hogrod import checks
from hogrod.types import DType, Seed, TensorLike, Tree

__all__ = ["TabularMDP", "Navigation2D", "IteratedPrisonersDilemma", "TASK_SAMPLING"]

TASK_SAMPLING = ("independent", "latin_hypercube")


def latin_hypercube(seed: tf.Tensor, n: int, d: int, dtype: DType) -> tf.Tensor:
    """`[n, d]` draws on the unit interval forming a Latin hypercube, for a meta-batch's
    tasks (`TASK_SAMPLING`'s "latin_hypercube").

    In each column every one of the `n` intervals [k / n, (k + 1) / n] holds exactly one
    draw, uniform inside it, the intervals assigned to the rows by an independent random
    permutation per column. Each draw is still uniform, so a mean over the tasks keeps its
    expectation, but the meta-batch covers the range evenly: a mean over tasks whose value
    varies smoothly with the task (a return that grows with a goal's distance) varies far
    less from one meta-batch to the next.

    Args:
      seed: an int64 `[2]` tensor.
      n: the rows (tasks), an int >= 1.
      d: the columns, an int >= 1.
      dtype: a floating dtype.

    Returns:
      The `[n, d]` tensor.
    """
    order, within = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    intervals = tf.argsort(tf.random.stateless_uniform([d, n], order), axis=1)
    u = tf.random.stateless_uniform([n, d], within, dtype=dtype)
    # an interval's index and the offset are summed first: exact for n < 2**24 in float32
    return (tf.cast(tf.transpose(intervals), dtype) + u) / tf.cast(n, dtype)


class TabularMDP:
    """A finite MDP with given transitions, rewards and initial distribution.

    Observations are one-hot states (`[batch, S]`), actions int32 indices in 0..A-1; the
    reward of a step is ``rewards[s, a]``; `done` is True at the last step of the horizon.
    A task is the MDP's tables (`{"transitions", "rewards", "initial"}`), so tasks with other
    tables of the same sizes can be built by hand; `sample_tasks` repeats the given one.

    Args:
      transitions: `[S, A, S]` next-state probabilities (rows summing to 1 within 1e-6).
      rewards: `[S, A]` rewards.
      initial: `[S]` initial distribution; None: uniform.
      horizon: the episode length, an int >= 1.
      dtype: the observations' and rewards' dtype; None: Keras's floatx.

    Raises:
      ArgumentError: tables of the wrong shapes, or not probabilities.
    """

    def __init__(self, transitions: TensorLike, rewards: TensorLike,
                 initial: Optional[TensorLike] = None, horizon: int = 10,
                 dtype: Optional[DType] = None) -> None:
        where = "TabularMDP"
        self.dtype = tf.as_dtype(dtype or keras.backend.floatx())
        p = tf.cast(checks.floating(transitions, "transitions", where), self.dtype)
        r = tf.cast(checks.floating(rewards, "rewards", where), self.dtype)
        if p.shape.rank != 3 or p.shape[0] != p.shape[2] or r.shape != p.shape[:2]:
            raise checks.ArgumentError(f"{where}: transitions must be [S, A, S] and rewards "
                                       f"[S, A], got {checks.describe((p, r))}")
        self.num_states, self.num_actions = int(p.shape[0]), int(p.shape[1])
        mu = (tf.fill([self.num_states], tf.constant(1.0 / self.num_states, self.dtype))
              if initial is None else tf.cast(checks.floating(initial, "initial", where),
                                              self.dtype))
        if mu.shape != [self.num_states]:
            raise checks.ArgumentError(f"{where}: initial must be [{self.num_states}], got "
                                       f"{mu.shape.as_list()}")
        for name, t in (("transitions", p), ("initial", mu)):
            checks.require(lambda t: tf.reduce_all(t >= 0) & tf.reduce_all(
                tf.abs(tf.reduce_sum(t, axis=-1) - 1) < 1e-6),
                f"{where}: {name} must be probabilities summing to 1", t)
        self.transitions, self.rewards, self.initial = p, r, mu
        self.on_host = False
        self.horizon = checks.integer(horizon, "horizon", where, 1)
        self.observation_dim = self.num_states

    def sample_tasks(self, seed: Seed, n: int) -> Tree:
        """`n` copies of the MDP's tables (the task distribution is the one MDP).

        Args:
          seed: unused (the task is fixed); an int >= 0 or a `[2]` integer tensor.
          n: the number of tasks, an int >= 1.

        Returns:
          A dict of `transitions` `[n, S, A, S]`, `rewards` `[n, S, A]` and `initial`
          `[n, S]`.
        """
        checks.stateless_seed(seed, "seed", "TabularMDP.sample_tasks")
        n = checks.integer(n, "n", "TabularMDP.sample_tasks", 1)
        tile = lambda t: tf.tile(t[None], [n] + [1] * t.shape.rank)  # noqa: E731
        return {"transitions": tile(self.transitions), "rewards": tile(self.rewards),
                "initial": tile(self.initial)}

    def _observe(self, s):
        return tf.one_hot(s, self.num_states, dtype=self.dtype)

    def reset(self, task: Tree, seed: Seed, batch: int) -> tuple:
        """Starts `batch` episodes of one task.

        Args:
          task: one task (`sample_tasks`' tree without the leading axis).
          seed: an int >= 0 or a `[2]` integer tensor; it and the step decide every draw.
          batch: the number of episodes, an int >= 1.

        Returns:
          `(state, observation)`: the state `{"s": int32[batch], "t": int32 scalar, "seed":
          int64[2]}` and the `[batch, S]` one-hot observation.
        """
        s = checks.stateless_seed(seed, "seed", "TabularMDP.reset")
        batch = checks.integer(batch, "batch", "TabularMDP.reset", 1)
        draw, following = tf.unstack(tf.random.experimental.stateless_split(s, 2))
        logits = tf.math.log(tf.tile(task["initial"][None], [batch, 1]))
        states = tf.random.stateless_categorical(logits, 1, draw, dtype=tf.int32)[:, 0]
        return ({"s": states, "t": tf.zeros([], tf.int32), "seed": following},
                self._observe(states))

    def step(self, task: Tree, state: Tree, action: TensorLike) -> tuple:
        """One step of every episode.

        Args:
          task: one task.
          state: the state from `reset` or `step`.
          action: int `[batch]` actions in 0..A-1.

        Returns:
          `(state, observation, reward, done)`: the next state, its `[batch, S]`
          observation, the `[batch]` rewards ``rewards[s, a]`` and the `[batch]` bool done
          (True at the horizon's last step).

        Raises:
          ArgumentError: actions not integers of shape `[batch]`, or out of 0..A-1 (see the
            module's note on checks: not under `jit_compile` for data-dependent actions).
        """
        where = "TabularMDP.step"
        a = tf.convert_to_tensor(action)
        if not a.dtype.is_integer or not a.shape.is_compatible_with(state["s"].shape):
            raise checks.ArgumentError(f"{where}: action must be integer [batch], got "
                                       f"{checks.describe(a)}")
        a = tf.cast(a, tf.int32)
        # the gathers wait for the check: an out-of-range action fails with this message,
        # not as the gather's index error
        with tf.control_dependencies(checks.require(
                lambda a: tf.reduce_all((a >= 0) & (a < self.num_actions)),
                f"{where}: action must lie in 0..{self.num_actions - 1}", a)):
            a = tf.identity(a)
        s = state["s"]
        index = tf.stack([s, a], axis=1)
        reward = tf.gather_nd(task["rewards"], index)
        draw, following = tf.unstack(tf.random.experimental.stateless_split(state["seed"], 2))
        logits = tf.math.log(tf.gather_nd(task["transitions"], index))
        nxt = tf.random.stateless_categorical(logits, 1, draw, dtype=tf.int32)[:, 0]
        t = state["t"] + 1
        done = tf.fill(tf.shape(s), t >= self.horizon)
        return {"s": nxt, "t": t, "seed": following}, self._observe(nxt), reward, done


def _check_steps(state, action, where, shape, integer):
    a = tf.convert_to_tensor(action)
    kind = "integer" if integer else "floating"
    ok = a.dtype.is_integer if integer else a.dtype.is_floating
    if not ok or not a.shape.is_compatible_with(shape):
        raise checks.ArgumentError(f"{where}: action must be {kind} {shape.as_list()}, got "
                                   f"{checks.describe(a)}")
    return a


class Navigation2D:
    """MAML's 2D navigation: a point moved by velocity actions toward a goal.

    A task is a goal drawn uniformly from [-0.5, 0.5]^2 (independently, or with
    `task_sampling="latin_hypercube"` evenly spread over a meta-batch, each goal still
    uniform); an episode starts at the origin;
    an action (`[batch, 2]`) is clipped to [-0.1, 0.1] per coordinate and added to the
    position; the reward is the negative Euclidean distance from the new position to the
    goal; `done` is True within Euclidean distance 0.01 of the goal and at the last step of
    the horizon. The observation is the position, or with `observe_goal` the position then
    the goal (`[batch, 4]`: the MAML paper's oracle, a policy that is told its task).

    Args:
      horizon: the episode length, an int >= 1 (100 in MAML).
      dtype: the positions' and rewards' dtype; None: Keras's floatx.
      observe_goal: whether the observation holds the goal too.
      task_sampling: how `sample_tasks` draws a meta-batch's goals, one of `TASK_SAMPLING`:
        "independent" (MAML's) or "latin_hypercube" (each coordinate stratified over the
        meta-batch, a lower-variance mean over its tasks; see `sample_tasks`).
    """

    action_dim = 2
    on_host = False

    def __init__(self, horizon: int = 100, dtype: Optional[DType] = None,
                 observe_goal: bool = False, task_sampling: str = "independent") -> None:
        self.horizon = checks.integer(horizon, "horizon", "Navigation2D", 1)
        self.task_sampling = checks.choice(task_sampling, TASK_SAMPLING, "task_sampling",
                                           "Navigation2D")
        self.dtype = tf.as_dtype(dtype or keras.backend.floatx())
        if not isinstance(observe_goal, bool):
            raise checks.ArgumentError(f"Navigation2D: observe_goal must be a bool, got "
                                       f"{observe_goal!r}")
        self.observe_goal = observe_goal
        self.observation_dim = 4 if observe_goal else 2

    def _observe(self, task, position):
        if not self.observe_goal:
            return position
        goal = tf.broadcast_to(tf.cast(task["goal"], self.dtype), tf.shape(position))
        return tf.concat([position, goal], -1)

    def sample_tasks(self, seed: Seed, n: int) -> Tree:
        """`n` goals uniform in [-0.5, 0.5]^2: independent, or a Latin hypercube (each
        coordinate's range cut into `n` equal intervals, one goal in each).

        Args:
          seed: an int >= 0 or a `[2]` integer tensor.
          n: the number of tasks, an int >= 1.

        Returns:
          A dict with `goal` `[n, 2]`.
        """
        s = checks.stateless_seed(seed, "seed", "Navigation2D.sample_tasks")
        n = checks.integer(n, "n", "Navigation2D.sample_tasks", 1)
        half = tf.constant(0.5, self.dtype)
        if self.task_sampling == "independent":
            return {"goal": tf.random.stateless_uniform([n, 2], s, -half, half,
                                                        dtype=self.dtype)}
        return {"goal": latin_hypercube(s, n, 2, self.dtype) - half}

    def reset(self, task: Tree, seed: Seed, batch: int) -> tuple:
        """Starts `batch` episodes at the origin.

        Args:
          task: one task, `{"goal": [2]}`.
          seed: an int >= 0 or a `[2]` integer tensor (the start is deterministic).
          batch: the number of episodes, an int >= 1.

        Returns:
          `(state, observation)`: the state `{"position": [batch, 2], "t": int32 scalar}` and
          the observation (`[batch, observation_dim]`).
        """
        checks.stateless_seed(seed, "seed", "Navigation2D.reset")
        batch = checks.integer(batch, "batch", "Navigation2D.reset", 1)
        position = tf.zeros([batch, 2], self.dtype)
        return {"position": position, "t": tf.zeros([], tf.int32)}, self._observe(task, position)

    def step(self, task: Tree, state: Tree, action: TensorLike) -> tuple:
        """One step of every episode.

        Args:
          task: one task, `{"goal": [2]}`.
          state: the state from `reset` or `step`.
          action: `[batch, 2]` velocities of the environment's dtype (clipped here).

        Returns:
          `(state, observation, reward, done)`: the next state, the observation
          (`[batch, observation_dim]`), the `[batch]` negative distances to the goal and
          the `[batch]` bool done (within 0.01 of the goal, or the horizon's last step).

        Raises:
          ArgumentError: an action not floating `[batch, 2]` of the environment's dtype.
        """
        where = "Navigation2D.step"
        a = _check_steps(state, action, where, state["position"].shape, integer=False)
        if a.dtype != self.dtype:
            raise checks.ArgumentError(f"{where}: action has dtype {a.dtype.name}, the "
                                       f"environment {self.dtype.name}")
        bound = tf.constant(0.1, self.dtype)
        position = state["position"] + tf.clip_by_value(a, -bound, bound)
        distance = tf.norm(position - task["goal"], axis=-1)
        t = state["t"] + 1
        done = (distance < tf.constant(0.01, self.dtype)) | (t >= self.horizon)
        return ({"position": position, "t": t}, self._observe(task, position), -distance,
                done)


class IteratedPrisonersDilemma:
    """The iterated prisoner's dilemma of two agents.

    Actions are int32 `[batch, 2]`, agent 0's then agent 1's, 0 = cooperate, 1 = defect.
    Each agent's per-step payoff, own action first: (C, C) -1, (C, D) -3, (D, C) 0,
    (D, D) -2. `done` is True at the horizon's last step. The task is the payoff table
    (`{"payoffs": [2, 2]}`, own action first); `sample_tasks` repeats the one above.

    Observations are per agent, not one joint state shared by both: each agent sees the
    last joint action from its own perspective, OWN action first, as the index ``2 own +
    other`` (0 CC, 1 CD, 2 DC, 3 DD), or 4 at the start. Observation ``[b, 0]`` is agent
    0's and ``[b, 1]`` agent 1's, so after agent 0 cooperates and agent 1 defects agent 0
    sees 1 (CD) and agent 1 sees 2 (DC); the two indices are equal only after (C, C),
    (D, D) and at the start. A memory-one policy of agent i is a function of
    ``observation[:, i]``.

    Args:
      horizon: the episode length, an int >= 1 (150 in LOLA-DiCE).
      dtype: the observations' and rewards' dtype; None: Keras's floatx.
    """

    observation_dim = 5
    num_actions = 2
    PAYOFFS = ((-1.0, -3.0), (0.0, -2.0))

    def __init__(self, horizon: int = 150, dtype: Optional[DType] = None) -> None:
        self.horizon = checks.integer(horizon, "horizon", "IteratedPrisonersDilemma", 1)
        self.dtype = tf.as_dtype(dtype or keras.backend.floatx())

    def sample_tasks(self, seed: Seed, n: int) -> Tree:
        """`n` copies of the payoff table.

        Args:
          seed: unused (one game); an int >= 0 or a `[2]` integer tensor.
          n: the number of tasks, an int >= 1.

        Returns:
          A dict with `payoffs` `[n, 2, 2]`.
        """
        checks.stateless_seed(seed, "seed", "IteratedPrisonersDilemma.sample_tasks")
        n = checks.integer(n, "n", "IteratedPrisonersDilemma.sample_tasks", 1)
        return {"payoffs": tf.tile(tf.constant(self.PAYOFFS, self.dtype)[None], [n, 1, 1])}

    def reset(self, task: Tree, seed: Seed, batch: int) -> tuple:
        """Starts `batch` games in the start state.

        Args:
          task: one task, `{"payoffs": [2, 2]}`.
          seed: an int >= 0 or a `[2]` integer tensor (the start is deterministic).
          batch: the number of games, an int >= 1.

        Returns:
          `(state, observation)`: the state `{"s": int32[batch, 2], "t": int32 scalar}`
          (each agent's own-perspective state index, 4 at the start) and the
          `[batch, 2, 5]` one-hot observations (`[:, i]` agent i's).
        """
        checks.stateless_seed(seed, "seed", "IteratedPrisonersDilemma.reset")
        batch = checks.integer(batch, "batch", "IteratedPrisonersDilemma.reset", 1)
        s = tf.fill([batch, 2], 4)
        return {"s": s, "t": tf.zeros([], tf.int32)}, tf.one_hot(s, 5, dtype=self.dtype)

    def step(self, task: Tree, state: Tree, action: TensorLike) -> tuple:
        """One round of every game.

        Args:
          task: one task, `{"payoffs": [2, 2]}`.
          state: the state from `reset` or `step`.
          action: int `[batch, 2]` actions (agent 0's, agent 1's), 0 = C, 1 = D.

        Returns:
          `(state, observation, reward, done)`: the next state, the `[batch, 2, 5]`
          observations (`[:, i]` agent i's, own action first), the `[batch, 2]` payoffs
          (agent 0's, agent 1's) and the `[batch]` bool done.

        Raises:
          ArgumentError: actions not integers of shape `[batch, 2]`, or out of {0, 1} (see
            the module's note on checks: not under `jit_compile` for data-dependent
            actions).
        """
        where = "IteratedPrisonersDilemma.step"
        a = tf.cast(_check_steps(state, action, where, state["s"].shape, integer=True), tf.int32)
        checks.require(lambda a: tf.reduce_all((a >= 0) & (a <= 1)),
                         f"{where}: action must lie in 0..1 (0 cooperate, 1 defect)", a)
        own, other = a[:, 0], a[:, 1]
        reward = tf.stack([tf.gather_nd(task["payoffs"], tf.stack([own, other], 1)),
                           tf.gather_nd(task["payoffs"], tf.stack([other, own], 1))], 1)
        s = tf.stack([2 * own + other, 2 * other + own], 1)
        t = state["t"] + 1
        done = tf.fill(tf.shape(own), t >= self.horizon)
        return ({"s": s, "t": t}, tf.one_hot(s, 5, dtype=self.dtype), reward, done)
