"""MAML and its family, each as a meta-loss that `hogrod.train.make_train_step` minimizes.

Every algorithm here is a function `(model, loss_fn, ...) -> Algorithm` where

- `Algorithm.meta_loss(tasks) -> {"query": scalar, ...}` is the outer objective over a
  meta-batch `tasks = (x_support, y_support, x_query, y_query)`, each with a leading task
  axis; its gradient with respect to the model's variables (and `Algorithm.variables`, the
  algorithm's own learned quantities) is the algorithm's meta-gradient;
- `Algorithm.adapt(support, steps)` gives the fast weights used at evaluation;
- `Algorithm.variables` lists extra trainables (Meta-SGD's and MAML++'s learned rates).

Reptile and iMAML do not differentiate a loss through the inner loop; they are written as
surrogate losses whose gradient is their update: Reptile's 0.5 ||theta - sg(phi)||^2 has
gradient theta - phi, iMAML's <theta, sg(g)> has gradient g, the implicit meta-gradient.
So one compiled train step (clipping, logging, NaN guard, tf.distribute sharding of the
meta-batch across replicas) serves every algorithm.

The meta-batch is vectorized with `tf.vectorized_map` (the inner tapes included); set
`vectorize=False` for a sequential `tf.map_fn` (less memory), and `recompute=True` to
recompute each task's inner loop in the backward pass (`tf.recompute_grad`; sequential).

Random layers (Dropout): each `meta_loss` call draws fresh seeds from the model's seed
generators and advances them (`hogrod.meta.inner.draw_seeds`), and every forward pass of
every task (each inner step, the query) gets its own; a fixed generator state reproduces
the masks exactly, in the vectorized and sequential maps alike. Under
`tf.vectorized_map` the random ops of those layers run as a loop over the tasks (TF
cannot vectorize a per-task seed), so `tf.vectorized_map` may log that it uses a
while_loop for them. `Algorithm.adapt` (evaluation) uses the model's seed state as is.

Called eagerly, `meta_loss` runs as one `tf.function` (traced once per input signature):
`tf.vectorized_map` would otherwise trace a new function on every call.
"""

import collections
import contextlib
import functools
import logging

import gin
import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.ops.parallel_for import control_flow_ops as pfor_ops

import hogrod
from hogrod import linalg, tree
from hogrod.meta.inner import adapt, as_dtype, draw_seeds, initial_params, run, seeded_state

__all__ = ["Algorithm", "maml", "fomaml", "reptile", "anil", "meta_sgd", "maml_plus_plus",
           "imaml", "ALGORITHMS"]

Algorithm = collections.namedtuple(
    "Algorithm", ["meta_loss", "adapt", "variables", "predict", "state"], defaults=(None, ()))
Algorithm.__doc__ = """meta_loss(tasks) -> {term: scalar}; adapt(support, steps) -> fast weights;
variables: the algorithm's own trainables; predict(fast, x, steps) -> outputs on query
inputs after `steps` adaptation steps (None: `functional_call(model, fast, x,
training=True)`, BatchNorm on the query batch's statistics, the transductive setting);
state: the algorithm's non-trainable variables (MAML++'s per-step BatchNorm statistics),
to checkpoint with the model."""


class _RandomOpLoops(logging.Filter):
    """Drops pfor's notice that a stateless random op runs as a loop over the tasks: that
    is how per-task dropout masks are drawn (see above), not a problem to report on every
    trace. Every other notice (e.g. a conv gradient run as a loop) passes."""

    def filter(self, record):
        return "Using a while_loop for converting StatelessRandom" not in record.getMessage()


