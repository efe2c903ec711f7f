"""Shapes: the primitives `Box` and `Disk` and their regularized set operations.

A CSG node (`union(a, b)`, `difference(a, b)`, `intersection(a, b)`, also `a | b`, `a - b`,
`a & b`) is the regularized set operation: the closure of the interior of the plain set
operation. So two boxes sharing a face make one box (the face is interior), and an L-shape
cut from a square by a box that reaches the square's sides keeps none of those sides
beyond the cut: the domain has no slits or dangling faces, and its boundary is the set of
points every neighbourhood of which meets both the domain's interior and its exterior.

Point tests (`inside`, `interior`, `on_boundary`) read a ball of radius `tol` around each
point: `inside` when the ball meets the domain's interior, `interior` when the ball lies in
it, `on_boundary` when it meets both the interior and the exterior. A CSG node answers by
evaluating the set operation on its primitives' open interiors at the 2^dim corners
x + tol (+-1, ..., +-1) (each primitive whose boundary is farther than `tol` from x counts
as it does at x). Near a point, box faces cut space into orthants, one corner in each, and
a sphere is a half-space: so the tests are exact on faces (shared ones included), on the
edges and corners of boxes, and on spheres, up to 3-D. At the points where a sphere meets
another boundary a sector narrower than the corners' directions can be missed (the point
itself, not its neighbours), and a cusp thinner than `tol` at a tangential contact (a disk
touching a side from within) is not resolved: its contact point counts as outside.

Boundary sampling (`boundary(n)`): candidates are drawn on the primitives' boundaries, each
primitive in proportion to its boundary's measure (length in 2-D, area in 3-D), and a
candidate on primitive P is kept when, stepping a distance `step` (1e-9 times the larger of
1 and the bounding box's diameter) along P's outward normal and against it, exactly one of
the two points lies in the domain's interior. A candidate also on the boundary of a
primitive listed before P (a face two primitives share) is dropped, so every piece of the
boundary is drawn once, with density proportional to its measure. Drawing goes on until n
points are kept. CSG nodes are limited to 3-D, where these rules are checked; a `Box` or
`Disk` alone works in any dimension.
"""

import math
from typing import Optional

import keras
import numpy as np
import scipy.special

from hogrod import checks
from hogrod.types import DType, TensorLike

__all__ = ["Geometry", "Box", "Disk", "union", "difference", "intersection",
           "MIN_ACCEPTANCE", "MAX_CSG_DIM"]

# Rejection stops with an error below this acceptance (fraction of candidates kept).
MIN_ACCEPTANCE = 1e-3
# CSG nodes are exact (and allowed) up to this dimension.
MAX_CSG_DIM = 3


def _dtype(dtype, where):
    """The numpy floating dtype asked for (Keras's floatx for None)."""
    if dtype is None:
        dtype = keras.config.floatx()
    try:
        dt = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))
    except TypeError:
        dt = None
    if dt is None or not np.issubdtype(dt, np.floating):
        raise checks.ArgumentError(f"{where}: dtype must be a floating dtype (float32, "
                                   f"float64), got {dtype!r}")
    return dt


def _points(x, dim, where):
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] != dim:
        raise checks.ArgumentError(f"{where}: points must have shape [n, {dim}], got "
                                   f"{x.shape}")
    return x


