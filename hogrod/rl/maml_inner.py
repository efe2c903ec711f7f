"""MAML-RL's inner step: `hogrod.meta.adapt` on a DiCE objective, and the per-task statistics
it and the outer step take from a task's episodes.

The inner step is the meta family's inner loop (`hogrod.meta.adapt`, the primitive
supervised MAML adapts with) given a per-task objective instead of a Keras loss: one task's
episodes, the baseline's values on them and a constant scale are the support set, and the
objective is the negative of `dice_surrogate` (maximized) times the scale. Taken under outer
tapes its derivatives are DiCE's, every order unbiased.

The scale is pytorch-maml-rl's: its inner loss is a time average of normalized advantages,
so its step size of 0.1 means a step on ``1 / (mean episode length * std(advantages))``
times the summed, unnormalized surrogate (`inner_scales`).
"""

from typing import Optional

import keras
import tensorflow as tf

from hogrod import checks, taskmap
from hogrod.meta import inner
from hogrod.rl.estimators import dice_surrogate
from hogrod.rl.returns import LinearFeatureBaseline, discounted_returns, gae_advantages
from hogrod.rl.rollout import Trajectories, policy_distribution
from hogrod.types import Params

__all__ = ["inner_step", "baseline_values", "inner_scales", "outer_advantages",
           "masked_mean"]


