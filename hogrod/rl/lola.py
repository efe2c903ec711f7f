"""LOLA-DiCE: two learners aware of each other's learning, on the iterated prisoner's
dilemma, with every derivative from DiCE (Foerster et al. 2018, "DiCE: The Infinitely
Differentiable Monte Carlo Estimator", section on LOLA; Foerster et al. 2018, "Learning
with Opponent-Learning Awareness").

Each agent i maximizes its expected discounted return ``J_i(theta_0, theta_1)``. A naive
learner ascends ``d J_i / d theta_i``. A LOLA learner i first predicts the other agent j's
parameters after `inner_steps` steps of gradient ascent on j's own objective,
``phi_j <- phi_j + inner_lr d J_j(theta_i, phi_j) / d phi_j`` from ``phi_j = theta_j``
(each step on a fresh batch drawn at ``(theta_i, phi_j)``), and ascends
``d J_i(theta_i, phi_j(theta_i)) / d theta_i``: the derivative goes through the predicted
steps (nested tapes), so i shapes how j learns. `inner_steps` = 0 is the naive learner.
`make_lola_update` steps both agents from the same parameters ("simultaneous") or in the
reference's order ("sequential": agent 0 first, then agent 1's gradient at agent 0's new
parameters on the batches drawn before).

All derivatives are DiCE's: an agent's surrogate (maximized) on a batch is
`dice_surrogate` of the joint log-probabilities (``log_probs[b, t]`` the sum of both
agents' log-probabilities at step t, every choice the rewards depend on) and its own
rewards, so the second derivatives the look-ahead needs are unbiased too.

The agents are the reference's tabular ones (`hogrod.rl.ipd`): a cooperation logit per
own-perspective state, and with its value baseline (`baseline="value"`, the reference's
`use_baseline`) a linear value head per agent, fitted at its own learning rate before each
update and never differentiated.

Conventions: `surrogates(params, seed)`, the callable `lola_dice_gradients` differentiates,
takes the parameters first and the data second, as `meta.adapt`'s `objective(params,
support)`; the data is a seed, since every look-ahead step draws a fresh batch at the
predicted parameters. Its result is maximized, hence a surrogate, not an objective.
"""

from typing import Callable, NamedTuple, Optional, Sequence

import tensorflow as tf

from hogrod import checks
from hogrod.rl.estimators import dice_surrogate, magic_box
from hogrod.rl.envs import IteratedPrisonersDilemma
from hogrod.rl.ipd import (STATES, _agent_params, _ipd, fit_ipd_values, ipd_log_probs,
                           ipd_values, sample_ipd)
from hogrod.types import Seed, TensorLike

__all__ = ["LolaParams", "BASELINES", "ORDERS", "joint_dice_surrogates", "lola_dice_gradients",
           "make_lola_update"]

BASELINES = ("value", "batch_mean", "none")
ORDERS = ("simultaneous", "sequential")


class LolaParams(NamedTuple):
    """Both agents' parameters, what `make_lola_update`'s update steps.

    Attributes:
      policy: `[2, 5]` cooperation logits, row i agent i's (see `sample_ipd`).
      value: `[2, 6]` value heads, row i agent i's: a weight per own-perspective state, then
        a bias (see `ipd_values`); fitted and used with `baseline="value"` only, otherwise
        passed through unchanged.
    """

    policy: tf.Tensor
    value: tf.Tensor


