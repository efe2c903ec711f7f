"""PINN losses and the standard recipe: Adam (hogrod.train), then L-BFGS (scipy) to convergence.

`pinn_loss(problem, u_fn, points, condition_points, weights)` returns the loss function of
named terms (`term_names`: "residual", one per condition, "data" for an inverse problem and
"gpinn" for gradient-enhanced PINNs) that `hogrod.train.make_train_step` takes;
`pointwise_terms` gives each term's pointwise values before the mean (what the weighting
schemes of `weighting.py` look at).
`lbfgs(loss, variables)` runs scipy's L-BFGS-B on a compiled float64 value-and-gradient of
the same terms; `relative_l2` measures a solution against the problem's reference
(a float, or None without one); `predict_on_grid` evaluates it on the problem's grid.
`Clock` counts training seconds without the evaluations; `seconds_to_error` reads the time
to an error off an error curve.
"""

import contextlib
import math
import numbers
import time
from typing import Callable, NamedTuple

import numpy as np
import scipy.optimize
import tensorflow as tf
from absl import logging

import hogrod
from hogrod.pinn.pdes import residual
from hogrod.pinn.problems import condition_misfit
from hogrod.train import objective_terms, weighted_total

__all__ = ["solution_fn", "term_names", "Term", "pointwise_terms", "pinn_loss", "lbfgs",
           "relative_l2", "predict_on_grid", "Clock", "seconds_to_error"]


def solution_fn(problem, net):
    """u(x): the network, through the problem's hard-constraint transform if it has one."""
    if problem.transform is None:
        return net
    return lambda x: problem.transform(x, net(x))


def _check_gpinn(problem, gpinn):
    """{coordinate: weight} as {int: float}, checked against the problem's dimension."""
    if gpinn is None:
        return {}
    if not isinstance(gpinn, dict) or not gpinn:
        raise TypeError(f"gpinn must be a non-empty dict {{coordinate index: weight}} (e.g. "
                        f"pinn_experiment.gpinn = {{0: 0.01}}), got {gpinn!r}")
    dim = problem.domain.dim
    out = {}
    for j, w in gpinn.items():
        if not isinstance(j, numbers.Integral) or isinstance(j, bool) or not 0 <= j < dim:
            raise ValueError(f"gpinn: coordinate {j!r} is not an index of the {dim}-D domain of "
                             f"problem {problem.name!r} (0..{dim - 1})")
        if not (isinstance(w, numbers.Real) and not isinstance(w, bool) and math.isfinite(w)
                and w > 0):
            raise ValueError(f"gpinn: the weight of coordinate {j} must be a finite number > 0, "
                             f"got {w!r}")
        out[int(j)] = float(w)
    return dict(sorted(out.items()))


def term_names(problem, gpinn=None):
    """The names of `pinn_loss`'s terms for `problem`, in order ("gpinn" last, with gPINN
    terms)."""
    return (["residual"] + [name for name, _, _ in problem.conditions]
            + (["data"] if problem.data is not None else [])
            + (["gpinn"] if _check_gpinn(problem, gpinn) else []))


def _check_one_set_per_condition(problem, names, condition_points,
                                 what="condition_points"):
    """One set of points per condition, in order: zipping shorter lists would drop terms."""
    if len(condition_points) != len(names):
        missing = names[len(condition_points):]
        detail = (f"no points for condition(s) {missing}" if missing else
                  f"{len(condition_points) - len(names)} set(s) of points beyond them")
        raise ValueError(f"pinn_loss: {what} must hold one set of points per condition of "
                         f"problem {problem.name!r}, in order {names}; got "
                         f"{len(condition_points)}: {detail}")


class Term(NamedTuple):
    """One loss term before reduction: `scale * mean(values(points) ** 2)`.

    points: [n, dim]; values: `values(x) -> [n, m]`, the pointwise quantity the term
    squares (the PDE residual, a condition's misfit, ...); scale: a Python number."""
    points: tf.Tensor
    values: Callable
    scale: float = 1.0


def _gpinn_values(pde, u_fn, coords):
    """x -> [n, m * k]: sqrt(w_j) d residual / d x_j for the k coordinates j, grouped by j.

    The network is applied pointwise, so the residual at a point depends on that point
    only and the per-point Jacobian (`hogrod.batch_jacobian`) is the whole derivative."""
    roots = [math.sqrt(w) for w in coords.values()]

    def values(x):
        jac = hogrod.batch_jacobian(lambda z: residual(pde, u_fn, z), x)  # [n, m, dim]
        return tf.concat([r * jac[:, :, j] for r, j in zip(roots, coords)], axis=1)
    return values