@contextlib.contextmanager
def _quiet_random_op_loops():
    logger, quiet = tf.get_logger(), _RandomOpLoops()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _vectorized_map(fn, elems):
    """tf.vectorized_map, except in a graph XLA compiles (make_train_step.jit_compile):
    there tf.vectorized_map wraps its loop in a nested tf.function, and XLA then takes
    every input of the compiled step (the data, the weights) as a compile-time constant,
    compiling it anew on every step. The same pfor loop, not wrapped, compiles once."""
    under_xla = getattr(pfor_ops, "_is_under_xla_context", None)
    if tf.executing_eagerly() or under_xla is None or not under_xla():
        return tf.vectorized_map(fn, elems)
    loop = getattr(pfor_ops, "_pfor_impl", None)
    if loop is None:  # a TensorFlow without it: sequential, still compiled once
        absl_logging.warning("this TensorFlow has no unwrapped pfor; under XLA the tasks "
                             "are mapped sequentially (tf.map_fn)")
        return tf.map_fn(fn, elems, fn_output_signature=_signature(fn, elems, False))
    flat = tf.nest.flatten(elems)
    n = flat[0].shape[0] if flat[0].shape[0] is not None else tf.shape(flat[0])[0]
    return loop(lambda i: fn(tf.nest.map_structure(lambda t: tf.gather(t, i), elems)), n,
                fallback_to_while_loop=True)


def _map_tasks(fn, tasks, vectorize=True, seeds=None, scalars=True):
    """fn(task, seeds) for every task (stacked on a leading axis); seeds: None, or one row
    per task (`draw_seeds`), given to fn with its task."""
    elems = (tasks, seeds)
    call = lambda e: fn(*e)  # noqa: E731
    if seeds is None:
        elems, call = tasks, lambda t: fn(t, None)  # noqa: E731
    if vectorize:
        with _quiet_random_op_loops():
            return _vectorized_map(call, elems)
    return tf.map_fn(call, elems, fn_output_signature=_signature(call, elems, scalars))


def _over_tasks(fn, tasks, vectorize=True, recompute=None, seeds=None):
    """Mean over the task axis of fn(task, seeds) (a scalar or a dict of scalars per task).

    recompute: None, or the params fn differentiates through (`fn(task, seeds, params)`);
    then each task's forward pass is recomputed in the backward pass (tf.recompute_grad),
    tasks run sequentially.
    """
    if recompute is not None:  # a Python loop: recompute_grad inside a while loop cannot
        params, n = list(recompute), len(recompute)  # capture BatchNorm's state variables
        per_task = []
        for i in range(tasks[0].shape[0]):
            seed = None if seeds is None else seeds[i]
            task = tf.nest.map_structure(lambda t: t[i], tasks)
            inner = tf.recompute_grad(
                lambda *args, seed=seed: fn(args[n:], seed, list(args[:n])))
            # recompute_grad runs its forward pass with every tape stopped, the inner
            # loop's included: its value is the loss without adaptation. Its gradient (a
            # recomputation under a live tape) is right; the value comes from a forward
            # pass on constants, which keeps nothing for the backward pass.
            grad_only = inner(*params, *task)
            value = fn(task, seed, [tf.stop_gradient(p) for p in params])
            per_task.append(tf.nest.map_structure(
                lambda v, g: tf.stop_gradient(v) + (g - tf.stop_gradient(g)), value,
                grad_only))
        out = tf.nest.map_structure(lambda *v: tf.stack(v), *per_task)
    else:
        out = _map_tasks(fn, tasks, vectorize, seeds)
    return tf.nest.map_structure(tf.reduce_mean, out)


def _signature(fn, elems, scalars=True):
    probe = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), elems)
    out = tf.function(fn).get_concrete_function(probe).structured_outputs
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec([] if scalars else t.shape, t.dtype), out)


def _seeds(model, tasks, passes):
    """Seeds for `passes` forward passes per task (None without random layers)."""
    return draw_seeds(model, tf.shape(tasks[0])[0], passes)


def _pass(seeds, i, stop=None):
    """Pass i's seed of one task's seeds (passes i..stop-1 if stop is given), or None."""
    if seeds is None:
        return None
    return seeds[i] if stop is None else seeds[i:stop]


def _compiled_when_eager(meta_loss):
    """meta_loss run as one tf.function when called eagerly (eager tf.vectorized_map traces
    a new function on every call and TF warns of retracing); inside a caller's tf.function
    (the train step) it is traced into that function as is."""
    # a partial, because TF keys its retracing warning on the code object: every
    # algorithm built would count as a retrace of the others
    compiled = tf.function(functools.partial(meta_loss))

    def call(tasks):
        return compiled(tasks) if tf.executing_eagerly() else meta_loss(tasks)
    return call