def joint_dice_surrogates(log_probs: TensorLike, rewards: TensorLike, discount: float,
                          baseline: str = "batch_mean",
                          values: Optional[TensorLike] = None) -> tf.Tensor:
    """Every agent's DiCE surrogate on a batch of joint trajectories, each to be MAXIMIZED.

    Agent i's surrogate is `dice_surrogate` of ``sum_j log_probs[..., j]`` (the
    log-probability of every choice made at a step, all agents') and of its own rewards
    ``rewards[..., i]``, so its derivatives of every order in any agent's parameters are
    unbiased estimates of the expected discounted return's. The baselines are the LOLA-DiCE
    reference's (`lola_dice/rpg.py`, `build_losses`):

    - "value" (its `use_baseline`): plus ``mean_b sum_t discount**t V_i[b, t] (1 -
      magic_box(l_t))`` with ``V_i = values[..., i]`` (constants) and ``l_t = sum_j
      log_probs[b, t, j]``, the log-probability of step t's choices alone: its value is 0
      and its derivatives of every order vanish in expectation, since the boxed ratio of
      step t's choices has expectation 1 given the state ``V_i`` is evaluated in; at first
      order it subtracts ``discount**t V_i`` from the return that multiplies step t's score.
    - "batch_mean" (the reference's IPD script): the batch mean of agent i's reward at each
      step is subtracted from its rewards inside the estimator and its discounted sum added
      back as a constant (a baseline whose terms vanish in expectation at every order, up to
      the O(1/batch) dependence of a mean on its own sample).
    - "none": plain DiCE.

    Args:
      log_probs: `[batch, T, n]` floating log-probabilities of the n agents' actions,
        differentiable in their parameters (batch, T >= 1).
      rewards: `[batch, T, n]` rewards of `log_probs`' dtype (constants).
      discount: the discount, a Python number in (0, 1].
      baseline: "value", "batch_mean" or "none".
      values: with "value" only: `[batch, T, n]` values ``V_i(s_t)`` of `log_probs`' dtype,
        each agent's estimate of its return from step t on (no gradient flows into them).

    Returns:
      A `[n]` tensor of `log_probs`' dtype: the surrogates, whose values are each agent's
      batch-mean discounted return ``sum_t discount**t r_t`` (the baselines' terms are 0 or
      added back).

    Raises:
      ArgumentError: tensors not floating `[batch, T, n]` of one shape and dtype, `values`
        missing with "value" or given with another baseline, or a bad discount or baseline.
    """
    where = "joint_dice_surrogates"
    baseline = checks.choice(baseline, BASELINES, "baseline", where)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    lp = checks.floating(log_probs, "log_probs", where)
    if lp.shape.rank != 3:
        raise checks.ArgumentError(f"{where}: log_probs must be floating [batch, T, agents], "
                                   f"got {checks.describe(lp)}")
    r = checks.like(rewards, "rewards", where, lp, "log_probs")
    if (values is None) == (baseline == "value"):
        raise checks.ArgumentError(f"{where}: values must be given with baseline 'value' and "
                                   f"only then; got baseline {baseline!r} and values "
                                   f"{checks.describe(values)}")
    v = None if values is None else tf.stop_gradient(
        checks.like(values, "values", where, lp, "log_probs"))
    joint = tf.reduce_sum(lp, axis=-1)
    r = tf.stop_gradient(r)
    weights = tf.pow(tf.constant(discount, lp.dtype), tf.cast(tf.range(tf.shape(r)[1]),
                                                              lp.dtype))
    surrogates = []
    for i in range(r.shape[-1]):
        own = r[..., i]
        if baseline == "batch_mean":
            b = tf.reduce_mean(own, axis=0, keepdims=True)
            constant = tf.reduce_sum(weights * b[0])
            surrogates.append(dice_surrogate(joint, own - b, discount) + constant)
            continue
        surrogate = dice_surrogate(joint, own, discount)
        if baseline == "value":
            term = weights * v[..., i] * (1 - magic_box(joint))
            surrogate += tf.reduce_mean(tf.reduce_sum(term, axis=1))
        surrogates.append(surrogate)
    return tf.stack(surrogates)


def _unconnected(agent, whose, other):
    return checks.ArgumentError(
        f"lola_dice_gradients: agent {agent}'s surrogate does not depend on agent {whose}'s "
        f"parameters ({other}); the surrogates' log-probabilities must be differentiable "
        "functions of both agents' parameters (log_probs[b, t] the sum of both agents')")


def _pair(both):
    """`surrogates`' result checked: a floating `[2]` tensor."""
    t = tf.convert_to_tensor(both)
    if not t.dtype.is_floating or not t.shape.is_compatible_with([2]):
        raise checks.ArgumentError("lola_dice_gradients: surrogates must return a floating "
                                   f"[2] tensor (both agents' surrogates), got "
                                   f"{checks.describe(t)}")
    return t


