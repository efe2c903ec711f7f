"""Hessian-free optimization (Martens 2010) behind the step-optimizer protocol.

Each step, on the step's batch, with the global gradient g and the damping lambda:

1. CG (`hogrod.linalg.cg`) on ``(C + l2_reg I + lambda I) d = -g``, C the Gauss-Newton
   matrix of the model's loss (`hessian_free`) or the objective's Hessian
   (`hessian_free.from_objective`), from the previous solution times `warm_start_decay`
   (Martens' 0.95), preconditioned by ``(diag(F) + l2_reg + lambda)^preconditioner_power``,
   F the empirical Fisher of the per-example gradients (Martens' 0.75), for at most
   `cg_maxiter` steps or until ``||r|| <= tol ||g||``; a direction of non-positive
   curvature ends the solve at the iterate reached (Steihaug), and where that is the
   first direction of a cold start, the step is that direction scaled as scipy's
   Newton-CG does (``p r^T z / |p^T A p|``).
2. CG backtracking: CG's iterates after ``ceil(1.3^j)`` steps are kept; from the last one,
   earlier ones are taken while the objective on the batch keeps decreasing (Martens
   2010, section 4.6).
3. The reduction ratio rho of that step against the undamped quadratic model
   ``g^T d + 1/2 d^T (C + l2_reg I) d`` (from CG's recurrences: no further product) and
   Levenberg-Marquardt on lambda (`common.levenberg_marquardt`: rho > 3/4 multiplies it by
   `damping_decay` (Martens' 2/3), rho < 1/4 divides it).
4. A backtracking line search on the rate: from `learning_rate`, multiplied by
   `line_search_shrink` (0.8) until Armijo's ``f(theta + a d) <= f(theta) + armijo a g^T d``
   (armijo 1e-2, Martens and Sutskever 2012), at most `line_search_maxiter` values of the
   objective; none accepted (or a direction that is not finite): no step (rate 0), and the
   damping grows as after a failed step.

Under a strategy each product, value and Fisher diagonal is the replicas' mean; the
solve and the searches run once in cross-replica context (a replica's loop cannot hold
an all-reduce), so every replica takes the step one device would. Every pass beyond the
train step's own (a product, a value, the Fisher diagonal) runs in `common.stateless()`:
BatchNorm statistics and random layers' seeds move once per step, as with SGD.

With ``damping=0, warm_start_decay=0, backtrack=False, cg_tol=0.5,
cg_tol_rule="superlinear"`` and exact Hessian products, `from_objective` is a truncated
Newton method with a line search, the algorithm of scipy's Newton-CG (Nocedal and Wright,
Algorithm 7.1), its CG stopping at ``||r|| <= min(0.5, sqrt(||g||)) ||g||``.
"""

import math
from typing import Callable, Optional, Sequence

import gin
import keras
import tensorflow as tf

from hogrod import checks, linalg, tree
from hogrod.autodiff import hvp
from hogrod.curvature.likelihood import per_example_loss
from hogrod.second_order import common
from hogrod.train import protocol
from hogrod.types import Batch, Loss, Tensor

__all__ = ["hessian_free", "HessianFree", "CURVATURES", "TOL_RULES"]

CURVATURES = ("hessian",)  # from_objective's curvature
TOL_RULES = ("constant", "superlinear")
_GAMMA = 1.3  # Martens' spacing of the kept CG iterates


