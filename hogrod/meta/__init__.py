"""Gradient-based meta-learning on any Keras 3 model.

A task is `(x_support, y_support, x_query, y_query)`; `loss` is always a Keras loss
`loss(y_true, y_pred) -> scalar`.

- `adapt(model, loss, support, inner_lr, inner_steps=1, first_order=False, params=None,
  ..., optimizer=None, objective=None)`: the pure inner loop (`inner.py`) on a Keras `loss`
  or on any per-task `objective(params, support)` (MAML-RL's DiCE inner step);
  `optimizer` takes a `hogrod.optim` optimizer (inner Adam, ...) in place of SGD at
  `inner_lr`.
- algorithms, one module each, each `(model, loss, ..., task_map="vectorized") ->
  Algorithm(meta_loss, adapt, variables, predict, state)`: `maml`, `fomaml` (`maml.py`),
  `reptile`, `anil`, `meta_sgd`, `maml_plus_plus`, `imaml`; gathered in `algorithms.py`
  (`ALGORITHMS`). `meta_loss(tasks, step=None) -> {"loss": objective, "monitor/...":
  logged}` goes to `hogrod.train.make_train_step`; `meta_gradient(algorithm, model, tasks,
  step)` gives `(loss, grads)` directly.
- `task_map`, an argument of every algorithm and of the evaluation: 'vectorized',
  'sequential' or 'recomputed' (`hogrod.taskmap.MODES`, the task mapping every family
  shares). An experiment binds it once (`maml_experiment.task_map` in gin) and passes it
  down.
- tasks: `sinusoid_meta_batches`, `sample_sinusoids` (`tasks.py`); N-way K-shot
  `episodes` from `load_omniglot` (the original zips) or `load_tfds_classes` (`episodes.py`);
  `omniglot_characters` (the zips' characters in order, decoded once and cached).
- few-shot heads `prototype_logits`, `ridge_logits`, `svm_logits` (`heads.py`; the SVM's
  dual solver, always in float64, in `svm.py`) and their algorithms `protonet`, `r2d2`,
  `metaoptnet` (`fewshot.py`, gathered in `FEW_SHOT`).
- `evaluate`, `evaluator` (traced once, for periodic use): query loss/accuracy after 0, 1,
  ... adaptation steps, Dropout masks fresh per task and pass from an evaluation seed
  (`evaluation.py`).

Adding an algorithm:

1. a module `hogrod/meta/<name>.py` with a `@gin.configurable` function
   `<name>(model, loss, ..., task_map="vectorized")` that checks its arguments
   (`common.check_loss`, `taskmap.check_task_map`, `hogrod.checks`) and returns
   `common.Algorithm`: its `meta_loss(tasks, step=None)` reads `params =
   initial_params(model)` once, draws `task_seeds(model, tasks, passes)` (one seed per
   forward pass per task), and returns `{"loss": taskmap.mean_over_tasks(fn, tasks, seeds,
   params, task_map), ...}` with `fn(task, seeds, params)` the per-task objective (`pass_seed(seeds,
   i)` for pass i); wrap it in `compiled_when_eager`; its `adapt(support, steps,
   seeds=None)` is usually `adapt_with(model, loss, rates)`. `maml.py` is the model to
   copy; algorithms that only change the inner rates build on `maml.unrolled` (see
   `anil.py`).
2. its import in `algorithms.py` (and here), and its entry in `ALGORITHMS`;
3. `configs/maml/algorithms/<name>.gin` (`maml_experiment.algorithm = @<name>` and its
   hyperparameters), and a `configs/maml/sinusoid_<name>.gin` that includes it.

Every test in tests/test_meta.py that loops over `ALGORITHMS` then covers it.

Note: the algorithm modules share their functions' names, so `hogrod.meta.maml` is the
function; the module is `sys.modules["hogrod.meta.maml"]`.
"""

from hogrod.meta.algorithms import (ALGORITHMS, Algorithm, anil, fomaml, imaml, maml,
                                    maml_plus_plus, meta_sgd, reptile)
from hogrod.meta.common import meta_gradient
from hogrod.meta.episodes import (ImageClasses, episodes, load_omniglot, load_tfds_classes,
                                  omniglot_characters)
from hogrod.meta.evaluation import evaluate, evaluator
from hogrod.meta.fewshot import FEW_SHOT, metaoptnet, protonet, r2d2
from hogrod.meta.heads import prototype_logits, ridge_logits, svm_logits
from hogrod.meta.inner import adapt, initial_params
from hogrod.meta.tasks import sample_sinusoids, sinusoid_meta_batches

__all__ = ["adapt", "initial_params", "Algorithm", "ALGORITHMS", "maml", "fomaml",
           "reptile", "anil", "meta_sgd", "maml_plus_plus", "imaml", "meta_gradient",
           "sample_sinusoids", "sinusoid_meta_batches", "ImageClasses", "episodes",
           "load_omniglot", "omniglot_characters", "load_tfds_classes", "evaluate", "evaluator",
           "protonet", "r2d2", "metaoptnet", "FEW_SHOT", "prototype_logits", "ridge_logits",
           "svm_logits"]
