"""MAML for reinforcement learning (Finn et al. 2017) with DiCE inner steps.

Each meta-iteration samples a meta-batch of tasks; for each task (vectorized over the
tasks, `tf.vectorized_map`; the meta-gradient's map as `task_map` says) it

1. rolls out `batch` episodes with the policy's parameters theta,
2. fits the linear feature baseline to them and takes the inner step
   ``theta' = theta + step_size scale grad dice_surrogate`` (`inner_step`): Loaded DiCE
   with the baseline's values, scaled by 1 / (mean episode length * the advantages'
   standard deviation) held constant (pytorch-maml-rl's inner loss is a time average of
   normalized advantages, the scale its step size of 0.1 is meant for), so the
   meta-gradient through ``theta'`` has every second-order term of the expected return
   (the score of the inner episodes' distribution included),
3. rolls out `batch` episodes with ``theta'`` and computes their advantages (the
   baseline fitted to them, GAE with `gae_lambda`, optionally normalized).

With `adapt=False` training takes no inner step: the episodes of step 1 are the outer
step's, with ``theta'`` = theta (the MAML paper's "pretrained" policy, trained by the same
TRPO on every task; with a goal-observing environment, its oracle). Evaluation adapts
either way.

The outer step improves the mean over tasks of the importance-weighted surrogate
``mean_t ratio_t A_t`` (``ratio = pi_theta'(theta)(a|s) / pi_old(a|s)`` on the post-
adaptation episodes, ``theta'(theta)`` recomputed from the fixed inner episodes), by

- `outer="trpo"`: TRPO (`hogrod.rl.trpo`): the natural gradient by CG on Fisher-vector
  products, `hogrod.hvp` of the mean KL from the sampling policy (through the inner step,
  as pytorch-maml-rl), then a backtracking line search on the KL and the surrogate;
- `outer="clip"`: `outer_steps` Adam steps on the clipped surrogate ``mean_t min(ratio_t
  A_t, clip(ratio_t, 1 - clip, 1 + clip) A_t)`` (ProMP's, without its inner KL penalty).

Under a `tf.distribute` strategy the tasks are split over the replicas (the meta-batch
divides by their count); every gradient, Fisher-vector product, surrogate and KL is the
mean over the replicas of each replica's mean over its tasks, the CG and line-search loops
run once on the reduced values. A task's draws come from the iteration's seed folded with
the task's index in the meta-batch, so a step equals one device's on the same tasks.

An environment with `make_envs(num_envs)` (`hogrod.rl.HalfCheetahTasks`) is stepped on the
host: its episodes come from `gym_rollout` on a `gymnasium` vector environment of ``tasks *
batch`` sub-environments (made once per task count), seeded as `rollout`, outside the
compiled step; the baseline, the inner step and the outer step are compiled on them (one
replica).
"""

from typing import Any, Dict, NamedTuple, Optional

import keras
import tensorflow as tf

from hogrod import checks, distribute, optim, tree
from hogrod.autodiff import HVP_MODES, hvp
from hogrod.meta.common import map_tasks
from hogrod.rl.estimators import dice_surrogate
from hogrod.rl.gym import gym_rollout
from hogrod.rl.returns import LinearFeatureBaseline, discounted_returns, gae_advantages
from hogrod.rl.rollout import Trajectories, policy_distribution, rollout
from hogrod.rl.trpo import line_search, natural_step
from hogrod.types import Params, Tree

__all__ = ["inner_step", "MetaBatch", "MamlRL", "OUTER_STEPS", "TASK_MAPS"]

OUTER_STEPS = ("trpo", "clip")
TASK_MAPS = ("vectorized", "sequential")


def _mean(x, mask):
    return tf.reduce_sum(x * mask) / tf.maximum(tf.reduce_sum(mask), tf.ones([], mask.dtype))


