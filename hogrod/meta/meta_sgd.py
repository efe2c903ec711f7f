"""Meta-SGD (Li et al. 2017): MAML with a learned inner rate per parameter entry."""

import gin
import tensorflow as tf

from hogrod.meta.common import resolve_task_map
from hogrod.meta.inner import as_dtype
from hogrod.meta.maml import unrolled

__all__ = ["meta_sgd"]


@gin.configurable
def meta_sgd(model, loss_fn, inner_lr=0.01, inner_steps=1, task_map=None, vectorize=None,
             recompute=None):
    """Meta-SGD: a learned inner learning rate per parameter entry, initialized at
    `inner_lr` and meta-trained with the weights (`Algorithm.variables`)."""
    mode = resolve_task_map("meta_sgd", task_map, vectorize, recompute)
    rates = [tf.Variable(tf.fill(v.shape, as_dtype(inner_lr, v.dtype)),
                         name=f"lr/{v.path.replace('/', '_')}")
             for v in model.trainable_variables]
    return unrolled(model, loss_fn, rates, inner_steps, False, mode, variables=rates)
