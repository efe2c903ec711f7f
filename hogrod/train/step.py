"""The compiled train step: named loss terms, weights, transforms, accumulation, groups,
loss scaling and a tf.distribute strategy, in one `tf.function`.

    step = make_train_step(objective, optimizer, model.trainable_variables,
                           weights={"l2": 1e-4}, transform=clip_by_global_norm(1.0))
    logs = step(batch)   # {"ce": ..., "l2": ..., "loss": ..., "grad_norm": ..., "lr": ...,
                         #  "applied": ...}

`objective(batch)` returns a scalar or a dict of named scalar terms, each a mean over the
examples it was given. The step differentiates the weighted sum once (one tape, every
variable group), averages over micro-batches and replicas, applies the transform, and
updates the variables only if every term and the gradient are finite; the returned logs
let `train_loop` stop on the first non-finite value without saving it.

One step is a chain of small functions, one job each:
  `weighted_total`   the terms and their weighted sum, at the loss's dtype (a Python-number
                      weight multiplies a float64 term in float64, never via float32;
                      `terms.py`);
  `_gradient`         one (micro-)batch's terms and gradient, with loss scaling applied
                      and undone around its tape;
  `_replica_gradient` the mean over a replica's k micro-batches (gradient accumulation);
  `_cross_replica`    the mean over the replicas;
  `_transformed`      the gradient transform (clipping, ...);
  `_apply`            the update, each group by its optimizer through the step-optimizer
                      protocol (`protocol.py`: the gradient, the objective and this
                      replica's batch), only if everything is finite (the guard is a cond
                      in `step`).

The scale convention for gradients. Every gradient here is the gradient of a mean: of the
weighted loss over the examples it was computed from. `_gradient` returns a micro-batch's
(no loss scale left in it), `_replica_gradient` averages the k micro-batches', and
`_cross_replica` averages the replicas' (an all-reduce MEAN: a distributed global batch
is split into equal shards), which gives the gradient of the weighted loss over the
global batch, the same for any replica count and accumulation. That global gradient is
what "grad_norm", the NaN guard and the transform see. It is rescaled in one place,
the Keras adapter of `protocol.py`, into what Keras expects: in a replica context `apply_gradients` sums the
replicas' gradients, so each replica hands it global / replicas; a LossScaleOptimizer
divides by its loss scale (and skips the step on overflow), so it gets them times that
scale.
"""

from typing import Callable, Literal, Mapping, Optional, Sequence

import gin
import keras
import tensorflow as tf
from absl import logging

from hogrod import checks
from hogrod.optim import Optimizer as PureOptimizer
from hogrod.piecewise_linear import skip_zero_curvature
from hogrod.train.compile import check_jit_compile, compiled
from hogrod.train.protocol import StepOptimizer, as_step_optimizer
from hogrod.train.terms import check_weights, objective_terms, weighted_total
from hogrod.train.transforms import global_norm, zeros_for_unconnected
from hogrod.types import Batch, Objective, Scalar

__all__ = ["make_train_step", "build_optimizers"]

# [(optimizer, variables)]: each group of variables updated by its own optimizer (a Keras,
# hogrod.optim or hogrod.train.StepOptimizer optimizer: `protocol.py`)
Groups = Sequence[tuple[keras.optimizers.Optimizer | StepOptimizer, Sequence[tf.Variable]]]


def _name(v):
    return getattr(v, "path", None) or v.name


def _groups(optimizer, variables):
    """Normalize to [(optimizer, [vars])] and check that groups are disjoint."""
    grouped = isinstance(optimizer, (list, tuple)) and not isinstance(optimizer, PureOptimizer)
    if grouped:
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


def build_optimizers(groups: Groups) -> None:
    """Create every optimizer's slots now (inside the current strategy scope).

    Keras 3 creates optimizer variables lazily on the first apply, which fails inside a
    replica function; building here, before the first step, is what makes strategies work.
    An optimizer already built is left as it is.

    Args:
      groups: (optimizer, variables) pairs; each optimizer is built for its variables.
    """
    for opt, vs in groups:
        if not opt.built:
            opt.build(vs)


def _step_groups(groups, replicas, scaler, k):
    """Every group's optimizer behind the step-optimizer protocol (`protocol.py`)."""
    out = []
    for i, (opt, vs) in enumerate(groups):
        step_opt = as_step_optimizer(opt, replicas, scaler if opt is scaler else None)
        if step_opt.uses_batch and k > 1:
            raise ValueError(
                f"make_train_step: accumulation_steps={k} splits the batch, but optimizer "
                f"{type(opt).__name__} (group {i}) computes on the whole batch (its curvature or "
                "line search); use accumulation_steps=1 and a batch that fits")
        out.append((step_opt, vs))
    return out


