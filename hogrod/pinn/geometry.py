"""Domains and collocation sampling.

The shapes are in `csg.py` and importable from here: the primitives `Box` (axis-aligned;
for space-time put time last) and `Disk` (a ball in any dimension), and the regularized set
operations `union(a, b)` (also `a | b`), `difference(a, b)` (`a - b`), `intersection(a, b)`
(`a & b`) (up to 3-D): the PINNacle complex-geometry cases (rectangles minus disks, a
backward-facing step). A set operation's domain is the closure of the interior of the
plain operation, so faces two operands share and faces cut away are not boundary. Every
geometry has `inside(x)`, `on_boundary(x)`, `interior(x)` (within `tol`, by default 1e-9
times the larger of 1 and its bounding box's diameter), `bbox` (a Box) and
`boundary(n, seed, dtype)`: n points uniform on the boundary (by area, or length in 2-D);
`csg.py`'s docstring gives the rules that make these exact.

`sample(geometry, n, method, seed, dtype)`: n interior points, method "uniform", "lhs",
"sobol" (`scipy.stats.qmc`) or "hammersley" (the Hammersley set, `hammersley`); for a Box
directly, for other geometries by rejection from the bounding box (drawing more until n
are inside; an error when the geometry fills too little of it). `refine`: residual-based
adaptive refinement. Every sampler returns `dtype`, Keras's floatx by default.
"""

import warnings
from typing import Callable, Optional

import numpy as np
import scipy.stats
import scipy.stats.qmc

from hogrod import checks
from hogrod.types import DType, TensorLike
from hogrod.pinn.csg import (MIN_ACCEPTANCE, Box, Disk, Geometry, _dtype, difference,
                             intersection, union)

__all__ = ["Geometry", "Box", "Disk", "union", "difference", "intersection", "sample",
           "hammersley", "radical_inverse", "refine", "METHODS"]

METHODS = ("uniform", "lhs", "sobol", "hammersley")


def radical_inverse(i: TensorLike, base: int) -> np.ndarray:
    """The radical inverse: the base-`base` digits of i mirrored about the radix point.

    ``phi_base(i) = sum_k d_k base^(-k-1)`` for ``i = sum_k d_k base^k``.

    Args:
      i: integers >= 0 (an array or a number; ArgumentError for a negative one).
      base: an integer >= 2.
    Returns:
      float64 array of the shape of i, in [0, 1).
    """
    base = checks.integer(base, "base", "radical_inverse", least=2)
    i = np.asarray(i, np.int64).copy()
    if np.any(i < 0):
        raise checks.ArgumentError(f"radical_inverse: i must be >= 0, got {i.min()}")
    out, scale = np.zeros(i.shape), 1.0 / base
    while np.any(i > 0):
        out += scale * (i % base)
        i //= base
        scale /= base
    return out


def _primes(k):
    primes, c = [], 2
    while len(primes) < k:
        if all(c % p for p in primes):
            primes.append(c)
        c += 1
    return primes


def hammersley(n: int, dim: int, dtype: Optional[DType] = None) -> np.ndarray:
    """The Hammersley set in [0, 1)^dim, deterministic.

    Point i (i = 0..n-1) is (i / n, phi_2(i), phi_3(i), phi_5(i), ...): radical inverses
    in the first dim - 1 primes.

    Args:
      n: the number of points, >= 1.
      dim: the dimension, >= 1.
      dtype: the points' dtype; None for Keras's floatx.
    Returns:
      numpy array [n, dim] of `dtype`.
    """
    n = checks.integer(n, "n", "hammersley", least=1)
    dim = checks.integer(dim, "dim", "hammersley", least=1)
    return _hammersley(n, dim).astype(_dtype(dtype, "hammersley"))


def _hammersley(n, dim):
    i = np.arange(n)
    cols = [i / n] + [radical_inverse(i, p) for p in _primes(dim - 1)]
    return np.stack(cols[:dim], axis=1)


def _unit(method, n, dim, rng):
    if method == "uniform":
        return rng.random((n, dim))
    if method == "lhs":
        return scipy.stats.qmc.LatinHypercube(d=dim, seed=rng).random(n)
    if method == "sobol":
        with warnings.catch_warnings():  # n need not be a power of 2: the points asked for
            warnings.filterwarnings("ignore", "The balance properties of Sobol")
            return scipy.stats.qmc.Sobol(d=dim, scramble=True, seed=rng).random(n)
    return _hammersley(n, dim)


