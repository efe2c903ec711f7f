"""The outer step: a meta-gradient estimate applied to theta by a `hogrod.optim` optimizer.

``meta = meta_step(problem, estimator, outer_lr, optimizer=optim.sgd, clip_norm=None)``
returns `MetaStep(init, step)`:

- ``state = meta.init(theta, seed)``: a `MetaState` (theta, the outer optimizer's state,
  the estimator's state, the meta-step count and the run's seed), a nest of tensors that a
  checkpoint of `tf.Variable`s holding it restores exactly;
- ``state, estimate = meta.step(state)``: one estimate (its perturbations drawn from the
  run's seed and the step count, so a resumed run draws what an uninterrupted one does),
  its gradient clipped to a global norm of at most `clip_norm` (in theta's dtype), then
  ``optimizer(outer_lr).update``. `step` is one `tf.function`, traced once for a run (the
  state's shapes never change). The ES estimators' unrolls inside it are XLA computations
  (their `jit_compile`, "auto" by default); the draws around them (perturbations, resets,
  batches) are not, since under XLA TensorFlow draws other stateless random numbers for
  the same seed. tbptt's unroll is not: its gradient through the mapped steps (pfor) does
  not compile.
"""

from typing import Any, Callable, NamedTuple, Optional, Tuple

import gin
import tensorflow as tf

from hogrod import checks, optim, tree
from hogrod.learned import problem as problem_lib
from hogrod.learned.estimators import Estimate, Estimator, EstimatorState
from hogrod.learned.problem import InnerProblem
from hogrod.types import Seed, Tree

__all__ = ["MetaState", "MetaStep", "meta_step"]

_no_autograph = tf.autograph.experimental.do_not_convert


class MetaState(NamedTuple):
    """Everything a meta-training run carries from one outer step to the next.

    Attributes:
        theta: the meta-parameters, a nest of floating tensors.
        outer_state: the outer optimizer's state (``optimizer.init(theta)``).
        estimator: the estimator's `EstimatorState` (particles, accumulated perturbations).
        step: the outer steps taken, an int64 scalar.
        seed: the run's ``[2]`` int64 seed: step n estimates with a seed folded from it
            and n.
    """

    theta: Tree
    outer_state: Any
    estimator: EstimatorState
    step: tf.Tensor
    seed: tf.Tensor


class MetaStep(NamedTuple):
    """An outer loop's two functions, built by `meta_step`.

    Attributes:
        init: ``init(theta, seed) -> MetaState``.
        step: ``step(state) -> (MetaState, Estimate)``, a `tf.function` (its
            ``experimental_get_tracing_count()`` says how often it traced).
    """

    init: Callable[[Tree, Seed], MetaState]
    step: Callable[[MetaState], Tuple[MetaState, Estimate]]


def _clip_by_global_norm(grads: Tree, clip_norm: float) -> Tree:
    """`grads` scaled by ``min(1, clip_norm / ||grads||)`` in the leaves' dtype (exact in
    float64, where `hogrod.train.clip_by_global_norm` computes its scale in float32)."""
    norm = tree.norm(grads)
    limit = tf.constant(clip_norm, norm.dtype)
    scale = tf.minimum(tf.ones_like(norm), limit / tf.maximum(norm, limit * 1e-30))
    return tf.nest.map_structure(lambda g: g * tf.cast(scale, g.dtype), grads)


@gin.configurable(module="hogrod.learned")
def meta_step(problem: InnerProblem, estimator: Estimator, outer_lr: float,
              optimizer: Callable[..., optim.Optimizer] = optim.sgd,
              clip_norm: Optional[float] = None,
              strategy: Optional[tf.distribute.Strategy] = None) -> MetaStep:
    """The outer loop of meta-training: estimate, clip, update theta.

    Args:
        problem: the inner problem.
        estimator: a meta-gradient estimator (`tbptt`, `es`, `pes`, `full_es`).
        outer_lr: the outer learning rate, > 0, given to `optimizer`.
        optimizer: a `hogrod.optim` factory called as ``optimizer(outer_lr)``
            (``@hogrod.optim.adam`` in gin, its other hyperparameters bound there);
            default `hogrod.optim.sgd`.
        clip_norm: clip each estimate to this global norm (> 0), or None (default): no
            clipping.
        strategy: a `tf.distribute` strategy whose replicas split the particles, or None
            (default): one device.

    Returns:
        The `MetaStep(init, step)`.

    Raises:
        ArgumentError: `problem` or `estimator` is not one, `outer_lr` or `clip_norm` is
            not positive, or `optimizer` is not callable or does not build a
            `hogrod.optim.Optimizer`.
    """
    where = "hogrod.learned.meta_step"
    problem_lib.check_problem(problem, where)
    if not isinstance(estimator, Estimator):
        raise checks.ArgumentError(f"{where}: estimator must be a hogrod.learned Estimator "
                                   f"(tbptt, es, pes, full_es), got {type(estimator).__name__}")
    outer_lr = checks.positive(outer_lr, "outer_lr", where)
    checks.function(optimizer, "optimizer", where, "optimizer(outer_lr) -> hogrod.optim.Optimizer")
    opt = optimizer(outer_lr)
    if not isinstance(opt, optim.Optimizer):
        raise checks.ArgumentError(f"{where}: optimizer(outer_lr) must return a hogrod.optim "
                                   f"Optimizer, got {type(opt).__name__}")
    if clip_norm is not None:
        clip_norm = checks.positive(clip_norm, "clip_norm", where)

    @_no_autograph
    def init(theta: Tree, seed: Seed) -> MetaState:
        checks.params(theta, where + ".init", "theta")
        theta = tf.nest.map_structure(tf.convert_to_tensor, theta)
        seed = checks.stateless_seed(seed, "seed", where + ".init")
        est = estimator.init(problem, theta, tf.random.experimental.stateless_fold_in(seed, 0))
        return MetaState(theta, opt.init(theta), est, tf.constant(0, tf.int64), seed)

    def step(state: MetaState) -> Tuple[MetaState, Estimate]:
        run_seed = tf.random.experimental.stateless_fold_in(state.seed, 1)
        seed = tf.random.experimental.stateless_fold_in(run_seed, state.step)
        estimate, est = estimator.estimate(problem, state.theta, state.estimator, seed,
                                           strategy=strategy)
        grads = estimate.grads
        if clip_norm is not None:
            grads = _clip_by_global_norm(grads, clip_norm)
        theta, outer_state = opt.update(grads, state.outer_state, state.theta)
        return MetaState(theta, outer_state, est, state.step + 1, state.seed), estimate

    return MetaStep(init, tf.function(step, autograph=False))