def _batch_seeds(seed, inner_steps):
    """The batches' seeds: agent i's batch m (m = inner_steps the last, its update's) is
    drawn with row ``i (inner_steps + 1) + m``."""
    return tf.random.experimental.stateless_split(seed, 2 * (inner_steps + 1))


def _agent_gradient(surrogate, theta, i, inner_steps, rate):
    """Agent i's LOLA-DiCE gradient at `theta` and the `[2]` surrogates on its first batch;
    ``surrogate(pair, m)``: both agents' surrogates on agent i's batch m at `pair`."""
    j = 1 - i
    own = tf.identity(theta[i])  # a tensor of its own: the tapes differentiate in it

    def pair(phi):
        return [own, phi] if i == 0 else [phi, own]

    values = None
    with tf.GradientTape(persistent=inner_steps > 0) as outer:
        outer.watch(own)
        phi = tf.identity(theta[j])
        for m in range(inner_steps):
            with tf.GradientTape() as inner:
                inner.watch(phi)
                both = surrogate(pair(phi), m)
                target = both[j]  # indexed on the tape
            values = both if values is None else values
            step = inner.gradient(target, phi)
            if step is None:
                raise _unconnected(j, j, "in a look-ahead step")
            phi = phi + rate * tf.convert_to_tensor(step)  # gathers give IndexedSlices
        both = surrogate(pair(phi), inner_steps)
        target = both[i]
        values = both if values is None else values
    gradient = outer.gradient(target, own)
    if gradient is None:
        raise _unconnected(i, i, "in its update")
    if inner_steps and outer.gradient(phi, own) is None:  # pruned when traced
        raise checks.ArgumentError(
            f"lola_dice_gradients: agent {j}'s look-ahead does not depend on agent {i}'s "
            f"parameters; the log-probabilities of agent {j}'s surrogate must include agent "
            f"{i}'s (log_probs[b, t] the sum of both agents')")
    return tf.convert_to_tensor(gradient), values


def lola_dice_gradients(surrogates: Callable[[Sequence[tf.Tensor], tf.Tensor], tf.Tensor],
                        params: Sequence[TensorLike], seed: Seed, inner_steps: int,
                        inner_lr: float) -> tuple:
    """Each agent's LOLA-DiCE gradient: of its surrogate at its own parameters and the
    other agent's parameters after `inner_steps` predicted steps of the other's learning.

    For agent i and the other agent j: ``phi = theta_j``; `inner_steps` times ``phi <- phi
    + inner_lr d J_j(theta_i, phi) / d phi`` on a fresh batch; then the total derivative
    of ``J_i(theta_i, phi(theta_i))`` in ``theta_i`` (through the predicted steps, nested
    tapes), on another batch. `inner_steps` = 0: the naive gradient ``d J_i / d theta_i``.
    Both gradients are taken at `params` (simultaneous learners). The batches' seeds are
    the ``2 (inner_steps + 1)`` rows of ``tf.random.experimental.stateless_split(seed)``:
    agent i's m-th batch (m = 0 to `inner_steps`, the last its own surrogate's) has row
    ``i (inner_steps + 1) + m``.

    Args:
      surrogates: ``surrogates(params, seed) -> [2]`` both agents' DiCE surrogates (each
        MAXIMIZED) on a batch drawn with `seed` (a `[2]` int64 tensor) at the values of
        `params` (a list of both agents' parameter tensors), differentiable in both, e.g.
        `joint_dice_surrogates` of `ipd_log_probs` of `sample_ipd`.
      params: agent 0's and agent 1's parameters, two floating tensors of one dtype and
        shape.
      seed: an int >= 0 or a `[2]` integer tensor.
      inner_steps: the number of predicted steps of the other agent, an int >= 0.
      inner_lr: the predicted steps' learning rate, a positive Python number applied at the
        parameters' dtype.

    Returns:
      `(gradients, values)`: the list of both agents' gradients (ascent directions, each
      its parameters' shape) and the `[2]` surrogates' values at `params` themselves (on
      agent 0's first batch).

    Raises:
      ArgumentError (a ValueError): a bad argument; or, when the gradient is taken
        (eagerly, or when traced), a surrogate that does not depend on the parameters it
        is differentiated in (naming the agent), or a look-ahead that does not depend on
        the looking agent's parameters. Dependence is the tapes' (a gradient of None): a
        surrogate that reaches a parameter only through a zero factor or slice counts as
        depending on it.
    """
    where = "lola_dice_gradients"
    surrogates = checks.function(surrogates, "surrogates", where, "surrogates(params, seed)")
    theta = _agent_params(params, where)
    inner_steps = checks.integer(inner_steps, "inner_steps", where, 0)
    rate = tf.constant(checks.positive(inner_lr, "inner_lr", where), theta[0].dtype)
    seeds = _batch_seeds(checks.stateless_seed(seed, "seed", where), inner_steps)
    gradients, values = [], None
    for i in range(2):
        def surrogate(pair, m, row=i * (inner_steps + 1)):
            return _pair(surrogates(pair, seeds[row + m]))
        gradient, first = _agent_gradient(surrogate, theta, i, inner_steps, rate)
        gradients.append(gradient)
        values = first if values is None else values
    return gradients, tf.stop_gradient(values)


