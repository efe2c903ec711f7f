"""The compiled train step: named loss terms, weights, transforms, accumulation, groups,
loss scaling and a tf.distribute strategy, in one `tf.function`.

    step = make_train_step(loss_fn, optimizer, model.trainable_variables,
                           weights={"l2": 1e-4}, transform=clip_by_global_norm(1.0))
    logs = step(batch)   # {"ce": ..., "l2": ..., "loss": ..., "grad_norm": ..., "lr": ...,
                         #  "applied": ...}

`loss_fn(batch)` returns a scalar or a dict of named scalar terms, each a mean over the
examples it was given. The step differentiates the weighted sum once (one tape, every
variable group), sums the gradient over replicas, undoes loss scaling, applies the
transform, and updates the variables only if every term and the gradient are finite; the
returned logs let `train_loop` stop on the first non-finite value without saving it.
"""

import numbers

import gin
import keras
import tensorflow as tf
from absl import logging

from hogrod.train.transforms import global_norm, zeros_for_unconnected

__all__ = ["make_train_step", "build_optimizers", "MONITOR"]

MONITOR = "monitor/"  # terms named "monitor/..." are logged and guarded, not optimized


def _name(v):
    return getattr(v, "path", None) or v.name


def _groups(optimizer, variables):
    """Normalize to [(optimizer, [vars])] and check that groups are disjoint."""
    if isinstance(optimizer, (list, tuple)):
        groups = [(opt, list(vs)) for opt, vs in optimizer]
        if not groups:
            raise ValueError("make_train_step: optimizer is an empty list of (optimizer, "
                             "variables) groups")
        if variables is not None:
            raise ValueError("pass variables inside the (optimizer, variables) groups, not both")
    else:
        if variables is None:
            raise ValueError("make_train_step needs `variables` with a single optimizer")
        groups = [(optimizer, list(variables))]
    grouped = isinstance(optimizer, (list, tuple))
    for i, (_, vs) in enumerate(groups):
        where = f"optimizer group {i}'s variables" if grouped else "variables"
        if not vs:
            raise ValueError(f"make_train_step: {where} is empty; nothing would be trained "
                             "(a model not built yet has no variables)")
        for j, v in enumerate(vs):
            if not isinstance(v, (tf.Variable, keras.Variable)):
                raise TypeError(f"make_train_step: {where}[{j}] must be a variable, got "
                                f"{type(v).__name__}")
    owner = {}
    for i, (_, vs) in enumerate(groups):
        for v in vs:
            key = id(v)
            if key in owner:
                raise ValueError(f"variable '{_name(v)}' is in optimizer groups {owner[key]} and "
                                 f"{i}; groups must not overlap")
            owner[key] = i
    return groups


def build_optimizers(groups):
    """Create every optimizer's slots now (inside the current strategy scope).

    Keras 3 creates optimizer variables lazily on the first apply, which fails inside a
    replica function; building here, before the first step, is what makes strategies work.
    """
    for opt, vs in groups:
        if not opt.built:
            opt.build(vs)


def _terms(value):
    terms = dict(value) if isinstance(value, dict) else {"loss": value}
    out = {}
    for name, t in terms.items():
        t = tf.convert_to_tensor(t)
        if t.shape.rank != 0:
            raise ValueError(f"loss term '{name}' must be a scalar, got shape {t.shape}")
        out[name] = tf.cast(t, tf.float32)
    return out


