"""PDE residuals as plain functions of the `partials` dict.

A `PDE` is (wanted derivatives, residual(x, d) -> [batch, m]); a new equation is a few
lines, no subclassing:

    my_pde = PDE([(), (0,), (1, 1)], lambda x, d: d[(0,)] - 0.1 * d[(1, 1)] + d[()] ** 3)

and a problem to solve is one factory in `problems.py` (`advection` and
`advection_problem` are such a pair). Coordinates: space first, time last (x, t) for
time-dependent problems.
"""

import collections
import math

import gin
import tensorflow as tf

from hogrod.pinn.operators import laplacian, partials

__all__ = ["PDE", "residual", "burgers", "poisson", "heat", "wave", "allen_cahn", "helmholtz",
           "advection"]

PDE = collections.namedtuple("PDE", ["wanted", "residual"])


def residual(pde, u_fn, x):
    """The residual of `pde` for network `u_fn` at points x, [batch, m]."""
    out = pde.residual(x, partials(u_fn, x, pde.wanted))
    if out.shape.rank != 2 or out.shape[0] != x.shape[0]:
        raise ValueError(f"the residual must have shape [batch, m] = [{x.shape[0]}, m], got "
                         f"{out.shape}")
    return out


@gin.configurable
def burgers(nu=0.01 / math.pi):
    """u_t + u u_x - nu u_xx = 0 on (x, t); nu may be a callable (a learned coefficient,
    read at every evaluation)."""
    return PDE([(), (0,), (1,), (0, 0)],
               lambda x, d: d[(1,)] + d[()] * d[(0,)] - (nu() if callable(nu) else nu) * d[(0, 0)])


@gin.configurable
def poisson(dim=2, source=None):
    """Laplacian u = f(x) on n-D space; source(x) -> [batch, 1] (default: the one whose
    solution is prod_i sin(pi x_i), f = -dim pi^2 prod_i sin(pi x_i))."""
    if source is None:
        source = lambda x: -dim * math.pi ** 2 * tf.reduce_prod(  # noqa: E731
            tf.sin(math.pi * x), axis=1, keepdims=True)
    return PDE([(i, i) for i in range(dim)],
               lambda x, d: laplacian(d, range(dim)) - source(x))


@gin.configurable
def heat(dim=1, alpha=1.0):
    """u_t = alpha Laplacian_x u on (x_1..x_dim, t)."""
    return PDE([(dim,)] + [(i, i) for i in range(dim)],
               lambda x, d: d[(dim,)] - alpha * laplacian(d, range(dim)))


@gin.configurable
def wave(c=1.0):
    """u_tt = c^2 u_xx on (x, t)."""
    return PDE([(1, 1), (0, 0)], lambda x, d: d[(1, 1)] - c ** 2 * d[(0, 0)])


@gin.configurable
def allen_cahn(diffusion=1e-4, reaction=5.0):
    """u_t - diffusion u_xx + reaction (u^3 - u) = 0 on (x, t)."""
    return PDE([(), (1,), (0, 0)],
               lambda x, d: d[(1,)] - diffusion * d[(0, 0)] + reaction * (d[()] ** 3 - d[()]))


@gin.configurable
def helmholtz(k=1.0, dim=2, source=None):
    """Laplacian u + k^2 u = f(x); default f from the solution prod_i sin(pi x_i)."""
    if source is None:
        source = lambda x: (k ** 2 - dim * math.pi ** 2) * tf.reduce_prod(  # noqa: E731
            tf.sin(math.pi * x), axis=1, keepdims=True)
    return PDE([()] + [(i, i) for i in range(dim)],
               lambda x, d: laplacian(d, range(dim)) + k ** 2 * d[()] - source(x))


@gin.configurable
def advection(c=1.0):
    """u_t + c u_x = 0 on (x, t)."""
    return PDE([(0,), (1,)], lambda x, d: d[(1,)] + c * d[(0,)])
