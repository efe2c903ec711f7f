"""The iterated prisoner's dilemma's tabular agents, as the LOLA-DiCE reference builds them
(alshedivat/lola, `lola_dice/policy.py`'s `SimplePolicy`): games, log-probabilities and value
heads, for `hogrod.rl.lola`.

Agent i cooperates in its own-perspective state s (`IteratedPrisonersDilemma`'s observation
index, 4 at the start, else ``2 own + other`` of the last round) with probability
``sigmoid(policy_i[s])``: `[5]` parameters per agent. Its value head (the reference's
`use_baseline`) is linear in the one-hot state, ``V_i(s) = value_i[s] + value_i[5]``: `[6]`
parameters, fitted to the agent's own return-to-go by `fit_ipd_values`.
"""

from typing import NamedTuple, Sequence

import tensorflow as tf

from hogrod import checks
from hogrod.rl import envs
from hogrod.rl.returns import discounted_returns
from hogrod.types import Seed, TensorLike

__all__ = ["IPDTrajectories", "sample_ipd", "ipd_log_probs", "ipd_values", "fit_ipd_values"]

STATES = envs.IteratedPrisonersDilemma.observation_dim


class IPDTrajectories(NamedTuple):
    """A batch of iterated prisoner's dilemma games.

    Attributes:
      states: int32 `[batch, T, 2]`: each agent's own-perspective state index before its
        action at step t (4 at the start, else ``2 own + other`` of the last round).
      actions: int32 `[batch, T, 2]`: agent 0's and agent 1's actions, 0 = cooperate,
        1 = defect.
      rewards: `[batch, T, 2]` payoffs of agent 0 and agent 1, the environment's dtype.
    """

    states: tf.Tensor
    actions: tf.Tensor
    rewards: tf.Tensor


def _agent_params(params, where):
    """Two floating tensors of one dtype and shape, one per agent."""
    if isinstance(params, (tf.Tensor, tf.Variable)) or not isinstance(params, (list, tuple)):
        raise checks.ArgumentError(f"{where}: params must be a list or tuple of two tensors "
                                   f"(agent 0's, agent 1's), got {checks.describe(params)}")
    if len(params) != 2:
        raise checks.ArgumentError(f"{where}: params must hold two agents' parameters, got "
                                   f"{len(params)}")
    out = []
    for i, p in enumerate(params):
        t = p if isinstance(p, tf.Variable) else tf.convert_to_tensor(p)
        if not t.dtype.is_floating:
            raise checks.ArgumentError(f"{where}: params[{i}] (agent {i}'s parameters) must "
                                       f"be floating, got {checks.describe(t)}")
        out.append(t)
    if out[0].dtype != out[1].dtype or out[0].shape != out[1].shape:
        raise checks.ArgumentError(f"{where}: both agents' parameters must have one dtype and "
                                   f"shape, got {checks.describe(out)}")
    return out


def _table_params(params, where):
    """The two agents' `[5]` tables of cooperation logits."""
    out = _agent_params(params, where)
    if out[0].shape != [STATES]:
        raise checks.ArgumentError(f"{where}: each agent's parameters must have shape [5] "
                                   f"(a cooperation logit per state), got "
                                   f"{checks.describe(out)}")
    return out


def _ipd(env, where):
    if not isinstance(env, envs.IteratedPrisonersDilemma):
        raise checks.ArgumentError(f"{where}: env must be an IteratedPrisonersDilemma, got "
                                   f"{type(env).__name__}")
    return env


