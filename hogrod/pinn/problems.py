"""The catalogue of problems: one gin-configurable factory per PDE problem.

Each factory builds a `Problem` (`problem.py`: a PDE, its domain, its conditions and, when
known, its reference solution); a config swaps problems and coefficients by binding them.
Adding an equation is one `PDE` line (`pdes.py`) and one factory here: see `advection` and
`advection_problem`.
"""

import dataclasses
import functools
import math

import gin
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.pinn import pdes, reference
from hogrod.pinn.csg import _dtype
from hogrod.pinn.geometry import Box, Disk, sample
from hogrod.pinn.problem import Observations, Problem, Unknown

__all__ = ["burgers_problem", "burgers_inverse_problem", "poisson_problem", "heat_problem",
           "wave_problem", "helmholtz_problem", "allen_cahn_problem", "advection_problem",
           "poisson_nd_problem", "two_body_solution", "two_body_laplacian"]


def _grid(domain, shape):
    axes = [np.linspace(lo, hi, n) for lo, hi, n in zip(domain.low, domain.high, shape)]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


# points_fn(n, seed, dtype=None): drawn in float64, cast once to dtype (None: floatx)

def _on_face(domain, axis, value):
    def points(n, seed, dtype=None):
        dtype = _dtype(dtype, "points_fn")
        rng = np.random.default_rng(seed)
        x = domain.low + rng.random((n, domain.dim)) * (domain.high - domain.low)
        x[:, axis] = value
        return x.astype(dtype)
    return points