def _options(where, learning_rate, damping, cg_maxiter, cg_tol, cg_tol_rule,
             line_search_maxiter, l2_reg, warm_start_decay, backtrack, damping_decay,
             min_damping, max_damping, armijo, line_search_shrink):
    """Every hyperparameter both factories take, checked, as a dict."""
    min_damping = checks.nonnegative(min_damping, "min_damping", where)
    if not (isinstance(max_damping, float) and max_damping == math.inf):  # the default
        max_damping = checks.number(max_damping, "max_damping", where, min_damping)
    return dict(
        learning_rate=checks.positive(learning_rate, "learning_rate", where),
        damping=checks.nonnegative(damping, "damping", where),
        cg_maxiter=checks.integer(cg_maxiter, "cg_maxiter", where, 1),
        cg_tol=checks.nonnegative(cg_tol, "cg_tol", where),
        cg_tol_rule=checks.choice(cg_tol_rule, TOL_RULES, "cg_tol_rule", where),
        line_search_maxiter=checks.integer(line_search_maxiter, "line_search_maxiter", where),
        l2_reg=checks.nonnegative(l2_reg, "l2_reg", where),
        warm_start_decay=checks.probability(warm_start_decay, "warm_start_decay", where),
        backtrack=checks.boolean(backtrack, "backtrack", where),
        damping_decay=checks.number(damping_decay, "damping_decay", where, 0.0, 1.0,
                                    low_open=True),
        min_damping=min_damping, max_damping=max_damping,
        armijo=checks.number(armijo, "armijo", where, 0.0, 1.0, True, True),
        line_search_shrink=checks.number(line_search_shrink, "line_search_shrink", where,
                                         0.0, 1.0, True, True))


def _keep(maxiter: int, backtrack: bool) -> tuple:
    """The CG step counts kept: ceil(1.3^j) up to maxiter, and maxiter (the last iterate)."""
    if not backtrack:
        return (maxiter,)
    counts, j = set(), 0
    while math.ceil(_GAMMA ** j) < maxiter:
        counts.add(math.ceil(_GAMMA ** j))
        j += 1
    return tuple(sorted(counts)) + (maxiter,)


