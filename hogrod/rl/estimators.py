"""Score-function estimators of every order: DiCE's magic box and objective, and Loaded
DiCE with a baseline.

The expected discounted return ``J(theta) = E[sum_t discount**t r_t]`` of trajectories
sampled from a policy has no derivative a tape can see: the samples do not depend on the
parameters. `dice_surrogate` builds a scalar whose value is the sample return and whose
derivatives of every order, taken with nested `tf.GradientTape`s, are unbiased estimates of
J's derivatives (Foerster et al. 2018, "DiCE: The Infinitely Differentiable Monte Carlo
Estimator"). A surrogate ``sum_t log_prob_t * R`` has the right first derivative only; its
second already misses terms.
"""

from typing import Optional

import tensorflow as tf

from hogrod import checks
from hogrod.rl.returns import _advantages, _masked, _powers
from hogrod.types import TensorLike

__all__ = ["magic_box", "dice_surrogate"]


def magic_box(x: TensorLike) -> tf.Tensor:
    """DiCE's magic box, ``exp(x - stop_gradient(x))``.

    Its value is exactly 1 and its derivatives of every order, under nested tapes, are those
    of ``exp(x - x0)`` at ``x0 = x``: the first is ``dx``, the second ``dx dx + d2x``, and so
    on. Applied to a sum of log-probabilities it weights a sampled cost by the likelihood
    ratio of the choices it depends on, to every order.

    Args:
      x: a floating tensor of any shape (a sum of log-probabilities).

    Returns:
      A tensor of ones of `x`'s shape and dtype.

    Raises:
      ArgumentError: `x` is not floating.
    """
    x = checks.floating(x, "x", "magic_box")
    return tf.exp(x - tf.stop_gradient(x))


def dice_surrogate(log_probs: TensorLike, rewards: TensorLike, discount: float = 1.0,
                   values: Optional[TensorLike] = None, gae_lambda: float = 1.0,
                   mask: Optional[TensorLike] = None) -> tf.Tensor:
    """The DiCE objective of a batch of trajectories: a scalar to be MAXIMIZED (its negative
    is the objective to minimize).

    Without `values` (DiCE): ``mean_b sum_t discount**t r_t magic_box(w_t)`` with
    ``w_t = sum_{t'<=t} log_probs_t'``, the log-probability of every choice the reward at t
    depends on. Its derivatives of every order with respect to the parameters behind
    `log_probs` are unbiased estimates of those of the expected discounted return.

    With `values` (Loaded DiCE, Farquhar et al. 2019): ``mean_b sum_t discount**t
    (magic_box(w_t) - magic_box(w_{t-1})) A_t`` (``w_{-1} = 0``) with the advantages ``A_t``
    of `gae_advantages(rewards, values, discount, gae_lambda, mask)`, plus the sample return
    as a constant (no derivative). With `gae_lambda` = 1 the derivatives of every order have
    the same expectations as DiCE's (the baseline ``V(s_t)`` subtracts nothing in
    expectation), with a lower variance for a good baseline; `gae_lambda` < 1 trades bias for
    variance as GAE does, every order biased unless `values` are the true values.

    The value is in both cases the batch mean of the discounted return ``sum_t discount**t
    r_t`` (magic boxes are 1; the loaded terms sum to 0), so it can be logged as the return.

    Args:
      log_probs: `[batch, T]` floating tensor: `log_probs[b, t]` is the sum of the
        log-probabilities of every stochastic choice made at step t (the action taken; both
        agents' actions in a two-agent game), differentiable in the parameters.
      rewards: `[batch, T]` rewards of `log_probs`' dtype: constants (the reward at t
        follows the choices at t).
      discount: the discount, a Python number in (0, 1], applied at `log_probs`' dtype.
      values: optional `[batch, T]` baseline values ``V(s_t)`` (constants, no gradient
        flows into them): None is DiCE, a tensor Loaded DiCE.
      gae_lambda: GAE's lambda in [0, 1] for the advantages of Loaded DiCE (1: unbiased at
        every order); only used with `values`.
      mask: optional `[batch, T]` mask of `log_probs`' dtype, 1 before an episode ends and
        0 after (only 0 and 1, non-increasing in time): log-probabilities, rewards and
        values after the end are ignored (they may hold anything, -inf and NaN included):
        they are replaced by 0 with `tf.where` before any arithmetic, so the value and the
        derivatives in `log_probs` are those of the same batch with 0 there. A NaN made
        upstream of `log_probs` (``log(0)``'s infinite derivative times the 0 that flows
        back) is the caller's to avoid, by a `tf.where` before the log.

    Returns:
      A scalar of `log_probs`' dtype, to be maximized.

    Raises:
      ArgumentError: `log_probs`, `rewards`, `values` or `mask` not floating `[batch, T]`
        tensors of one shape and dtype, an empty batch (batch or T 0; in a graph with an
        unknown shape, an assertion), `discount` not in (0, 1], `gae_lambda` not in
        [0, 1], or a mask with other values than 0 and 1 or increasing in time (eagerly,
        or when traced for a constant mask; for a mask computed in a graph an assertion
        fails when the graph runs, and XLA, `jit_compile=True`, drops it).
    """
    where = "dice_surrogate"
    lp = checks.floating(log_probs, "log_probs", where)
    lp = checks.like(lp, "log_probs", where, lp, "log_probs", rank=2)
    r = checks.like(rewards, "rewards", where, lp, "log_probs", rank=2)
    v = None if values is None else checks.like(values, "values", where, lp, "log_probs",
                                                  rank=2)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    gae_lambda = checks.probability(gae_lambda, "gae_lambda", where)
    mask = checks.mask_of(mask, where, lp, "log_probs")
    # an empty batch's mean is NaN: no trajectory (batch 0) or no step (T 0) is an error
    shape = tf.shape(lp)
    nonempty = checks.require(lambda n: tf.reduce_all(n > 0), f"{where}: log_probs has shape "
                              f"{lp.shape.as_list()}; it needs at least one trajectory "
                              "(batch >= 1) and one step (T >= 1)", shape, data=[shape])
    with tf.control_dependencies(nonempty):
        lp = tf.identity(lp)
    lp, r = _masked(lp, mask), tf.stop_gradient(_masked(r, mask))
    weights = _powers(discount, tf.shape(lp)[1], lp.dtype)[None, :]
    dependencies = tf.cumsum(lp, axis=1)
    if v is None:
        return tf.reduce_mean(tf.reduce_sum(weights * r * magic_box(dependencies), axis=1))
    advantages = _advantages(r, tf.stop_gradient(v), discount, gae_lambda, mask)
    earlier = tf.cumsum(lp, axis=1, exclusive=True)
    loaded = weights * (magic_box(dependencies) - magic_box(earlier)) * advantages
    sample_return = tf.reduce_sum(weights * r, axis=1)
    return tf.reduce_mean(tf.stop_gradient(sample_return) + tf.reduce_sum(loaded, axis=1))
