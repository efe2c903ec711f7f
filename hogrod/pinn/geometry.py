"""Domains and collocation sampling.

Primitives: `Box` (axis-aligned; for space-time put time last) and `Disk` (a ball in any
dimension). Constructive solid geometry: `union(a, b)` (also `a | b`), `difference(a, b)`
(`a - b`), `intersection(a, b)` (`a & b`): the PINNacle complex-geometry cases (rectangles
minus disks, unions of rectangles).

Every geometry has `inside(x)` (the closed set), `on_boundary(x)` and `interior(x)`
(boundary and strict interior, within `tol`, by default 1e-9 times its bounding box's
diameter), `bbox` (a Box) and `boundary(n, seed)`: n points uniform on the boundary
(by area, or length in 2-D). The boundary of a CSG set is made of pieces of its primitives'
boundaries: of A - B, the points of A's boundary outside B's interior and the points of B's
boundary inside A; of A | B, each one's boundary outside the other's interior; of A & B,
each one's boundary inside the other. Boundary points are drawn on every primitive (in
proportion to its boundary's measure) and kept when on the set's boundary, so each piece
gets its share. (Primitives sharing a face, such as two boxes side by side, count the shared
face as boundary: the strict-interior test is per primitive.)

`sample(geometry, n, method, seed)`: n interior points, method "uniform", "lhs", "sobol"
(`scipy.stats.qmc`) or "hammersley" (the Hammersley set, `hammersley`); for a Box directly,
for other geometries by rejection from the bounding box (drawing more until n are inside;
an error when the geometry fills too little of it). `refine`: residual-based adaptive
refinement.
"""

import math
import numbers
import warnings

import numpy as np
import scipy.special
import scipy.stats
import scipy.stats.qmc

__all__ = ["Geometry", "Box", "Disk", "union", "difference", "intersection", "sample",
           "hammersley", "radical_inverse", "refine", "METHODS"]

METHODS = ("uniform", "lhs", "sobol", "hammersley")
# Rejection stops with an error below this acceptance (fraction of the bounding box inside).
MIN_ACCEPTANCE = 1e-3


def _points(x, dim, what):
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{what}: points must have shape [n, {dim}], got {x.shape}")
    return x


def _count(n, what):
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{what}: the number of points must be a positive integer, got {n!r}")
    return int(n)


class Geometry:
    """A closed set in R^dim. Subclasses give `dim`, `bbox`, `_inside(x, tol)`,
    `_interior(x, tol)`, `_boundary_leaves()` and `_keep_on_boundary(x, tol)`."""

    def inside(self, x, tol=None):
        """bool [n]: x in the closed set (within tol)."""
        return self._inside(_points(x, self.dim, "inside"), self._tol(tol))

    def interior(self, x, tol=None):
        """bool [n]: x inside by more than tol."""
        return self._interior(_points(x, self.dim, "interior"), self._tol(tol))

    def on_boundary(self, x, tol=None):
        """bool [n]: x within tol of the boundary (inside and not in the interior)."""
        x, tol = _points(x, self.dim, "on_boundary"), self._tol(tol)
        return self._inside(x, tol) & ~self._interior(x, tol)

    def _tol(self, tol):
        return 1e-9 * max(1.0, float(np.linalg.norm(self.bbox.high - self.bbox.low))) \
            if tol is None else float(tol)

    def boundary(self, n, seed=0, dtype=np.float64):
        """n points uniform (by measure) on the boundary, [n, dim]."""
        n = _count(n, f"{type(self).__name__}.boundary")
        rng = np.random.default_rng(seed)
        leaves = self._boundary_leaves()
        measures = np.array([leaf.boundary_measure() for leaf in leaves])
        kept, drawn, tol = [], 0, self._tol(None)
        want = 2 * n
        while sum(map(len, kept)) < n:
            counts = rng.multinomial(want, measures / measures.sum())
            cand = np.concatenate([leaf._primitive_boundary(c, rng)
                                   for leaf, c in zip(leaves, counts)])
            kept.append(cand[self._keep_on_boundary(cand, tol)])
            drawn += want
            got = sum(map(len, kept))
            if got < MIN_ACCEPTANCE * drawn:
                raise ValueError(
                    f"{self!r}: only {got} of {drawn} points drawn on its primitives' boundaries "
                    "lie on its boundary (is the set empty, or one primitive hidden inside "
                    "another?); boundary sampling cannot give points here")
            want = int(1.25 * (n - got) * drawn / max(got, 1)) + 16
        pts = np.concatenate(kept)
        return pts[rng.permutation(len(pts))[:n]].astype(dtype)

    def __or__(self, other):
        return union(self, other)

    def __sub__(self, other):
        return difference(self, other)

    def __and__(self, other):
        return intersection(self, other)


