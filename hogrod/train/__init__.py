"""The custom-training-loop toolkit every hogrod trainer is built on.

- `make_train_step(objective, optimizer, variables, weights=, transform=, accumulation_steps=,
  strategy=, jit_compile=)`: one compiled step over named loss terms (`step.py`; the terms
  and their weighted sum: `terms.py`).
- `compiled(fn, jit_compile, where)`: the one XLA convention of every step builder,
  `jit_compile="auto"` (XLA where it compiles, else a plain `tf.function` with one
  warning), True or False (`compile.py`); `xla_blocker`: why XLA would not run a function
  as TensorFlow does (its check, for loops compiled elsewhere).
- the step-optimizer protocol: `StepOptimizer` (an optimizer owning its state and taking
  each step's objective and batch: `hogrod.second_order`), `as_step_optimizer` (Keras and
  `hogrod.optim` optimizers adapted), `assign`, `replica_mean`, `state_variable`
  (`protocol.py`).
- transforms: `chain`, `clip_by_global_norm`, `clip_by_value`, `zeros_for_unconnected`
  (`transforms.py`); per-variable-group optimizers are lists of (optimizer, variables).
- `mixed_precision(optimizer, policy)`: loss scaling for float16; `precision_policy(policy)`:
  the dtype policy of the layers built in its `with` block, restored after (`precision.py`).
- `Checkpointer`, `train_loop`, `NonFiniteError`: resumable runs with a NaN guard,
  TensorBoard summaries and a progress line, several steps per compiled call
  (`steps_per_execution`) (`loop.py`, `execution.py`).
- `read_history`, `record_eval`, `write_json`: a run's evaluations beside its checkpoints,
  kept across a resume (`history.py`).
- `saliency`, `integrated_gradients`: input attribution (`attribution.py`).

Strategies come from `hogrod.distribute.make_strategy`.
"""

from hogrod.train.attribution import integrated_gradients, saliency
from hogrod.train.compile import AutoCompiled, compiled, xla_blocker
from hogrod.train.history import EvalHistory, read_history, record_eval, write_json
from hogrod.train.loop import CheckpointMismatchError, Checkpointer, NonFiniteError, train_loop
from hogrod.train.precision import mixed_precision, precision_policy
from hogrod.train.protocol import (StepOptimizer, as_step_optimizer, assign, replica_mean,
                                   state_variable)
from hogrod.train.step import build_optimizers, make_train_step
from hogrod.train.terms import objective_terms, weighted_total
from hogrod.train.transforms import (chain, clip_by_global_norm, clip_by_value, global_norm,
                                     zeros_for_unconnected)

__all__ = ["make_train_step", "compiled", "AutoCompiled", "xla_blocker",
           "build_optimizers", "StepOptimizer", "as_step_optimizer", "assign",
           "replica_mean", "state_variable", "objective_terms", "weighted_total",
           "chain", "clip_by_global_norm", "clip_by_value", "global_norm",
           "zeros_for_unconnected", "mixed_precision", "precision_policy",
           "Checkpointer", "train_loop", "NonFiniteError", "CheckpointMismatchError",
           "EvalHistory", "read_history", "record_eval", "write_json", "saliency",
           "integrated_gradients"]
