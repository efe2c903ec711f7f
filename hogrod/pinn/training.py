"""PINN losses and the standard recipe: Adam (hogrod.train), then L-BFGS (scipy) to convergence.

`pinn_loss(problem, u_fn, points, condition_points, weights)` returns the objective of named
terms (`term_names`: "residual", one per condition, "data" for an inverse problem and
"gpinn" for gradient-enhanced PINNs) that `hogrod.train.make_train_step` takes;
`pointwise_terms` gives each term's pointwise values before the mean (what the weighting
schemes of `weighting.py` look at).
`lbfgs(objective, variables)` runs scipy's L-BFGS-B on a compiled float64 value-and-gradient of
the same terms; `relative_l2` measures a solution against the problem's reference
(a float, or None without one); `predict_on_grid` evaluates it on the problem's grid.
`Clock` counts training seconds without the evaluations; `seconds_to_error` reads the time
to an error off an error curve.
"""

import contextlib
import math
import numbers
import time
from typing import (Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple)

import numpy as np
import scipy.optimize
import tensorflow as tf
from absl import logging

from hogrod import autodiff, checks
from hogrod.pinn import pointsets
from hogrod.pinn.pdes import residual
from hogrod.pinn.problem import Problem, condition_misfit
from hogrod.train import objective_terms, weighted_total
from hogrod.types import Batch, DType, Objective, TensorLike

__all__ = ["solution_fn", "term_names", "Term", "pointwise_terms", "pinn_loss", "lbfgs",
           "relative_l2", "reference_nan_rows", "predict_on_grid", "Clock", "seconds_to_error"]


def solution_fn(problem: Problem,
                net: Callable[[tf.Tensor], tf.Tensor]) -> Callable[[tf.Tensor], tf.Tensor]:
    """u(x): the network, through the problem's hard-constraint transform if it has one.

    Args:
      problem: a `Problem`; its `transform(x, net_out) -> u`, if not None, is applied.
      net: the network, [n, dim] -> [n, m].
    Returns:
      `net` itself without a transform, else `x -> problem.transform(x, net(x))`.
    """
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


def term_names(problem: Problem, gpinn: Optional[Mapping[int, float]] = None) -> List[str]:
    """The names of `pinn_loss`'s terms for `problem`, in order.

    Args:
      problem: a `Problem`.
      gpinn: None, or {coordinate index: weight > 0} (checked against the domain).
    Returns:
      ["residual", each condition's name, "data" for an inverse problem, "gpinn" with
      gPINN weights].
    Raises:
      TypeError, ValueError: `gpinn` not a non-empty dict of coordinates and finite
        weights > 0.
    """
    return (["residual"] + [name for name, _, _ in problem.conditions]
            + (["data"] if problem.data is not None else [])
            + (["gpinn"] if _check_gpinn(problem, gpinn) else []))


class Term(NamedTuple):
    """One loss term before reduction: `scale * mean(values(points) ** 2)`.

    points: [n, dim]; values: `values(x) -> [n, m]`, the pointwise quantity the term
    squares (the PDE residual, a condition's misfit, ...); scale: a Python number."""
    points: tf.Tensor
    values: Callable
    scale: float = 1.0


def _gpinn_values(pde, u_fn, coords, derivatives):
    """x -> [n, m * k]: sqrt(w_j) d residual / d x_j for the k coordinates j, grouped by j.

    The network is applied pointwise, so the residual at a point depends on that point
    only and the per-point Jacobian (`hogrod.batch_jacobian`) is the whole derivative."""
    roots = [math.sqrt(w) for w in coords.values()]

    def values(x):
        jac = autodiff.batch_jacobian(lambda z: residual(pde, u_fn, z, **derivatives),
                                      x)  # [n, m, dim]
        return tf.concat([r * jac[:, :, j] for r, j in zip(roots, coords)], axis=1)
    return values


