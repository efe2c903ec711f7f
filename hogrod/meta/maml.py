"""MAML (Finn et al. 2017) and first-order MAML: the query loss after a few inner steps,
differentiated through the inner loop. `unrolled` is the shared form (any per-param
rates, learned or frozen), which ANIL and Meta-SGD reuse."""

import gin

from hogrod.meta.common import (Algorithm, adapt_with, check_steps, compiled_when_eager,
                                mean_over_tasks, pass_seed, query_loss, resolve_task_map,
                                task_seeds)
from hogrod.meta.inner import adapt, initial_params

__all__ = ["maml", "fomaml", "unrolled"]


def unrolled(model, loss_fn, rates, inner_steps, first_order, mode, variables=()):
    """The `Algorithm` whose objective is the mean query loss after `inner_steps` steps at
    `rates` (see `hogrod.meta.adapt`'s inner_lr) from the model's weights."""
    check_steps("inner_steps", inner_steps)

    def meta_loss(tasks, step=None):  # step: unused (no schedule)
        params = initial_params(model)  # read once, under the train step's tape
        seeds = task_seeds(model, tasks, inner_steps + 1)  # the inner steps, then the query

        def task_loss(task, seeds, start):
            xs, ys, xq, yq = task
            fast = adapt(model, loss_fn, (xs, ys), rates, inner_steps, first_order, start,
                         seeds=pass_seed(seeds, 0, inner_steps))
            return query_loss(model, loss_fn, fast, xq, yq, pass_seed(seeds, inner_steps))

        return {"loss": mean_over_tasks(task_loss, tasks, seeds, params, mode)}

    return Algorithm(compiled_when_eager(meta_loss), adapt_with(model, loss_fn, rates),
                     list(variables))


@gin.configurable
def maml(model, loss_fn, inner_lr=0.01, inner_steps=1, first_order=False, task_map=None,
         vectorize=None, recompute=None):
    """MAML: the query loss after `inner_steps` steps from theta, differentiated through
    the inner loop (second order unless `first_order`). task_map: None (the
    `task_map.mode` binding), 'vectorized', 'sequential' or 'recomputed';
    vectorize / recompute: deprecated, forwarded to task_map."""
    mode = resolve_task_map("maml", task_map, vectorize, recompute)
    return unrolled(model, loss_fn, inner_lr, inner_steps, first_order, mode)


@gin.configurable
def fomaml(model, loss_fn, inner_lr=0.01, inner_steps=1, task_map=None, vectorize=None,
           recompute=None):
    """First-order MAML: the inner gradients are treated as constants."""
    mode = resolve_task_map("fomaml", task_map, vectorize, recompute)
    return unrolled(model, loss_fn, inner_lr, inner_steps, True, mode)
