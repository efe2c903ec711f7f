"""MAML for reinforcement learning (Finn et al. 2017): rollouts, `hogrod.meta.adapt` on a
DiCE objective, and a TRPO or clipped-surrogate outer step.

Each meta-iteration samples a meta-batch of tasks; for each task (vectorized over the
tasks; the meta-gradient's map as `task_map` says, `hogrod.taskmap`) it

1. rolls out `batch` episodes with the policy's parameters theta,
2. fits the linear feature baseline to them and takes the inner step
   ``theta' = theta + inner_lr scale grad dice_surrogate`` (`inner_step`, `maml_inner.py`:
   `hogrod.meta.adapt` on the objective ``-scale * dice_surrogate``): Loaded DiCE with the
   baseline's values, scaled by 1 / (mean episode length * the advantages' standard
   deviation) held constant (`inner_scales`), so the meta-gradient through ``theta'`` has
   every second-order term of the expected return (the score of the inner episodes'
   distribution included),
3. rolls out `batch` episodes with ``theta'`` and computes their advantages (the
   baseline fitted to them, GAE with `gae_lambda`, optionally normalized),

and the outer step (`maml_outer.py`) improves the mean over tasks of the importance-weighted
surrogate on the post-adaptation episodes, ``theta'(theta)`` recomputed from the fixed inner
episodes. With `adapt=False` training takes no inner step: the episodes of step 1 are the
outer step's, with ``theta'`` = theta (the MAML paper's "pretrained" policy, trained by the
same TRPO on every task; with a goal-observing environment, its oracle). Evaluation adapts
either way.

Under a `tf.distribute` strategy the tasks are split over the replicas (the meta-batch
divides by their count). A task's draws come from the iteration's seed folded with the
task's index in the meta-batch, so a step equals one device's on the same tasks.

An environment whose `on_host` is True (`hogrod.rl.HalfCheetahTasks`) is stepped on the
host: its episodes come from `gym_rollout` on the `gymnasium` vector environment of
``tasks * batch`` sub-environments its `make_envs` makes (once per task count), seeded as
`rollout`, outside the compiled step; the baseline, the inner step and the outer step are
compiled on them (one replica). An in-graph environment (`on_host` False or absent) is
stepped by `rollout` inside the compiled step.
"""

from typing import Any, Dict, NamedTuple, Optional, Sequence

import keras
import tensorflow as tf

from hogrod import checks, distribute, optim, taskmap
from hogrod.autodiff import HVP_MODES
from hogrod.rl.gym import gym_rollout
from hogrod.rl.maml_inner import baseline_values, inner_scales, inner_step, outer_advantages
from hogrod.rl.maml_outer import OUTER_STEPS, OuterStep
from hogrod.rl.returns import LinearFeatureBaseline
from hogrod.rl.rollout import Trajectories, policy_distribution, rollout
from hogrod.types import Params, Tree

__all__ = ["MetaBatch", "MamlRL", "OUTER_STEPS"]


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


