"""Metric and convex-head few-shot learners: Prototypical Networks, R2D2 and
MetaOptNet-SVM, as `Algorithm`s of the meta family.

The model is an embedding network (its output `[batch, d]`, no classification layer). For
each task of a meta-batch it embeds the support set and the query set (two forward passes,
each with its own seed for random layers, BatchNorm on each batch's statistics as in MAML's
transductive setting), a head (`hogrod.meta.heads`) fits the support embeddings in closed
form or by a convex solve, and the objective is `loss(y_query, logits)` averaged over the
tasks: no inner gradient steps, the meta-gradient flows through the head's solution.

The number of classes is read from the labels: one more than the largest support label of
the meta-batch (of the task, in `adapt`), so a model trained on 60-way episodes is
evaluated on 5- or 20-way ones with the same `Algorithm`; a task missing a class is an
error naming it, and so is a query label outside those classes. `adapt(support, steps=0,
seeds=None)` returns the head's solution (its support pass seeded by `seeds[0]`, which
`hogrod.meta.evaluate` draws from its seed and the task's index; None: the model's seed
states) and `predict` the query logits from it; these
algorithms have no adaptation steps, so `evaluate` them with `steps=(0,)`
(`accuracy_after_0`).
"""

from typing import Optional

import gin
import keras
import numpy as np
import tensorflow as tf

from hogrod import checks, taskmap
from hogrod.meta import heads, svm
from hogrod.meta.common import (Algorithm, check_loss, compiled_when_eager, pass_seed,
                                task_seeds)
from hogrod.meta.inner import initial_params, run
from hogrod.types import Loss

__all__ = ["protonet", "r2d2", "metaoptnet", "FEW_SHOT"]

# The traced functions have no Python control flow on tensors: converting them (and the
# implicit differentiation they call) with AutoGraph would only multiply the trace time.
_no_autograph = tf.autograph.experimental.do_not_convert


def _embeddings(model, params, inputs, seeds):
    """One task's support and query embeddings, one forward pass (and seed) each."""
    xs, xq = inputs
    return (run(model, params, xs, True, pass_seed(seeds, 0)),
            run(model, params, xq, True, pass_seed(seeds, 1)))


def _classes(labels):
    """One more than the largest label (an int32 scalar tensor)."""
    return tf.reduce_max(tf.cast(labels, tf.int32)) + 1


def _support_seed(seeds, where):
    """The support pass's seed in `adapt`: None (the model's seed states, for a direct
    call), else the first of `seeds` [passes, generators, 2], which must hold one: at 0
    steps `hogrod.meta.evaluate` gives one, drawn from its seed and the task's index."""
    if seeds is None:
        return None
    seeds = tf.convert_to_tensor(seeds)
    if seeds.shape.rank != 3 or seeds.shape[0] == 0:
        raise checks.ArgumentError(
            f"{where}: adapt's seeds must be None or one pass's seeds for the support pass, "
            f"[passes >= 1, generators, 2], got {checks.describe(seeds)}")
    return seeds[0]


def _query_labels_checked(labels, n_way, where):
    """The assertion that the query labels are in `0..n_way-1` (`n_way` a tensor, printed
    with the labels' range when it fails)."""
    labels = tf.convert_to_tensor(labels)
    if not labels.dtype.is_integer:
        raise checks.ArgumentError(f"{where}: the query labels (tasks[3]) must be integers, "
                                   f"got {checks.describe(labels)}")
    labels = tf.cast(labels, tf.int32)
    low, high = tf.reduce_min(labels), tf.reduce_max(labels)
    return checks.require(
        tf.logical_and(low >= 0, high < n_way),
        f"{where}: the query labels (tasks[3]) must be in 0..n_way-1, n_way being one more "
        "than the largest support label (printed below with the query labels' range): a "
        "query class must have support examples",
        data=["n_way =", n_way, "query labels from", low, "to", high])


