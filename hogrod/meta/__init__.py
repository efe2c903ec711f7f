"""Gradient-based meta-learning on any Keras 3 model.

- `adapt(model, loss_fn, support, inner_lr, steps=1, first_order=False, params=None)`: the
  pure inner loop (`inner.py`).
- algorithms, each `(model, loss_fn, ...) -> Algorithm(meta_loss, adapt, variables)`:
  `maml`, `fomaml`, `reptile`, `anil`, `meta_sgd`, `maml_plus_plus`, `imaml`
  (`algorithms.py`); the meta-loss goes to `hogrod.train.make_train_step`.
- tasks: `sinusoid_meta_batches`, `sample_sinusoids` (`tasks.py`); N-way K-shot
  `episodes` from `load_omniglot` (the original zips) or `load_tfds_classes` (`episodes.py`).
- `evaluate`, `evaluator` (traced once, for periodic use): query loss/accuracy after 0, 1,
  ... adaptation steps (`evaluation.py`).
"""

from hogrod.meta.algorithms import (ALGORITHMS, Algorithm, anil, fomaml, imaml, maml,
                                    maml_plus_plus, meta_sgd, reptile)
from hogrod.meta.episodes import ImageClasses, episodes, load_omniglot, load_tfds_classes
from hogrod.meta.evaluation import evaluate, evaluator
from hogrod.meta.inner import adapt, initial_params
from hogrod.meta.tasks import sample_sinusoids, sinusoid_meta_batches

__all__ = ["adapt", "initial_params", "Algorithm", "ALGORITHMS", "maml", "fomaml", "reptile",
           "anil", "meta_sgd", "maml_plus_plus", "imaml", "sample_sinusoids",
           "sinusoid_meta_batches", "ImageClasses", "episodes", "load_omniglot",
           "load_tfds_classes", "evaluate", "evaluator"]