class Box(Geometry):
    """An axis-aligned box [low_i, high_i]; for space-time put time last."""

    def __init__(self, low, high):
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if (self.low.ndim != 1 or self.low.shape != self.high.shape
                or np.any(self.high <= self.low)):
            raise ValueError(f"Box needs low < high of one shape, got {low} and {high}")

    @property
    def dim(self):
        return len(self.low)

    @property
    def bbox(self):
        return self

    def __repr__(self):
        return f"Box({self.low.tolist()}, {self.high.tolist()})"

    def _inside(self, x, tol):
        return np.all((x >= self.low - tol) & (x <= self.high + tol), axis=1)

    def _interior(self, x, tol):
        return np.all((x > self.low + tol) & (x < self.high - tol), axis=1)

    def _boundary_leaves(self):
        return [self]

    def _keep_on_boundary(self, x, tol):
        return np.ones(len(x), bool)

    def _face_measures(self):
        side = self.high - self.low
        return np.array([np.prod(np.delete(side, a)) for a in range(self.dim)])

    def boundary_measure(self):
        return 2.0 * self._face_measures().sum()

    def _primitive_boundary(self, n, rng):
        """n points uniform on the faces (a face chosen in proportion to its area)."""
        x = self.low + rng.random((n, self.dim)) * (self.high - self.low)
        faces = self._face_measures()
        axis = rng.choice(self.dim, size=n, p=faces / faces.sum())
        upper = rng.random(n) < 0.5
        x[np.arange(n), axis] = np.where(upper, self.high[axis], self.low[axis])
        return x


class Disk(Geometry):
    """The closed ball |x - center| <= radius (a disk in 2-D, any dimension)."""

    def __init__(self, center, radius):
        self.center = np.asarray(center, np.float64)
        if self.center.ndim != 1 or len(self.center) < 1:
            raise ValueError(f"Disk center must be a vector of coordinates, got {center!r}")
        if not isinstance(radius, numbers.Real) or not radius > 0:
            raise ValueError(f"Disk radius must be a positive number, got {radius!r}")
        self.radius = float(radius)

    @property
    def dim(self):
        return len(self.center)

    @property
    def bbox(self):
        return Box(self.center - self.radius, self.center + self.radius)

    def __repr__(self):
        return f"Disk({self.center.tolist()}, {self.radius})"

    def _distance(self, x):
        return np.linalg.norm(x - self.center, axis=1)

    def _inside(self, x, tol):
        return self._distance(x) <= self.radius + tol

    def _interior(self, x, tol):
        return self._distance(x) < self.radius - tol

    def _boundary_leaves(self):
        return [self]

    def _keep_on_boundary(self, x, tol):
        return np.ones(len(x), bool)

    def boundary_measure(self):
        d = self.dim
        return 2 * math.pi ** (d / 2) / scipy.special.gamma(d / 2) * self.radius ** (d - 1)

    def _primitive_boundary(self, n, rng):
        g = rng.standard_normal((n, self.dim))
        return self.center + self.radius * g / np.linalg.norm(g, axis=1, keepdims=True)


class _CSG(Geometry):
    op = None

    def __init__(self, a, b):
        for name, g in (("first", a), ("second", b)):
            if not isinstance(g, Geometry):
                raise TypeError(f"{self.op}: the {name} operand must be a Geometry (Box, Disk "
                                f"or a combination), got {type(g).__name__}")
        if a.dim != b.dim:
            raise ValueError(f"{self.op}: operands of dimensions {a.dim} and {b.dim}")
        self.a, self.b = a, b

    @property
    def dim(self):
        return self.a.dim

    def __repr__(self):
        return f"{self.op}({self.a!r}, {self.b!r})"

    def _boundary_leaves(self):
        return self.a._boundary_leaves() + self.b._boundary_leaves()

    def _keep_on_boundary(self, x, tol):
        """Candidates drawn on the primitives' boundaries that are on this set's."""
        return self._inside(x, tol) & ~self._interior(x, tol)


class _Union(_CSG):
    op = "union"

    @property
    def bbox(self):
        return Box(np.minimum(self.a.bbox.low, self.b.bbox.low),
                   np.maximum(self.a.bbox.high, self.b.bbox.high))

    def _inside(self, x, tol):
        return self.a._inside(x, tol) | self.b._inside(x, tol)

    def _interior(self, x, tol):
        return self.a._interior(x, tol) | self.b._interior(x, tol)