def _query_loss(model, loss_fn, fast, xq, yq, seed=None):
    return loss_fn(yq, run(model, fast, xq, True, seed))


@gin.configurable
def maml(model, loss_fn, inner_lr=0.01, inner_steps=1, first_order=False, vectorize=True,
         recompute=False):
    """MAML (Finn et al. 2017): the query loss after `inner_steps` steps from theta,
    differentiated through the inner loop (second order unless `first_order`)."""
    def meta_loss(tasks):
        params = initial_params(model)  # read once, under the train step's tape
        seeds = _seeds(model, tasks, inner_steps + 1)  # the inner steps, then the query

        def task_loss(task, seeds, start=params):
            xs, ys, xq, yq = task
            fast = adapt(model, loss_fn, (xs, ys), inner_lr, inner_steps, first_order, start,
                         seeds=_pass(seeds, 0, inner_steps))
            return _query_loss(model, loss_fn, fast, xq, yq, _pass(seeds, inner_steps))

        return {"query": _over_tasks(task_loss, tasks, vectorize,
                                     params if recompute else None, seeds)}

    def adapt_eval(support, steps):
        return adapt(model, loss_fn, support, inner_lr, steps)

    return Algorithm(_compiled_when_eager(meta_loss), adapt_eval, [])


@gin.configurable
def fomaml(model, loss_fn, inner_lr=0.01, inner_steps=1, vectorize=True):
    """First-order MAML: the inner gradients are treated as constants."""
    return maml(model, loss_fn, inner_lr, inner_steps, first_order=True, vectorize=vectorize)


@gin.configurable
def reptile(model, loss_fn, inner_lr=0.01, inner_steps=5, vectorize=True):
    """Reptile (Nichol et al. 2018): move theta toward the adapted weights phi.

    The surrogate 0.5 ||theta - sg(phi)||^2, averaged over tasks, has gradient theta - mean
    phi; with SGD at rate eps the outer step is Reptile's theta += eps (phi - theta). The
    inner loop runs on support and query together (Reptile has no query split)."""
    def task_loss(task, seeds):
        xs, ys, xq, yq = task
        x, y = tf.concat([xs, xq], 0), tf.concat([ys, yq], 0)
        params = initial_params(model)
        fast = adapt(model, loss_fn, (x, y), inner_lr, inner_steps, True, params,
                     seeds=_pass(seeds, 0, inner_steps))
        gap = tf.add_n([tf.reduce_sum((p - tf.stop_gradient(f)) ** 2)
                        for p, f in zip(params, fast)])
        return {"reptile": 0.5 * gap, "query": tf.stop_gradient(
            _query_loss(model, loss_fn, fast, xq, yq, _pass(seeds, inner_steps)))}

    def meta_loss(tasks):
        seeds = _seeds(model, tasks, inner_steps + 1)
        out = _over_tasks(task_loss, tasks, vectorize, seeds=seeds)
        return {"reptile": out["reptile"], "monitor/query": out["query"]}

    def adapt_eval(support, steps):
        return adapt(model, loss_fn, support, inner_lr, steps)

    return Algorithm(_compiled_when_eager(meta_loss), adapt_eval, [])


def _head_mask(model, head_layers):
    """Which trainable variables belong to the last `head_layers` layers with weights."""
    weighted = [layer for layer in model.layers if layer.trainable_variables]
    if isinstance(head_layers, bool) or not isinstance(head_layers, int) or not (
            1 <= head_layers <= len(weighted)):
        raise ValueError(
            f"anil.head_layers must be an integer from 1 to {len(weighted)} (the model's "
            f"layers with trainable weights: {[layer.name for layer in weighted]}), got "
            f"{head_layers!r}; layers without weights (activations, pooling, dropout) do "
            "not count")
    head = {id(v) for layer in weighted[-head_layers:] for v in layer.trainable_variables}
    return [id(v) in head for v in model.trainable_variables]