def pointwise_terms(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor],
                    points: tf.Tensor, condition_points: Sequence[tf.Tensor],
                    gpinn: Optional[Mapping[int, float]] = None, use_jet: bool = True,
                    jet_jit_compile: bool = True) -> Dict[str, Term]:
    """Each loss term's pointwise values before the mean (what weighting schemes look at).

    The terms are the residual at the collocation points, each condition's misfit u -
    target (`condition_misfit`) at its points, the observations' misfit ("data", inverse
    problems) and, with `gpinn`, the gPINN term "gpinn" = sum_j w_j mean((d residual /
    d x_j)^2) at the collocation points (Yu, Lu, Meng and Karniadakis 2022).

    Args:
      problem: a `Problem` with its PDE.
      u_fn: the solution, [n, dim] -> [n, m] (`solution_fn`).
      points: the collocation points, [n, dim].
      condition_points: one set of points per condition, in order.
      gpinn: None, or {coordinate j: weight w_j}.
      use_jet: `residual`'s derivative path (the operator jet where it applies).
      jet_jit_compile: `residual`'s `jit_compile` (the jet XLA-compiled in a tf.function).
    Returns:
      A dict mapping each name of `term_names(problem, gpinn)`, in that order, to its
      `Term`.
    """
    coords = _check_gpinn(problem, gpinn)
    pde = problem.pde
    derivatives = dict(use_jet=use_jet, jit_compile=jet_jit_compile)
    terms = {"residual": Term(points, lambda x: residual(pde, u_fn, x, **derivatives))}
    for condition, x in zip(problem.conditions, condition_points):
        terms[condition[0]] = Term(x, lambda x, c=condition: condition_misfit(c, u_fn, x))
    if problem.data is not None:
        x, y = (tf.constant(a, points.dtype) for a in problem.data)
        terms["data"] = Term(x, lambda x, y=y: u_fn(x) - y)
    if coords:
        terms["gpinn"] = Term(points, _gpinn_values(pde, u_fn, coords, derivatives),
                              float(len(coords)))
    return terms


def pinn_loss(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor], points: TensorLike,
              condition_points: Sequence[TensorLike],
              weights: Optional[Mapping[str, TensorLike]] = None,
              extra_terms: Optional[Mapping[str, Callable[[], tf.Tensor]]] = None,
              gpinn: Optional[Mapping[int, float]] = None,
              reducers: Optional[Mapping[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]] = None,
              use_jet: bool = True, jet_jit_compile: bool = True,
              check_domain: bool = True) -> Objective:
    """The PINN objective: a function `objective(batch=None) -> {term: scalar}`.

    Its terms are the mean squared residual at the collocation points, the mean squared
    misfit of each condition at its points and, for an inverse problem (`problem.data`),
    of the observations ("data"), each times its weight. Every point set is checked when
    this is called: its shape against the domain's dimension, its dtype against the
    network's, and (with `check_domain`) its points against the domain.

    Args:
      problem: a `Problem` with its PDE (an inverse problem after `bind_unknowns`).
      u_fn: the solution, [n, dim] -> [n, m] (`solution_fn(problem, net)`).
      points: the collocation points, [n, dim], of the network's dtype.
      condition_points: one set of points per condition of the problem, in order.
      weights: None, or {term name: weight} scaling terms (the others 1).
      extra_terms: None, or {name: fn() -> scalar}, terms added as they are.
      gpinn: None, or {coordinate j: w_j}: adds the gradient-enhanced term "gpinn" = sum_j
        w_j mean((d residual / d x_j)^2).
      reducers: None, or {name: reduce(points, squares [n, m]) -> scalar} (from a weighting
        scheme: causal or self-adaptive weights), replacing a term's mean over its points.
      use_jet: `residual`'s derivative path: True, the operator jet where it applies;
        False, nested tapes (`partials`) always.
      jet_jit_compile: `residual`'s `jit_compile`: the jet XLA-compiled inside a
        tf.function.
      check_domain: check that every point set lies in `problem.domain` (its `inside`;
        domains without one are not checked); False fits points outside it on purpose.
    Returns:
      The objective `objective(batch=None)`, returning a dict of the terms' scalars.
      `batch`, when given, is `(points, condition_points)`, this replica's shard of them
      under a tf.distribute strategy
      (`hogrod.distribute.shard(strategy, (points, condition_points))`); None uses the
      points given here. Every replica fits all the observations.
    Raises:
      ValueError: no PDE yet, a point set of the wrong shape or outside the domain, or
        weights or reducers for terms the problem does not have.
      TypeError: a point set of another dtype than the network's.
    """
    if problem.pde is None:
        raise ValueError(f"pinn_loss: problem {problem.name!r} has unknowns "
                         f"{[u.name for u in problem.unknowns]} and no PDE yet: build it from "
                         "training variables with pinn.bind_unknowns(problem, {name: "
                         "unknown.variable(dtype)})")
    for arg, value in (("use_jet", use_jet), ("jet_jit_compile", jet_jit_compile),
                       ("check_domain", check_domain)):
        if not isinstance(value, bool):
            raise checks.ArgumentError(f"pinn_loss: {arg} must be True or False, got {value!r}")
    points = tf.convert_to_tensor(points)
    condition_points = [tf.convert_to_tensor(x) for x in condition_points]
    names = [name for name, _, _ in problem.conditions]
    pointsets.one_set_per_condition(problem, names, condition_points)
    dim = problem.domain.dim
    sets = pointsets.point_sets(problem, points, condition_points, names)
    for what, x in sets:
        if len(x.shape) != 2 or x.shape[-1] != dim:
            raise ValueError(f"pinn_loss: {what} must have shape [n, {dim}] for the "
                             f"{dim}-D domain of problem {problem.name!r}, got {x.shape}")
    pointsets.check_dtypes(problem, u_fn, sets)
    if check_domain:
        pointsets.check_inside(problem, sets)
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
    pointwise = pointwise_terms(problem, u_fn, points, condition_points, gpinn, use_jet,
                                jet_jit_compile)

    def objective(batch=None):
        pts, cond_pts = (points, condition_points) if batch is None else batch
        pointsets.one_set_per_condition(problem, names, cond_pts, "the batch's condition points")
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
    return objective