def inner_step(policy: keras.Model, params: Params, episodes: Trajectories, step_size: float,
               discount: float, values: Optional[tf.Tensor] = None,
               gae_lambda: float = 1.0, scale: Optional[tf.Tensor] = None) -> list:
    """One policy-gradient step on the DiCE objective of one task's episodes.

    ``params + step_size * scale * grad dice_surrogate(log_probs(params), rewards,
    discount, values, gae_lambda, mask)``, the log-probabilities recomputed from the episodes'
    observations and actions through ``policy.distribution(observations, params)``. Taken
    under outer tapes, its derivatives are DiCE's, every order unbiased.

    Args:
      policy: a built policy with `distribution(observations, params)`.
      params: tensors for `policy.trainable_variables`, in their order.
      episodes: one task's `Trajectories`, `[batch, T, ...]` fields.
      step_size: the inner step, a Python number > 0 (applied at each parameter's dtype).
      discount: the discount in (0, 1].
      values: optional `[batch, T]` baseline values (Loaded DiCE); None: DiCE.
      gae_lambda: GAE's lambda of Loaded DiCE's advantages, in [0, 1].
      scale: None (1) or a positive scalar multiplying the objective, held constant (no
        gradient flows through it): `MamlRL` divides by the mean episode length times the
        advantages' standard deviation, so a step size means what it means with
        pytorch-maml-rl's normalized, time-averaged inner loss.

    Returns:
      The adapted parameters, a list like `params`.

    Raises:
      ValueError: the log-probabilities do not depend on a parameter (its gradient would
        be a silent zero): the message names it (the policy's `distribution` must use
        `params`).
      ArgumentError: `step_size` not > 0, or bad episodes (see `dice_surrogate`).
    """
    step_size = checks.positive(step_size, "step_size", "inner_step")
    params = [tf.convert_to_tensor(p) for p in params]
    with tf.GradientTape() as tape:
        tape.watch(params)
        dist = policy_distribution(policy, episodes.observations, params)
        objective = dice_surrogate(dist.log_prob(episodes.actions), episodes.rewards,
                                   discount, values, gae_lambda, episodes.mask)
        if scale is not None:
            objective = objective * tf.stop_gradient(tf.cast(scale, objective.dtype))
    grads = tape.gradient(objective, params)
    for g, v in zip(grads, policy.trainable_variables):
        if g is None:
            raise ValueError(
                f"inner_step: the log-probabilities do not depend on parameter {v.path!r}, so "
                "its inner gradient would be zero: the policy's distribution(observations, "
                "params) must compute them from params")
    return [p + tf.constant(step_size, p.dtype) * g for p, g in zip(params, grads)]


class MetaBatch(NamedTuple):
    """The episodes of one meta-iteration, every field with a leading task axis.

    Attributes:
      inner: the `Trajectories` sampled with the current parameters (the inner step's).
      inner_values: `[tasks, batch, T]` the baseline's values on them.
      inner_scale: `[tasks]` the inner objective's scale (`inner_step`'s `scale`).
      outer: the `Trajectories` sampled with each task's adapted parameters.
      advantages: `[tasks, batch, T]` their advantages (constants).
      old: the sampling distribution's fields on the outer observations (a tuple of
        `[tasks, batch, T, n]` tensors), the KL's fixed side.
    """

    inner: Trajectories
    inner_values: tf.Tensor
    inner_scale: tf.Tensor
    outer: Trajectories
    advantages: tf.Tensor
    old: tuple