@gin.configurable
def anil(model, loss_fn, inner_lr=0.01, inner_steps=1, head_layers=1, first_order=False,
         vectorize=True):
    """ANIL (Raghu et al. 2020): adapt only the last `head_layers` layers with trainable
    weights (layers without weights are not counted); the body is meta-learned through the
    head's adaptation but never adapted itself."""
    mask = _head_mask(model, head_layers)
    rates = [inner_lr if m else None for m in mask]
    algo = maml(model, loss_fn, rates, inner_steps, first_order, vectorize)
    return Algorithm(algo.meta_loss,
                     lambda support, steps: adapt(model, loss_fn, support, rates, steps), [])


@gin.configurable
def meta_sgd(model, loss_fn, inner_lr=0.01, inner_steps=1, vectorize=True):
    """Meta-SGD (Li et al. 2017): a learned inner learning rate per parameter entry,
    initialized at `inner_lr` and meta-trained with the weights."""
    rates = [tf.Variable(tf.fill(v.shape, as_dtype(inner_lr, v.dtype)),
                         name=f"lr/{v.path.replace('/', '_')}")
             for v in model.trainable_variables]
    algo = maml(model, loss_fn, rates, inner_steps, False, vectorize)
    return Algorithm(algo.meta_loss,
                     lambda support, steps: adapt(model, loss_fn, support, rates, steps), rates)