def lbfgs(objective: Objective, variables: Sequence[tf.Variable], maxiter: int = 10000,
          tol: float = 1e-12, history_size: int = 50, callback_every: int = 500,
          strategy: Optional[tf.distribute.Strategy] = None, batch: Batch = None,
          callback: Optional[Callable[[int], None]] = None,
          jit_compile: bool = False) -> Tuple[float, int, float]:
    """Minimize `objective` over `variables` with scipy's L-BFGS-B.

    The value minimized is the sum of the objective's terms, as `make_train_step`
    minimizes it (terms named "monitor/..." are not minimized); the value and gradient are
    one compiled function of a flat float64 vector. With a `strategy`, each replica
    differentiates its shard's terms and the value and gradient are averaged over
    replicas (equal shards: the full-batch ones).

    Args:
      objective: `objective(batch) -> scalar or {term: scalar}` (`pinn_loss`'s).
      variables: the variables to move; left at the solution.
      maxiter: the most L-BFGS iterations (scipy may stop earlier, at `tol`); at most
        1.25 maxiter evaluations.
      tol: scipy's `ftol` and `gtol`.
      history_size: the number of correction pairs kept (scipy's `maxcor`).
      callback_every: iterations between progress logs and `callback` calls.
      strategy: None, or the tf.distribute strategy `batch` is sharded for.
      batch: what `objective` is called with (None: its own points; under a strategy the
        sharded points, `hogrod.distribute.shard`).
      callback: None, or `callback(iteration)`, run with the variables set to the current
        iterate (error curves); its time is not counted in the returned seconds.
      jit_compile: compile each replica's value and gradient with XLA.
    Returns:
      (final value, iterations, seconds), the minimized sum as a float, scipy's iteration
      count and the wall seconds less the time spent in `callback`.
    Raises:
      ArgumentError: a non-callable objective, or a bad `maxiter`, `tol`, `history_size`
        or `callback_every`.
    """
    checks.function(objective, "objective", "lbfgs", "objective(batch) -> scalar or dict")
    maxiter = checks.integer(maxiter, "maxiter", "lbfgs", least=1)
    tol = checks.nonnegative(tol, "tol", "lbfgs")
    history_size = checks.integer(history_size, "history_size", "lbfgs", least=1)
    callback_every = checks.integer(callback_every, "callback_every", "lbfgs", least=1)
    variables = list(variables)
    shapes = [v.shape for v in variables]
    sizes = [int(np.prod(s)) for s in shapes]

    def replica_value_and_grad(b):
        return autodiff.value_and_grad(
            lambda: weighted_total(objective_terms(objective(b)), {}), variables)

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
        options={"maxiter": maxiter, "maxfun": int(maxiter * 1.25),
                 "maxcor": history_size, "ftol": tol, "gtol": tol})
    assign(tf.constant(result.x))  # leave the variables at the solution
    return float(result.fun), int(result.nit), time.perf_counter() - start - outside[0]


