"""Reference solutions: Burgers by the Cole-Hopf transform, closed forms for the others.

Burgers on x in [-1, 1] with u(x, 0) = -sin(pi x): Cole-Hopf gives
    u(x, t) = -int sin(pi (x - e)) f(x - e) G(e) de / int f(x - e) G(e) de,
    f(y) = exp(-cos(pi y) / (2 pi nu)),  G(e) = exp(-e^2 / (4 nu t)),
and with e = sqrt(4 nu t) z both integrals are Gauss-Hermite quadratures. The common
factor exp(-1/(2 pi nu)) is divided out of f for range; no data file is needed.
"""

import math

import numpy as np

__all__ = ["burgers_cole_hopf", "poisson_sine", "heat_sine", "wave_sine", "helmholtz_sine"]


def burgers_cole_hopf(x, t, nu=0.01 / math.pi, nodes=300):
    """u(x, t) for arrays x, t of one shape (t = 0 gives the initial condition).

    nodes: Gauss-Hermite nodes (numpy's weights overflow beyond about 360)."""
    x, t = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(t, np.float64))
    z, w = np.polynomial.hermite.hermgauss(nodes)
    out = -np.sin(np.pi * x)
    pos = t > 0
    xs, ts = x[pos][:, None], t[pos][:, None]
    y = xs - np.sqrt(4 * nu * ts) * z[None]
    log_f = -(np.cos(np.pi * y) - 1) / (2 * np.pi * nu)  # log f minus its maximum over y
    log_f -= log_f.max(axis=1, keepdims=True)
    f = np.exp(log_f) * w[None]
    out[pos] = -np.sum(np.sin(np.pi * y) * f, axis=1) / np.sum(f, axis=1)
    return out


def poisson_sine(x):
    """prod_i sin(pi x_i): solves Laplacian u = -dim pi^2 u (the default Poisson source)."""
    return np.prod(np.sin(np.pi * np.asarray(x)), axis=-1, keepdims=True)


def helmholtz_sine(x):
    """prod_i sin(pi x_i): solves the default Helmholtz problem for any k."""
    return poisson_sine(x)


def heat_sine(x, alpha=1.0):
    """sin(pi x) exp(-alpha pi^2 t) on (x, t)."""
    x = np.asarray(x)
    return (np.sin(np.pi * x[..., 0]) * np.exp(-alpha * np.pi ** 2 * x[..., 1]))[..., None]


def wave_sine(x, c=1.0):
    """sin(pi x) cos(c pi t) on (x, t)."""
    x = np.asarray(x)
    return (np.sin(np.pi * x[..., 0]) * np.cos(c * np.pi * x[..., 1]))[..., None]