@gin.configurable
def maml_plus_plus(model, loss_fn, inner_lr=0.01, inner_steps=5, multi_step_iterations=10000,
                   first_order_iterations=5000, iterations=None, vectorize=True,
                   transductive=True):
    """MAML++ (Antoniou et al. 2019):

    - learned per-layer, per-step inner rates (LSLR), initialized at `inner_lr`;
    - the multi-step loss: the query loss after every inner step, weighted from uniform
      toward the last step only over `multi_step_iterations` outer steps;
    - first-order for the first `first_order_iterations` outer steps, second order after;
    - per-step BatchNorm running statistics (BNRS): one copy of the model's BatchNorm
      statistics per number of inner updates (0 .. inner_steps), each an exponential moving
      average (the layers' own momentum) of the batch statistics the weights after that
      many updates see (support batches; the query batch after the last update), averaged
      over the meta-batch and over replicas.
    `iterations` is the outer step counter (the optimizer's `iterations`); required.

    The losses always use batch statistics (transductive, as MAML and MAML++'s code train).
    `transductive=False` keeps the per-step running statistics (one extra forward pass per
    inner step) and makes `Algorithm.predict` use them (training=False), so a query
    prediction does not depend on the other query examples; with the default True they
    would never be read, so they are not kept.
    """
    if iterations is None:
        raise ValueError("maml_plus_plus needs `iterations` (the outer optimizer's counter)")
    variables = model.trainable_variables
    layer_of = {}
    for layer in model.layers:
        for v in layer.trainable_variables:
            layer_of[id(v)] = layer.name
    layers = sorted(set(layer_of.values()))
    dtype = variables[0].dtype
    lslr = {name: tf.Variable(tf.fill([inner_steps], as_dtype(inner_lr, dtype)),
                              name=f"lslr/{name}") for name in layers}
    # per-step copies of the float non-trainable state (BatchNorm moving mean and variance)
    tracked = [] if transductive else [i for i, v in enumerate(model.non_trainable_variables)
                                       if tf.as_dtype(v.dtype).is_floating]
    step_stats = [[tf.Variable(model.non_trainable_variables[i], trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.MEAN,
                               name=f"bn_step{s}/{model.non_trainable_variables[i].name}")
                   for i in tracked] for s in range(inner_steps + 1)] if tracked else []

    def state_at(s):  # the model's state with step s's statistics substituted
        state = hogrod.model_state(model)
        for i, var in zip(tracked, step_stats[s]):
            state[i] = tf.convert_to_tensor(var)
        return state

    def updated_stats(s, fast, x, seed):  # step s's statistics after seeing batch x
        _, new = hogrod.functional_call(model, [tf.stop_gradient(p) for p in fast], x,
                                        training=True,
                                        state=seeded_state(model, seed, state_at(s)))
        return [tf.stop_gradient(new[i]) for i in tracked]

    def rates(step):
        return [lslr[layer_of[id(v)]][step] for v in variables]

    def step_weights():
        progress = tf.minimum(tf.cast(iterations, dtype) / max(multi_step_iterations, 1), 1.0)
        uniform = tf.fill([inner_steps], as_dtype(1.0 / inner_steps, dtype))
        last = tf.one_hot(inner_steps - 1, inner_steps, dtype=dtype)
        return (1.0 - progress) * uniform + progress * last

    def meta_loss(tasks):
        params = initial_params(model)
        # passes s < inner_steps: support at step s (its BatchNorm statistics too); then
        # the query after each step (the last one's statistics on the query batch)
        seeds = _seeds(model, tasks, 2 * inner_steps)

        def task_losses(task, seeds, first_order):
            xs, ys, xq, yq = task
            fast, losses, stats = params, [], []
            for s in range(inner_steps):
                if tracked:
                    stats.append(updated_stats(s, fast, xs, _pass(seeds, s)))
                fast = adapt(model, loss_fn, (xs, ys), lambda _, s=s: rates(s), 1, first_order,
                             fast, seeds=_pass(seeds, s, s + 1))
                losses.append(_query_loss(model, loss_fn, fast, xq, yq,
                                          _pass(seeds, inner_steps + s)))
            if tracked:
                stats.append(updated_stats(inner_steps, fast, xq,
                                           _pass(seeds, 2 * inner_steps - 1)))
            return tf.stack(losses), stats

        def over_tasks(first_order):
            fn = lambda t, seeds: task_losses(t, seeds, first_order)  # noqa: E731
            out = _map_tasks(fn, tasks, vectorize, seeds, scalars=False)
            return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0), out)

        per_step, stats = tf.cond(iterations < first_order_iterations,
                                  lambda: over_tasks(True), lambda: over_tasks(False))
        for step_vars, values in zip(step_stats, stats):
            for var, value in zip(step_vars, values):
                var.assign(value)
        return {"query": tf.reduce_sum(step_weights() * per_step),
                "monitor/query_last": per_step[-1]}

    def adapt_eval(support, steps):
        fast = None
        for s in range(steps):
            fast = adapt(model, loss_fn, support, lambda _, s=s: rates(min(s, inner_steps - 1)),
                         1, True, fast)
        return initial_params(model) if fast is None else fast

    def predict_non_transductive(fast, x, steps):
        return hogrod.functional_call(model, fast, x, training=False,
                                      state=state_at(min(steps, inner_steps)))[0]

    if not transductive and not tracked:
        raise ValueError("maml_plus_plus.transductive = False needs a model with BatchNorm "
                         "(its per-step statistics are what predictions use)")
    predict = None if transductive else predict_non_transductive
    return Algorithm(_compiled_when_eager(meta_loss), adapt_eval, list(lslr.values()), predict,
                     [v for step_vars in step_stats for v in step_vars])