class Geometry:
    """A closed set in R^dim.

    Subclasses give `dim`, `bbox` (a Box), `_inside(x, tol)` and `_interior(x, tol)` (bool
    [n] for float64 points [n, dim]) and, to be sampled on their boundary,
    `_boundary(n, rng)` (float64 points [n, dim]).
    """

    def inside(self, x: TensorLike, tol: Optional[float] = None) -> np.ndarray:
        """Whether points are in the closed set (within `tol`).

        A point is inside when the ball of radius `tol` around it meets the set's interior.

        Args:
          x: points, [n, dim] (converted to float64; ArgumentError for another shape).
          tol: the distance allowed outside, >= 0; None for 1e-9 times the larger of 1 and
            the bounding box's diameter.
        Returns:
          bool array [n].
        """
        where = f"{type(self).__name__}.inside"
        return self._inside(_points(x, self.dim, where), self._tol(tol, where))

    def interior(self, x: TensorLike, tol: Optional[float] = None) -> np.ndarray:
        """Whether points are inside by more than `tol`.

        A point is interior when the ball of radius `tol` around it lies in the interior.

        Args:
          x: points, [n, dim] (converted to float64; ArgumentError for another shape).
          tol: the margin, >= 0; None for the default of `inside`.
        Returns:
          bool array [n].
        """
        where = f"{type(self).__name__}.interior"
        return self._interior(_points(x, self.dim, where), self._tol(tol, where))

    def on_boundary(self, x: TensorLike, tol: Optional[float] = None) -> np.ndarray:
        """Whether points are within `tol` of the boundary (inside and not interior).

        Args:
          x: points, [n, dim] (converted to float64; ArgumentError for another shape).
          tol: the distance allowed, >= 0; None for the default of `inside`.
        Returns:
          bool array [n].
        """
        where = f"{type(self).__name__}.on_boundary"
        x, tol = _points(x, self.dim, where), self._tol(tol, where)
        return self._inside(x, tol) & ~self._interior(x, tol)

    def _scale(self):
        return max(1.0, float(np.linalg.norm(self.bbox.high - self.bbox.low)))

    def _tol(self, tol, where="tol"):
        if tol is None:
            return 1e-9 * self._scale()
        return checks.nonnegative(tol, "tol", where)

    def boundary(self, n: int, seed: int = 0, dtype: Optional[DType] = None) -> np.ndarray:
        """n points uniform (by length in 2-D, area in 3-D) on the boundary.

        The points are drawn in float64 and cast to `dtype`; the module's docstring gives
        the rules for combinations of shapes.

        Args:
          n: the number of points, >= 1.
          seed: an integer seed (the same seed gives the same points).
          dtype: the points' floating dtype; None for Keras's floatx.
        Returns:
          numpy array [n, dim] of `dtype`.
        Raises:
          ValueError: a combination of shapes whose boundary the sampler cannot reach (too
            few candidates on its primitives' boundaries lie on its own).
        """
        where = f"{type(self).__name__}.boundary"
        n = checks.integer(n, "n", where, least=1)
        seed = checks.seed(seed, "seed", where)
        dtype = _dtype(dtype, where)
        return self._boundary(n, np.random.default_rng(seed)).astype(dtype)

    def _boundary(self, n, rng):
        raise ValueError(f"{self!r} has no boundary sampler")

    def __or__(self, other):
        return union(self, other)

    def __sub__(self, other):
        return difference(self, other)

    def __and__(self, other):
        return intersection(self, other)


class _Primitive(Geometry):
    """A Box or a Disk: a leaf of a CSG tree."""

    def _leaves(self):
        return [self]

    def _eval(self, values):
        return next(values)

    def _near(self, x, tol):
        """Within tol of the boundary."""
        return self._inside(x, tol) & ~self._interior(x, tol)

    def _boundary(self, n, rng):
        return self._draw(n, rng)[0]


class Box(_Primitive):
    """An axis-aligned box [low_i, high_i]; for space-time put time last.

    The corners are kept as float64 vectors `low` and `high`; see `Geometry` for the methods.

    Args:
      low: the lower corner, a vector.
      high: the upper corner, a vector of the same length, high > low componentwise
        (ArgumentError otherwise).
    """

    def __init__(self, low: TensorLike, high: TensorLike) -> None:
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if (self.low.ndim != 1 or self.low.shape != self.high.shape
                or not np.all(self.high > self.low)):
            raise checks.ArgumentError(f"Box needs low < high of one shape, got {low} and "
                                       f"{high}")

    @property
    def dim(self) -> int:
        """The dimension, len(low)."""
        return len(self.low)

    @property
    def bbox(self) -> "Box":
        """The box itself."""
        return self

    def __repr__(self):
        return f"Box({self.low.tolist()}, {self.high.tolist()})"

    def _inside(self, x, tol):
        return np.all((x >= self.low - tol) & (x <= self.high + tol), axis=1)

    def _interior(self, x, tol):
        return np.all((x > self.low + tol) & (x < self.high - tol), axis=1)

    def _face_measures(self):
        side = self.high - self.low
        return np.array([np.prod(np.delete(side, a)) for a in range(self.dim)])

    def boundary_measure(self) -> float:
        """The boundary's measure (perimeter in 2-D, area in 3-D).

        Returns:
          Twice the sum over axes of the product of the other sides' lengths.
        """
        return 2.0 * float(self._face_measures().sum())

    def _draw(self, n, rng):
        """n points uniform on the faces (by measure) and their outward normals."""
        x = self.low + rng.random((n, self.dim)) * (self.high - self.low)
        faces = self._face_measures()
        axis = rng.choice(self.dim, size=n, p=faces / faces.sum())
        upper = rng.random(n) < 0.5
        x[np.arange(n), axis] = np.where(upper, self.high[axis], self.low[axis])
        normal = np.zeros((n, self.dim))
        normal[np.arange(n), axis] = np.where(upper, 1.0, -1.0)
        return x, normal


