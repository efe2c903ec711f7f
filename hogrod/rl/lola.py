"""LOLA-DiCE: two learners aware of each other's learning, on the iterated prisoner's
dilemma, with every derivative from DiCE (Foerster et al. 2018, "DiCE: The Infinitely
Differentiable Monte Carlo Estimator", section on LOLA; Foerster et al. 2018, "Learning
with Opponent-Learning Awareness").

Each agent i maximizes its expected discounted return ``J_i(theta_0, theta_1)``. A naive
learner ascends ``d J_i / d theta_i``. A LOLA learner i first predicts the other agent j's
parameters after `lookahead` steps of gradient ascent on j's own objective,
``phi_j <- phi_j + inner_rate d J_j(theta_i, phi_j) / d phi_j`` from ``phi_j = theta_j``
(each step on a fresh batch drawn at ``(theta_i, phi_j)``), and ascends
``d J_i(theta_i, phi_j(theta_i)) / d theta_i``: the derivative goes through the predicted
steps (nested tapes), so i shapes how j learns. Both agents update from the same
parameters at once; `lookahead` = 0 is the naive learner.

All derivatives are DiCE's: an agent's objective on a batch is `dice_surrogate` of the
joint log-probabilities (``log_probs[b, t]`` the sum of both agents' log-probabilities at
step t, every choice the rewards depend on) and its own rewards, so the second derivatives
the look-ahead needs are unbiased too.

The policies are the LOLA-DiCE reference's: agent i cooperates in its own-perspective
state s (`IteratedPrisonersDilemma`'s observation index) with probability
``sigmoid(theta_i[s])``, `[5]` parameters per agent.
"""

from typing import Callable, NamedTuple, Sequence

import tensorflow as tf

from hogrod import checks
from hogrod.rl import envs
from hogrod.rl.estimators import dice_surrogate
from hogrod.types import Seed, TensorLike

__all__ = ["IPDTrajectories", "sample_ipd", "ipd_log_probs", "joint_dice_surrogates",
           "lola_dice_gradients", "make_lola_update"]

BASELINES = ("batch_mean", "none")


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
    if out[0].shape != [envs.IteratedPrisonersDilemma.observation_dim]:
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


def joint_dice_surrogates(log_probs: TensorLike, rewards: TensorLike, discount: float,
                          baseline: str = "batch_mean") -> tf.Tensor:
    """Every agent's DiCE objective on a batch of joint trajectories, each to be MAXIMIZED.

    Agent i's objective is `dice_surrogate` of ``sum_j log_probs[..., j]`` (the
    log-probability of every choice made at a step, all agents') and of its own rewards
    ``rewards[..., i]``, so its derivatives of every order in any agent's parameters are
    unbiased estimates of the expected discounted return's. With `baseline` "batch_mean"
    (the LOLA-DiCE reference's variance reduction) the batch mean of agent i's reward at
    each step is subtracted from its rewards inside the estimator (a constant whose terms
    vanish in expectation at every order, up to the O(1/batch) dependence of a mean on its
    own sample).

    Args:
      log_probs: `[batch, T, n]` floating log-probabilities of the n agents' actions,
        differentiable in their parameters.
      rewards: `[batch, T, n]` rewards of `log_probs`' dtype (constants).
      discount: the discount, a Python number in (0, 1].
      baseline: "batch_mean" or "none".

    Returns:
      A `[n]` tensor of `log_probs`' dtype: the objectives, whose values are each agent's
      batch-mean discounted return ``sum_t discount**t r_t`` (the baseline's terms added
      back as a constant).

    Raises:
      ArgumentError: tensors not floating `[batch, T, n]` of one shape and dtype, or a bad
        discount or baseline.
    """
    where = "joint_dice_surrogates"
    baseline = checks.choice(baseline, BASELINES, "baseline", where)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    lp = tf.convert_to_tensor(log_probs)
    r = tf.convert_to_tensor(rewards)
    for arg, t in (("log_probs", lp), ("rewards", r)):
        if not t.dtype.is_floating or t.shape.rank != 3:
            raise checks.ArgumentError(f"{where}: {arg} must be floating [batch, T, agents], "
                                       f"got {checks.describe(t)}")
    if r.dtype != lp.dtype or not r.shape.is_compatible_with(lp.shape):
        raise checks.ArgumentError(f"{where}: rewards are {checks.describe(r)}, log_probs "
                                   f"{checks.describe(lp)}; dtype and shape must be equal")
    joint = tf.reduce_sum(lp, axis=-1)
    r = tf.stop_gradient(r)
    weights = tf.pow(tf.constant(discount, lp.dtype), tf.cast(tf.range(tf.shape(r)[1]),
                                                              lp.dtype))
    objectives = []
    for i in range(r.shape[-1]):
        own = r[..., i]
        if baseline == "none":
            objectives.append(dice_surrogate(joint, own, discount))
            continue
        b = tf.reduce_mean(own, axis=0, keepdims=True)
        constant = tf.reduce_sum(weights * b[0])
        objectives.append(dice_surrogate(joint, own - b, discount) + constant)
    return tf.stack(objectives)


