"""Problems: a PDE, its domain, its conditions and (when known) its reference solution.

A `Problem` bundles what a PINN run needs:
- `pde`: a `PDE` (residual and the derivatives it needs);
- `domain`: a `Box` (space first, time last);
- `conditions`: a list of (name, points_fn(n, seed) -> x, target_fn(x) -> u) pairs, each
  a soft penalty term mean((u(x) - target(x))^2);
- `transform`: optional hard constraint, `transform(x, net_out) -> u`, built so that u
  satisfies the initial/boundary conditions exactly (then `conditions` can be empty);
- `reference`: numpy `reference(x) -> u` or None; `grid`: evaluation points.
Every problem is a gin-configurable factory, so a config swaps problems and coefficients.
"""

import collections
import math

import gin
import numpy as np
import tensorflow as tf

from hogrod.pinn import pdes, reference
from hogrod.pinn.geometry import Box

__all__ = ["Problem", "burgers_problem", "poisson_problem", "heat_problem", "wave_problem",
           "helmholtz_problem", "allen_cahn_problem"]

Problem = collections.namedtuple(
    "Problem", ["name", "pde", "domain", "conditions", "transform", "reference", "grid",
                "grid_shape"])


def _grid(domain, shape):
    axes = [np.linspace(lo, hi, n) for lo, hi, n in zip(domain.low, domain.high, shape)]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


def _on_face(domain, axis, value):
    def points(n, seed):
        rng = np.random.default_rng(seed)
        x = domain.low + rng.random((n, domain.dim)) * (domain.high - domain.low)
        x[:, axis] = value
        return x.astype(np.float32)
    return points


def _boundary_of_box(domain):
    """Points on every face of a box, spread evenly."""
    def points(n, seed):
        faces = [_on_face(domain, a, v) for a in range(domain.dim)
                 for v in (domain.low[a], domain.high[a])]
        per = -(-n // len(faces))
        return np.concatenate([f(per, seed + i) for i, f in enumerate(faces)])[:n]
    return points


def _zeros(x):
    return tf.zeros([tf.shape(x)[0], 1], x.dtype)


@gin.configurable
def burgers_problem(nu=0.01 / math.pi, hard_constraints=True, grid_shape=(256, 100)):
    """Raissi et al.'s Burgers problem on x in [-1, 1], t in [0, 1], u(x, 0) = -sin(pi x),
    u(+-1, t) = 0; reference by Cole-Hopf on a 256 x 100 grid.

    hard_constraints: u = -sin(pi x) + t (1 - x^2) N(x, t), exact at t = 0 and x = +-1.
    """
    domain = Box((-1.0, 0.0), (1.0, 1.0))
    pi = math.pi
    ic = ("initial", _on_face(domain, 1, 0.0), lambda x: -tf.sin(pi * x[:, :1]))
    bc = ("boundary", lambda n, s: np.concatenate([_on_face(domain, 0, -1.0)(n // 2, s),
                                                   _on_face(domain, 0, 1.0)(n - n // 2, s + 1)]),
          _zeros)
    def hard(x, out):
        xs, t = x[:, :1], x[:, 1:]
        return -tf.sin(pi * xs) + t * (1.0 - xs ** 2) * out
    return Problem("burgers", pdes.burgers(nu), domain, [] if hard_constraints else [ic, bc],
                   hard if hard_constraints else None, lambda x: reference.burgers_cole_hopf(x[:, 0], x[:, 1], nu)[:, None],
                   _grid(domain, grid_shape), tuple(grid_shape))


@gin.configurable
def poisson_problem(dim=2, grid_points=101):
    """Laplacian u = -dim pi^2 prod sin(pi x_i) on [0, 1]^dim, u = 0 on the boundary;
    solution prod sin(pi x_i)."""
    domain = Box([0.0] * dim, [1.0] * dim)
    bc = ("boundary", _boundary_of_box(domain), _zeros)
    shape = (grid_points,) * 2 if dim == 2 else (grid_points,) * dim
    return Problem(f"poisson{dim}d", pdes.poisson(dim), domain, [bc], None,
                   reference.poisson_sine, _grid(domain, shape), shape)


@gin.configurable
def heat_problem(alpha=0.1, grid_shape=(101, 101)):
    """u_t = alpha u_xx on x in [0, 1], t in [0, 1]; u(x, 0) = sin(pi x), u(0, t) = u(1, t) = 0;
    solution sin(pi x) exp(-alpha pi^2 t)."""
    domain = Box((0.0, 0.0), (1.0, 1.0))
    ic = ("initial", _on_face(domain, 1, 0.0), lambda x: tf.sin(math.pi * x[:, :1]))
    bc = ("boundary", lambda n, s: np.concatenate([_on_face(domain, 0, 0.0)(n // 2, s),
                                                   _on_face(domain, 0, 1.0)(n - n // 2, s + 1)]),
          _zeros)
    return Problem("heat", pdes.heat(1, alpha), domain, [ic, bc], None,
                   lambda x: reference.heat_sine(x, alpha), _grid(domain, grid_shape),
                   tuple(grid_shape))


@gin.configurable
def wave_problem(c=1.0, grid_shape=(101, 101)):
    """u_tt = c^2 u_xx on [0, 1] x [0, 1]; u(x, 0) = sin(pi x), u_t(x, 0) = 0, u = 0 at x = 0, 1;
    solution sin(pi x) cos(c pi t). Hard constraint: u = sin(pi x) + t^2 x (1 - x) N."""
    domain = Box((0.0, 0.0), (1.0, 1.0))

    def transform(x, out):
        xs, t = x[:, :1], x[:, 1:]
        return tf.sin(math.pi * xs) + t ** 2 * xs * (1.0 - xs) * out
    return Problem("wave", pdes.wave(c), domain, [], transform,
                   lambda x: reference.wave_sine(x, c), _grid(domain, grid_shape),
                   tuple(grid_shape))


@gin.configurable
def helmholtz_problem(k=1.0, grid_points=101):
    """Laplacian u + k^2 u = f on [-1, 1]^2 with u = 0 on the boundary; solution
    sin(pi x) sin(pi y). Hard constraint: u = (1 - x^2)(1 - y^2) N."""
    domain = Box((-1.0, -1.0), (1.0, 1.0))

    def transform(x, out):
        return tf.reduce_prod(1.0 - x ** 2, axis=1, keepdims=True) * out
    return Problem("helmholtz", pdes.helmholtz(k, 2), domain, [], transform,
                   reference.helmholtz_sine, _grid(domain, (grid_points,) * 2), (grid_points,) * 2)


@gin.configurable
def allen_cahn_problem(diffusion=1e-4, reaction=5.0, grid_shape=(201, 101)):
    """u_t - d u_xx + r (u^3 - u) = 0 on x in [-1, 1], t in [0, 1], u(x, 0) = x^2 cos(pi x),
    u(-1, t) = u(1, t) (= -1 for these data). No closed form: no reference error."""
    domain = Box((-1.0, 0.0), (1.0, 1.0))

    def transform(x, out):
        xs, t = x[:, :1], x[:, 1:]
        return xs ** 2 * tf.cos(math.pi * xs) + t * (1.0 - xs ** 2) * out
    return Problem("allen_cahn", pdes.allen_cahn(diffusion, reaction), domain, [], transform,
                   None, _grid(domain, grid_shape), tuple(grid_shape))