class MamlRL:
    """MAML-RL's meta-training step and evaluation on a batched environment.

    Args:
      env: a `hogrod.rl` environment (`sample_tasks`, `reset`, `step`, `horizon`,
        `observation_dim`), or one with `make_envs(num_envs)` stepped on the host
        (`sample_tasks`, `horizon`, `observation_dim`; see the module docstring).
      policy: a built policy of the environment's dtype, created under `strategy.scope()`
        when a strategy is given.
      meta_batch: tasks per meta-iteration, an int >= 1 divisible by the replicas.
      batch: episodes per task and per rollout, an int >= 1 (20 in MAML).
      horizon: steps per episode; None: `env.horizon`.
      step_size: the inner step, > 0 (0.1 for 2D navigation).
      discount: the discount in (0, 1] (0.99).
      gae_lambda: GAE's lambda, in [0, 1], of the inner Loaded DiCE and the outer
        advantages (1.0).
      normalize_advantages: whether the outer advantages are normalized per task (mean 0,
        standard deviation 1 over the unmasked steps), as pytorch-maml-rl.
      outer: "trpo" or "clip" (see the module docstring).
      max_kl: TRPO's KL bound, > 0 (0.01).
      cg_maxiter: TRPO's CG iterations, >= 1 (10).
      damping: TRPO's Fisher damping, >= 0 (1e-5).
      line_search_steps: TRPO's backtracking tries, >= 1 (15).
      backtrack_ratio: TRPO's backtracking factor in (0, 1) (0.8).
      clip: the clipped surrogate's epsilon, in (0, 1) ("clip" only).
      outer_lr: the clipped surrogate's Adam step size, > 0 ("clip" only).
      outer_steps: Adam steps on each meta-batch, >= 1 ("clip" only).
      reg_coeff: the baseline's first ridge regularization, > 0.
      hvp_mode: `hogrod.hvp`'s mode for the Fisher-vector products; with
        `task_map="sequential"` "auto" is "reverse_over_reverse".
      strategy: None (the current strategy) or a `tf.distribute.Strategy`.
      adapt: whether training takes the inner step (MAML-RL); False: the outer step on the
        unadapted policy's episodes (see the module docstring).
      task_map: how the surrogate and the KL (the meta-gradient, the Fisher-vector
        products) map over the tasks: "vectorized" (`tf.vectorized_map`) or "sequential"
        (`tf.map_fn`, tasks in parallel iterations), as the meta family's `task_map`
        (`hogrod.meta.common.map_tasks`). The same numbers up to rounding; on CPU
        "sequential" computed the 2D-navigation meta-gradient faster (`pfor`'s batched
        products of the inner step's second-order graph cost more than they save there),
        unless `jit_compile`.
      jit_compile: compile the meta-gradient, the Fisher-vector products and the line
        search's surrogate with XLA (the rollouts and the outer loop stay outside). On
        CPU, with "vectorized", XLA fuses the batched products' elementwise work: the
        2D-navigation meta-gradient ran about 1.6x as fast; the first meta-iteration
        compiles for seconds.

    Raises:
      ArgumentError: an argument out of range, `outer` not one of `OUTER_STEPS`,
        `hvp_mode` not "auto" or one of `hogrod.autodiff.HVP_MODES`, `task_map` not
        "vectorized" or "sequential", or a host environment under a strategy of several
        replicas.
    """

    def __init__(self, env: Any, policy: keras.Model, meta_batch: int = 20, batch: int = 20,
                 horizon: Optional[int] = None, step_size: float = 0.1,
                 discount: float = 0.99, gae_lambda: float = 1.0,
                 normalize_advantages: bool = True, outer: str = "trpo",
                 max_kl: float = 0.01, cg_maxiter: int = 10, damping: float = 1e-5,
                 line_search_steps: int = 15, backtrack_ratio: float = 0.8,
                 clip: float = 0.2, outer_lr: float = 1e-3, outer_steps: int = 5,
                 reg_coeff: float = 1e-5, hvp_mode: str = "auto",
                 strategy: Optional[tf.distribute.Strategy] = None,
                 adapt: bool = True, task_map: str = "vectorized",
                 jit_compile: bool = False) -> None:
        where = "MamlRL"
        self.task_map = checks.choice(task_map, TASK_MAPS, "task_map", where)
        hvp_mode = checks.choice(hvp_mode, ("auto",) + HVP_MODES, "hvp_mode", where)
        if self.task_map == "sequential":
            # forward mode cannot pass tf.map_fn's TensorArrays (a variant tangent)
            if hvp_mode == "forward_over_reverse":
                raise checks.ArgumentError(
                    f"{where}: hvp_mode='forward_over_reverse' cannot differentiate through "
                    f"task_map='sequential' (tf.map_fn); use 'reverse_over_reverse' or "
                    f"'auto', or task_map='vectorized'")
            hvp_mode = "reverse_over_reverse"
        for arg, value in (("adapt", adapt), ("jit_compile", jit_compile)):
            if not isinstance(value, bool):
                raise checks.ArgumentError(f"{where}: {arg} must be a bool, got {value!r}")
        self.adapt = adapt
        self.env, self.policy = env, policy
        self.strategy = strategy or tf.distribute.get_strategy()
        replicas = self.strategy.num_replicas_in_sync
        self.meta_batch = checks.integer(meta_batch, "meta_batch", where, 1)
        if self.meta_batch % replicas:
            raise checks.ArgumentError(f"{where}: meta_batch = {meta_batch} does not divide "
                                       f"over the strategy's {replicas} replicas")
        self.batch = checks.integer(batch, "batch", where, 1)
        self.host, self._host_envs = hasattr(env, "make_envs"), {}
        if self.host and replicas != 1:
            raise checks.ArgumentError(f"{where}: an environment stepped on the host "
                                       f"(make_envs) runs on one replica, not {replicas}")
        self.horizon = checks.integer(env.horizon if horizon is None else horizon, "horizon",
                                      where, 1)
        self.step_size = checks.positive(step_size, "step_size", where)
        self.discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
        self.gae_lambda = checks.probability(gae_lambda, "gae_lambda", where)
        self.normalize_advantages = bool(normalize_advantages)
        self.outer = checks.choice(outer, OUTER_STEPS, "outer", where)
        self.max_kl = checks.positive(max_kl, "max_kl", where)
        self.cg_maxiter = checks.integer(cg_maxiter, "cg_maxiter", where, 1)
        self.damping = checks.nonnegative(damping, "damping", where)
        self.line_search_steps = checks.integer(line_search_steps, "line_search_steps",
                                                where, 1)
        self.backtrack_ratio = checks.number(backtrack_ratio, "backtrack_ratio", where, 0.0,
                                             1.0, low_open=True, high_open=True)
        self.clip = checks.number(clip, "clip", where, 0.0, 1.0, low_open=True, high_open=True)
        self.outer_steps = checks.integer(outer_steps, "outer_steps", where, 1)
        self.hvp_mode = hvp_mode
        self.variables = list(policy.trainable_variables)
        self.dtype = tf.as_dtype(self.variables[0].dtype)
        self.baseline = LinearFeatureBaseline(env.observation_dim, reg_coeff, self.dtype)
        self.optimizer = optim.adam(checks.positive(outer_lr, "outer_lr", where))
        with self.strategy.scope():  # the clipped surrogate's Adam state, checkpointed
            self.optimizer_state = tf.nest.map_structure(
                lambda t: tf.Variable(t, trainable=False),
                self.optimizer.init([tf.convert_to_tensor(v) for v in self.variables]))
        self._step = tf.function(self._meta_step, autograph=False)
        self._host_fns = [tf.function(f, autograph=False) for f in (
            self._prepare, self._finish, self._outer_step, self._eval_adapt)]
        # each traced once and called as a function where the loops call it again; with
        # jit_compile, XLA compiles each (the episodes and parameters are its inputs)
        def compiled(fn):
            return tf.function(fn, autograph=False, jit_compile=jit_compile)
        self._gradient_fn = compiled(lambda d, p: self._gradient(d, p, False))
        self._fvp_fn = compiled(self._fvp)
        self._evaluate_fn = compiled(self.surrogate_and_kl)
        self._clipped_gradient_fn = compiled(lambda d, p: self._gradient(d, p, True))
        self._evaluate = {}

    # ---- per replica: one shard of the tasks ----------------------------------------------

    def _values(self, episodes):
        """The baseline fitted to each task's episodes, `[tasks, batch, T]` values."""
        def one(e):
            obs, r, m = e
            c = self.baseline.solve(obs, discounted_returns(r, self.discount, m), m)
            return self.baseline.predict(obs, m, c)
        return tf.vectorized_map(one, (episodes.observations, episodes.rewards,
                                       episodes.mask))

    def _scales(self, episodes, values):
        """Each task's inner scale: 1 / (mean episode length * the advantages' standard
        deviation), `[tasks]`."""
        def one(a):
            r, v, m = a
            adv = gae_advantages(r, v, self.discount, self.gae_lambda, m)
            std = tf.sqrt(_mean(tf.square(adv - _mean(adv, m)), m))
            length = tf.reduce_sum(m) / tf.cast(tf.shape(m)[0], m.dtype)
            return 1.0 / (length * (std + tf.constant(1e-8, m.dtype)))
        return tf.stop_gradient(tf.vectorized_map(one, (episodes.rewards, values,
                                                        episodes.mask)))

    def _adapt(self, params, inner, values, scales):
        """Each task's adapted parameters, `[tasks, ...]` tensors."""
        return tf.vectorized_map(lambda a: inner_step(
            self.policy, params, Trajectories(*a[0]), self.step_size, self.discount, a[1],
            self.gae_lambda, a[2]), (tuple(inner), values, scales))

    def sample(self, tasks: Tree, index: tf.Tensor, seed: tf.Tensor, params: Params
               ) -> MetaBatch:
        """The episodes of a meta-iteration for some tasks (one replica's).

        Args:
          tasks: a task tree with a leading axis of n tasks.
          index: `[n]` int each task's index in the meta-batch (its seed's key).
          seed: the iteration's `[2]` int64 seed.
          params: the policy's parameters (list of tensors).

        Returns:
          The `MetaBatch`.
        """
        keys = tf.map_fn(lambda i: tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(seed, i), 2),
            tf.cast(index, tf.int64), fn_output_signature=tf.int64)
        prepare, finish = self._host_fns[:2] if self.host else (self._prepare, self._finish)
        inner = self._rollout(tasks, keys[:, 0], params)
        values, scales, fast = prepare(params, inner)
        outer = self._rollout(tasks, keys[:, 1], fast, True) if self.adapt else inner
        return finish(inner, values, scales, fast, outer)

    def _rollout(self, tasks, seeds, params, per_task_params=False):
        if not self.host:
            return rollout(self.env, self.policy, tasks, seeds, self.batch, self.horizon,
                           params, per_task_params)
        n = tf.nest.flatten(tasks)[0].shape[0]
        if n not in self._host_envs:
            self._host_envs[n] = self.env.make_envs(n * self.batch)
        return gym_rollout(self._host_envs[n], self.policy, tasks, seeds, self.batch,
                           self.horizon, params, per_task_params)

    def _prepare(self, params, inner):
        values = self._values(inner)
        scales = self._scales(inner, values)
        if not self.adapt:
            # no inner step: each task's "adapted" parameters are params (`_finish` takes
            # the sampling distribution per task)
            return values, scales, [tf.stack([p] * inner.rewards.shape[0]) for p in params]
        return values, scales, self._adapt(params, inner, values, scales)

    def _finish(self, inner, values, scales, fast, outer):
        def advantages(a):
            obs, r, m = a
            c = self.baseline.solve(obs, discounted_returns(r, self.discount, m), m)
            adv = gae_advantages(r, self.baseline.predict(obs, m, c), self.discount,
                                 self.gae_lambda, m)
            if self.normalize_advantages:
                mean = _mean(adv, m)
                std = tf.sqrt(_mean(tf.square(adv - mean), m))
                adv = m * (adv - mean) / (std + tf.constant(1e-8, adv.dtype))
            return adv
        adv = tf.vectorized_map(advantages, (outer.observations, outer.rewards, outer.mask))
        old = tf.vectorized_map(lambda a: tuple(policy_distribution(self.policy, a[0], a[1])),
                                (outer.observations, fast))
        return MetaBatch(inner, values, scales, outer, tf.stop_gradient(adv),
                         tuple(tf.stop_gradient(t) for t in old))

    def surrogate_and_kl(self, data: MetaBatch, params: Params, clipped: bool = False
                         ) -> tuple:
        """The mean over the tasks of the surrogate (MAXIMIZED) and of the mean KL from the
        sampling policy, the adaptation recomputed from `params` on the fixed episodes.

        Args:
          data: a `MetaBatch` (one replica's tasks).
          params: the policy's parameters (list of tensors).
          clipped: the clipped surrogate instead of the importance-weighted one.

        Returns:
          `(surrogate, kl)`, scalars of the parameters' dtype.
        """
        def one(a, _, params):
            inner, values, scale, outer, adv, old = a
            fast = inner_step(self.policy, params, Trajectories(*inner), self.step_size,
                              self.discount, values, self.gae_lambda, scale
                              ) if self.adapt else params
            dist = policy_distribution(self.policy, outer[0], fast)
            ratio = tf.exp(dist.log_prob(outer[1]) - outer[2])
            gain = ratio * adv
            if clipped:
                low = tf.constant(1.0 - self.clip, ratio.dtype)
                high = tf.constant(1.0 + self.clip, ratio.dtype)
                gain = tf.minimum(gain, tf.clip_by_value(ratio, low, high) * adv)
            kl = type(dist)(*old).kl(dist)
            return _mean(gain, outer[4]), _mean(kl, outer[4])
        surrogate, kl = map_tasks(one, (tuple(data.inner), data.inner_values,
                                        data.inner_scale, tuple(data.outer), data.advantages,
                                        data.old), None, params, self.task_map)
        return tf.reduce_mean(surrogate), tf.reduce_mean(kl)

    def _gradient(self, data, params, clipped):
        with tf.GradientTape() as tape:
            tape.watch(params)
            surrogate, kl = self.surrogate_and_kl(data, params, clipped)
        return tape.gradient(surrogate, params), surrogate, kl

    def _fvp(self, data, params, v):
        return hvp(lambda: self.surrogate_and_kl(data, params)[1], params, v, self.hvp_mode)

    def _returns(self, episodes):
        return tf.reduce_mean(tf.reduce_sum(episodes.rewards * episodes.mask, -1))

    # ---- across replicas ------------------------------------------------------------------

    def _mean(self, fn, *args):
        out = self.strategy.run(fn, args=args)
        return tf.nest.map_structure(
            lambda t: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, t, axis=None), out)

    def _meta_step(self, shards, seed):
        params = [tf.convert_to_tensor(v) for v in self.variables]
        data = self.strategy.run(lambda s: self.sample(s["task"], s["index"], seed, params),
                                 args=(shards,))
        return self._outer_step(data, params)

    def _outer_step(self, data, params):
        before, after = self._mean(lambda d: (self._returns(d.inner), self._returns(d.outer)),
                                   data)
        logs = {"return_before": before, "return_after": after}
        if self.outer == "trpo":
            g, surrogate, _ = self._mean(lambda d: self._gradient_fn(d, params), data)
            step, info = natural_step(
                g, lambda v: self._mean(lambda d, v: self._fvp_fn(d, params, v), data, v),
                self.max_kl, self.cg_maxiter, self.damping)
            new, search = line_search(
                lambda c: self._mean(lambda d, c: self._evaluate_fn(d, c), data, c),
                params, step, surrogate, self.max_kl, self.line_search_steps,
                self.backtrack_ratio)
            logs.update(surrogate_before=surrogate, surrogate=search.surrogate, kl=search.kl,
                        accepted=tf.cast(search.accepted, self.dtype),
                        step_fraction=search.fraction, cg_iterations=info.iterations)
        else:
            new, state = params, tf.nest.map_structure(tf.convert_to_tensor,
                                                       self.optimizer_state)
            for k in range(self.outer_steps):
                g, surrogate, kl = self._mean(self._clipped_gradient_fn, data, new)
                if k == 0:
                    logs["surrogate_before"] = surrogate
                new, state = self.optimizer.update(tree.scale(-1.0, g), state, new)
            tf.nest.map_structure(lambda v, t: v.assign(t), self.optimizer_state, state)
            surrogate, kl = self._mean(lambda d, c: self.surrogate_and_kl(d, c, True), data,
                                       new)
            logs.update(surrogate=surrogate, kl=kl)
        for v, p in zip(self.variables, new):
            v.assign(p)
        return logs

    def step(self, seed: Any) -> Dict[str, tf.Tensor]:
        """One meta-iteration: tasks drawn with `seed`, episodes, the outer step (assigned to
        the policy's variables).

        Args:
          seed: the iteration's seed, an int >= 0 or a `[2]` integer tensor (the tasks and
            every episode's draws follow from it).

        Returns:
          Scalars: `return_before` and `return_after` (the mean undiscounted return of the
          episodes before and after the inner step; equal with `adapt=False`),
          `surrogate_before`, `surrogate`, `kl` and, for TRPO, `accepted`, `step_fraction`,
          `cg_iterations`.
        """
        if isinstance(seed, (tf.Tensor, tf.Variable)):
            s = tf.cast(tf.convert_to_tensor(seed), tf.int64)
        else:
            s = tf.constant([checks.seed(seed, "seed", "MamlRL.step"), 0], tf.int64)
        task_key, episode_key = tf.unstack(tf.random.experimental.stateless_split(s, 2))
        tasks = self.env.sample_tasks(task_key, self.meta_batch)
        if self.host:
            params = [tf.convert_to_tensor(v) for v in self.variables]
            return self._host_fns[2](self.sample(tasks, tf.range(self.meta_batch, dtype=tf.int64),
                                                 episode_key, params), params)
        shards = distribute.shard(self.strategy, {
            "task": tasks, "index": tf.range(self.meta_batch, dtype=tf.int64)})
        return self._step(shards, episode_key)

    def evaluate(self, tasks: Tree, seed: int, steps: int = 3) -> tf.Tensor:
        """The mean undiscounted return of fresh episodes of each task after 0..steps inner
        steps, each step on fresh episodes of the policy it reached (MAML's evaluation).

        Args:
          tasks: a task tree with a leading task axis.
          seed: an int >= 0: every draw follows from it and the task's index.
          steps: the inner steps, an int >= 0.

        Returns:
          `[steps + 1, tasks]` returns (means over `batch` episodes).
        """
        steps = checks.integer(steps, "steps", "MamlRL.evaluate", 0)
        seed = checks.seed(seed, "seed", "MamlRL.evaluate")
        if self.host:
            return self._evaluation(tasks, tf.constant([seed, 0], tf.int64), steps)
        if steps not in self._evaluate:
            self._evaluate[steps] = tf.function(lambda t, s: self._evaluation(t, s, steps),
                                                 autograph=False)
        return self._evaluate[steps](tasks, tf.constant([seed, 0], tf.int64))

    def _evaluation(self, tasks, seed, steps):
        n = tf.nest.flatten(tasks)[0].shape[0]
        params = [tf.convert_to_tensor(v) for v in self.variables]
        per_task = [tf.stack([p] * n) for p in params]
        out = []
        for s in range(steps + 1):
            keys = tf.map_fn(lambda i: tf.random.experimental.stateless_fold_in(
                tf.random.experimental.stateless_fold_in(seed, i), tf.constant(s, tf.int64)),
                tf.range(n, dtype=tf.int64), fn_output_signature=tf.int64)
            episodes = self._rollout(tasks, keys, per_task, True)
            out.append(tf.reduce_mean(tf.reduce_sum(episodes.rewards * episodes.mask, -1), -1))
            if s < steps:
                per_task = (self._host_fns[3] if self.host else self._eval_adapt)(
                    per_task, episodes)
        return tf.stack(out)

    def _eval_adapt(self, per_task, episodes):
        values = self._values(episodes)
        return tf.vectorized_map(lambda a: inner_step(
            self.policy, a[0], Trajectories(*a[1]), self.step_size, self.discount, a[2],
            self.gae_lambda, a[3]), (per_task, tuple(episodes), values,
                                     self._scales(episodes, values)))