def make_lola_update(env: IteratedPrisonersDilemma, batch: int, discount: float,
                     inner_steps: int, inner_lr: float, outer_lr: float,
                     baseline: str = "batch_mean", value_lr: float = 0.1,
                     value_epochs: int = 5, value_minibatch: int = 16,
                     order: str = "simultaneous") -> Callable:
    """A compiled LOLA-DiCE update of two tabular agents on the iterated prisoner's dilemma.

    ``update(params, seed) -> (params, returns)``, `params` a `LolaParams` of the
    environment's dtype, `seed` a `[2]` int64 tensor. With `baseline` "value" the value
    heads are first fitted as the reference does (`value_epochs` times: a fresh batch at
    the agents' policies, then one epoch of `fit_ipd_values` at `value_lr`, minibatches of
    `value_minibatch` steps; seeds folded from `seed` apart from the gradients'). Then the
    agents ascend their LOLA-DiCE gradients (batches of `batch` games from `sample_ipd`,
    surrogates `joint_dice_surrogates` with `ipd_values` of the fitted heads, the batches'
    seeds as `lola_dice_gradients` splits them) by `outer_lr` times the gradient, in
    `order`:

    - "simultaneous": both gradients at `params`, `lola_dice_gradients`' (the LOLA
      papers' definition).
    - "sequential": the reference's (alshedivat/lola, `lola_dice/rpg.py`, `train`, which
      runs agent 0's update op, then agent 1's in the same graph). Agent 0 steps first,
      exactly as in "simultaneous". Agent 1's batches are the ones "simultaneous" draws
      (every draw at the old parameters: its look-ahead's at agent 0's parameters
      predicted from agent 0's old ones), but its surrogates' log-probabilities, and so
      its predicted steps of agent 0, which start from agent 0's parameters, read agent
      0's updated parameters: its gradient is its look-ahead gradient at (agent 0's new,
      agent 1's old) parameters, on batches drawn before agent 0's step and not reweighted.
      It estimates no derivative at those parameters: a baseline's terms no longer vanish
      in expectation, and with the value baseline (uncentred returns) agent 1's first step
      can saturate its policy (a logit moved by 138 to 7,810 in `configs/rl/lola_dice.gin`'s
      seeds 0-4; the reference's published runs use the batch mean).

    It is traced once (an input signature) and the same arguments give the same result.
    `returns` is `[2]`, each agent's discounted return at `params` normalized to a
    per-step mean, ``sum_t discount**t r_t / sum_t discount**t`` (batch mean of agent 0's
    first batch; the reference reports ``(1 - discount) sum_t discount**t r_t``, 0.2%
    smaller at T = 150, discount 0.96). `inner_steps` = 0: naive learners.

    Where it differs from the reference: float64 by default (the reference float32); every
    draw and the value minibatches' order come from `seed` (the reference's from unseeded
    generators); the reference's `train` fits its value heads for `value_epochs` = 5
    epochs and its IPD script, which runs the batch mean (`use_baseline=False`), sets
    minibatches of 16 steps.

    Args:
      env: the game, an `IteratedPrisonersDilemma` (its horizon is T, its dtype the
        parameters').
      batch: games per batch, an int >= 1 (64 in LOLA-DiCE).
      discount: the discount, a Python number in (0, 1] (0.96).
      inner_steps: predicted steps of the other agent, an int >= 0 (2 or 3).
      inner_lr: the predicted steps' learning rate, a positive Python number (0.1).
      outer_lr: the agents' learning rate, a positive Python number (0.2).
      baseline: "value", "batch_mean" or "none", see `joint_dice_surrogates`.
      value_lr: the value heads' learning rate, a positive Python number (0.1).
      value_epochs: value-fitting epochs per update, an int >= 1 (5).
      value_minibatch: steps per value minibatch, an int >= 1 (16).
      order: "simultaneous" or "sequential" (the reference's), see above.

    Returns:
      The `tf.function` `update`.

    Raises:
      ArgumentError: an argument out of range.
    """
    where = "make_lola_update"
    env = _ipd(env, where)
    batch = checks.integer(batch, "batch", where, 1)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    inner_steps = checks.integer(inner_steps, "inner_steps", where, 0)
    inner_lr = checks.positive(inner_lr, "inner_lr", where)
    outer_lr = checks.positive(outer_lr, "outer_lr", where)
    baseline = checks.choice(baseline, BASELINES, "baseline", where)
    checks.positive(value_lr, "value_lr", where)
    value_epochs = checks.integer(value_epochs, "value_epochs", where, 1)
    value_minibatch = checks.integer(value_minibatch, "value_minibatch", where, 1)
    order = checks.choice(order, ORDERS, "order", where)
    scale = sum(discount ** t for t in range(env.horizon))

    def fit(policy, value, seed):
        seeds = tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(seed, 1), 2 * value_epochs)
        for e in range(value_epochs):
            games = sample_ipd(env, tf.unstack(policy), seeds[2 * e], batch)
            value = fit_ipd_values(value, games.states, games.rewards, discount, value_lr,
                                   value_minibatch, seeds[2 * e + 1])
        return value

    spec = LolaParams(tf.TensorSpec([2, STATES], env.dtype),
                      tf.TensorSpec([2, STATES + 1], env.dtype))

    @tf.function(input_signature=[spec, tf.TensorSpec([2], tf.int64)], autograph=False)
    def update(params, seed):
        value = params.value
        if baseline == "value":
            value = fit(params.policy, value, seed)

        def on(policy, games):
            values = ipd_values(value, games.states) if baseline == "value" else None
            return joint_dice_surrogates(ipd_log_probs(policy, games.states, games.actions),
                                         games.rewards, discount, baseline, values)

        seeds = _batch_seeds(seed, inner_steps)
        drawn = [{}, {}]  # agent i's batch m, as drawn

        def drawing(i):
            def surrogate(policy, m):
                drawn[i][m] = sample_ipd(env, policy, seeds[i * (inner_steps + 1) + m], batch)
                return on(policy, drawn[i][m])
            return surrogate

        theta = tf.unstack(params.policy)
        rate, step = (tf.constant(x, env.dtype) for x in (inner_lr, outer_lr))
        gradient0, values = _agent_gradient(drawing(0), theta, 0, inner_steps, rate)
        gradient1, _ = _agent_gradient(drawing(1), theta, 1, inner_steps, rate)
        new0 = theta[0] + step * gradient0
        if order == "sequential":  # the pass above drew agent 1's batches; its gradient unused
            gradient1, _ = _agent_gradient(lambda policy, m: on(policy, drawn[1][m]),
                                           [new0, theta[1]], 1, inner_steps, rate)
        new = tf.stack([new0, theta[1] + step * gradient1])
        return LolaParams(new, value), tf.stop_gradient(values) / tf.constant(scale, env.dtype)

    return update