def _split(batch, k):
    def split(t):
        n = t.shape[0]
        if n is None or n % k:
            raise ValueError(f"accumulation_steps={k} must divide the batch size, got a batch "
                             f"tensor of shape {t.shape}")
        return tf.reshape(t, [k, n // k] + t.shape[1:].as_list())
    return tf.nest.map_structure(split, batch)


def _gradient(objective, weights, variables, scaler, batch):
    """(terms, weighted total, gradient) of one (micro-)batch. With a LossScaleOptimizer
    the tape differentiates total * scale (small half-precision gradients do not
    underflow) and the gradient is divided by the scale here: no loss scale leaves."""
    with tf.GradientTape() as tape:
        terms = objective_terms(objective(batch))
        total = weighted_total(terms, weights)
        differentiated = total
        if scaler is not None:
            differentiated = total * tf.cast(scaler.dynamic_scale, total.dtype)
    with skip_zero_curvature():  # a penalty's or meta-gradient's zeros through ReLUs
        grads = zeros_for_unconnected(tape.gradient(differentiated, variables), variables)
    grads = [tf.convert_to_tensor(g) for g in grads]  # IndexedSlices: dense
    if scaler is not None:
        grads = [g / tf.cast(scaler.dynamic_scale, g.dtype) for g in grads]
    return terms, total, grads


def _replica_gradient(gradient, batch, k):
    """`gradient` averaged over the k micro-batches of this replica's batch: the same mean
    as one pass over the whole batch, with the memory of one micro-batch."""
    if k == 1:
        return gradient(batch)
    micro = _split(batch, k)
    terms, total, grads = gradient(tf.nest.map_structure(lambda t: t[0], micro))
    for i in tf.range(1, k):
        t_i, total_i, g_i = gradient(tf.nest.map_structure(lambda t: t[i], micro))
        terms = {name: terms[name] + t_i[name] for name in terms}
        total += total_i
        grads = [a + b for a, b in zip(grads, g_i)]
    return {name: t / k for name, t in terms.items()}, total / k, [g / k for g in grads]


def _cross_replica(terms, total, grads):
    """The replicas' means averaged: the global batch's (equal shards)."""
    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, (terms, total, grads))


def _finite(terms, norm, scaler):
    finite = tf.reduce_all([tf.math.is_finite(t) for t in terms.values()])
    if scaler is None:  # with loss scaling, overflowing gradients are the scaler's business
        finite = tf.logical_and(finite, tf.math.is_finite(norm))
    return finite


def _transformed(transform, grads, variables):
    if transform is None:
        return grads
    out = transform(grads, variables)
    if not isinstance(out, (list, tuple)) or len(out) != len(grads):
        raise ValueError(f"make_train_step.transform must return a list of {len(grads)} "
                         f"gradients (one per variable), got {type(out).__name__}"
                         + (f" of {len(out)}" if isinstance(out, (list, tuple)) else ""))
    return list(out)


def _apply(groups, grads, loss, batch):
    """Each group's slice of the global gradient to its optimizer (replica context), with
    the objective and this replica's batch (`protocol.py`; a Keras optimizer's adapter
    rescales for `apply_gradients`: the module docstring)."""
    start = 0
    for opt, vs in groups:
        g = grads[start:start + len(vs)]
        start += len(vs)
        opt.apply(g, vs, loss, batch)


def _rate(opt, i):
    return {"lr" if i == 0 else f"lr_group_{i}": tf.cast(opt.learning_rate, tf.float32)}


def _logs(terms, total, norm, groups):
    """The step's logs before the update: a Keras or pure optimizer's rate is the one this
    step is about to use."""
    rates = {}
    for i, (opt, _) in enumerate(groups):
        if opt.adapted and opt.learning_rate is not None:
            rates.update(_rate(opt, i))
    return dict(terms, loss=total, grad_norm=norm, **rates)


def _optimizer_logs(groups):
    """What each step optimizer reports it used (its rate, damping, ...), read after the
    update."""
    out = {}
    for i, (opt, _) in enumerate(groups):
        if not opt.adapted:
            out.update(_rate(opt, i))
        for name, value in opt.logs().items():
            out[name if i == 0 else f"{name}_group_{i}"] = tf.convert_to_tensor(value)
    return out


def _is_default(strategy):
    """Whether `strategy` is the default one (no tf.distribute scope): its `run` calls the
    function as it is and its all-reduce is the identity."""
    return not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy()


def _fused_step(gradient, groups, all_vars, transform, k, loss, jit_compile):
    """The whole step as one XLA computation, the update and its guard included: one
    replica, no loss scaling ("auto": where XLA compiles it, `compile.py`). Outside XLA,
    Keras's update of a few small variables costs as much as a small model's gradient (its
    many small ops, each dispatched)."""
    def step(batch):
        terms, total, grads = _replica_gradient(gradient, batch, k)
        norm = global_norm(grads)
        finite = _finite(terms, norm, None)
        grads = _transformed(transform, grads, all_vars)

        def apply():
            _apply(groups, grads, loss, batch)
            return tf.constant(1.0)

        applied = tf.cond(finite, apply, lambda: tf.constant(0.0))
        return dict(_logs(terms, total, norm, groups), **_optimizer_logs(groups),
                    applied=applied)

    logging.info("train step: %d variables in %d group(s), one XLA computation%s, "
                 "accumulation %d", len(all_vars), len(groups),
                 " where it compiles" if jit_compile == "auto" else "", k)
    return compiled(step, jit_compile, "make_train_step")


def _auto_plain(groups, fused):
    """Why jit_compile="auto" takes the plain step without trying XLA (None: it tries)."""
    if not fused:
        return "a strategy or loss scaling: the update runs outside XLA"
    opted_out = [type(opt).__name__ for opt, _ in groups if not opt.auto_jit_compile]
    if opted_out:
        return (f"optimizer {', '.join(opted_out)} is not compiled with XLA by default "
                "(its auto_jit_compile is False)")
    return None


@gin.configurable(denylist=["objective", "optimizer", "variables"])
def make_train_step(objective: Objective,
                    optimizer: keras.optimizers.Optimizer | Groups,
                    variables: Optional[Sequence[tf.Variable]] = None,
                    weights: Optional[Mapping[str, Scalar]] = None,
                    transform: Optional[Callable[..., list]] = None,
                    accumulation_steps: int = 1,
                    strategy: Optional[tf.distribute.Strategy] = None,
                    jit_compile: bool | Literal["auto"] = "auto"
                    ) -> Callable[[Batch], dict[str, tf.Tensor]]:
    """Build a compiled train step.

    Gin-configurable: `weights`, `transform`, `accumulation_steps`, `strategy` and
    `jit_compile` may be bound (`make_train_step.accumulation_steps = 2`).

    Args:
      objective: the objective over a batch (not a Keras `loss(y_true, y_pred)`):
        `objective(batch)` -> scalar or {name: scalar}; means over the batch given.
        Terms named "monitor/..." are logged (and NaN-guarded) but not optimized.
        Under a multi-replica strategy a Keras loss object (`keras.losses.MeanSquaredError()`)
        returns its shard's mean divided by the replicas (the convention of Keras's own
        `fit`, which sums the replicas' losses): call its function form
        (`keras.losses.mean_squared_error`, then the mean) or
        `hogrod.curvature.data.batch_loss(loss, y, z)`, which multiplies it back.
      optimizer: a Keras optimizer, a `hogrod.optim` optimizer or a
        `hogrod.train.StepOptimizer` (`hogrod.second_order`'s, which receive each step's
        objective and batch: `protocol.py`), with `variables`; or a list of (optimizer,
        variables) groups, e.g. [(Adam(1e-5), backbone_vars), (Adam(1e-3), head_vars)].
        Wrap a single Keras optimizer in `keras.optimizers.LossScaleOptimizer` for mixed
        precision.
      variables: the variables to train with a single optimizer (None with a list of
        groups, which hold their variables).
      weights: {term: weight}; terms not named get weight 1 (None: every weight 1). A weight
        for a term the loss does not return is an error (raised on the first step). A Python
        number is applied at the dtype of the loss (float64 for a float64 loss: exact); a
        scalar tensor or variable (a schedule) is cast to it.
      transform: `transform(grads, variables) -> grads` (see `hogrod.train.transforms`),
        applied to the global gradient; unconnected gradients are zeros (with a warning).
        None: the gradient as it is.
      accumulation_steps: split each batch into this many micro-batches, average their
        gradients, and make one update: the same update as one step on the whole batch,
        with the memory of one micro-batch. Must divide every batch's (per-replica) size.
      strategy: a `tf.distribute.Strategy`; default the current one. The batch passed to
        the step is then a distributed batch (`hogrod.distribute.distribute_dataset`).
      jit_compile: "auto" (default), True or False (`hogrod.train.compiled`). XLA fuses
        the many small elementwise ops of a PINN residual or a small MLP: with the default
        strategy and no loss scaling the whole step (gradient, guard, transform and update)
        is one XLA computation. "auto": that computation where XLA compiles it and computes
        what TensorFlow does, else (an op XLA has no kernel for, a graph assertion it would
        drop, random ops it would draw otherwise) a plain `tf.function`, with one warning,
        decided at the first call before anything changes; under a strategy
        or loss scaling, or with a step optimizer whose `auto_jit_compile` is False
        (`hogrod.second_order`'s), the plain step. True: XLA required (under a strategy or
        loss scaling the loss and its gradient per replica are compiled, the update and the
        all-reduce stay outside). False: plain. A loss that calls `tf.vectorized_map`
        directly defeats XLA: it then takes the batch and the weights as compile-time
        constants and compiles anew on every step (`hogrod.taskmap.vectorized_map` and
        hogrod.meta's algorithms avoid this).

    Returns:
      `step(batch) -> logs`, a `tf.function` (with "auto" and the one-computation step an
      `AutoCompiled`, called the same way); logs hold each term (unweighted; float64
      terms stay float64, the others are float32), "loss" (weighted total, float64 if any
      term is), "grad_norm" (global, before the transform), "lr" (first group;
      "lr_group_1", ... for the others), what a step optimizer reports (its `logs()`:
      damping, ...; suffixed "_group_i" beyond the first group) and "applied" (1.0 if the
      update was applied, 0.0 if a non-finite value stopped it).

    Raises:
      ValueError: the optimizer groups are empty or overlap, `variables` is given with
        groups or missing without them, a LossScaleOptimizer comes with other groups, or a
        weight is not finite.
      TypeError: a variable is not a variable, `objective` or `transform` not callable,
        or `weights` not a dict of numbers or scalar tensors.
      ArgumentError: `accumulation_steps` is not a positive integer, or `jit_compile` not
        "auto", True or False.
      ValueError: `accumulation_steps` > 1 with an optimizer that uses the batch.
    """
    strategy = strategy or tf.distribute.get_strategy()
    groups = _groups(optimizer, variables)
    all_vars = [v for _, vs in groups for v in vs]
    scaler = groups[0][0] if isinstance(groups[0][0], keras.optimizers.LossScaleOptimizer) else None
    if scaler is not None and len(groups) > 1:
        raise ValueError("mixed precision (LossScaleOptimizer) supports one optimizer group")
    weights = check_weights(weights)
    checks.function(objective, "objective", "make_train_step",
                    "objective(batch) -> scalar or {name: scalar}")
    k = checks.integer(accumulation_steps, "accumulation_steps", "make_train_step", least=1)
    jit_compile = check_jit_compile(jit_compile, "make_train_step")
    if transform is not None:
        checks.function(transform, "transform", "make_train_step",
                        "transform(grads, variables) -> grads")
    replicas = strategy.num_replicas_in_sync
    groups = _step_groups(groups, replicas, scaler, k)
    with strategy.scope():
        build_optimizers(groups)

    def gradient(batch):
        return _gradient(objective, weights, all_vars, scaler, batch)

    def loss(batch):  # what a step optimizer evaluates: the weighted total, a mean
        return weighted_total(objective_terms(objective(batch)), weights)

    fused = replicas == 1 and scaler is None and _is_default(strategy)
    if jit_compile == "auto" and _auto_plain(groups, fused):
        logging.info("make_train_step: jit_compile='auto' takes the plain step: %s",
                     _auto_plain(groups, fused))
        jit_compile = False
    if jit_compile and fused:
        return _fused_step(gradient, groups, all_vars, transform, k, loss, jit_compile)
    if jit_compile:
        gradient = tf.function(gradient, jit_compile=True)

    def replica_step(batch):
        terms, total, grads = _cross_replica(*_replica_gradient(gradient, batch, k))
        norm = global_norm(grads)  # before the transform: the raw gradient's size
        finite = _finite(terms, norm, scaler)
        grads = _transformed(transform, grads, all_vars)
        return _logs(terms, total, norm, groups), grads, finite

    @tf.function
    def step(batch):
        logs, grads, finite = strategy.run(replica_step, args=(batch,))
        finite = strategy.experimental_local_results(finite)[0]
        # The update runs only on finite values. The cond is in cross-replica context: a
        # replica-context cond around apply_gradients (which synchronizes) is not allowed.
        def apply():
            strategy.run(lambda g, b: _apply(groups, g, loss, b), args=(grads, batch))
            return tf.constant(1.0)

        applied = tf.cond(finite, apply, lambda: tf.constant(0.0))
        logs = {name: strategy.experimental_local_results(v)[0] for name, v in logs.items()}
        return dict(logs, **_optimizer_logs(groups), applied=applied)

    logging.info("train step: %d variables in %d group(s), %d replica(s), accumulation %d",
                 len(all_vars), len(groups), replicas, k)
    return step
