"""Environments as batched, pure TensorFlow functions, so a meta-batch of tasks rolls out
inside one compiled step.

Every environment has

- `sample_tasks(seed, n)`: a task tree with a leading axis of `n` tasks;
- `reset(task, seed, batch) -> (state, observation)`: `batch` episodes of one task;
- `step(task, state, action) -> (state, observation, reward, done)`, pure: the state
  carries everything the next step needs (a stateless seed where the dynamics are random);
- `horizon`: the number of steps of an episode; `observation_dim`.

The functions take one task; map them over a task axis with `tf.vectorized_map`.
"""

from typing import Optional

import keras
import tensorflow as tf

from hogrod import checks
from hogrod.rl import _tensors
from hogrod.types import DType, Seed, TensorLike, Tree

__all__ = ["TabularMDP"]


def _seed(seed, where):
    if isinstance(seed, (tf.Tensor, tf.Variable)):
        s = tf.convert_to_tensor(seed)
        if not s.dtype.is_integer or not s.shape.is_compatible_with([2]):
            raise checks.ArgumentError(f"{where}: seed must be an int or a [2] integer tensor, "
                                       f"got {checks.describe(s)}")
        return tf.cast(s, tf.int64)
    return tf.constant([checks.seed(seed, "seed", where), 0], tf.int64)


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
        p = tf.cast(_tensors.floating(transitions, "transitions", where), self.dtype)
        r = tf.cast(_tensors.floating(rewards, "rewards", where), self.dtype)
        if p.shape.rank != 3 or p.shape[0] != p.shape[2] or r.shape != p.shape[:2]:
            raise checks.ArgumentError(f"{where}: transitions must be [S, A, S] and rewards "
                                       f"[S, A], got {checks.describe((p, r))}")
        self.num_states, self.num_actions = int(p.shape[0]), int(p.shape[1])
        mu = (tf.fill([self.num_states], tf.constant(1.0 / self.num_states, self.dtype))
              if initial is None else tf.cast(_tensors.floating(initial, "initial", where),
                                              self.dtype))
        if mu.shape != [self.num_states]:
            raise checks.ArgumentError(f"{where}: initial must be [{self.num_states}], got "
                                       f"{mu.shape.as_list()}")
        for name, t in (("transitions", p), ("initial", mu)):
            sums = tf.reduce_sum(t, axis=-1)
            _tensors.require(tf.reduce_all(t >= 0) & tf.reduce_all(tf.abs(sums - 1) < 1e-6),
                             f"{where}: {name} must be probabilities summing to 1")
        self.transitions, self.rewards, self.initial = p, r, mu
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
        _seed(seed, "TabularMDP.sample_tasks")
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
        s = _seed(seed, "TabularMDP.reset")
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
          ArgumentError: actions not integers of shape `[batch]` in 0..A-1.
        """
        where = "TabularMDP.step"
        a = tf.convert_to_tensor(action)
        if not a.dtype.is_integer or not a.shape.is_compatible_with(state["s"].shape):
            raise checks.ArgumentError(f"{where}: action must be integer [batch], got "
                                       f"{checks.describe(a)}")
        a = tf.cast(a, tf.int32)
        _tensors.require(tf.reduce_all((a >= 0) & (a < self.num_actions)),
                         f"{where}: action must lie in 0..{self.num_actions - 1}")
        s = state["s"]
        index = tf.stack([s, a], axis=1)
        reward = tf.gather_nd(task["rewards"], index)
        draw, following = tf.unstack(tf.random.experimental.stateless_split(state["seed"], 2))
        logits = tf.math.log(tf.gather_nd(task["transitions"], index))
        nxt = tf.random.stateless_categorical(logits, 1, draw, dtype=tf.int32)[:, 0]
        t = state["t"] + 1
        done = tf.fill(tf.shape(s), t >= self.horizon)
        return {"s": nxt, "t": t, "seed": following}, self._observe(nxt), reward, done
