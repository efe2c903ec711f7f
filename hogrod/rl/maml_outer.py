"""MAML-RL's outer step: the surrogate and the mean KL through the inner step, TRPO or
Adam on the clipped surrogate.

The outer step improves the mean over tasks of the importance-weighted surrogate
``mean_t ratio_t A_t`` (``ratio = pi_theta'(theta)(a|s) / pi_old(a|s)`` on the post-
adaptation episodes, ``theta'(theta)`` recomputed from the fixed inner episodes by the inner
step), by

- `outer="trpo"`: TRPO (`hogrod.rl.trpo`): the natural gradient by CG on Fisher-vector
  products, `hogrod.hvp` of the mean KL(old || new) from the sampling policy (through the
  inner step, as pytorch-maml-rl), then a backtracking line search on the KL and the
  surrogate;
- `outer="clip"`: `outer_steps` Adam steps on the clipped surrogate ``mean_t min(ratio_t
  A_t, clip(ratio_t, 1 - clip, 1 + clip) A_t)`` (ProMP's, without its inner KL penalty).

Under a `tf.distribute` strategy every gradient, Fisher-vector product, surrogate and KL is
the mean over the replicas of each replica's mean over its tasks; the CG and line-search
loops run once on the reduced values.
"""

from typing import Any, Dict, Tuple

import tensorflow as tf

from hogrod import taskmap, tree
from hogrod.autodiff import hvp
from hogrod.rl.maml_inner import inner_step, masked_mean
from hogrod.rl.rollout import Trajectories, policy_distribution
from hogrod.rl.trpo import line_search, natural_step
from hogrod.types import Params

__all__ = ["OUTER_STEPS", "OuterStep"]

OUTER_STEPS = ("trpo", "clip")


class OuterStep:
    """The outer step of `hogrod.rl.MamlRL` (which it is a base of; see the module
    docstring): `surrogate_and_kl` and the TRPO or clipped-surrogate update, on the
    learner's settings (`policy`, `inner_lr`, `discount`, `gae_lambda`, `adapt`, `clip`,
    `task_map`, `outer`, TRPO's and Adam's settings, `strategy`)."""

    policy: Any
    strategy: Any

    def surrogate_and_kl(self, data: Any, params: Params, clipped: bool = False
                         ) -> Tuple[tf.Tensor, tf.Tensor]:
        """The mean over the tasks of the surrogate (MAXIMIZED) and of the mean KL from the
        sampling policy, KL(old || new), the adaptation recomputed from `params` on the
        fixed episodes.

        Args:
          data: a `MetaBatch` (one replica's tasks).
          params: the policy's parameters (list of tensors).
          clipped: the clipped surrogate instead of the importance-weighted one.

        Returns:
          `(surrogate, kl)`, scalars of the parameters' dtype.
        """
        def one(a, _, params):
            inner, values, scale, outer, adv, old = a
            fast = inner_step(self.policy, params, Trajectories(*inner), self.inner_lr,
                              self.discount, values, self.gae_lambda, scale
                              ) if self.adapt else params
            dist = policy_distribution(self.policy, outer.observations, fast)
            ratio = tf.exp(dist.log_prob(outer.actions) - outer.log_probs)
            gain = ratio * adv
            if clipped:
                low = tf.constant(1.0 - self.clip, ratio.dtype)
                high = tf.constant(1.0 + self.clip, ratio.dtype)
                gain = tf.minimum(gain, tf.clip_by_value(ratio, low, high) * adv)
            kl = type(dist)(*old).kl(dist)
            return masked_mean(gain, outer.mask), masked_mean(kl, outer.mask)
        surrogate, kl = taskmap.map_tasks(
            one, (data.inner, data.inner_values, data.inner_scale, data.outer,
                  data.advantages, data.old), params=params, mode=self.task_map)
        return tf.reduce_mean(surrogate), tf.reduce_mean(kl)

    def _gradient(self, data, params, clipped):
        with tf.GradientTape() as tape:
            tape.watch(params)
            surrogate, kl = self.surrogate_and_kl(data, params, clipped)
        return tape.gradient(surrogate, params), surrogate, kl

    def _fvp(self, data, params, v):
        return hvp(lambda: self.surrogate_and_kl(data, params)[1], params, v, self.hvp_mode)

    def _mean(self, fn, *args):
        """fn on every replica, each output the mean over the replicas."""
        out = self.strategy.run(fn, args=args)
        return tf.nest.map_structure(
            lambda t: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, t, axis=None), out)

    def _outer_step(self, data, params) -> Dict[str, tf.Tensor]:
        """The outer update from `params` on the episodes `data`, assigned to the policy's
        variables; the step's logs."""
        def returns(episodes):
            return tf.reduce_mean(tf.reduce_sum(episodes.rewards * episodes.mask, -1))
        before, after = self._mean(lambda d: (returns(d.inner), returns(d.outer)), data)
        logs = {"return_before": before, "return_after": after}
        if self.outer == "trpo":
            new = self._trpo(data, params, logs)
        else:
            new = self._clipped(data, params, logs)
        for v, p in zip(self.variables, new):
            v.assign(p)
        return logs

    def _trpo(self, data, params, logs):
        g, surrogate, _ = self._mean(lambda d: self._gradient_fn(d, params), data)
        step, info = natural_step(
            g, lambda v: self._mean(lambda d, v: self._fvp_fn(d, params, v), data, v),
            self.max_kl, self.cg_maxiter, self.damping)
        new, search = line_search(
            lambda c: self._mean(lambda d, c: self._evaluate_fn(d, c), data, c),
            params, step, surrogate, self.max_kl, self.line_search_maxiter,
            self.backtrack_ratio)
        logs.update(surrogate_before=surrogate, surrogate=search.surrogate, kl=search.kl,
                    accepted=tf.cast(search.accepted, self.dtype),
                    step_fraction=search.fraction, cg_iterations=info.iterations)
        return new

    def _clipped(self, data, params, logs):
        new, state = params, tf.nest.map_structure(tf.convert_to_tensor, self.optimizer_state)
        for k in range(self.outer_steps):
            g, surrogate, kl = self._mean(self._clipped_gradient_fn, data, new)
            if k == 0:
                logs["surrogate_before"] = surrogate
            new, state = self.optimizer.update(tree.scale(-1.0, g), state, new)
        tf.nest.map_structure(lambda v, t: v.assign(t), self.optimizer_state, state)
        surrogate, kl = self._mean(lambda d, c: self.surrogate_and_kl(d, c, True), data, new)
        logs.update(surrogate=surrogate, kl=kl)
        return new
