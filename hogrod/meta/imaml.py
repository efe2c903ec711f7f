"""iMAML (Rajeswaran et al. 2019): the implicit meta-gradient of a proximal inner problem."""

import gin
import tensorflow as tf

import hogrod
from hogrod import linalg, tree
from hogrod.meta.common import (Algorithm, check_steps, compiled_when_eager, mean_over_tasks,
                                pass_seed, query_loss, resolve_task_map, task_seeds)
from hogrod.meta.inner import as_dtype, initial_params, run

__all__ = ["imaml"]


@gin.configurable
def imaml(model, loss_fn, inner_lr=0.01, inner_steps=10, lam=1.0, cg_steps=5,
          curvature_probes=0, task_map=None, vectorize=None, recompute=None):
    """iMAML: the implicit meta-gradient.

    The inner problem is min_phi L_s(phi) + lam/2 ||phi - theta||^2, solved approximately by
    `inner_steps` gradient steps (not differentiated). Its meta-gradient is
    (I + H_s(phi)/lam)^{-1} grad L_q(phi), found by `cg_steps` of conjugate gradient on
    Hessian-vector products (`hogrod.hvp`) of the support loss at phi. The implicit gradient
    assumes phi solves the inner problem: give enough `inner_steps` at a stable `inner_lr`.
    `meta_loss` returns the surrogate <theta, sg(g)> (gradient g, the implicit
    meta-gradient) under `loss` and the query loss at phi under `monitor/query`.
    `adapt` (evaluation) runs the same proximal steps.

    curvature_probes: 0, or the number of power iterations (HVPs) that estimate, per task,
    the largest curvature L of the proximal objective at theta; the inner rate is then
    min(inner_lr, 1 / L). iMAML's objective rewards a support loss that is sharp relative
    to lam (the exact proximal solution then fits the support), so meta-training raises the
    curvature until a fixed rate diverges (on the sinusoids: experiments/RESULTS.md,
    "Meta-learning"). The implicit gradient depends only on the inner solution, not on the
    solver, so a curvature-safe rate keeps the algorithm the same."""
    mode = resolve_task_map("imaml", task_map, vectorize, recompute)
    check_steps("imaml.inner_steps", inner_steps, minimum=0)

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
            def prox(phi=phi, seed=pass_seed(seeds, k)):
                fit = loss_fn(ys, run(model, phi, xs, True, seed))
                return fit + 0.5 * lam * tf.add_n(
                    [tf.reduce_sum((p - a) ** 2) for p, a in zip(phi, anchor)])
            g = hogrod.grad(prox, phi)
            phi = [p - lr * gi for p, gi in zip(phi, g)]
        return phi

    def task_loss(task, seeds, theta):
        xs, ys, xq, yq = task
        # passes: the proximal steps, the query, the support Hessian, the curvature probes
        phi = proximal((xs, ys), [tf.stop_gradient(t) for t in theta], inner_steps,
                       pass_seed(seeds, 0, inner_steps), pass_seed(seeds, inner_steps + 2))
        phi = [tf.stop_gradient(p) for p in phi]
        query, gq = hogrod.value_and_grad(
            lambda: query_loss(model, loss_fn, phi, xq, yq, pass_seed(seeds, inner_steps)),
            phi)
        hessian_seed = pass_seed(seeds, inner_steps + 1)
        support = lambda: loss_fn(ys, run(model, phi, xs, True, hessian_seed))  # noqa: E731
        matvec = lambda v: [vi + hi / lam for vi, hi in zip(v, hogrod.hvp(support, phi, v))]  # noqa
        # truncated at a direction of non-positive curvature (Steihaug): for a non-convex
        # support loss I + H/lam can be indefinite, and plain CG then runs away
        meta_grad, _ = linalg.cg(matvec, gq, maxiter=cg_steps, tol=0.0,
                                 on_negative_curvature="stop")
        surrogate = tf.add_n([tf.reduce_sum(t * tf.stop_gradient(m))
                              for t, m in zip(theta, meta_grad)])
        return {"loss": surrogate, "monitor/query": tf.stop_gradient(query)}

    def meta_loss(tasks, step=None):  # step: unused
        seeds = task_seeds(model, tasks, inner_steps + 3)
        return mean_over_tasks(task_loss, tasks, seeds, initial_params(model), mode)

    def adapt_eval(support, steps):  # the inner problem iMAML was meta-trained for
        return proximal(support, initial_params(model), steps)

    return Algorithm(compiled_when_eager(meta_loss), adapt_eval, [])