def _on_faces(domain, axis):
    """Points on both faces normal to `axis`, half on each."""
    low, high = _on_face(domain, axis, domain.low[axis]), _on_face(domain, axis, domain.high[axis])
    return lambda n, s, dtype=None: np.concatenate([low(n // 2, s, dtype),
                                                    high(n - n // 2, s + 1, dtype)])


def _boundary_of_box(domain):
    """Points on every face of a box, spread evenly."""
    def points(n, seed, dtype=None):
        faces = [_on_face(domain, a, v) for a in range(domain.dim)
                 for v in (domain.low[a], domain.high[a])]
        per = -(-n // len(faces))
        return np.concatenate([f(per, seed + i, dtype) for i, f in enumerate(faces)])[:n]
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
    ic = ("initial", _on_face(domain, 1, 0.0), lambda x: -tf.sin(math.pi * x[:, :1]))
    bc = ("boundary", _on_faces(domain, 0), _zeros)

    def hard(x, out):
        xs, t = x[:, :1], x[:, 1:]
        return -tf.sin(math.pi * xs) + t * (1.0 - xs ** 2) * out
    return Problem(name="burgers", pde=pdes.burgers(nu), domain=domain, time_dependent=True,
                   conditions=() if hard_constraints else (ic, bc),
                   transform=hard if hard_constraints else None,
                   reference=lambda x: reference.burgers_cole_hopf(x[:, 0], x[:, 1], nu)[:, None],
                   grid=_grid(domain, grid_shape), grid_shape=tuple(grid_shape))


@gin.configurable
def burgers_inverse_problem(viscosity=0.01 / math.pi, initial=0.05, n_observations=2000,
                            seed=99):
    """Raissi et al.'s inverse Burgers problem: the viscosity is unknown, learned (as its
    log, from `initial`) with the solution from `n_observations` noiseless Cole-Hopf values
    at Sobol points (`seed`) of the solution with the true `viscosity`. The rest is
    `burgers_problem`, whose bindings apply (hard_constraints, grid_shape)."""
    forward = burgers_problem(nu=viscosity)
    x = sample(forward.domain, n_observations, "sobol", seed)
    return dataclasses.replace(
        forward, name="burgers_inverse", pde=None,
        unknowns=(Unknown("viscosity", initial, true=viscosity, positive=True),),
        pde_with=lambda viscosity: pdes.burgers(viscosity),
        data=Observations(x, forward.reference(x)))


@gin.configurable
def poisson_problem(dim=2, grid_points=101):
    """Laplacian u = -dim pi^2 prod sin(pi x_i) on [0, 1]^dim, u = 0 on the boundary;
    solution prod sin(pi x_i)."""
    domain = Box([0.0] * dim, [1.0] * dim)
    shape = (grid_points,) * dim
    return Problem(name=f"poisson{dim}d", pde=pdes.poisson(dim), domain=domain,
                   conditions=[("boundary", _boundary_of_box(domain), _zeros)],
                   reference=reference.poisson_sine, grid=_grid(domain, shape), grid_shape=shape)


@gin.configurable
def heat_problem(alpha=0.1, grid_shape=(101, 101)):
    """u_t = alpha u_xx on x in [0, 1], t in [0, 1]; u(x, 0) = sin(pi x), u(0, t) = u(1, t) = 0;
    solution sin(pi x) exp(-alpha pi^2 t)."""
    domain = Box((0.0, 0.0), (1.0, 1.0))
    ic = ("initial", _on_face(domain, 1, 0.0), lambda x: tf.sin(math.pi * x[:, :1]))
    bc = ("boundary", _on_faces(domain, 0), _zeros)
    return Problem(name="heat", pde=pdes.heat(1, alpha), domain=domain, conditions=[ic, bc],
                   time_dependent=True,
                   reference=lambda x: reference.heat_sine(x, alpha),
                   grid=_grid(domain, grid_shape), grid_shape=tuple(grid_shape))


@gin.configurable
def wave_problem(c=1.0, grid_shape=(101, 101)):
    """u_tt = c^2 u_xx on [0, 1] x [0, 1]; u(x, 0) = sin(pi x), u_t(x, 0) = 0, u = 0 at x = 0, 1;
    solution sin(pi x) cos(c pi t). Hard constraint: u = sin(pi x) + t^2 x (1 - x) N."""
    domain = Box((0.0, 0.0), (1.0, 1.0))

    def transform(x, out):
        xs, t = x[:, :1], x[:, 1:]
        return tf.sin(math.pi * xs) + t ** 2 * xs * (1.0 - xs) * out
    return Problem(name="wave", pde=pdes.wave(c), domain=domain, transform=transform,
                   time_dependent=True,
                   reference=lambda x: reference.wave_sine(x, c),
                   grid=_grid(domain, grid_shape), grid_shape=tuple(grid_shape))


@gin.configurable
def helmholtz_problem(k=1.0, grid_points=101):
    """Laplacian u + k^2 u = f on [-1, 1]^2 with u = 0 on the boundary; solution
    sin(pi x) sin(pi y). Hard constraint: u = (1 - x^2)(1 - y^2) N."""
    domain = Box((-1.0, -1.0), (1.0, 1.0))

    def transform(x, out):
        return tf.reduce_prod(1.0 - x ** 2, axis=1, keepdims=True) * out
    shape = (grid_points,) * 2
    return Problem(name="helmholtz", pde=pdes.helmholtz(k, 2), domain=domain,
                   transform=transform, reference=reference.helmholtz_sine,
                   grid=_grid(domain, shape), grid_shape=shape)


@functools.lru_cache(maxsize=4)
def _allen_cahn_solution(diffusion, reaction, points):
    """The spectral reference at `points` (a tuple of (x, t) pairs), computed once."""
    x = np.asarray(points)
    return reference.allen_cahn_spectral(x[:, 0], x[:, 1], diffusion, reaction)[:, None]


@gin.configurable
def allen_cahn_problem(diffusion=1e-4, reaction=5.0, grid_shape=(201, 101),
                       hard_constraints=True, boundary_term=True):
    """jaxpi's Allen-Cahn benchmark: u_t - d u_xx + r (u^3 - u) = 0 on x in [-1, 1],
    t in [0, 1], u(x, 0) = x^2 cos(pi x), periodic in x. Reference: the Fourier
    pseudo-spectral ETDRK4 solution (`reference.allen_cahn_spectral`; jaxpi's
    allen_cahn.mat comes from the same scheme), evaluated on the grid once.

    hard_constraints: u = x^2 cos(pi x) + t (1 - x^2) N: exact at t = 0, and u(+-1, t) = -1,
    the value the periodic solution keeps to within 3e-3 (reference at x = +-1). False: a soft
    "initial" term, and with `boundary_term` a soft "boundary" term u(+-1, t) = -1; without
    it, the network must be periodic in x by construction (`@periodic_embedding` with
    periods {0: 2.0}), as in jaxpi."""
    domain = Box((-1.0, 0.0), (1.0, 1.0))

    def initial(x):
        return x[:, :1] ** 2 * tf.cos(math.pi * x[:, :1])

    def transform(x, out):
        xs, t = x[:, :1], x[:, 1:]
        return initial(x) + t * (1.0 - xs ** 2) * out
    conditions = () if hard_constraints else (
        (("initial", _on_face(domain, 1, 0.0), initial),)
        + ((("boundary", _on_faces(domain, 0), lambda x: -tf.ones_like(x[:, :1])),)
           if boundary_term else ()))

    def solution(x):
        return _allen_cahn_solution(diffusion, reaction, tuple(map(tuple, np.asarray(x))))
    return Problem(name="allen_cahn", pde=pdes.allen_cahn(diffusion, reaction), domain=domain,
                   time_dependent=True, conditions=conditions,
                   transform=transform if hard_constraints else None, reference=solution,
                   grid=_grid(domain, grid_shape), grid_shape=tuple(grid_shape))


@gin.configurable
def advection_problem(c=1.0, grid_shape=(101, 51)):
    """u_t + c u_x = 0 (c > 0) on x in [0, 2], t in [0, 1]; u(x, 0) = sin(pi x) exactly
    (u = sin(pi x) + t N), the inflow u(0, t) = -sin(pi c t) a soft condition; solution
    sin(pi (x - c t)). The example of adding an equation: `pdes.advection` and this."""
    if not c > 0:
        raise ValueError(f"advection_problem.c must be > 0 (inflow at x = 0), got {c}")
    domain = Box((0.0, 0.0), (2.0, 1.0))
    inflow = ("inflow", _on_face(domain, 0, 0.0), lambda x: -tf.sin(math.pi * c * x[:, 1:]))
    return Problem(name="advection", pde=pdes.advection(c), domain=domain, conditions=[inflow],
                   time_dependent=True,
                   transform=lambda x, out: tf.sin(math.pi * x[:, :1]) + x[:, 1:] * out,
                   reference=lambda x: np.sin(np.pi * (x[:, :1] - c * x[:, 1:])),
                   grid=_grid(domain, grid_shape), grid_shape=tuple(grid_shape))


def _two_body_parts(x, c):
    """phi_i = x_i + cos x_{i+1} + x_{i+1} cos x_i for i < d - 1 and its derivatives."""
    xi, xj = x[:, :-1], x[:, 1:]
    phi = xi + tf.cos(xj) + xj * tf.cos(xi)
    a, b = 1.0 - xj * tf.sin(xi), tf.cos(xi) - tf.sin(xj)  # d phi / d x_i, d phi / d x_{i+1}
    a2, b2 = -xj * tf.cos(xi), -tf.cos(xj)  # the second derivatives
    return tf.constant(c, x.dtype), phi, a, b, a2, b2


def two_body_solution(x, c):
    """u(x) = (1 - |x|^2) sum_{i<d} c_i sin(x_i + cos x_{i+1} + x_{i+1} cos x_i), [n, 1]
    for x [n, d] (a tensor; c: d - 1 numbers)."""
    c, phi, *_ = _two_body_parts(x, c)
    s = tf.reduce_sum(c * tf.sin(phi), axis=1, keepdims=True)
    return (1.0 - tf.reduce_sum(x * x, axis=1, keepdims=True)) * s


def two_body_laplacian(x, c):
    """The Laplacian of `two_body_solution` in closed form, [n, 1]: with u = (1 - |x|^2) s,
    Lap u = -2 d s - 4 x . grad s + (1 - |x|^2) Lap s, and for each term sin(phi_i),
    Lap sin(phi) = cos(phi) Lap phi - sin(phi) |grad phi|^2."""
    c, phi, a, b, a2, b2 = _two_body_parts(x, c)
    dim = x.shape[-1]
    xi, xj = x[:, :-1], x[:, 1:]
    s = tf.reduce_sum(c * tf.sin(phi), axis=1, keepdims=True)
    x_grad_s = tf.reduce_sum(c * tf.cos(phi) * (xi * a + xj * b), axis=1, keepdims=True)
    lap_s = tf.reduce_sum(c * (tf.cos(phi) * (a2 + b2) - tf.sin(phi) * (a * a + b * b)),
                          axis=1, keepdims=True)
    r2 = tf.reduce_sum(x * x, axis=1, keepdims=True)
    return -2.0 * dim * s - 4.0 * x_grad_s + (1.0 - r2) * lap_s


@gin.configurable
def poisson_nd_problem(dim=100, laplacian=pdes.exact_laplacian, n_test=2000, seed=0):
    """-Laplacian u = f in the unit ball of R^dim, u = 0 on the sphere, with the solution

        u(x) = (1 - |x|^2) sum_{i=1}^{d-1} c_i sin(x_i + cos x_{i+1} + x_{i+1} cos x_i),

    c_i ~ N(0, 1) (numpy, `seed`): the inseparable "two-body" Poisson test of Hu, Shukla,
    Karniadakis and Kawaguchi, "Tackling the curse of dimensionality with physics-informed
    neural networks" (Neural Networks 2024), also STDE's (Shi et al., NeurIPS 2024)
    high-dimensional Poisson case. f = -Lap u in closed form (`two_body_laplacian`); the
    boundary condition is hard: u = (1 - |x|^2) N(x).

    laplacian: the operator the residual applies, by reference: @exact_laplacian (d
    backward passes) or @randomized_laplacian (its bindings: num_probes, method; a new seed
    at every evaluation). The relative L2 error is measured on `n_test` held-out uniform
    points of the ball (the grid; seed + 1000, apart from training's Sobol points)."""
    checks.integer(dim, "poisson_nd_problem.dim", "poisson_nd_problem", least=2)
    op = pdes.check_laplacian(laplacian, "poisson_nd_problem.laplacian")
    c = np.random.default_rng(seed).standard_normal(dim - 1)
    pde = pdes.PDE([], lambda x, d, u_fn: op.apply(u_fn, x) - two_body_laplacian(x, c),
                   uses_network=True)
    ball = Disk(np.zeros(dim), 1.0)
    test = sample(ball, n_test, "uniform", seed + 1000, dtype=np.float64)
    return Problem(name=f"poisson{dim}d_ball_{op.name}", pde=pde, domain=ball,
                   transform=lambda x, out: (1.0 - tf.reduce_sum(x * x, 1, keepdims=True)) * out,
                   reference=lambda x: two_body_solution(tf.constant(x, tf.float64), c).numpy(),
                   grid=test)
