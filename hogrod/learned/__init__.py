"""Meta-learning through long horizons: learned optimizers and the tasks they train.

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
"""

from hogrod.learned.base import LearnedOptimizer
from hogrod.learned.mlp_optimizer import MLPOptimizerState, feature_count, mlp_optimizer
from hogrod.learned.problem import InnerProblem
from hogrod.learned.schedule import BASES, KINDS, LearnedSchedule, learned_schedule
from hogrod.learned.tasks import (SPLITS, TaskFamily, TaskState, digits_mlp, optimizer_problem,
                                  task_seed, training_curves)

__all__ = ["InnerProblem", "LearnedOptimizer", "MLPOptimizerState", "feature_count",
           "mlp_optimizer", "LearnedSchedule", "KINDS", "BASES", "learned_schedule",
           "SPLITS", "TaskFamily", "TaskState", "task_seed", "digits_mlp",
           "optimizer_problem", "training_curves"]