def pointwise_terms(problem, u_fn, points, condition_points, gpinn=None):
    """{name: Term} for `term_names(problem, gpinn)`: the residual at the collocation
    points, each condition's misfit u - target at its points, the observations' misfit
    ("data", inverse problems) and, with `gpinn` ({coordinate j: weight w_j}), the gPINN
    term "gpinn" = sum_j w_j mean((d residual / d x_j)^2) at the collocation points (Yu,
    Lu, Meng and Karniadakis 2022)."""
    coords = _check_gpinn(problem, gpinn)
    pde = problem.pde
    terms = {"residual": Term(points, lambda x: residual(pde, u_fn, x))}
    for condition, x in zip(problem.conditions, condition_points):
        terms[condition[0]] = Term(x, lambda x, c=condition: condition_misfit(c, u_fn, x))
    if problem.data is not None:
        x, y = (tf.constant(a, points.dtype) for a in problem.data)
        terms["data"] = Term(x, lambda x, y=y: u_fn(x) - y)
    if coords:
        terms["gpinn"] = Term(points, _gpinn_values(pde, u_fn, coords), float(len(coords)))
    return terms


def pinn_loss(problem, u_fn, points, condition_points, weights=None, extra_terms=None,
              gpinn=None, reducers=None):
    """A `loss_fn(batch=None) -> {term: scalar}`: mean squared residual at the collocation
    points, mean squared misfit of each condition at its points and, for an inverse problem
    (`problem.data`), of the observations ("data"). `weights` scale terms ({name: w});
    `extra_terms` adds terms ({name: fn() -> scalar}); `gpinn` ({coordinate j: w_j}) adds
    the gradient-enhanced term "gpinn" = sum_j w_j mean((d residual / d x_j)^2);
    `reducers` ({name: reduce(points, squares [n, m]) -> scalar}, from a weighting scheme:
    causal or self-adaptive weights) replace a term's mean over its points.

    `batch`, when given, is `(points, condition_points)`: this replica's shard of them under
    a tf.distribute strategy (`hogrod.distribute.shard(strategy, (points, condition_points))`);
    None uses the `points` and `condition_points` given here. Every replica fits all the
    observations."""
    if problem.pde is None:
        raise ValueError(f"pinn_loss: problem {problem.name!r} has unknowns "
                         f"{[u.name for u in problem.unknowns]} and no PDE yet: build it from "
                         "training variables with pinn.bind_unknowns(problem, {name: "
                         "unknown.variable(dtype)})")
    points = tf.convert_to_tensor(points)
    condition_points = [tf.convert_to_tensor(x) for x in condition_points]
    names = [name for name, _, _ in problem.conditions]
    _check_one_set_per_condition(problem, names, condition_points)
    dim = problem.domain.dim
    for what, x in [("collocation points", points)] + [
            (f"the {name!r} condition's points", x) for name, x in zip(names, condition_points)]:
        if x.shape.rank != 2 or x.shape[-1] != dim:
            raise ValueError(f"{what} must have shape [n, {dim}] for the {dim}-D domain of "
                             f"problem {problem.name!r}, got {x.shape}")
    all_names = term_names(problem, gpinn)
    weights = dict(weights or {})
    unknown = set(weights) - set(all_names) - set(extra_terms or {})
    if unknown:
        raise ValueError(f"weights for unknown PINN loss terms {sorted(unknown)}; the terms "
                         f"of problem {problem.name!r} are {all_names}")
    reducers = dict(reducers or {})
    if set(reducers) - set(all_names):
        raise ValueError(f"reducers for unknown PINN loss terms "
                         f"{sorted(set(reducers) - set(all_names))}; the terms of problem "
                         f"{problem.name!r} are {all_names}")
    pointwise = pointwise_terms(problem, u_fn, points, condition_points, gpinn)

    def loss_fn(batch=None):
        pts, cond_pts = (points, condition_points) if batch is None else batch
        _check_one_set_per_condition(problem, names, cond_pts, "the batch's condition points")
        at = dict(zip(names, cond_pts), residual=pts, gpinn=pts)
        terms = {}
        for name, term in pointwise.items():
            x = at.get(name, term.points)  # the observations are the same on every replica
            squares = tf.square(term.values(x))
            reduce = reducers.get(name)
            value = tf.reduce_mean(squares) if reduce is None else reduce(x, squares)
            terms[name] = term.scale * value if term.scale != 1.0 else value
        for name, fn in (extra_terms or {}).items():
            terms[name] = fn()
        return {k: weights.get(k, 1.0) * v for k, v in terms.items()}
    return loss_fn