def sample_ipd(env: envs.IteratedPrisonersDilemma, params: Sequence[TensorLike], seed: Seed,
               batch: int) -> IPDTrajectories:
    """Plays `batch` games of `env.horizon` rounds with the tabular policies `params`.

    Agent i cooperates in its state s with probability ``sigmoid(params[i][s])``. The
    draws are not differentiable (the parameters' values are used, no gradient flows):
    differentiate `ipd_log_probs` of the result. Runs as one `tf.while_loop` inside a
    `tf.function`.

    Args:
      env: the game; its horizon is the number of rounds T.
      params: agent 0's and agent 1's `[5]` cooperation logits, of the environment's dtype.
      seed: an int >= 0 or a `[2]` integer tensor; it decides every draw.
      batch: the number of games, an int >= 1.

    Returns:
      The `IPDTrajectories` of the games.

    Raises:
      ArgumentError: `env` not an `IteratedPrisonersDilemma`, parameters not two `[5]`
        tensors of the environment's dtype, or a bad seed or batch.
    """
    where = "sample_ipd"
    env = _ipd(env, where)
    theta = _table_params(params, where)
    if theta[0].dtype != env.dtype:
        raise checks.ArgumentError(f"{where}: params have dtype {theta[0].dtype.name}, the "
                                   f"environment {env.dtype.name}")
    batch = checks.integer(batch, "batch", where, 1)
    seed = checks.stateless_seed(seed, "seed", where)
    steps = env.horizon
    table = tf.stop_gradient(tf.concat(theta, 0))  # [10]: agent i's state s at 5 i + s
    task = {"payoffs": tf.constant(env.PAYOFFS, env.dtype)}
    state, _ = env.reset(task, seed, batch)
    draws = tf.random.stateless_uniform([steps, batch, 2], seed, dtype=env.dtype)
    offset = tf.constant([0, 5], tf.int32)

    def body(t, state, states, actions, rewards):
        s = state["s"]
        cooperate = draws[t] < tf.sigmoid(tf.gather(table, s + offset))
        a = tf.cast(tf.logical_not(cooperate), tf.int32)
        state, _, reward, _ = env.step(task, state, a)
        return (t + 1, state, states.write(t, s), actions.write(t, a),
                rewards.write(t, reward))

    arrays = (tf.TensorArray(tf.int32, steps), tf.TensorArray(tf.int32, steps),
              tf.TensorArray(env.dtype, steps))
    _, _, *arrays = tf.while_loop(lambda t, *_: t < steps, body,
                                  (tf.constant(0), state, *arrays))
    return IPDTrajectories(*(tf.transpose(a.stack(), [1, 0, 2]) for a in arrays))


def _indices(x, arg, where):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_integer or x.shape.rank != 3 or x.shape[-1] not in (None, 2):
        raise checks.ArgumentError(f"{where}: {arg} must be integer [batch, T, 2], got "
                                   f"{checks.describe(x)}")
    return tf.cast(x, tf.int32)


def ipd_log_probs(params: Sequence[TensorLike], states: TensorLike, actions: TensorLike
                  ) -> tf.Tensor:
    """Each agent's log-probability of its actions under the tabular policies `params`,
    differentiable in the parameters.

    ``log p_i(a | s) = log_sigmoid(params[i][s])`` for a = 0 (cooperate) and
    ``log_sigmoid(-params[i][s])`` for a = 1 (defect).

    Args:
      params: agent 0's and agent 1's `[5]` cooperation logits (floating, one dtype).
      states: integer `[batch, T, 2]` own-perspective states in 0..4 (`IPDTrajectories`).
      actions: integer `[batch, T, 2]` actions in {0, 1}, `states`' shape.

    Returns:
      A `[batch, T, 2]` tensor of the parameters' dtype: agent 0's and agent 1's
      log-probabilities.

    Raises:
      ArgumentError: parameters not two `[5]` floating tensors of one dtype, or `states`
        or `actions` not integer `[batch, T, 2]` of one shape.
    """
    where = "ipd_log_probs"
    theta = _table_params(params, where)
    s, a = _indices(states, "states", where), _indices(actions, "actions", where)
    if not s.shape.is_compatible_with(a.shape):
        raise checks.ArgumentError(f"{where}: states have shape {s.shape.as_list()}, actions "
                                   f"{a.shape.as_list()}; they must be equal")
    logits = tf.stack([tf.gather(theta[i], s[..., i]) for i in range(2)], -1)
    sign = tf.cast(1 - 2 * a, logits.dtype)  # +1 cooperate, -1 defect
    return tf.math.log_sigmoid(sign * logits)


def _value_heads(value, where):
    v = checks.floating(value, "value", where)
    if v.shape != [2, STATES + 1]:
        raise checks.ArgumentError(f"{where}: value must be [2, 6] (each agent's weight per "
                                   f"state, then its bias), got {checks.describe(v)}")
    return v