class Disk(_Primitive):
    """The closed ball ``||x - center|| <= radius`` (a disk in 2-D, any dimension).

    Kept as a float64 vector `center` and a float `radius`; see `Geometry` for the methods.

    Args:
      center: the center, a vector of at least one coordinate (ArgumentError otherwise).
      radius: a positive number.
    """

    def __init__(self, center: TensorLike, radius: float) -> None:
        self.center = np.asarray(center, np.float64)
        if self.center.ndim != 1 or len(self.center) < 1:
            raise checks.ArgumentError(f"Disk: center must be a vector of coordinates, got "
                                       f"{center!r}")
        self.radius = checks.positive(radius, "radius", "Disk")

    @property
    def dim(self) -> int:
        """The dimension, len(center)."""
        return len(self.center)

    @property
    def bbox(self) -> Box:
        """The bounding box, a Box."""
        return Box(self.center - self.radius, self.center + self.radius)

    def __repr__(self):
        return f"Disk({self.center.tolist()}, {self.radius})"

    def _distance(self, x):
        return np.linalg.norm(x - self.center, axis=1)

    def _inside(self, x, tol):
        return self._distance(x) <= self.radius + tol

    def _interior(self, x, tol):
        return self._distance(x) < self.radius - tol

    def boundary_measure(self) -> float:
        """The sphere's measure (2 pi r in 2-D, 4 pi r^2 in 3-D, 2 in 1-D).

        Returns:
          ``2 pi^(d/2) / Gamma(d/2) r^(d-1)`` for dimension d and radius r.
        """
        d = self.dim
        return 2 * math.pi ** (d / 2) / scipy.special.gamma(d / 2) * self.radius ** (d - 1)

    def _draw(self, n, rng):
        g = rng.standard_normal((n, self.dim))
        normal = g / np.linalg.norm(g, axis=1, keepdims=True)
        return self.center + self.radius * normal, normal


def _corners(dim):
    """The 2^dim sign vectors (+-1, ..., +-1), [2^dim, dim]."""
    return np.array(np.meshgrid(*[[-1.0, 1.0]] * dim, indexing="ij")).reshape(dim, -1).T


class _CSG(Geometry):
    op = None

    def __init__(self, a, b):
        for name, g in (("first", a), ("second", b)):
            if not isinstance(g, (_Primitive, _CSG)):
                raise checks.ArgumentError(
                    f"{self.op}: the {name} operand must be a Box, a Disk or a combination of "
                    f"them, got {type(g).__name__}")
        if a.dim != b.dim:
            raise checks.ArgumentError(f"{self.op}: operands of dimensions {a.dim} and "
                                       f"{b.dim}")
        if a.dim > MAX_CSG_DIM:
            raise checks.ArgumentError(
                f"{self.op}: operands of dimension {a.dim}; set operations are exact (and "
                f"allowed) up to {MAX_CSG_DIM}-D only, where the point tests and boundary "
                "sampling are checked: use a Box or a Disk alone above")
        self.a, self.b = a, b

    @property
    def dim(self) -> int:
        """The dimension of the operands."""
        return self.a.dim

    def __repr__(self):
        return f"{self.op}({self.a!r}, {self.b!r})"

    def _leaves(self):
        return self.a._leaves() + self.b._leaves()

    def _eval(self, values):
        """The set operation on the leaves' values (bool arrays, in `_leaves` order)."""
        return self._combine(self.a._eval(values), self.b._eval(values))

    def _open_interior(self, p):
        """Whether points off every primitive's boundary are in the interior."""
        return self._eval(iter([leaf._interior(p, 0.0) for leaf in self._leaves()]))

    def _corner_values(self, x, tol):
        """bool [n, 2^dim]: the interior at the corners x + tol (+-1, ..., +-1).

        Each primitive farther than tol from x is taken as at x.
        """
        if tol == 0.0:
            return self._open_interior(x)[:, None]
        signs = _corners(self.dim)
        probes = (x[:, None, :] + tol * signs[None]).reshape(-1, self.dim)
        values = []
        for leaf in self._leaves():
            at_probes = leaf._interior(probes, 0.0).reshape(len(x), len(signs))
            at_x = leaf._interior(x, 0.0)[:, None]
            values.append(np.where(leaf._near(x, tol)[:, None], at_probes, at_x))
        return self._eval(iter(values))

    def _inside(self, x, tol):
        return self._corner_values(x, tol).any(axis=1)

    def _interior(self, x, tol):
        return self._corner_values(x, tol).all(axis=1)

    def _keep(self, x, normal, index, leaves, step):
        """Candidates on leaves[index] that lie on this set's boundary.

        Kept: one side of the step along the outward normal is in the interior, and the
        candidate is on no boundary of a leaf listed before.
        """
        keep = self._open_interior(x + step * normal) != self._open_interior(x - step * normal)
        for j in range(index):
            keep &= ~leaves[j]._near(x, step)
        return keep

    def _boundary(self, n, rng):
        leaves = self._leaves()
        measures = np.array([leaf.boundary_measure() for leaf in leaves])
        step = 1e-9 * self._scale()
        kept, drawn, got = [], 0, 0
        want = 2 * n
        while got < n:
            counts = rng.multinomial(want, measures / measures.sum())
            for i, (leaf, c) in enumerate(zip(leaves, counts)):
                if c:
                    x, normal = leaf._draw(int(c), rng)
                    kept.append(x[self._keep(x, normal, i, leaves, step)])
            drawn += want
            got = sum(map(len, kept))
            if got < MIN_ACCEPTANCE * drawn:
                raise ValueError(
                    f"{self!r}: only {got} of {drawn} points drawn on its primitives' "
                    "boundaries lie on its boundary (is the set empty, or one primitive hidden "
                    "inside another?); boundary sampling cannot give points here")
            want = int(1.25 * (n - got) * drawn / max(got, 1)) + 16
        pts = np.concatenate(kept)
        return pts[rng.permutation(len(pts))[:n]]