@gin.configurable
def imaml(model, loss_fn, inner_lr=0.01, inner_steps=10, lam=1.0, cg_steps=5,
          curvature_probes=0, vectorize=True):
    """iMAML (Rajeswaran et al. 2019): the implicit meta-gradient.

    The inner problem is min_phi L_s(phi) + lam/2 ||phi - theta||^2, solved approximately by
    `inner_steps` gradient steps (not differentiated). Its meta-gradient is
    (I + H_s(phi)/lam)^{-1} grad L_q(phi), found by `cg_steps` of conjugate gradient on
    Hessian-vector products (`hogrod.hvp`) of the support loss at phi. The implicit gradient
    assumes phi solves the inner problem: give enough `inner_steps` at a stable `inner_lr`.
    `adapt` (evaluation) runs the same proximal steps.

    curvature_probes: 0, or the number of power iterations (HVPs) that estimate, per task,
    the largest curvature L of the proximal objective at theta; the inner rate is then
    min(inner_lr, 1 / L). iMAML's objective rewards a support loss that is sharp relative
    to lam (the exact proximal solution then fits the support), so meta-training raises the
    curvature until a fixed rate diverges (on the sinusoids: L from 20 to 1,000 in 2,000
    steps, then inf). The implicit gradient depends only on the inner solution, not on the
    solver, so a curvature-safe rate keeps the algorithm the same."""
    def rate(support, anchor, seed=None):
        if not curvature_probes:
            return inner_lr
        xs, ys = support
        fit = lambda: loss_fn(ys, run(model, anchor, xs, True, seed))  # noqa: E731
        # |v^T H v| for the power iteration's unit v: a lower bound of |lambda|_max
        top, _ = linalg.power_iteration(lambda v: hogrod.hvp(fit, anchor, v),
                                        tree.ones_like(anchor), iters=curvature_probes)
        # |lambda|_max of H + lam I is at most that bound + lam; underestimating it by less
        # than a factor 2 still leaves the rate below 2 / L, the stability limit
        return tf.minimum(as_dtype(inner_lr, top.dtype), 1.0 / (tf.abs(top) + lam))

    def proximal(support, anchor, steps, seeds=None, probe_seed=None):
        """`steps` gradient steps on L_s(phi) + lam/2 ||phi - anchor||^2 from the anchor
        (seeds: one per step for random layers, or None)."""
        xs, ys = support
        lr = rate(support, anchor, probe_seed)
        phi = list(anchor)
        for k in range(steps):
            def prox(phi=phi, seed=_pass(seeds, k)):
                fit = loss_fn(ys, run(model, phi, xs, True, seed))
                return fit + 0.5 * lam * tf.add_n(
                    [tf.reduce_sum((p - a) ** 2) for p, a in zip(phi, anchor)])
            g = hogrod.grad(prox, phi)
            phi = [p - lr * gi for p, gi in zip(phi, g)]
        return phi

    def task_loss(task, seeds):
        xs, ys, xq, yq = task
        theta = initial_params(model)
        # passes: the proximal steps, the query, the support Hessian, the curvature probes
        phi = proximal((xs, ys), [tf.stop_gradient(t) for t in theta], inner_steps,
                       _pass(seeds, 0, inner_steps), _pass(seeds, inner_steps + 2))
        phi = [tf.stop_gradient(p) for p in phi]
        query, gq = hogrod.value_and_grad(
            lambda: _query_loss(model, loss_fn, phi, xq, yq, _pass(seeds, inner_steps)), phi)
        hessian_seed = _pass(seeds, inner_steps + 1)
        support = lambda: loss_fn(ys, run(model, phi, xs, True, hessian_seed))  # noqa: E731
        matvec = lambda v: [vi + hi / lam for vi, hi in zip(v, hogrod.hvp(support, phi, v))]  # noqa
        # truncated at a direction of non-positive curvature (Steihaug): for a non-convex
        # support loss I + H/lam can be indefinite, and plain CG then runs away
        meta_grad, _ = linalg.cg(matvec, gq, maxiter=cg_steps, tol=0.0,
                                 on_negative_curvature="stop")
        surrogate = tf.add_n([tf.reduce_sum(t * tf.stop_gradient(m))
                              for t, m in zip(theta, meta_grad)])
        return {"implicit": surrogate, "query": tf.stop_gradient(query)}

    def meta_loss(tasks):
        seeds = _seeds(model, tasks, inner_steps + 3)
        out = _over_tasks(task_loss, tasks, vectorize, seeds=seeds)
        return {"implicit": out["implicit"], "monitor/query": out["query"]}

    def adapt_eval(support, steps):  # the inner problem iMAML was meta-trained for
        return proximal(support, initial_params(model), steps)

    return Algorithm(_compiled_when_eager(meta_loss), adapt_eval, [])


ALGORITHMS = {"maml": maml, "fomaml": fomaml, "reptile": reptile, "anil": anil,
              "meta_sgd": meta_sgd, "maml_plus_plus": maml_plus_plus, "imaml": imaml}