class HessianFree(protocol.StepOptimizer):
    """Hessian-free optimization (the module docstring); made by `hessian_free` or
    `hessian_free.from_objective`.

    Args:
      product: ``product(loss, batch, variables, vector) -> C vector`` on this replica's
        batch, averaged over the replicas (C without l2_reg), `loss` the step's objective
        (the one `apply` is given), the model's state (BatchNorm statistics, seeds)
        untouched.
      diagonal: ``diagonal(batch, variables) -> diag(F)``, the empirical Fisher's diagonal
        averaged over the replicas, or None (no preconditioner).
      options: the checked hyperparameters (`_options`), and "preconditioner_power".
      variables: the variables it must train (None: any).
      name: the optimizer's name.
    """

    def __init__(self, product: Callable, diagonal: Optional[Callable], options: dict,
                 variables: Optional[Sequence[tf.Variable]] = None,
                 name: str = "hessian_free") -> None:
        super().__init__(name=name)
        self._product, self._diagonal, self._opt = product, diagonal, dict(options)
        self._expected = None if variables is None else [id(v) for v in variables]
        self._keep = _keep(options["cg_maxiter"], options["backtrack"])

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Create the state: the damping, CG's previous solution and what the step used.

        Args:
          variables: the variables it trains (one floating dtype).

        Raises:
          ValueError: the variables are not the ones `from_objective` was given, or do not
            share one floating dtype.
        """
        where = self.name
        if self._expected is not None and [id(v) for v in variables] != self._expected:
            raise ValueError(f"{where}: make_train_step's variables must be the variables "
                             "given to hessian_free.from_objective, in the same order")
        dtypes = {tf.as_dtype(v.dtype) for v in variables}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating:
            raise ValueError(f"{where}: the variables must share one floating dtype, got "
                             f"{sorted(d.name for d in dtypes)}")
        self.dtype = dtype = dtypes.pop()
        state = protocol.state_variable
        self.damping = state(tf.constant(self._opt["damping"], dtype), "damping")
        self.previous = [state(tf.zeros(v.shape, dtype), f"previous_{i}")
                         for i, v in enumerate(variables)]
        self.used = {name: state(tf.zeros([], dtype), name)
                     for name in ("rate", "damping_used", "rho")}
        self.counts = {name: state(tf.zeros([], tf.int64), name)
                       for name in ("cg_iterations", "products", "evaluations", "steps")}
        self.built = True

    def apply(self, grads: Sequence[Tensor], variables: Sequence[tf.Variable],
              loss: Callable[[Batch], Tensor], batch: Batch) -> None:
        """One Hessian-free step (the module docstring).

        Args:
          grads: the global gradient, one tensor per variable.
          variables: the variables, as given to `build`.
          loss: `loss(batch) -> scalar`, the objective's weighted total (a mean).
          batch: this replica's batch.
        """
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            # the loops below evaluate all-reduced values: they run in cross-replica
            # context, each replica's work through strategy.run
            def merged(strategy, grads, batch):
                first = [strategy.experimental_local_results(g)[0] for g in grads]
                self._step(first, variables, loss, batch, _runner(strategy))
            tf.distribute.get_replica_context().merge_call(merged, args=(list(grads), batch))
        else:
            self._step(list(grads), variables, loss, batch, lambda fn, *args: fn(*args))

    def _step(self, grads, variables, loss, batch, run):
        opt, dtype = self._opt, self.dtype
        theta = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        g = [tf.convert_to_tensor(t) for t in grads]
        lam = tf.identity(self.damping.read_value())
        nan = tf.constant(float("nan"), dtype)
        evaluations = [tf.constant(1, tf.int64)]  # f(theta)

        def value_at(step):  # the objective on the batch at theta + step
            protocol.assign(variables, [t + s for t, s in zip(theta, step)])
            return run(lambda b: common.value_on_batch(loss, b), batch)

        f0 = run(lambda b: common.value_on_batch(loss, b), batch)
        x, info, d, quadratic, f1, count, products = self._solve(g, variables, loss, batch,
                                                                 run, lam, value_at)
        evaluations.append(count)
        # a non-finite direction (a NaN or infinite product) is no direction
        usable = _finite(d)
        d = [tf.where(usable, t, tf.zeros_like(t)) for t in d]
        f1, quadratic = tf.where(usable, f1, nan), tf.where(usable, quadratic, nan)
        model_change = quadratic - lam / 2 * tree.dot(d, d)  # the undamped model
        rho = common.reduction_ratio(f1, f0, model_change)
        rate, ok, count = self._line_search(g, d, f0, f1, usable, value_at)
        evaluations.append(count)
        # no rate accepted: the weights stay as they were (theta + 0 d is NaN where d is)
        # and the step counts as failed, so the damping grows
        new_damping = common.levenberg_marquardt(
            lam, tf.where(ok, rho, nan), opt["damping_decay"], opt["min_damping"],
            opt["max_damping"])
        protocol.assign(variables, [tf.where(ok, t + rate * s, t) for t, s in zip(theta, d)])
        used = {"rate": rate, "damping_used": lam, "rho": rho}
        counts = {"cg_iterations": tf.cast(info.iterations, tf.int64), "products": products,
                  "evaluations": tf.add_n(evaluations), "steps": self.counts["steps"] + 1}
        protocol.assign(  # a NaN solution does not warm-start the next solve
            [self.damping] + self.previous + [self.used[k] for k in used]
            + [self.counts[k] for k in counts],
            [new_damping] + [tf.where(_finite(x), t, tf.zeros_like(t)) for t in x]
            + list(used.values()) + list(counts.values()))

    def _solve(self, g, variables, loss, batch, run, lam, value_at):
        """CG from the decayed previous solution, then the backtracking: (x, info, d,
        the damped quadratic at d, f(theta + d), objective evaluations, curvature
        products)."""
        opt, dtype = self._opt, self.dtype
        l2 = tf.constant(opt["l2_reg"], dtype)

        def matvec(v):
            cv = run(lambda b, *v: self._product(loss, b, variables, list(v)), batch, *v)
            return [c + l2 * t for c, t in zip(cv, v)] if opt["l2_reg"] else list(cv)

        pre = None
        if self._diagonal is not None:
            power = tf.constant(self._opt["preconditioner_power"], dtype)
            diag = run(lambda b: self._diagonal(b, variables), batch)
            m = [tf.pow(t + l2 + lam, power) for t in diag]
            pre = lambda v: [t / s for t, s in zip(v, m)]  # noqa: E731
        x0 = None  # a cold start costs no product for the first residual
        if opt["warm_start_decay"] > 0:
            x0 = [tf.constant(opt["warm_start_decay"], dtype) * p for p in self.previous]
        tol = opt["cg_tol"]
        if opt["cg_tol_rule"] == "superlinear":
            tol = tf.minimum(tf.constant(tol, dtype), tf.sqrt(tree.norm(g)))
        b = [-t for t in g]
        x, info, kept = linalg.cg(matvec, b, x0, opt["cg_maxiter"], tol, damping=lam,
                                  on_negative_curvature="stop", preconditioner=pre,
                                  keep=self._keep)
        last = tf.argmax(tf.cast(tf.constant(self._keep) >= info.iterations, tf.int32),
                         output_type=tf.int32)
        j, f1, count = self._backtrack(kept, last, value_at)
        d = [t[j] for t in kept.iterates]
        quadratic = kept.quadratic[j]
        # negative curvature on a cold start's first direction: that direction, scaled
        z = b if pre is None else pre(b)
        rz, pap = tree.dot(b, z), info.curvature
        cold = tf.equal(info.iterations, 0)
        if x0 is not None:
            cold = tf.logical_and(cold, tf.equal(tree.dot(x0, x0), 0))
        steepest = tf.logical_and(cold, info.negative_curvature)
        scale = rz / tf.where(steepest, tf.abs(pap), tf.ones_like(pap))

        def fallback():
            step = [scale * t for t in z]
            return step, -1.5 * rz * scale, value_at(step)

        d, quadratic, f1 = tf.cond(steepest, fallback, lambda: (d, quadratic, f1))
        # CG's steps, the product that found negative curvature, a warm start's residual
        products = (tf.cast(info.iterations, tf.int64)
                    + tf.cast(info.negative_curvature, tf.int64) + (0 if x0 is None else 1))
        return x, info, d, quadratic, f1, count + tf.cast(steepest, tf.int64), products

    def _backtrack(self, kept, last, value_at):
        """Martens' CG backtracking: from the last kept iterate, earlier ones while the
        objective decreases: (the index taken, its value, evaluations)."""
        def at(j):
            return value_at([t[j] for t in kept.iterates])

        f_last = at(last)
        if not self._opt["backtrack"]:
            return last, f_last, tf.constant(1, tf.int64)

        def cond(j, best, go, count):
            return tf.logical_and(go, j > 0)

        def body(j, best, go, count):
            earlier = at(j - 1)
            better = earlier < best
            return (tf.where(better, j - 1, j), tf.where(better, earlier, best), better,
                    count + 1)

        j, best, _, count = tf.while_loop(
            cond, body, (last, f_last, tf.constant(True), tf.constant(1, tf.int64)))
        return j, best, count

    def _line_search(self, g, d, f0, f1, usable, value_at):
        """Armijo backtracking on the rate from `learning_rate` along a `usable` d: (the
        rate, 0 where none was accepted; whether one was; evaluations)."""
        opt, dtype = self._opt, self.dtype
        rate0 = tf.constant(opt["learning_rate"], dtype)
        if opt["line_search_maxiter"] == 0:
            return tf.where(usable, rate0, 0 * rate0), usable, tf.constant(0, tf.int64)
        slope = tf.constant(opt["armijo"], dtype) * tree.dot(g, d)
        shrink = tf.constant(opt["line_search_shrink"], dtype)
        reuse = opt["learning_rate"] == 1.0  # f(theta + d) is known
        first = f1 if reuse else value_at([rate0 * t for t in d])

        def accepted(rate, value):
            return usable & tf.math.is_finite(value) & (value <= f0 + rate * slope)

        def cond(k, rate, value, ok):  # along an unusable d no value is taken
            return usable & ~ok & (k < opt["line_search_maxiter"])

        def body(k, rate, value, ok):
            rate = rate * shrink
            value = value_at([rate * t for t in d])
            return k + 1, rate, value, accepted(rate, value)

        k, rate, _, ok = tf.while_loop(cond, body,
                                       (tf.constant(1), rate0, first, accepted(rate0, first)))
        count = tf.cast(k, tf.int64) - (1 if reuse else 0)
        return tf.where(ok, rate, tf.zeros_like(rate)), ok, count

    @property
    def learning_rate(self) -> Tensor:
        """The rate the last step used (0 where its line search accepted none)."""
        return self.used["rate"]

    def logs(self) -> dict:
        """What the last step used: its damping, reduction ratio rho, CG's iterations, its
        curvature products (CG's steps, the one that found negative curvature, a warm
        start's first residual) and the objective's evaluations (beyond the train step's
        own).

        Returns:
          {"damping", "rho", "cg_iterations", "products", "evaluations"}: scalars.
        """
        return {"damping": self.used["damping_used"], "rho": self.used["rho"],
                "cg_iterations": self.counts["cg_iterations"],
                "products": self.counts["products"],
                "evaluations": self.counts["evaluations"]}


def _finite(tensors):
    """Whether every entry of `tensors` is finite, a scalar bool."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def _runner(strategy):
    """`run(fn, *args)`: fn on every replica (an all-reduce inside), replica 0's result."""
    def run(fn, *args):
        out = strategy.run(fn, args=args)
        return tf.nest.map_structure(lambda t: strategy.experimental_local_results(t)[0], out)
    return run


@gin.configurable(denylist=["model", "loss"])
def hessian_free(model: keras.Model, loss: Loss, learning_rate: float = 1.0,
                 damping: float = 1.0, cg_maxiter: int = 250, cg_tol: float = 1e-4,
                 line_search_maxiter: int = 20, preconditioner_power: float = 0.75,
                 l2_reg: float = 0.0, warm_start_decay: float = 0.95, backtrack: bool = True,
                 damping_decay: float = 2 / 3, min_damping: float = 0.0,
                 max_damping: float = float("inf"), armijo: float = 1e-2,
                 line_search_shrink: float = 0.8, cg_tol_rule: str = "constant",
                 preconditioner_batch: int = 64,
                 name: str = "hessian_free") -> HessianFree:
    """Hessian-free optimization of a Keras model (Martens 2010; the module docstring):
    Gauss-Newton products of `loss` on the step's batch solved by preconditioned CG.

    Gin-configurable (`make_train_step`'s objective is the model's `loss` on the batch,
    with any regularization; its curvature here is the Gauss-Newton matrix of `loss` plus
    `l2_reg`, kfac-jax's convention: an L2 term in the objective is not seen otherwise).

    Args:
      model: a built Keras model (called with `training=True`).
      loss: its Keras loss `loss(y_true, y_pred)`, convex in the outputs; batches are
        `(x, y)`.
      learning_rate: the rate the line search starts from (> 0); default 1.
      damping: the initial Levenberg-Marquardt damping lambda (>= 0); default 1.
      cg_maxiter: CG's most steps (>= 1); default 250 (Martens').
      cg_tol: CG's relative residual tolerance (>= 0); default 1e-4.
      line_search_maxiter: the most objective values the line search takes (>= 0; 0: no
        search, the step at `learning_rate`); default 20.
      preconditioner_power: the power of the empirical Fisher diagonal preconditioner, in
        [0, 1] (0: no preconditioner, and no per-example gradients); default 0.75.
      l2_reg: added to the curvature (>= 0); default 0.
      warm_start_decay: CG starts from the previous solution times this, in [0, 1];
        default 0.95.
      backtrack: Martens' CG backtracking; default True.
      damping_decay: lambda's factor after a good step, in (0, 1] (1: fixed damping);
        default 2/3.
      min_damping: the least damping (>= 0); default 0.
      max_damping: the largest damping (>= min_damping); default infinity.
      armijo: the line search's sufficient-decrease constant, in (0, 1); default 1e-2.
      line_search_shrink: the rate's factor per rejected value, in (0, 1); default 0.8.
      cg_tol_rule: "constant" (default: `cg_tol`) or "superlinear" (min(cg_tol,
        sqrt(||g||))).
      preconditioner_batch: examples per vectorized per-example gradient pass (>= 1);
        default 64.
      name: the optimizer's name.

    Returns:
      A `HessianFree` step optimizer.

    Raises:
      ArgumentError: a hyperparameter is out of range; the message names it.
      ValueError: `model` is not a built Keras model with trainable variables.
      TypeError: `loss` is not callable.
    """
    where = "hessian_free"
    common.check_model_and_loss(model, loss, where)
    options = _options(where, learning_rate, damping, cg_maxiter, cg_tol, cg_tol_rule,
                       line_search_maxiter, l2_reg, warm_start_decay, backtrack,
                       damping_decay, min_damping, max_damping, armijo, line_search_shrink)
    options["preconditioner_power"] = checks.probability(preconditioner_power,
                                                         "preconditioner_power", where)
    chunk = checks.integer(preconditioner_batch, "preconditioner_batch", where, 1)
    diagonal = None
    if options["preconditioner_power"] > 0:
        per_example = per_example_loss(loss, where)

        def diagonal(batch, variables):
            return common.empirical_fisher_diagonal(model, per_example, batch, variables,
                                                    chunk, where)

    def product(objective, batch, variables, vector):
        del objective  # the Gauss-Newton matrix is of `loss`
        return common.gauss_newton_product(model, loss, batch, variables, vector, where)

    return HessianFree(product, diagonal, options, name=name)


@gin.configurable("from_objective", module="hessian_free", denylist=["variables"])
def from_objective(variables: Sequence[tf.Variable], curvature: str = "hessian",
                   learning_rate: float = 1.0, damping: float = 1.0, cg_maxiter: int = 250,
                   cg_tol: float = 1e-4, line_search_maxiter: int = 20, l2_reg: float = 0.0,
                   warm_start_decay: float = 0.95, backtrack: bool = True,
                   damping_decay: float = 2 / 3, min_damping: float = 0.0,
                   max_damping: float = float("inf"), armijo: float = 1e-2,
                   line_search_shrink: float = 0.8, cg_tol_rule: str = "constant",
                   name: str = "hessian_free") -> HessianFree:
    """Hessian-free optimization of any objective: exact Hessian-vector products
    (`hogrod.autodiff.hvp`) of the train step's objective, unpreconditioned CG.

    The Hessian is of the loss `apply` is given, the step's weighted total of the
    objective's terms ("monitor/" ones left out): the gradient's function.
    Gin-configurable as `hessian_free.from_objective`. Damping 0 is allowed: CG then
    stops at a direction of non-positive curvature (Steihaug). scipy's Newton-CG (a
    truncated Newton method with a line search, no damping) is ``damping=0,
    warm_start_decay=0, backtrack=False, cg_tol=0.5, cg_tol_rule="superlinear"``.

    Args:
      variables: the variables `make_train_step` trains (checked when it builds).
      curvature: "hessian" (the one curvature of an objective without a model).
      learning_rate: the rate the line search starts from (> 0); default 1.
      damping: the initial Levenberg-Marquardt damping lambda (>= 0); default 1.
      cg_maxiter: CG's most steps (>= 1); default 250.
      cg_tol: CG's relative residual tolerance (>= 0); default 1e-4.
      line_search_maxiter: the most objective values the line search takes (>= 0);
        default 20.
      l2_reg: added to the curvature (>= 0); default 0.
      warm_start_decay: CG starts from the previous solution times this, in [0, 1];
        default 0.95.
      backtrack: Martens' CG backtracking; default True.
      damping_decay: lambda's factor after a good step, in (0, 1]; default 2/3.
      min_damping: the least damping (>= 0); default 0.
      max_damping: the largest damping (>= min_damping); default infinity.
      armijo: the line search's sufficient-decrease constant, in (0, 1); default 1e-2.
      line_search_shrink: the rate's factor per rejected value, in (0, 1); default 0.8.
      cg_tol_rule: "constant" (default) or "superlinear" (min(cg_tol, sqrt(||g||))).
      name: the optimizer's name.

    Returns:
      A `HessianFree` step optimizer for `variables`.

    Raises:
      ArgumentError: `variables` is empty or not variables, `curvature` is unknown or a
        hyperparameter is out of range; the message names it.
    """
    where = "hessian_free.from_objective"
    variables = checks.params(variables, where, "variables")
    checks.choice(curvature, CURVATURES, "curvature", where)
    options = _options(where, learning_rate, damping, cg_maxiter, cg_tol, cg_tol_rule,
                       line_search_maxiter, l2_reg, warm_start_decay, backtrack,
                       damping_decay, min_damping, max_damping, armijo, line_search_shrink)

    def product(loss, batch, variables, vector):
        with common.stateless():  # the model's state (BatchNorm, seeds) not written
            hv = hvp(lambda: loss(batch), list(variables), list(vector))
        return protocol.replica_mean(hv)

    return HessianFree(product, None, options, variables, name=name)


hessian_free.from_objective = from_objective
