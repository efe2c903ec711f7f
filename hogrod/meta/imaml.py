"""iMAML (Rajeswaran et al. 2019): the implicit meta-gradient of a proximal inner problem."""

import math
import numbers

import gin
import keras
import tensorflow as tf

from hogrod import autodiff, checks, implicit, linalg, taskmap, tree
from hogrod.meta.common import (Algorithm, check_loss, compiled_when_eager, pass_seed,
                                query_loss, task_seeds)
from hogrod.meta.inner import as_dtype, check_rate, initial_params, run
from hogrod.types import Loss, Scalar

__all__ = ["imaml"]


@gin.configurable
def imaml(model: keras.Model, loss: Loss, inner_lr: Scalar = 0.01, inner_steps: int = 10,
          lam: Scalar = 1.0, maxiter: int = 5, curvature_probes: int = 0,
          accelerated: bool = False, task_map: str = "vectorized") -> Algorithm:
    """iMAML: the implicit meta-gradient of a proximal inner problem.

    The inner problem is ``min_phi L_s(phi) + lam/2 ||phi - theta||**2``, solved
    approximately by `inner_steps` gradient steps (the solver of a
    `hogrod.implicit.custom_root`, never differentiated). Its optimality condition
    ``F(phi, theta) = grad L_s(phi) + lam (phi - theta) = 0`` gives, by the implicit
    function theorem, the meta-gradient ``(I + H_s(phi)/lam)^{-1} grad L_q(phi)``, found by
    at most `maxiter` steps of conjugate gradient on Hessian-vector products of the
    support loss at phi (the paper's fixed budget; CG stops earlier at non-positive
    curvature). The implicit gradient assumes phi solves the inner problem: give enough
    `inner_steps` at a stable `inner_lr`. `meta_loss` returns the surrogate
    ``<theta, sg(g)>`` (g the implicit meta-gradient, computed per task) under `loss`, the
    query loss at phi under `monitor/query` and the mean inner rate used under
    `monitor/inner_lr`. `adapt` (evaluation) runs the same proximal steps.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the proximal steps' rate (an upper bound with `curvature_probes`).
      inner_steps: proximal gradient steps per task (>= 0).
      lam: the proximal weight (> 0; a tensor is checked when run).
      maxiter: the iteration limit of the conjugate-gradient solve (>= 1).
      curvature_probes: 0, or the number of power iterations (HVPs) that estimate, per
        task, the largest curvature L of the proximal objective at theta; the inner rate
        is then ``min(inner_lr, 1 / L)``. iMAML's objective rewards a support loss that is
        sharp relative to lam (the exact proximal solution then fits the support), so
        meta-training raises the curvature until a fixed rate diverges (on the sinusoids:
        experiments/RESULTS.md, "Meta-learning"). The implicit gradient depends only on
        the inner solution, not on the solver, so a curvature-safe rate keeps the
        algorithm the same.
      accelerated: Nesterov's accelerated gradient steps (still `inner_steps` gradients of
        the proximal objective, one per step) with the constant momentum
        ``(1 - sqrt(lam lr)) / (1 + sqrt(lam lr))`` of a lam-strongly convex objective at
        rate ``lr <= 1/L``: a solver of the same inner problem. At a curvature-safe rate
        1/L plain steps shrink the error in a direction of curvature lam only by
        ``(1 - lam/L)`` per step, the accelerated ones by about ``(1 - sqrt(lam/L))``:
        with L ~ 100 and lam 2, 16 plain steps leave 72% of it, 16 accelerated ones 10%.
        Evaluation (`adapt`) uses the same solver. A Python-number rate needs
        ``lam * inner_lr`` in (0, 1] (a ValueError when the algorithm runs otherwise).
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      an `Algorithm`.

    Raises:
      hogrod.checks.ArgumentError: a bad `loss`, `task_map`, `inner_steps`, `maxiter`,
        `curvature_probes`, `lam` or `accelerated`, named.
    """
    where = "hogrod.meta.imaml"
    check_loss(loss, where)
    mode = taskmap.check_task_map(task_map, where)
    inner_steps = checks.integer(inner_steps, "inner_steps", where)
    maxiter = checks.integer(maxiter, "maxiter", where, least=1)
    curvature_probes = checks.integer(curvature_probes, "curvature_probes", where)
    if not isinstance(lam, (tf.Tensor, tf.Variable)):  # a tensor is checked when run
        checks.positive(lam, "lam (the proximal weight)", where)
    if not isinstance(accelerated, bool):
        raise checks.ArgumentError(f"{where}: accelerated must be True or False, got "
                                   f"{accelerated!r}")

    check_rate(inner_lr, "inner_lr", where)
    prox = _Proximal(model, loss, inner_lr, lam, curvature_probes, accelerated)

    def task_loss(task, seeds, theta):
        xs, ys, xq, yq = task
        support = (xs, ys)
        # passes: the proximal steps, the query, the support Hessian, the curvature probes
        hessian_seed = pass_seed(seeds, inner_steps + 1)

        def task_optimality(phi, theta):  # the support data through a closure: no gradient
            return prox.optimality(phi, theta, support, hessian_seed)

        # The implicit function theorem on the optimality condition gives the meta-gradient
        # lam (H + lam I)^{-1} grad L_q = (I + H/lam)^{-1} grad L_q, the CG solve of the
        # paper (CG is invariant to the system's scale). At most `maxiter` CG steps:
        # the paper's fixed budget; truncation at non-positive curvature (Steihaug) because
        # a non-convex support loss makes H + lam I indefinite somewhere. check_root=False:
        # `inner_steps` proximal steps approximate the inner solution by design (the paper's
        # fixed budget), so the output is not a root to any fixed tolerance.
        rates = []  # the rate the solver used (a value only: the solver is not differentiated)

        @implicit.custom_root(task_optimality, solve="cg", maxiter=maxiter, truncated=True,
                              check_root=False)
        def inner_solution(init, theta):  # never differentiated
            return prox.solve(support, theta, inner_steps, pass_seed(seeds, 0, inner_steps),
                              pass_seed(seeds, inner_steps + 2), rates)

        # The implicit gradient is taken here, per task: a tape outside tf.vectorized_map
        # differentiates pfor's converted ops, where tf.custom_gradient's override is lost.
        # (Unconnected is zero, not an error: task_map 'recomputed' runs this once with
        # every tape stopped, keeping only the value, and recomputes it for the gradient.)
        anchor = [tf.stop_gradient(t) for t in theta]
        query, meta_grad = autodiff.value_and_grad(
            lambda: query_loss(model, loss, inner_solution(anchor, anchor), xq, yq,
                               pass_seed(seeds, inner_steps)), anchor)
        surrogate = tf.add_n([tf.reduce_sum(t * tf.stop_gradient(g))
                              for t, g in zip(theta, meta_grad)])
        lr = tf.cast(tf.stop_gradient(rates[0]), query.dtype)
        return {"loss": surrogate, "monitor/query": tf.stop_gradient(query),
                "monitor/inner_lr": lr}

    def meta_loss(tasks, step=None):  # step: unused
        seeds = task_seeds(model, tasks, inner_steps + 3)
        return taskmap.mean_over_tasks(task_loss, tasks, seeds, initial_params(model), mode)

    def adapt_eval(support, steps, seeds=None):  # the inner problem iMAML was meta-trained for
        return prox.solve(support, initial_params(model), steps, seeds)

    return Algorithm(compiled_when_eager(meta_loss, model), adapt_eval, [])