class MamlRL(OuterStep):
    """MAML-RL's meta-training step and evaluation on a batched environment.

    Args:
      env: a `hogrod.rl` environment (`sample_tasks`, `reset`, `step`, `horizon`,
        `observation_dim`), or one with `on_host = True` and `make_envs(num_envs)`,
        stepped on the host (`sample_tasks`, `horizon`, `observation_dim`; see the module
        docstring).
      policy: a built policy of the environment's dtype, created under `strategy.scope()`
        when a strategy is given.
      meta_batch: tasks per meta-iteration, an int >= 1 divisible by the replicas.
      batch: episodes per task and per rollout, an int >= 1 (20 in MAML).
      horizon: steps per episode; None: `env.horizon`.
      inner_lr: the inner step's rate, > 0 (0.1 for 2D navigation).
      discount: the discount in (0, 1] (0.99).
      gae_lambda: GAE's lambda, in [0, 1], of the inner Loaded DiCE and the outer
        advantages (1.0).
      normalize_advantages: whether the outer advantages are normalized per task (mean 0,
        standard deviation 1 over the unmasked steps), as pytorch-maml-rl.
      outer: one of `OUTER_STEPS`, "trpo" or "clip" (see `maml_outer.py`).
      max_kl: TRPO's KL bound, > 0 (0.01).
      cg_maxiter: TRPO's CG iterations, >= 1 (10).
      damping: TRPO's Fisher damping, >= 0 (1e-5).
      line_search_maxiter: TRPO's most backtracking tries, >= 1 (15).
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
        products) map over the tasks, one of `hogrod.taskmap.MODES` but "recomputed":
        "vectorized" (`tf.vectorized_map`) or "sequential" (`tf.map_fn`). The same
        numbers up to rounding; on CPU "sequential" computed the 2D-navigation
        meta-gradient faster (`pfor`'s batched products of the inner step's second-order
        graph cost more than they save there), unless `jit_compile`.
      jit_compile: compile the meta-gradient, the Fisher-vector products and the line
        search's surrogate with XLA (the rollouts and the outer loop stay outside). On
        CPU, with "vectorized", XLA fuses the batched products' elementwise work: the
        2D-navigation meta-gradient ran about 1.6x as fast; the first meta-iteration
        compiles for seconds.

    Raises:
      ArgumentError: an argument out of range, `outer` not one of `OUTER_STEPS`,
        `hvp_mode` not "auto" or one of `hogrod.autodiff.HVP_MODES`, `task_map` not one of
        `hogrod.taskmap.MODES` or "recomputed", or a host environment under a strategy
        of several replicas.
    """

    def __init__(self, env: Any, policy: keras.Model, meta_batch: int = 20, batch: int = 20,
                 horizon: Optional[int] = None, inner_lr: float = 0.1,
                 discount: float = 0.99, gae_lambda: float = 1.0,
                 normalize_advantages: bool = True, outer: str = "trpo",
                 max_kl: float = 0.01, cg_maxiter: int = 10, damping: float = 1e-5,
                 line_search_maxiter: int = 15, backtrack_ratio: float = 0.8,
                 clip: float = 0.2, outer_lr: float = 1e-3, outer_steps: int = 5,
                 reg_coeff: float = 1e-5, hvp_mode: str = "auto",
                 strategy: Optional[tf.distribute.Strategy] = None,
                 adapt: bool = True, task_map: str = "vectorized",
                 jit_compile: bool = False) -> None:
        where = "MamlRL"
        self.task_map = taskmap.check_task_map(task_map, where)
        if self.task_map == "recomputed":
            raise checks.ArgumentError(
                f"{where}: task_map='recomputed' cannot map MAML-RL's tasks: "
                "tf.recompute_grad runs each task's forward pass with every tape stopped, "
                "where the DiCE inner step has no gradient, and gives first derivatives "
                "only, where TRPO's Fisher-vector products need second ones; use "
                "'vectorized' or 'sequential'")
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
        self.host, self._host_envs = self._on_host(env, where), {}
        if self.host and replicas != 1:
            raise checks.ArgumentError(f"{where}: an environment stepped on the host "
                                       f"(on_host) runs on one replica, not {replicas}")
        self.horizon = checks.integer(env.horizon if horizon is None else horizon, "horizon",
                                      where, 1)
        self.inner_lr = checks.positive(inner_lr, "inner_lr", where)
        self.discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
        self.gae_lambda = checks.probability(gae_lambda, "gae_lambda", where)
        self.normalize_advantages = bool(normalize_advantages)
        self.outer = checks.choice(outer, OUTER_STEPS, "outer", where)
        self.max_kl = checks.positive(max_kl, "max_kl", where)
        self.cg_maxiter = checks.integer(cg_maxiter, "cg_maxiter", where, 1)
        self.damping = checks.nonnegative(damping, "damping", where)
        self.line_search_maxiter = checks.integer(line_search_maxiter, "line_search_maxiter",
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

    @staticmethod
    def _on_host(env, where):
        """The environment's `on_host` (False when it has none), checked."""
        on_host = getattr(env, "on_host", False)
        if not isinstance(on_host, bool):
            raise checks.ArgumentError(f"{where}: env.on_host must be a bool, got "
                                       f"{on_host!r}")
        if on_host and not callable(getattr(env, "make_envs", None)):
            raise checks.ArgumentError(f"{where}: an environment with on_host = True needs "
                                       "make_envs(num_envs) (a gymnasium vector environment)")
        return on_host

    # ---- per replica: one shard of the tasks ----------------------------------------------

    def _adapt(self, params, inner, values, scales):
        """Each task's adapted parameters, `[tasks, ...]` tensors."""
        return taskmap.vectorized_map(lambda a: inner_step(
            self.policy, params, a[0], self.inner_lr, self.discount, a[1],
            self.gae_lambda, a[2]), (inner, values, scales))

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
        values = baseline_values(self.baseline, inner, self.discount)
        scales = inner_scales(inner, values, self.discount, self.gae_lambda)
        if not self.adapt:
            # no inner step: each task's "adapted" parameters are params (`_finish` takes
            # the sampling distribution per task)
            return values, scales, [tf.stack([p] * inner.rewards.shape[0]) for p in params]
        return values, scales, self._adapt(params, inner, values, scales)

    def _finish(self, inner, values, scales, fast, outer):
        adv = outer_advantages(self.baseline, outer, self.discount, self.gae_lambda,
                               self.normalize_advantages)
        old = taskmap.vectorized_map(
            lambda a: tuple(policy_distribution(self.policy, a[0], a[1])),
            (outer.observations, fast))
        return MetaBatch(inner, values, scales, outer, adv,
                         tuple(tf.stop_gradient(t) for t in old))

    # ---- across replicas ------------------------------------------------------------------

    def _meta_step(self, shards, seed):
        params = [tf.convert_to_tensor(v) for v in self.variables]
        data = self.strategy.run(lambda s: self.sample(s["task"], s["index"], seed, params),
                                 args=(shards,))
        return self._outer_step(data, params)

    def step(self, seed: Any) -> Dict[str, tf.Tensor]:
        """One meta-iteration: tasks drawn with `seed`, episodes, the outer step (assigned to
        the policy's variables).

        Args:
          seed: the iteration's seed, an int >= 0 or a `[2]` integer tensor (the tasks and
            every episode's draws follow from it).

        Returns:
          Scalars: `return_before` and `return_after` (the mean undiscounted return of the
          episodes before and after the inner step; equal with `adapt=False`),
          `surrogate_before`, `surrogate`, `kl` (the mean KL(old || new) from the sampling
          policy at the new parameters) and, for TRPO, `accepted`, `step_fraction`,
          `cg_iterations`.
        """
        s = checks.stateless_seed(seed, "seed", "MamlRL.step")
        task_key, episode_key = tf.unstack(tf.random.experimental.stateless_split(s, 2))
        tasks = self.env.sample_tasks(task_key, self.meta_batch)
        if self.host:
            params = [tf.convert_to_tensor(v) for v in self.variables]
            return self._host_fns[2](self.sample(tasks, tf.range(self.meta_batch, dtype=tf.int64),
                                                 episode_key, params), params)
        shards = distribute.shard(self.strategy, {
            "task": tasks, "index": tf.range(self.meta_batch, dtype=tf.int64)})
        return self._step(shards, episode_key)

    def evaluate(self, tasks: Tree, seed: int, steps: Sequence[int] = (0, 1, 2, 3)
                 ) -> tf.Tensor:
        """The mean undiscounted return of fresh episodes of each task after each count of
        inner steps in `steps`, each step on fresh episodes of the policy it reached (MAML's
        evaluation).

        Args:
          tasks: a task tree with a leading task axis.
          seed: an int >= 0: every draw follows from it and the task's index.
          steps: the inner-step counts to report, a non-empty sequence of ints >= 0 (as
            `hogrod.meta.evaluate`'s); the adaptation runs to the largest.

        Returns:
          `[len(steps), tasks]` returns (means over `batch` episodes), one row per count.

        Raises:
          ArgumentError: `seed` not an int >= 0 or `steps` not a non-empty sequence of
            ints >= 0.
        """
        where = "MamlRL.evaluate"
        steps = checks.counts(steps, "steps", where)
        seed = checks.seed(seed, "seed", where)
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
        out = {}
        for s in range(max(steps) + 1):
            keys = tf.map_fn(lambda i: tf.random.experimental.stateless_fold_in(
                tf.random.experimental.stateless_fold_in(seed, i), tf.constant(s, tf.int64)),
                tf.range(n, dtype=tf.int64), fn_output_signature=tf.int64)
            episodes = self._rollout(tasks, keys, per_task, True)
            out[s] = tf.reduce_mean(tf.reduce_sum(episodes.rewards * episodes.mask, -1), -1)
            if s < max(steps):
                per_task = (self._host_fns[3] if self.host else self._eval_adapt)(
                    per_task, episodes)
        return tf.stack([out[s] for s in steps])

    def _eval_adapt(self, per_task, episodes):
        values = baseline_values(self.baseline, episodes, self.discount)
        scales = inner_scales(episodes, values, self.discount, self.gae_lambda)
        return taskmap.vectorized_map(lambda a: inner_step(
            self.policy, a[0], a[1], self.inner_lr, self.discount, a[2], self.gae_lambda,
            a[3]), (per_task, episodes, values, scales))