def lbfgs(loss_fn, variables, max_iterations=10000, tolerance=1e-12, history_size=50,
          callback_every=500, strategy=None, batch=None, callback=None, jit_compile=False):
    """Minimize the objective `loss_fn(batch) -> scalar or {term: scalar}` over `variables`
    with scipy's L-BFGS-B: the sum of its terms, as `make_train_step` minimizes it (terms
    named "monitor/..." are not minimized).

    The value and gradient are one compiled function of a flat float64 vector; returns
    (final loss, iterations, seconds). With a `strategy`, `batch` is the sharded points
    (`hogrod.distribute.shard`): each replica differentiates its shard's terms and the
    value and gradient are averaged over replicas (equal shards: the full-batch ones).
    `callback(iteration)` runs every `callback_every` iterations with the variables set to
    the current iterate (error curves); its time is not counted in the returned seconds.
    `jit_compile`: compile each replica's value and gradient with XLA."""
    variables = list(variables)
    shapes = [v.shape for v in variables]
    sizes = [int(np.prod(s)) for s in shapes]

    def replica_value_and_grad(b):
        return hogrod.value_and_grad(
            lambda: weighted_total(objective_terms(loss_fn(b)), {}), variables)

    if jit_compile:
        replica_value_and_grad = tf.function(replica_value_and_grad, jit_compile=True)

    @tf.function
    def assign(flat):
        for v, part, s in zip(variables, tf.split(flat, sizes), shapes):
            v.assign(tf.cast(tf.reshape(part, s), v.dtype))

    @tf.function
    def value_and_grad(flat):
        assign(flat)
        if strategy is None:
            value, grads = replica_value_and_grad(batch)
        else:
            value, grads = strategy.run(replica_value_and_grad, args=(batch,))
            value, grads = tf.nest.map_structure(
                lambda t: strategy.reduce(tf.distribute.ReduceOp.MEAN, t, axis=None),
                (value, grads))
        return (tf.cast(value, tf.float64),
                tf.concat([tf.reshape(tf.cast(g, tf.float64), [-1]) for g in grads], 0))

    start, calls, iterations, outside = time.perf_counter(), [0], [0], [0.0]

    def fun(w):
        value, grad = value_and_grad(tf.constant(w))
        calls[0] += 1
        return float(value), grad.numpy()

    def on_iteration(xk):
        iterations[0] += 1
        if iterations[0] % callback_every:
            return
        t0 = time.perf_counter()
        logging.info("L-BFGS iteration %d (%d evaluations)", iterations[0], calls[0])
        if callback is not None:
            assign(tf.constant(xk))
            callback(iterations[0])
        outside[0] += time.perf_counter() - t0

    x0 = np.concatenate([v.numpy().ravel() for v in variables]).astype(np.float64)
    result = scipy.optimize.minimize(
        fun, x0, jac=True, method="L-BFGS-B", callback=on_iteration,
        options={"maxiter": max_iterations, "maxfun": int(max_iterations * 1.25),
                 "maxcor": history_size, "ftol": tolerance, "gtol": tolerance})
    assign(tf.constant(result.x))  # leave the variables at the solution
    return float(result.fun), int(result.nit), time.perf_counter() - start - outside[0]


def predict_on_grid(problem, u_fn, dtype=tf.float32):
    """u on the problem's grid, numpy [grid points, m] (evaluated in chunks)."""
    grid = problem.grid
    return np.concatenate([u_fn(tf.constant(grid[i:i + 8192], dtype)).numpy()
                           for i in range(0, len(grid), 8192)])


def relative_l2(problem, u_fn, dtype=tf.float32):
    """||u - u_ref|| / ||u_ref|| on the problem's grid, a float; None if the problem has no
    reference solution."""
    if problem.reference is None:
        return None
    pred = predict_on_grid(problem, u_fn, dtype)
    ref = np.asarray(problem.reference(problem.grid))
    if pred.shape != ref.shape:
        raise ValueError(f"relative_l2: the solution has shape {pred.shape} on the grid of "
                         f"problem {problem.name!r} but its reference has shape {ref.shape}")
    return float(np.linalg.norm(pred - ref) / np.linalg.norm(ref))


class Clock:
    """Training seconds: wall time since it was made, plus `offset` (a resumed run's earlier
    seconds), less the time spent inside `paused()` blocks (evaluations). While paused,
    `seconds()` is the time the pause began."""

    def __init__(self, offset=0.0):
        self._start = time.perf_counter() - float(offset)
        self._paused_total = 0.0
        self._paused_at = None

    def seconds(self):
        now = time.perf_counter() if self._paused_at is None else self._paused_at
        return now - self._start - self._paused_total

    @contextlib.contextmanager
    def paused(self):
        if self._paused_at is not None:  # already paused: the outer block counts the time
            yield
            return
        self._paused_at = time.perf_counter()
        try:
            yield
        finally:
            self._paused_total += time.perf_counter() - self._paused_at
            self._paused_at = None


def seconds_to_error(curve, threshold):
    """The seconds of the first point of an error curve ([seconds, phase, step, error] rows,
    error None where there is no reference) at or below `threshold`; None if none is."""
    if not threshold > 0:
        raise ValueError(f"seconds_to_error: threshold must be > 0, got {threshold}")
    return next((row[0] for row in curve if row[3] is not None and row[3] <= threshold), None)
