"""MAML++ (Antoniou et al. 2019): MAML with learned per-layer per-step rates, the annealed
multi-step loss, a first-order warm-up and per-step BatchNorm statistics."""

from typing import Optional

import gin
import keras
import tensorflow as tf

from hogrod import checks, functional, taskmap
from hogrod.meta.common import (Algorithm, adapt_with, check_loss, compiled_when_eager,
                                pass_seed, query_loss, task_seeds)
from hogrod.meta.inner import adapt, as_dtype, check_rate, initial_params, seeded_state
from hogrod.types import Loss, Scalar

__all__ = ["maml_plus_plus"]


def _per_step_statistics(model, inner_steps, transductive):
    """Slots of the float non-trainable state (BatchNorm moving mean and variance) and one
    copy of them per number of inner updates; none when transductive (never read)."""
    tracked = [] if transductive else [i for i, v in enumerate(model.non_trainable_variables)
                                       if tf.as_dtype(v.dtype).is_floating]
    copies = [[tf.Variable(model.non_trainable_variables[i], trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.MEAN,
                           name=f"bn_step{s}/{model.non_trainable_variables[i].name}")
               for i in tracked] for s in range(inner_steps + 1)] if tracked else []
    return tracked, copies


@gin.configurable
def maml_plus_plus(model: keras.Model, loss: Loss, inner_lr: Scalar = 0.01,
                   inner_steps: int = 5, multi_step_iterations: int = 10000,
                   first_order_iterations: int = 5000,
                   iterations: Optional[tf.Variable] = None, transductive: bool = True,
                   task_map: str = "vectorized") -> Algorithm:
    """MAML++: MAML with per-step rates, the multi-step loss and per-step statistics.

    - learned per-layer, per-step inner rates (LSLR), initialized at `inner_lr`;
    - the multi-step loss: the query loss after every inner step, weighted from uniform
      toward the last step only over `multi_step_iterations` outer steps;
    - first-order for the first `first_order_iterations` outer steps, second order after;
    - per-step BatchNorm running statistics (BNRS): one copy of the model's BatchNorm
      statistics per number of inner updates (0 .. inner_steps), each an exponential moving
      average (the layers' own momentum) of the batch statistics the weights after that
      many updates see (support batches; the query batch after the last update), averaged
      over the meta-batch and over replicas.

    The outer step counter is `meta_loss(tasks, step)`'s step (e.g. the optimizer's
    `iterations`); `iterations` (a variable read on every call) is used when no step is
    given. One of them is required.

    The losses always use batch statistics (transductive, as MAML and MAML++'s code train).
    `transductive=False` keeps the per-step running statistics (one extra forward pass per
    inner step) and makes `Algorithm.predict` use them (training=False), so a query
    prediction does not depend on the other query examples; with the default True they
    would never be read, so they are not kept.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the learned rates' starting value.
      inner_steps: inner steps per task (>= 1).
      multi_step_iterations: outer steps over which the multi-step loss's weights move to
        the last step (>= 0).
      first_order_iterations: outer steps run first-order (>= 0).
      iterations: None, or the outer iteration counter (a variable, e.g.
        `optimizer.iterations`), used when `meta_loss` is called without a step.
      transductive: True (the default): predictions use batch statistics; False: keep
        per-step running statistics and predict with them (see above; needs BatchNorm).
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      an `Algorithm` (its `predict` set when not transductive, its `state` the per-step
      statistics).

    Raises:
      ValueError: `transductive=False` on a model without BatchNorm; when run, no step and
        no `iterations`.
      hogrod.checks.ArgumentError: a bad `loss`, `task_map`, `inner_steps`, iteration
        count or `transductive`, named.
    """
    where = "hogrod.meta.maml_plus_plus"
    check_loss(loss, where)
    mode = taskmap.check_task_map(task_map, where)
    inner_steps = checks.integer(inner_steps, "inner_steps", where, least=1)
    multi_step_iterations = checks.integer(multi_step_iterations, "multi_step_iterations",
                                           where)
    first_order_iterations = checks.integer(first_order_iterations, "first_order_iterations",
                                            where)
    if not isinstance(transductive, bool):
        raise checks.ArgumentError(f"{where}: transductive must be True or False, got "
                                   f"{transductive!r}")
    variables = model.trainable_variables
    layer_of = {id(v): layer.name for layer in model.layers for v in layer.trainable_variables}
    dtype = variables[0].dtype
    check_rate(inner_lr, "inner_lr", "maml_plus_plus")
    lslr = {name: tf.Variable(tf.fill([inner_steps], as_dtype(inner_lr, dtype)),
                              name=f"lslr/{name}") for name in sorted(set(layer_of.values()))}
    tracked, step_stats = _per_step_statistics(model, inner_steps, transductive)
    if not transductive and not tracked:
        raise ValueError("maml_plus_plus.transductive = False needs a model with BatchNorm "
                         "(its per-step statistics are what predictions use)")

    def state_at(s):  # the model's state with step s's statistics substituted
        state = functional.model_state(model)
        for i, var in zip(tracked, step_stats[s]):
            state[i] = tf.convert_to_tensor(var)
        return state

    def updated_stats(s, fast, x, seed):  # step s's statistics after seeing batch x
        _, new = functional.functional_call(model, [tf.stop_gradient(p) for p in fast], x,
                                            training=True,
                                            state=seeded_state(model, seed, state_at(s)))
        return [tf.stop_gradient(new[i]) for i in tracked]

    def rates(step):
        return [lslr[layer_of[id(v)]][step] for v in variables]

    def step_weights(counter):
        progress = tf.minimum(tf.cast(counter, dtype) / max(multi_step_iterations, 1), 1.0)
        uniform = tf.fill([inner_steps], as_dtype(1.0 / inner_steps, dtype))
        last = tf.one_hot(inner_steps - 1, inner_steps, dtype=dtype)
        return (1.0 - progress) * uniform + progress * last

    def task_losses(task, seeds, params, first_order):
        """The query loss after each inner step, and the per-step statistics. Passes
        s < inner_steps: the support at step s (its statistics too); then the query after
        each step (the last one's statistics on the query batch)."""
        xs, ys, xq, yq = task
        fast, losses, stats = params, [], []
        for s in range(inner_steps):
            if tracked:
                stats.append(updated_stats(s, fast, xs, pass_seed(seeds, s)))
            fast = adapt(model, loss, (xs, ys), lambda _, s=s: rates(s), 1, first_order,
                         fast, seeds=pass_seed(seeds, s, s + 1))
            losses.append(query_loss(model, loss, fast, xq, yq,
                                     pass_seed(seeds, inner_steps + s)))
        if tracked:
            stats.append(updated_stats(inner_steps, fast, xq,
                                       pass_seed(seeds, 2 * inner_steps - 1)))
        return tf.stack(losses), stats

    def meta_loss(tasks, step=None):
        counter = iterations if step is None else step
        if counter is None:
            raise ValueError(
                "maml_plus_plus needs the outer iteration counter: call "
                "algo.meta_loss(tasks, step) (e.g. step=optimizer.iterations), or build it "
                "with iterations=optimizer.iterations")
        params = initial_params(model)
        seeds = task_seeds(model, tasks, 2 * inner_steps)

        first_order = counter < first_order_iterations
        if mode == "recomputed":  # a tf.recompute_grad in a cond's branch has no gradient
            per_step, stats = taskmap.mean_over_tasks(lambda t, sd, p: tf.cond(
                first_order, lambda: task_losses(t, sd, p, True),
                lambda: task_losses(t, sd, p, False)), tasks, seeds, params, mode)
        else:  # one cond around the map: no per-task cond for pfor to convert
            per_step, stats = tf.cond(first_order, *[
                lambda fo=fo: taskmap.mean_over_tasks(
                    lambda t, sd, p: task_losses(t, sd, p, fo), tasks, seeds, params, mode)
                for fo in (True, False)])
        for step_vars, values in zip(step_stats, stats):
            for var, value in zip(step_vars, values):
                var.assign(value)
        return {"loss": tf.reduce_sum(step_weights(counter) * per_step),
                "monitor/query_last": per_step[-1]}

    def predict_non_transductive(fast, x, steps, seed=None):  # seed: Dropout is inactive
        return functional.functional_call(model, fast, x, training=False,
                                          state=state_at(min(steps, inner_steps)))[0]

    # evaluation: step s at its own learned rate (past inner_steps, the last step's)
    adapt_eval = adapt_with(model, loss, lambda s: rates(min(s, inner_steps - 1)))
    return Algorithm(compiled_when_eager(meta_loss, model), adapt_eval, list(lslr.values()),
                     None if transductive else predict_non_transductive,
                     [v for step_vars in step_stats for v in step_vars])