def ipd_values(value: TensorLike, states: TensorLike) -> tf.Tensor:
    """Each agent's value head at its own states, ``V_i(s) = value[i, s] + value[i, 5]``.

    Args:
      value: `[2, 6]` floating value heads, row i agent i's (a weight per state, a bias).
      states: integer `[batch, T, 2]` own-perspective states in 0..4 (`IPDTrajectories`).

    Returns:
      A `[batch, T, 2]` tensor of `value`'s dtype.

    Raises:
      ArgumentError: `value` not a floating `[2, 6]` tensor or `states` not integer
        `[batch, T, 2]`.
    """
    where = "ipd_values"
    v = _value_heads(value, where)
    s = _indices(states, "states", where)
    weights = tf.stack([tf.gather(v[i, :STATES], s[..., i]) for i in range(2)], -1)
    return weights + v[:, STATES]


def fit_ipd_values(value: TensorLike, states: TensorLike, rewards: TensorLike, discount: float,
                   lr: float, minibatch: int, seed: Seed) -> tf.Tensor:
    """One epoch of the LOLA-DiCE reference's value fitting (`lola_dice/rpg.py`, `train`).

    Each agent's head is fitted to its own return-to-go ``G_t = sum_{k>=t} discount**(k-t)
    r_k`` (0 after the last round) by plain gradient descent at rate `lr` on the mean
    squared error ``mean (V_i(s_t) - G_t)**2`` over the games and the steps of a minibatch:
    the steps 0..T-1 in an order drawn from `seed`, cut into minibatches of `minibatch`
    steps (every game's; the last minibatch may be shorter), a step on each, then one step
    on the whole batch, as the reference's `gen_trace_batches` and `update_val` do.

    Args:
      value: `[2, 6]` floating value heads (see `ipd_values`).
      states: integer `[batch, T, 2]` own-perspective states, with T >= 1 and batch >= 1.
      rewards: `[batch, T, 2]` rewards of `value`'s dtype.
      discount: the discount, a Python number in (0, 1].
      lr: the value heads' learning rate, a positive Python number (the reference's 0.1).
      minibatch: steps per minibatch, an int >= 1 (the reference's 16).
      seed: an int >= 0 or a `[2]` integer tensor: the order of the steps.

    Returns:
      The fitted `[2, 6]` value heads (no gradient flows through the fit).

    Raises:
      ArgumentError: a tensor of the wrong dtype or shape (an empty batch included), or a
        bad discount, rate, minibatch or seed.
    """
    where = "fit_ipd_values"
    v = tf.stop_gradient(_value_heads(value, where))
    s = _indices(states, "states", where)
    r = checks.floating(rewards, "rewards", where)
    if r.dtype != v.dtype or not r.shape.is_compatible_with(s.shape) or 0 in r.shape:
        raise checks.ArgumentError(f"{where}: rewards are {checks.describe(r)}, states "
                                   f"{checks.describe(s)}; rewards must have value's dtype "
                                   "and both one non-empty shape [batch, T, 2]")
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    rate = tf.constant(checks.positive(lr, "lr", where), v.dtype)
    minibatch = checks.integer(minibatch, "minibatch", where, 1)
    seed = checks.stateless_seed(seed, "seed", where)
    steps = r.shape[1]
    if steps is None:
        raise checks.ArgumentError(f"{where}: the number of steps T must be known when "
                                   f"traced, got rewards {checks.describe(r)}")
    targets = tf.stack([discounted_returns(tf.stop_gradient(r[..., i]), discount)
                        for i in range(2)], -1)
    order = tf.argsort(tf.random.stateless_uniform([steps], seed))
    parts = [order[k:k + minibatch] for k in range(0, steps, minibatch)]
    for part in parts + [tf.range(steps)]:
        with tf.GradientTape() as tape:
            tape.watch(v)
            error = (ipd_values(v, tf.gather(s, part, axis=1))
                     - tf.gather(targets, part, axis=1))
            loss = tf.reduce_sum(tf.reduce_mean(tf.square(error), [0, 1]))  # each its own
        v = v - rate * tape.gradient(loss, v)
    return v