def _headed(model, loss, fit, logits_of, variables, task_map, where):
    """The `Algorithm` of a head: `fit(support, labels, n_way) -> solution` and
    `logits_of(solution, query) -> logits`, each on `[..., n, d]` embeddings with any
    leading axes (the meta-batch's tasks in `meta_loss`, none in `adapt`)."""
    check_loss(loss, where)
    mode = taskmap.check_task_map(task_map, where)
    if not model.trainable_variables:
        raise checks.ArgumentError(f"{where}: the model has no trainable variables (not "
                                   "built?); give a built embedding network")

    @_no_autograph
    def meta_loss(tasks, step=None):  # step: unused (no schedule)
        params = initial_params(model)  # read once, under the train step's tape
        seeds = task_seeds(model, tasks, 2)  # the support pass, then the query pass
        # only the inputs are mapped (the labels go to the head, outside the mapping)
        support, query = taskmap.map_tasks(
            lambda inputs, s, p: _embeddings(model, p, inputs, s), (tasks[0], tasks[2]), seeds,
            params, mode)
        # the classes of the support labels; a query label outside them is an error
        n_way = _classes(tasks[1])
        with tf.control_dependencies(_query_labels_checked(tasks[3], n_way, where)):
            logits = logits_of(fit(support, tasks[1], n_way), query)
        per_task = tf.map_fn(lambda e: tf.cast(loss(e[0], e[1]), logits.dtype),
                             (tasks[3], logits), fn_output_signature=logits.dtype)
        return {"loss": tf.reduce_mean(per_task)}

    @_no_autograph
    def adapt(support, steps=0, seeds=None):
        """The head's solution on one task's support set (steps must be 0); the support
        pass takes `seeds[0]` (None: the model's seed states)."""
        if not checks.integer(steps, "steps", where) == 0:
            raise checks.ArgumentError(
                f"{where}: has no adaptation steps, got steps={steps}; evaluate it with "
                "steps=(0,) (in an experiment, maml_experiment.eval_steps = (0,))")
        xs, ys = support
        embedded = run(model, initial_params(model), xs, True, _support_seed(seeds, where))
        return fit(embedded, ys, _classes(ys))

    @_no_autograph
    def predict(solution, x, steps=0, seed=None):
        """The query logits `[q, n_way]` under the head's solution."""
        return logits_of(solution, run(model, initial_params(model), x, True, seed))

    return Algorithm(compiled_when_eager(meta_loss, model), adapt, list(variables), predict)


@gin.configurable
def protonet(model: keras.Model, loss: Loss, task_map: str = "vectorized") -> Algorithm:
    """Prototypical Networks (Snell et al. 2017): logits minus the squared distance to each
    class's mean support embedding (`hogrod.meta.prototype_logits`).

    Args:
      model: a built Keras 3 embedding network, outputs `[batch, d]`.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar` of the query labels and logits
        (`hogrod.models.cross_entropy`).
      task_map: how the tasks' forward passes are mapped: 'vectorized', 'sequential' or
        'recomputed' (see `hogrod.meta.maml`).

    Returns:
      An `Algorithm` without variables; `adapt` returns the prototypes `[n_way, d]`.
    """
    where = "hogrod.meta.protonet"

    def fit(support, labels, n_way):
        xs, _, _, one_hot, counts, asserts = heads.episode(support, labels, support, n_way,
                                                           where)
        with tf.control_dependencies(asserts):
            return heads.prototypes_of(xs, one_hot, counts)

    return _headed(model, loss, fit, lambda p, q: heads.distance_logits(q, p), (), task_map,
                   where)


def _scalar_variable(value, dtype, name, arg, where, positive=False):
    value = (checks.positive if positive else checks.number)(value, arg, where)
    return tf.Variable(np.asarray(np.log(value) if positive else value,
                                  dtype.as_numpy_dtype), name=name)


def _dtype(model, where):
    dtypes = {tf.as_dtype(v.dtype) for v in model.trainable_variables}
    if len(dtypes) != 1:
        raise checks.ArgumentError(f"{where}: the head's learned scalars need one dtype for "
                                   f"every trainable variable of the model, got "
                                   f"{sorted(d.name for d in dtypes)}")
    return dtypes.pop()


@gin.configurable
def r2d2(model: keras.Model, loss: Loss, l2: float = 1.0, scale: float = 1.0,
         bias: float = 0.0, task_map: str = "vectorized") -> Algorithm:
    """R2D2 (Bertinetto et al. 2019): ridge regression onto one-hot targets in closed form
    (`hogrod.meta.ridge_logits`, the smaller of its primal and Woodbury systems), its
    penalty, scale and bias learned.

    `Algorithm.variables` are three scalars at the model's dtype, meta-trained with the
    weights: log(l2) (so the penalty stays positive), the logits' scale and bias.

    Args:
      model: a built Keras 3 embedding network, outputs `[batch, d]`.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar` of the query labels and logits.
      l2: the ridge penalty's starting value, > 0.
      scale: the logits' scale, starting value.
      bias: the logits' bias, starting value.
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      An `Algorithm` whose variables are `[log_l2, scale, bias]`; `adapt` returns the ridge
      weights `[d, n_way]`.
    """
    where = "hogrod.meta.r2d2"
    dtype = _dtype(model, where)
    log_l2 = _scalar_variable(l2, dtype, "r2d2_log_l2", "l2", where, positive=True)
    scale_v = _scalar_variable(scale, dtype, "r2d2_scale", "scale", where)
    bias_v = _scalar_variable(bias, dtype, "r2d2_bias", "bias", where)

    def fit(support, labels, n_way):
        xs, _, _, one_hot, _, asserts = heads.episode(support, labels, support, n_way, where)
        with tf.control_dependencies(asserts):
            return heads.ridge_weights(xs, one_hot, tf.exp(tf.cast(log_l2, xs.dtype)))

    def logits_of(weights, query):
        return heads.affine(tf.linalg.matmul(query, weights), scale_v, bias_v)

    return _headed(model, loss, fit, logits_of, [log_l2, scale_v, bias_v], task_map, where)