def sample(geometry: Geometry, n: int, method: str = "sobol", seed: int = 0,
           dtype: Optional[DType] = None) -> np.ndarray:
    """n points in a geometry.

    A Box maps the unit points directly; a Disk (ball) of dimension > 5 maps dim + 1 unit
    coordinates; other geometries take points of the bounding box that fall in their
    interior (rejection). A set drawn at once (LHS, Hammersley) is drawn larger until at
    least n points fall inside, and n of them are taken at random; Sobol and uniform points
    are taken in order.

    Args:
      geometry: a Box, a Disk or a combination of them.
      n: the number of points, >= 1.
      method: "uniform", "lhs", "sobol" or "hammersley" (deterministic: the seed only
        chooses among the points inside, for other geometries than a Box).
      seed: an integer seed (the same seed gives the same points).
      dtype: the points' floating dtype; None for Keras's floatx. Points are computed in
        float64 and cast.
    Returns:
      numpy array [n, dim] of `dtype`.
    Raises:
      ArgumentError: a geometry that is not a Box, a Disk or a combination of them, or a
        bad `n`, `method`, `seed` or `dtype`.
      ValueError: a geometry that fills too little of its bounding box (below 1e-3) for
        rejection sampling.
    """
    method = checks.choice(method, METHODS, "method", "sample")
    if not isinstance(geometry, Geometry):
        raise checks.ArgumentError(
            f"sample: geometry must be a Box, a Disk or a combination of them (union, "
            f"difference, intersection), got {type(geometry).__name__}")
    n = checks.integer(n, "n", "sample", least=1)
    seed = checks.seed(seed, "seed", "sample")
    dtype = _dtype(dtype, "sample")
    rng = np.random.default_rng(seed)
    box = geometry.bbox
    if isinstance(geometry, Box):
        unit = _unit(method, n, box.dim, rng)
        return (box.low + unit * (box.high - box.low)).astype(dtype)
    if isinstance(geometry, Disk) and geometry.dim > 5:  # below, rejection works
        return _in_ball(geometry, method, n, rng).astype(dtype)
    draw = 2 * n
    while True:
        x = box.low + _unit(method, draw, box.dim, rng) * (box.high - box.low)
        inside = np.flatnonzero(geometry.inside(x, tol=0.0))
        if len(inside) >= n:
            if method in ("lhs", "hammersley"):
                inside = np.sort(rng.choice(inside, n, replace=False))
            return x[inside[:n]].astype(dtype)
        if len(inside) < MIN_ACCEPTANCE * draw:
            raise ValueError(
                f"sample: only {len(inside)} of {draw} points of the bounding box {box!r} lie "
                f"in {geometry!r}: it fills too little of its box (or is empty) for rejection "
                "sampling")
        draw = int(1.25 * n * draw / max(len(inside), 1)) + 16


def _in_ball(ball, method, n, rng):
    """n points uniform in a ball, mapped from dim + 1 unit coordinates.

    A normal vector's direction (inverse normal CDF) and the radius R u^(1/dim). Rejection
    from the bounding box cannot: a ball fills 2.5e-3 of its box at dim 10, 2e-70 at dim 100.
    """
    unit = np.clip(_unit(method, n, ball.dim + 1, rng), 1e-12, 1 - 1e-12)
    g = scipy.stats.norm.ppf(unit[:, :-1])
    radius = ball.radius * unit[:, -1:] ** (1.0 / ball.dim)
    return ball.center + radius * g / np.linalg.norm(g, axis=1, keepdims=True)


def refine(points: TensorLike, residual_fn: Callable[[np.ndarray], TensorLike],
           geometry: Geometry, candidates: int = 10000, add: int = 1000, seed: int = 0,
           dtype: Optional[DType] = None) -> np.ndarray:
    """Residual-based adaptive refinement: the current points and those of largest residual.

    `candidates` fresh Sobol points are drawn in `geometry` (`sample`); the `add` of them
    with the largest residual (``abs(residual)`` summed over its columns) are appended to
    `points`.

    Args:
      points: the current points, [m, dim] of `dtype`.
      residual_fn: `residual_fn(x) -> [n] or [n, k]` for points x [n, dim] of `dtype`.
      geometry: a Box, a Disk or a combination of them.
      candidates: the number of candidates drawn, >= 1.
      add: the number of candidates added, in [0, candidates].
      seed: an integer seed.
      dtype: the points' dtype (that of `points`); None for Keras's floatx.
    Returns:
      numpy array [m + add, dim] of `dtype`, `points` first, then the chosen candidates.
    Raises:
      ArgumentError: `points` of another dtype than `dtype` or of another shape than
        [m, dim], `add` outside [0, candidates], or a `residual_fn` that is not callable.
    """
    dtype = _dtype(dtype, "refine")
    candidates = checks.integer(candidates, "candidates", "refine", least=1)
    add = checks.integer(add, "add", "refine", least=0, most=candidates)
    checks.function(residual_fn, "residual_fn", "refine", "residual_fn(x) -> [n] or [n, k]")
    cand = sample(geometry, candidates, "sobol", seed, dtype)
    points = np.asarray(points)
    if points.dtype != dtype:
        raise checks.ArgumentError(
            f"refine: points have dtype {points.dtype} but dtype is {dtype}: pass "
            f"dtype={points.dtype.name} or points of dtype {dtype}")
    if points.ndim != 2 or points.shape[1] != geometry.dim:
        raise checks.ArgumentError(f"refine: points must have shape [m, {geometry.dim}], got "
                                   f"{points.shape}")
    r = np.abs(np.asarray(residual_fn(cand))).reshape(len(cand), -1).sum(axis=1)
    return np.concatenate([points, cand[np.argsort(r)[::-1][:add]]], axis=0)