class _Union(_CSG):
    op = "union"

    @property
    def bbox(self) -> Box:
        """The bounding box, a Box."""
        return Box(np.minimum(self.a.bbox.low, self.b.bbox.low),
                   np.maximum(self.a.bbox.high, self.b.bbox.high))

    @staticmethod
    def _combine(a, b):
        return a | b


class _Difference(_CSG):
    op = "difference"

    @property
    def bbox(self) -> Box:
        """The bounding box, a Box (the first operand's)."""
        return self.a.bbox

    @staticmethod
    def _combine(a, b):
        return a & ~b


class _Intersection(_CSG):
    op = "intersection"

    @property
    def bbox(self) -> Box:
        """The bounding box, a Box."""
        low = np.maximum(self.a.bbox.low, self.b.bbox.low)
        high = np.minimum(self.a.bbox.high, self.b.bbox.high)
        if np.any(high <= low):
            raise ValueError(f"{self!r} is empty (its operands' bounding boxes do not overlap)")
        return Box(low, high)

    @staticmethod
    def _combine(a, b):
        return a & b


def union(a: Geometry, b: Geometry) -> Geometry:
    """The regularized union: the closure of the interior of a or b.

    Also written `a | b`.

    Args:
      a: a Box, a Disk or a combination of them.
      b: another, of the same dimension (at most 3 for combinations).
    Returns:
      A Geometry with every method of one (`inside`, `boundary`, `bbox`, ...).
    Raises:
      ArgumentError: a non-geometry operand, or dimensions that differ or exceed 3.
    """
    return _Union(a, b)


def difference(a: Geometry, b: Geometry) -> Geometry:
    """The regularized difference: the closure of a's interior less b.

    Also written `a - b`. b's boundary inside a bounds the result; a's boundary inside b
    does not.

    Args:
      a: a Box, a Disk or a combination of them.
      b: the part removed, of the same dimension (at most 3 for combinations).
    Returns:
      A Geometry with every method of one (`inside`, `boundary`, `bbox`, ...).
    Raises:
      ArgumentError: a non-geometry operand, or dimensions that differ or exceed 3.
    """
    return _Difference(a, b)


def intersection(a: Geometry, b: Geometry) -> Geometry:
    """The regularized intersection: the closure of the interior of a and b.

    Also written `a & b`.

    Args:
      a: a Box, a Disk or a combination of them.
      b: another, of the same dimension (at most 3 for combinations).
    Returns:
      A Geometry with every method of one (`inside`, `boundary`, `bbox`, ...).
    Raises:
      ArgumentError: a non-geometry operand, or dimensions that differ or exceed 3.
    """
    return _Intersection(a, b)