@gin.configurable
def metaoptnet(model: keras.Model, loss: Loss, c: float = 0.1, scale: float = 1.0,
               learn_scale: bool = True, maxiter: int = svm.SVM_MAXITER,
               tol: Optional[float] = None, kernel_ridge: float = svm.KERNEL_RIDGE,
               task_map: str = "vectorized") -> Algorithm:
    """MetaOptNet-SVM (Lee et al. 2019): the Crammer-Singer multi-class SVM on the support
    embeddings (`hogrod.meta.svm_logits`), solved in its dual per task and differentiated
    implicitly at its solution, the logits times a learned scale (MetaOptNet's).

    In `meta_loss` the tasks' duals are solved together, one batched interior-point solve
    (`hogrod.linalg.simplex_qp`) with each task's own implicit gradient, outside the
    mapping of the forward passes, so every task_map maps the embeddings as it says. They are solved in float64 whatever the
    model's dtype (see `hogrod.meta.svm`).

    Args:
      model: a built Keras 3 embedding network, outputs `[batch, d]`.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar` of the query labels and logits.
      c: the SVM's slack penalty C, > 0 (MetaOptNet's 0.1).
      scale: the logits' scale, starting value.
      learn_scale: meta-train the scale (`Algorithm.variables`); False keeps it fixed.
      maxiter: the dual solver's iteration limit (see `hogrod.meta.svm_logits`); the
        embeddings' norms grow in meta-training, and with them the iterations needed.
      tol: the dual solver's relative tolerance (None: 7.5e-9; see
        `hogrod.meta.svm_logits`).
      kernel_ridge: r >= 0 added to the diagonal of the dual's kernel (MetaOptNet's 1.0:
        the dual strongly convex, its solution and gradient unique even for linearly
        dependent support embeddings; 0: the plain SVM; see `hogrod.meta.svm_logits`).
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      An `Algorithm` whose variables are `[scale]` (none if not `learn_scale`); `adapt`
      returns `(weights [d, n_way], dual [n, n_way])`.
    """
    where = "hogrod.meta.metaoptnet"
    c = checks.positive(c, "c", where)
    maxiter = checks.integer(maxiter, "maxiter", where, least=1)
    kernel_ridge = checks.nonnegative(kernel_ridge, "kernel_ridge", where)
    if tol is not None:
        tol = checks.positive(tol, "tol", where)
    if not isinstance(learn_scale, bool):
        raise checks.ArgumentError(f"{where}: learn_scale must be True or False, got "
                                   f"{learn_scale!r}")
    dtype = _dtype(model, where)
    scale_v = _scalar_variable(scale, dtype, "metaoptnet_scale", "scale", where)
    variables = [scale_v] if learn_scale else []
    scale_value = scale_v if learn_scale else checks.number(scale, "scale", where)

    def fit(support, labels, n_way):
        xs, ys, _, _, _, asserts = heads.episode(support, labels, support, n_way, where)

        # a meta-batch [tasks, n, d] is solved at once, each task checked and differentiated
        # on its own
        alpha = svm.svm_dual(xs, ys, n_way, c, maxiter, tol, batched=xs.shape.rank != 2,
                             asserts=asserts, where=where, kernel_ridge=kernel_ridge)
        return tf.linalg.matmul(xs, alpha, transpose_a=True), alpha

    def logits_of(solution, query):
        return heads.affine(tf.linalg.matmul(query, solution[0]), scale_value, None)

    return _headed(model, loss, fit, logits_of, variables, task_map, where)


#: The few-shot algorithms by name (gin: `maml_experiment.algorithm = @protonet`, ...).
FEW_SHOT = {"protonet": protonet, "r2d2": r2d2, "metaoptnet": metaoptnet}