def _unconnected(agent, whose, other):
    return checks.ArgumentError(
        f"lola_dice_gradients: agent {agent}'s objective does not depend on agent {whose}'s "
        f"parameters ({other}); the objectives' log-probabilities must be differentiable "
        "functions of both agents' parameters (log_probs[b, t] the sum of both agents')")


def _pair(both):
    """`objectives`' result checked: a floating `[2]` tensor."""
    t = tf.convert_to_tensor(both)
    if not t.dtype.is_floating or not t.shape.is_compatible_with([2]):
        raise checks.ArgumentError("lola_dice_gradients: objectives must return a floating "
                                   f"[2] tensor (both agents' objectives), got "
                                   f"{checks.describe(t)}")
    return t


def lola_dice_gradients(objectives: Callable[[Sequence[tf.Tensor], tf.Tensor], tf.Tensor],
                        params: Sequence[TensorLike], seed: Seed, lookahead: int,
                        inner_rate: float) -> tuple:
    """Each agent's LOLA-DiCE gradient: of its objective at its own parameters and the
    other agent's parameters after `lookahead` predicted steps of the other's learning.

    For agent i and the other agent j: ``phi = theta_j``; `lookahead` times ``phi <- phi +
    inner_rate d J_j(theta_i, phi) / d phi`` on a fresh batch; then the total derivative of
    ``J_i(theta_i, phi(theta_i))`` in ``theta_i`` (through the predicted steps, nested
    tapes), on another batch. `lookahead` = 0: the naive gradient ``d J_i / d theta_i``.
    Agent i's batches are drawn with seeds split from `seed` (``2 (lookahead + 1)`` in all).

    Args:
      objectives: ``objectives(params, seed) -> [2]`` both agents' objectives (maximized)
        on a batch drawn with `seed` (a `[2]` int64 tensor) at the values of `params` (a
        list of both agents' parameter tensors), differentiable in both, e.g.
        `joint_dice_surrogates` of `ipd_log_probs` of `sample_ipd`.
      params: agent 0's and agent 1's parameters, two floating tensors of one dtype and
        shape.
      seed: an int >= 0 or a `[2]` integer tensor.
      lookahead: the number of predicted steps of the other agent, an int >= 0.
      inner_rate: the predicted steps' learning rate, a positive Python number applied at
        the parameters' dtype.

    Returns:
      `(gradients, values)`: the list of both agents' gradients (ascent directions, each
      its parameters' shape) and the `[2]` objectives' values at `params` themselves (on
      agent 0's first batch).

    Raises:
      ArgumentError (a ValueError): a bad argument; or, when the gradient is taken
        (eagerly, or when traced), an objective that does not depend on the parameters it
        is differentiated in (naming the agent), or a look-ahead that does not depend on
        the looking agent's parameters. Dependence is the tapes' (a gradient of None): an
        objective that reaches a parameter only through a zero factor or slice counts as
        depending on it.
    """
    where = "lola_dice_gradients"
    objectives = checks.function(objectives, "objectives", where, "objectives(params, seed)")
    theta = _agent_params(params, where)
    lookahead = checks.integer(lookahead, "lookahead", where, 0)
    rate = tf.constant(checks.positive(inner_rate, "inner_rate", where), theta[0].dtype)
    seeds = tf.random.experimental.stateless_split(
        checks.stateless_seed(seed, "seed", where), 2 * (lookahead + 1))
    gradients, values = [], None
    for i in range(2):
        j = 1 - i
        own = tf.identity(theta[i])  # a tensor of its own: the tapes differentiate in it
        with tf.GradientTape(persistent=lookahead > 0) as outer:
            outer.watch(own)
            phi = tf.identity(theta[j])
            for m in range(lookahead):
                with tf.GradientTape() as inner:
                    inner.watch(phi)
                    both = _pair(objectives([own, phi] if i == 0 else [phi, own],
                                            seeds[i * (lookahead + 1) + m]))
                    target = both[j]  # indexed on the tape
                values = both if values is None else values
                step = inner.gradient(target, phi)
                if step is None:
                    raise _unconnected(j, j, "in a look-ahead step")
                phi = phi + rate * tf.convert_to_tensor(step)  # gathers give IndexedSlices
            both = _pair(objectives([own, phi] if i == 0 else [phi, own],
                                    seeds[i * (lookahead + 1) + lookahead]))
            target = both[i]
            values = both if values is None else values
        gradient = outer.gradient(target, own)
        if gradient is None:
            raise _unconnected(i, i, "in its update")
        if lookahead and outer.gradient(phi, own) is None:  # pruned when traced
            raise checks.ArgumentError(
                f"{where}: agent {j}'s look-ahead does not depend on agent {i}'s parameters; "
                f"the log-probabilities of agent {j}'s objective must include agent {i}'s "
                "(log_probs[b, t] the sum of both agents')")
        gradients.append(tf.convert_to_tensor(gradient))
    return gradients, tf.stop_gradient(values)


