"""Meta-learning through long horizons: truncated unrolls and their gradient estimators.

- `InnerProblem` (`problem.py`): an inner problem as ``init(seed) -> state``,
  ``step(state, theta, batch) -> state``, ``objective(state, batch) -> scalar`` and an
  optional ``batch(seed, t)``; a truncation's meta-objective the mean (``"sum"``) or the
  last of its steps' objectives.
- `Particles`, `init_particles`, `reset`, `truncated_unroll`, `evaluate` (`unroll.py`): many
  particles unrolled K steps at a time in one compiled loop (mapped by
  `hogrod.taskmap.map_tasks`), reset after the horizon T, with staggered starts.
- `tbptt`, `es`, `pes`, `full_es` (`estimators.py`): gin factories of meta-gradient
  estimators with one calling shape, ``init(problem, theta, seed)`` and
  ``estimate(problem, theta, state, seed, strategy=None) -> (Estimate, state)``; under a
  `tf.distribute` strategy the particles split over the replicas.
- `meta_step` (`outer.py`): the outer loop, an estimate clipped and applied by a
  `hogrod.optim` optimizer at `outer_lr`, compiled once.
- `influence_balancing`, `toy_regression` (`problems.py`): the PES paper's synthetic
  problems, with influence balancing's closed-form optimum.
- `mlp_optimizer(...)`: the per-parameter MLP learned optimizer (learned_optimization's
  small MLP optimizer); `learned_schedule(...)`: a learned learning-rate schedule (a few
  log rates, piecewise linear or polynomial) driving SGD or Adam. Both return a
  `LearnedOptimizer`: ``init(seed) -> theta``, ``optimizer(theta) -> hogrod.optim.Optimizer``
  (differentiable in theta; `hogrod.meta.adapt`, `hogrod.hypergrad.unrolled` and
  `hogrod.train.make_train_step` take it), ``save(theta, path)`` / ``load(path)``.
- `optimizer_problem(learned, family)`: the `InnerProblem` of training a task of a
  `TaskFamily` (`digits_mlp(...)`: small MLPs on sklearn's 8x8 digits, random class
  subsets and initializations, held-out tasks by `task_seed(seed, "heldout")`) with a
  learned optimizer; `training_curves` trains tasks with any `hogrod.optim` optimizer.
- `heldout_curves`, `heldout_summary`, `validation_loss` (`comparison.py`): a learned
  optimizer against Adam on held-out tasks, and its loss on validation tasks apart from
  them (for choosing among thetas).
"""

from hogrod.learned.base import LearnedOptimizer
from hogrod.learned.comparison import (VALIDATION_SEED, heldout_curves, heldout_summary,
                                       validation_loss)
from hogrod.learned.estimators import (Estimate, Estimator, EstimatorState, es, full_es, pes,
                                       tbptt)
from hogrod.learned.mlp_optimizer import MLPOptimizerState, feature_count, mlp_optimizer
from hogrod.learned.outer import MetaState, MetaStep, meta_step
from hogrod.learned.problem import META_OBJECTIVES, InnerProblem
from hogrod.learned.problems import (influence_balancing, influence_balancing_optimum,
                                     toy_regression, toy_regression_loss)
from hogrod.learned.schedule import BASES, KINDS, LearnedSchedule, learned_schedule
from hogrod.learned.tasks import (SPLITS, TaskFamily, TaskState, digits_mlp, optimizer_problem,
                                  task_seed, training_curves)
from hogrod.learned.unroll import (Particles, evaluate, init_particles, reset,
                                   truncated_unroll)

__all__ = ["InnerProblem", "META_OBJECTIVES", "Particles", "init_particles", "reset",
           "truncated_unroll", "evaluate", "Estimate", "EstimatorState", "Estimator", "tbptt",
           "es", "pes", "full_es", "MetaState", "MetaStep", "meta_step",
           "influence_balancing", "influence_balancing_optimum", "toy_regression",
           "toy_regression_loss", "LearnedOptimizer", "MLPOptimizerState", "feature_count",
           "mlp_optimizer", "LearnedSchedule", "KINDS", "BASES", "learned_schedule", "SPLITS",
           "TaskFamily", "TaskState", "task_seed", "digits_mlp", "optimizer_problem",
           "training_curves", "VALIDATION_SEED", "heldout_curves", "heldout_summary",
           "validation_loss"]