def _split(batch, k):
    def split(t):
        n = t.shape[0]
        if n is None or n % k:
            raise ValueError(f"accumulation_steps={k} must divide the batch size, got a batch "
                             f"tensor of shape {t.shape}")
        return tf.reshape(t, [k, n // k] + t.shape[1:].as_list())
    return tf.nest.map_structure(split, batch)


@gin.configurable(denylist=["loss_fn", "optimizer", "variables"])
def make_train_step(loss_fn, optimizer, variables=None, weights=None, transform=None,
                    accumulation_steps=1, strategy=None, jit_compile=False):
    """Build a compiled train step.

    Args:
      loss_fn: `loss_fn(batch)` -> scalar or {name: scalar}; means over the batch given.
        Terms named "monitor/..." are logged (and NaN-guarded) but not optimized.
      optimizer: a Keras optimizer (with `variables`), or a list of (optimizer, variables)
        groups, e.g. [(Adam(1e-5), backbone_vars), (Adam(1e-3), head_vars)]. Wrap a single
        optimizer in `keras.optimizers.LossScaleOptimizer` for mixed precision.
      variables: the variables to train with a single optimizer.
      weights: {term: weight}; terms not named get weight 1. A weight for a term the loss
        does not return is an error (raised on the first step).
      transform: `transform(grads, variables) -> grads` (see `hogrod.train.transforms`),
        applied to the global gradient; unconnected gradients are zeros (with a warning).
      accumulation_steps: split each batch into this many micro-batches, average their
        gradients, and make one update: the same update as one step on the whole batch,
        with the memory of one micro-batch.
      strategy: a `tf.distribute.Strategy`; default the current one. The batch passed to
        the step is then a distributed batch (`strategy.experimental_distribute_dataset`).
      jit_compile: compile the loss and its gradient (per replica) with XLA, which fuses
        the many small elementwise ops of a PINN residual or a small MLP; the update and
        the all-reduce stay outside XLA. A loss that calls `tf.vectorized_map` directly
        defeats it: XLA then takes the batch and the weights as compile-time constants
        and compiles anew on every step (hogrod.meta's algorithms avoid this).

    Returns:
      `step(batch) -> logs`, a `tf.function`; logs hold each term (unweighted), "loss"
      (weighted total), "grad_norm" (global, before the transform), "lr" (first group;
      "lr_group_1", ... for the others) and "applied" (1.0 if the update was applied,
      0.0 if a non-finite value stopped it).
    """
    strategy = strategy or tf.distribute.get_strategy()
    groups = _groups(optimizer, variables)
    all_vars = [v for _, vs in groups for v in vs]
    scaler = groups[0][0] if isinstance(groups[0][0], keras.optimizers.LossScaleOptimizer) else None
    if scaler is not None and len(groups) > 1:
        raise ValueError("mixed precision (LossScaleOptimizer) supports one optimizer group")
    weights = dict(weights or {})
    k = accumulation_steps
    if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
        raise ValueError(f"make_train_step.accumulation_steps must be an integer >= 1, got "
                         f"{accumulation_steps!r}")
    k = int(k)
    with strategy.scope():
        build_optimizers(groups)

    def weighted(terms):
        unknown = sorted(set(weights) - set(terms))
        if unknown:
            raise ValueError(f"weights given for unknown loss term(s) {unknown}; the loss "
                             f"returns {sorted(terms)}")
        return tf.add_n([weights.get(n, 1.0) * t for n, t in terms.items()
                         if not n.startswith(MONITOR)])

    def grads_of(batch, scale):
        with tf.GradientTape() as tape:
            terms = _terms(loss_fn(batch))
            total = weighted(terms)
            objective = total * scale
            if scaler is not None:
                objective = scaler.scale_loss(objective)
        grads = tape.gradient(objective, all_vars)
        grads = zeros_for_unconnected(grads, all_vars)
        grads = [tf.convert_to_tensor(g) for g in grads]
        if scaler is not None:
            grads = [g / tf.cast(scaler.dynamic_scale, g.dtype) for g in grads]
        return terms, total, grads

    if jit_compile:
        grads_of = tf.function(grads_of, jit_compile=True)

    def replica_step(batch):
        ctx = tf.distribute.get_replica_context()
        n = strategy.num_replicas_in_sync
        if k == 1:
            terms, total, grads = grads_of(batch, 1.0 / n)
        else:
            micro = _split(batch, k)
            first = tf.nest.map_structure(lambda t: t[0], micro)
            terms, total, grads = grads_of(first, 1.0 / (n * k))
            for i in tf.range(1, k):
                t_i, tot_i, g_i = grads_of(tf.nest.map_structure(lambda t: t[i], micro),
                                           1.0 / (n * k))
                terms = {name: terms[name] + t_i[name] for name in terms}
                total += tot_i
                grads = [a + b for a, b in zip(grads, g_i)]
            terms = {name: t / k for name, t in terms.items()}
            total /= k
        # Global values: gradients summed over replicas, terms averaged.
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        terms = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, terms)
        total = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, total)
        norm = global_norm(grads)
        finite = tf.reduce_all([tf.math.is_finite(t) for t in terms.values()])
        if scaler is None:  # with loss scaling, overflowing gradients are the scaler's business
            finite = tf.logical_and(finite, tf.math.is_finite(norm))
        if transform is not None:
            grads = transform(grads, all_vars)
        rates = {"lr" if i == 0 else f"lr_group_{i}": tf.cast(opt.learning_rate, tf.float32)
                 for i, (opt, _) in enumerate(groups)}
        logs = dict(terms, loss=total, grad_norm=norm, **rates)
        return logs, grads, finite

    def replica_apply(grads):
        n = strategy.num_replicas_in_sync
        start = 0
        for opt, vs in groups:
            g = grads[start:start + len(vs)]
            start += len(vs)
            # Keras sums gradients over replicas itself; ours are already summed.
            g = [gi / n for gi in g]
            if opt is scaler:  # it unscales (and skips overflowing steps) itself
                g = [gi * tf.cast(scaler.dynamic_scale, gi.dtype) for gi in g]
            opt.apply_gradients(zip(g, vs))

    @tf.function
    def step(batch):
        logs, grads, finite = strategy.run(replica_step, args=(batch,))
        finite = strategy.experimental_local_results(finite)[0]
        # The update runs only on finite values. The cond is in cross-replica context: a
        # replica-context cond around apply_gradients (which synchronizes) is not allowed.
        def apply():
            strategy.run(replica_apply, args=(grads,))
            return tf.constant(1.0)

        applied = tf.cond(finite, apply, lambda: tf.constant(0.0))
        logs = {name: strategy.experimental_local_results(v)[0] for name, v in logs.items()}
        return dict(logs, applied=applied)

    logging.info("train step: %d variables in %d group(s), %d replica(s), accumulation %d",
                 len(all_vars), len(groups), strategy.num_replicas_in_sync, k)
    return step