class _Proximal:
    """The proximal inner problem ``min_phi L_s(phi) + lam/2 ||phi - anchor||^2`` of one
    model and loss, and its solver: gradient steps (Nesterov's with `accelerated`) at
    `inner_lr`, or at the curvature-safe rate with `curvature_probes` (see `imaml`)."""

    def __init__(self, model, loss, inner_lr, lam, curvature_probes, accelerated):
        self.model, self.loss, self.inner_lr, self.lam = model, loss, inner_lr, lam
        self.curvature_probes, self.accelerated = curvature_probes, accelerated

    def fit(self, params, support, seed):
        """The support loss at `params` (training mode: random layers drawn from `seed`)."""
        xs, ys = support
        return self.loss(ys, run(self.model, params, xs, True, seed))

    def rate(self, support, anchor, seed=None):
        """`inner_lr`, or min(inner_lr, 1 / L) with L estimated by power iteration."""
        if not self.curvature_probes:
            return self.inner_lr
        fit = lambda: self.fit(anchor, support, seed)  # noqa: E731
        # |v^T H v| for the power iteration's unit v: a lower bound of |lambda|_max
        top, _ = linalg.power_iteration(lambda v: autodiff.hvp(fit, anchor, v),
                                        tree.ones_like(anchor),
                                        maxiter=self.curvature_probes)
        # |lambda|_max of H + lam I is at most that bound + lam; underestimating it by less
        # than a factor 2 still leaves the rate below 2 / L, the stability limit
        return tf.minimum(as_dtype(self.inner_lr, top.dtype), 1.0 / (tf.abs(top) + self.lam))

    def momentum(self, lr):
        """(1 - sqrt(lam lr)) / (1 + sqrt(lam lr)), at lr's dtype (lr <= 1/(L + lam) keeps
        lam lr < 1)."""
        lam = self.lam
        if isinstance(lr, numbers.Real):
            if not 0 < lam * lr <= 1:
                raise ValueError(f"imaml.accelerated needs imaml.lam * imaml.inner_lr in "
                                 f"(0, 1] (the rate at most 1 / lam), got {lam} * {lr}")
            r = math.sqrt(lam * lr)
            return (1 - r) / (1 + r)
        r = tf.sqrt(lr * lam)
        return (1 - r) / (1 + r)

    def solve(self, support, anchor, steps, seeds=None, probe_seed=None, rates=None):
        """`steps` gradient steps on L_s(phi) + lam/2 ||phi - anchor||^2 from the anchor
        (seeds: one per step for random layers, or None; rates: a list the rate used is
        appended to, for the monitor)."""
        lr = self.rate(support, anchor, probe_seed)
        if rates is not None:
            rates.append(lr)
        momentum = self.momentum(lr) if self.accelerated else None
        phi = y = list(anchor)  # y: where the gradient is taken (phi itself when plain)
        for k in range(steps):
            def prox(y=y, seed=pass_seed(seeds, k)):
                return self.fit(y, support, seed) + 0.5 * self.lam * tf.add_n(
                    [tf.reduce_sum((p - a) ** 2) for p, a in zip(y, anchor)])
            g = autodiff.grad(prox, y)
            new = [p - lr * gi for p, gi in zip(y, g)]
            y = new if momentum is None else [
                n + momentum * (n - p) for n, p in zip(new, phi)]
            phi = new
        return phi

    def optimality(self, phi, theta, support, seed):
        """The gradient of the proximal objective: zero at the inner solution."""
        g = autodiff.grad(lambda: self.fit(phi, support, seed), phi)
        return [gi + self.lam * (p - t) for gi, p, t in zip(g, phi, theta)]