class _Difference(_CSG):
    op = "difference"

    @property
    def bbox(self):
        return self.a.bbox

    def _inside(self, x, tol):
        return self.a._inside(x, tol) & ~self.b._interior(x, tol)

    def _interior(self, x, tol):
        return self.a._interior(x, tol) & ~self.b._inside(x, tol)


class _Intersection(_CSG):
    op = "intersection"

    @property
    def bbox(self):
        low = np.maximum(self.a.bbox.low, self.b.bbox.low)
        high = np.minimum(self.a.bbox.high, self.b.bbox.high)
        if np.any(high <= low):
            raise ValueError(f"{self!r} is empty (its operands' bounding boxes do not overlap)")
        return Box(low, high)

    def _inside(self, x, tol):
        return self.a._inside(x, tol) & self.b._inside(x, tol)

    def _interior(self, x, tol):
        return self.a._interior(x, tol) & self.b._interior(x, tol)


def union(a, b):
    """The set of points in a or b."""
    return _Union(a, b)


def difference(a, b):
    """The closure of a minus b (b's boundary inside a belongs to it)."""
    return _Difference(a, b)


def intersection(a, b):
    """The set of points in both a and b."""
    return _Intersection(a, b)


def radical_inverse(i, base):
    """phi_base(i) = sum_k d_k base^(-k-1) for i = sum_k d_k base^k (digits mirrored about
    the radix point), elementwise for integer arrays i >= 0."""
    i = np.asarray(i, np.int64).copy()
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


def hammersley(n, dim):
    """The Hammersley set in [0, 1)^dim: point i (i = 0..n-1) is (i / n, phi_2(i), phi_3(i),
    phi_5(i), ...) (radical inverses in the first dim - 1 primes). Deterministic."""
    n = _count(n, "hammersley")
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
    return hammersley(n, dim)


def sample(geometry, n, method="sobol", seed=0, dtype=np.float32):
    """n points in the geometry, [n, dim] of `dtype` (float32 by default); method "uniform",
    "lhs", "sobol" or "hammersley" (deterministic: the seed is not used, only the
    rejection's choice among the points inside, for other geometries than a Box).

    A Disk (ball) of dimension > 5: mapped directly from dim + 1 unit coordinates. Other
    geometries than a Box: rejection from the bounding box. A set drawn at once (LHS,
    Hammersley) is drawn larger until at least n points fall inside, and n of them are taken
    at random; Sobol and uniform points are taken in order."""
    if method not in METHODS:
        raise ValueError(f"sampling method must be one of {METHODS}, got {method!r}")
    if not isinstance(geometry, Geometry):
        raise TypeError(f"sample: geometry must be a Box, a Disk or a combination of them "
                        f"(union, difference, intersection), got {type(geometry).__name__}")
    n = _count(n, "sample")
    rng = np.random.default_rng(seed)
    box = geometry.bbox
    if isinstance(geometry, Box):
        unit = _unit(method, n, box.dim, rng)
        return (box.low + unit * (box.high - box.low)).astype(dtype)
    if isinstance(geometry, Disk) and geometry.dim > 5:  # below, rejection (as before) works
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
    """n points uniform in a ball, mapped from dim + 1 unit coordinates: a normal vector's
    direction (inverse normal CDF) and the radius R u^(1/dim). Rejection from the bounding box
    cannot: a ball fills 2.5e-3 of its box at dim 10, 2e-70 at dim 100."""
    unit = np.clip(_unit(method, n, ball.dim + 1, rng), 1e-12, 1 - 1e-12)
    g = scipy.stats.norm.ppf(unit[:, :-1])
    radius = ball.radius * unit[:, -1:] ** (1.0 / ball.dim)
    return ball.center + radius * g / np.linalg.norm(g, axis=1, keepdims=True)


def refine(points, residual_fn, box, candidates=10000, add=1000, seed=0):
    """Residual-based adaptive refinement: add the `add` candidates (of `candidates` fresh
    Sobol points in the geometry `box`) with the largest |residual| to `points`."""
    cand = sample(box, candidates, "sobol", seed)
    r = np.abs(np.asarray(residual_fn(cand))).reshape(len(cand), -1).sum(axis=1)
    return np.concatenate([points, cand[np.argsort(r)[::-1][:add]]], axis=0)