def predict_on_grid(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor],
                    dtype: DType = tf.float32) -> np.ndarray:
    """The solution on the problem's grid, evaluated in chunks of 8192 points.

    Args:
      problem: a `Problem` with a grid.
      u_fn: the solution, [n, dim] -> [n, m].
      dtype: the network's dtype (the grid is converted to it).
    Returns:
      numpy [grid points, m].
    """
    grid = problem.grid
    return np.concatenate([u_fn(tf.constant(grid[i:i + 8192], dtype)).numpy()
                           for i in range(0, len(grid), 8192)])


def reference_nan_rows(problem: Problem) -> int:
    """How many grid points the problem's reference leaves undefined.

    A row holding NaN is a PINNacle file's point where the export has no solution;
    `relative_l2` and `l2re` leave them out.

    Args:
      problem: a `Problem`.
    Returns:
      The number of rows of `problem.reference(problem.grid)` holding a NaN; 0 without a
      reference.
    """
    if problem.reference is None:
        return 0
    ref = np.asarray(problem.reference_on_grid, np.float64)
    return int(np.isnan(ref.reshape(len(ref), -1)).any(axis=1).sum())


def relative_l2(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor],
                dtype: DType = tf.float32) -> Optional[float]:
    """``||u - u_ref|| / ||u_ref||`` on the problem's grid, over every output.

    Rows where the reference holds NaN are left out, as `l2re` leaves them out
    (`reference_nan_rows` counts them).

    Args:
      problem: a `Problem` with a grid.
      u_fn: the solution, [n, dim] -> [n, m].
      dtype: the network's dtype.
    Returns:
      A float; None if the problem has no reference solution.
    Raises:
      ValueError: the solution and the reference differ in shape, or the reference is NaN
        everywhere.
    """
    if problem.reference is None:
        return None
    pred = predict_on_grid(problem, u_fn, dtype)
    ref = problem.reference_on_grid
    if pred.shape != ref.shape:
        raise ValueError(f"relative_l2: the solution has shape {pred.shape} on the grid of "
                         f"problem {problem.name!r} but its reference has shape {ref.shape}")
    keep = ~np.isnan(ref.reshape(len(ref), -1)).any(axis=1)
    if not keep.any():
        raise ValueError(f"relative_l2: the reference of problem {problem.name!r} is NaN at "
                         "every grid point: nothing to compare")
    pred, ref = pred[keep], ref[keep]
    return float(np.linalg.norm(pred - ref) / np.linalg.norm(ref))


class Clock:
    """Training seconds: wall time since it was made, plus `offset`, less paused time.

    The time spent inside `paused()` blocks (evaluations) is not counted. While paused,
    `seconds()` is the time the pause began.

    Args:
      offset: a resumed run's earlier seconds.
    """

    def __init__(self, offset: float = 0.0) -> None:
        self._start = time.perf_counter() - float(offset)
        self._paused_total = 0.0
        self._paused_at = None

    def seconds(self) -> float:
        """The training seconds so far.

        Returns:
          Seconds since construction plus `offset`, less the paused time.
        """
        now = time.perf_counter() if self._paused_at is None else self._paused_at
        return now - self._start - self._paused_total

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """A block whose time is not counted (nested blocks count once).

        Yields:
          None, inside the block.
        """
        if self._paused_at is not None:  # already paused: the outer block counts the time
            yield
            return
        self._paused_at = time.perf_counter()
        try:
            yield
        finally:
            self._paused_total += time.perf_counter() - self._paused_at
            self._paused_at = None


def seconds_to_error(curve: Sequence[Sequence], threshold: float) -> Optional[float]:
    """The seconds of the first point of an error curve at or below `threshold`.

    Args:
      curve: rows [seconds, phase, step, error], in order; error None where there is no
        reference.
      threshold: the error to reach, > 0.
    Returns:
      The first row's seconds whose error is <= threshold; None if no row's is.
    Raises:
      ValueError: threshold <= 0.
    """
    if not threshold > 0:
        raise ValueError(f"seconds_to_error: threshold must be > 0, got {threshold}")
    return next((row[0] for row in curve if row[3] is not None and row[3] <= threshold), None)