def masked_mean(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """The mean of `x` over the steps where `mask` is 1 (0 where there are none).

    Args:
      x: a tensor.
      mask: a 0/1 tensor of `x`'s shape and dtype.

    Returns:
      A scalar.
    """
    return tf.reduce_sum(x * mask) / tf.maximum(tf.reduce_sum(mask), tf.ones([], mask.dtype))


def _check_episodes(episodes, where):
    """One task's episodes (`[batch, T]` rewards), or an error naming `episodes`."""
    rewards = getattr(episodes, "rewards", None)
    if not isinstance(episodes, Trajectories) or rewards is None:
        raise checks.ArgumentError(f"{where}: episodes must be one task's rl.Trajectories "
                                   f"([batch, T] fields), got {type(episodes).__name__}")
    if rewards.shape.rank != 2:
        hint = (" (rollout's [tasks, batch, T] output: pass one task's, "
                "rl.Trajectories(*[f[i] for f in episodes]), or map over the tasks)"
                if rewards.shape.rank == 3 else "")
        raise checks.ArgumentError(
            f"{where}: episodes must be one task's Trajectories, rewards of shape "
            f"[batch, T]; got rewards of shape {rewards.shape.as_list()}{hint}")


def _dice_objective(policy, discount, gae_lambda):
    """`objective(params, (episodes, values, scale))`: minus `scale` (held constant) times
    the DiCE surrogate of the episodes' log-probabilities under `params`."""
    def objective(params, support):
        episodes, values, scale = support
        dist = policy_distribution(policy, episodes.observations, params)
        surrogate = dice_surrogate(dist.log_prob(episodes.actions), episodes.rewards,
                                   discount, values, gae_lambda, episodes.mask)
        if scale is not None:
            # a Python number at the surrogate's dtype, never through float32
            surrogate = surrogate * tf.stop_gradient(inner.as_dtype(scale, surrogate.dtype))
        return -surrogate
    return objective


def inner_step(policy: keras.Model, params: Params, episodes: Trajectories, inner_lr: float,
               discount: float, values: Optional[tf.Tensor] = None,
               gae_lambda: float = 1.0, scale: Optional[tf.Tensor] = None) -> list:
    """One policy-gradient step on the DiCE objective of one task's episodes.

    ``params + inner_lr * scale * grad dice_surrogate(log_probs(params), rewards, discount,
    values, gae_lambda, mask)``, the log-probabilities recomputed from the episodes'
    observations and actions through ``policy.distribution(observations, params)``: one
    step of `hogrod.meta.adapt` on the objective ``-scale * dice_surrogate``. Taken under
    outer tapes, its derivatives are DiCE's, every order unbiased.

    Args:
      policy: a built policy with `distribution(observations, params)`.
      params: tensors for `policy.trainable_variables`, in their order.
      episodes: one task's `Trajectories`, `[batch, T, ...]` fields.
      inner_lr: the inner step, a Python number > 0 (applied at each parameter's dtype).
      discount: the discount in (0, 1].
      values: optional `[batch, T]` baseline values (Loaded DiCE); None: DiCE.
      gae_lambda: GAE's lambda of Loaded DiCE's advantages, in [0, 1].
      scale: None (1) or a positive scalar multiplying the objective (a Python number,
        checked, applied at the parameters' dtype; or a tensor), held constant (no
        gradient flows through it): `MamlRL` takes `inner_scales`, so an inner rate means
        what it means with pytorch-maml-rl's normalized, time-averaged inner loss.

    Returns:
      The adapted parameters, a list like `params`.

    Raises:
      ArgumentError: `inner_lr` or a number `scale` not > 0, episodes that are not one task's (rollout's
        `[tasks, batch, T]` output included), bad episodes (see `dice_surrogate`), or
        log-probabilities that do not depend on a parameter (its step would be a silent
        zero; the message names it: the policy's `distribution` must use `params`).
    """
    where = "inner_step"
    inner_lr = checks.positive(inner_lr, "inner_lr", where)
    if scale is not None and not isinstance(scale, (tf.Tensor, tf.Variable)):
        scale = checks.positive(scale, "scale", where)
    _check_episodes(episodes, where)
    params = [tf.convert_to_tensor(p) for p in params]
    return inner.adapt(policy, None, (episodes, values, scale), inner_lr, 1, params=params,
                       objective=_dice_objective(policy, discount, gae_lambda))


def baseline_values(baseline: LinearFeatureBaseline, episodes: Trajectories,
                    discount: float) -> tf.Tensor:
    """The baseline fitted to each task's episodes (their discounted returns), its values.

    Args:
      baseline: the `LinearFeatureBaseline`.
      episodes: `Trajectories` with a leading task axis.
      discount: the discount of the returns it is fitted to.

    Returns:
      `[tasks, batch, T]` values.
    """
    def one(e):
        obs, r, m = e
        c = baseline.solve(obs, discounted_returns(r, discount, m), m)
        return baseline.predict(obs, m, c)
    return taskmap.vectorized_map(one, (episodes.observations, episodes.rewards,
                                        episodes.mask))


def inner_scales(episodes: Trajectories, values: tf.Tensor, discount: float,
                 gae_lambda: float) -> tf.Tensor:
    """Each task's inner scale, ``1 / (mean episode length * (std(A) + 1e-8))``.

    The mean episode length is the unmasked steps over the episodes (``sum(mask) /
    batch``); ``A`` the GAE advantages of the values, their standard deviation over the
    unmasked steps (the population one).

    Args:
      episodes: `Trajectories` with a leading task axis.
      values: `[tasks, batch, T]` the baseline's values.
      discount: the discount.
      gae_lambda: GAE's lambda.

    Returns:
      `[tasks]` scales, constants (no gradient).
    """
    def one(a):
        r, v, m = a
        adv = gae_advantages(r, v, discount, gae_lambda, m)
        std = tf.sqrt(masked_mean(tf.square(adv - masked_mean(adv, m)), m))
        length = tf.reduce_sum(m) / tf.cast(tf.shape(m)[0], m.dtype)
        return 1.0 / (length * (std + tf.constant(1e-8, m.dtype)))
    return tf.stop_gradient(taskmap.vectorized_map(one, (episodes.rewards, values,
                                                         episodes.mask)))


def outer_advantages(baseline: LinearFeatureBaseline, episodes: Trajectories,
                     discount: float, gae_lambda: float, normalize: bool) -> tf.Tensor:
    """Each task's advantages of the post-adaptation episodes (the baseline refitted to
    them, GAE), optionally normalized per task over the unmasked steps.

    Args:
      baseline: the `LinearFeatureBaseline`.
      episodes: `Trajectories` with a leading task axis.
      discount: the discount.
      gae_lambda: GAE's lambda.
      normalize: mean 0 and standard deviation 1 per task (0 where masked).

    Returns:
      `[tasks, batch, T]` advantages, constants.
    """
    def one(a):
        obs, r, m = a
        c = baseline.solve(obs, discounted_returns(r, discount, m), m)
        adv = gae_advantages(r, baseline.predict(obs, m, c), discount, gae_lambda, m)
        if normalize:
            mean = masked_mean(adv, m)
            std = tf.sqrt(masked_mean(tf.square(adv - mean), m))
            adv = m * (adv - mean) / (std + tf.constant(1e-8, adv.dtype))
        return adv
    return tf.stop_gradient(taskmap.vectorized_map(
        one, (episodes.observations, episodes.rewards, episodes.mask)))