def make_lola_update(env: envs.IteratedPrisonersDilemma, batch: int, discount: float,
                     lookahead: int, inner_rate: float, outer_rate: float,
                     baseline: str = "batch_mean") -> Callable:
    """A compiled LOLA-DiCE update of two tabular agents on the iterated prisoner's dilemma.

    ``update(params, seed) -> (params, returns)``: both agents ascend their
    `lola_dice_gradients` (batches of `batch` games from `sample_ipd`, objectives
    `joint_dice_surrogates`) by ``outer_rate`` times the gradient, from the same
    parameters. `params` is a `[2, 5]` tensor of the environment's dtype (row i agent i's
    cooperation logits), `seed` a `[2]` int64 tensor; it is traced once (an input
    signature) and the same arguments give the same result. `returns` is `[2]`, each
    agent's discounted return at `params` normalized to a per-step mean, ``sum_t discount**t
    r_t / sum_t discount**t`` (batch mean of agent 0's first batch; the LOLA-DiCE reference
    reports ``(1 - discount) sum_t discount**t r_t``, 0.2% smaller at T = 150, discount
    0.96). `lookahead` = 0: naive learners.

    Args:
      env: the game (its horizon is T, its dtype the parameters').
      batch: games per batch, an int >= 1 (64 in LOLA-DiCE).
      discount: the discount, a Python number in (0, 1] (0.96).
      lookahead: predicted steps of the other agent, an int >= 0 (2 or 3).
      inner_rate: the predicted steps' learning rate, a positive Python number (0.3).
      outer_rate: the agents' learning rate, a positive Python number (0.2).
      baseline: "batch_mean" (the reference's) or "none", see `joint_dice_surrogates`.

    Returns:
      The `tf.function` `update`.

    Raises:
      ArgumentError: an argument out of range.
    """
    where = "make_lola_update"
    env = _ipd(env, where)
    batch = checks.integer(batch, "batch", where, 1)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    lookahead = checks.integer(lookahead, "lookahead", where, 0)
    checks.positive(inner_rate, "inner_rate", where)
    rate = checks.positive(outer_rate, "outer_rate", where)
    baseline = checks.choice(baseline, BASELINES, "baseline", where)
    scale = sum(discount ** t for t in range(env.horizon))

    def objectives(params, seed):
        games = sample_ipd(env, params, seed, batch)
        return joint_dice_surrogates(ipd_log_probs(params, games.states, games.actions),
                                     games.rewards, discount, baseline)

    @tf.function(input_signature=[tf.TensorSpec([2, 5], env.dtype),
                                  tf.TensorSpec([2], tf.int64)], autograph=False)
    def update(params, seed):
        gradients, values = lola_dice_gradients(objectives, tf.unstack(params), seed,
                                                lookahead, inner_rate)
        step = tf.constant(rate, env.dtype) * tf.stack(gradients)
        return params + step, values / tf.constant(scale, env.dtype)

    return update
