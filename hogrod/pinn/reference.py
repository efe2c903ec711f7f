"""Reference solutions: Burgers by the Cole-Hopf transform, closed forms for the others.

Burgers on x in [-1, 1] with u(x, 0) = -sin(pi x): Cole-Hopf gives
    u(x, t) = -int sin(pi (x - e)) f(x - e) G(e) de / int f(x - e) G(e) de,
    f(y) = exp(-cos(pi y) / (2 pi nu)),  G(e) = exp(-e^2 / (4 nu t)),
and with e = sqrt(4 nu t) z both integrals are Gauss-Hermite quadratures. The common
factor exp(-1/(2 pi nu)) is divided out of f for range; no data file is needed.
"""

import math

import numpy as np

from hogrod.types import TensorLike

__all__ = ["burgers_cole_hopf", "poisson_sine", "heat_sine", "wave_sine", "helmholtz_sine",
           "allen_cahn_spectral"]


def burgers_cole_hopf(x: TensorLike, t: TensorLike, nu: float = 0.01 / math.pi,
                      nodes: int = 300) -> np.ndarray:
    """Burgers' solution u(x, t) for u(x, 0) = -sin(pi x) on x in [-1, 1], by Cole-Hopf.

    The two integrals of the module docstring are Gauss-Hermite quadratures, in float64.

    Args:
      x: positions, an array (or a number) broadcastable with t.
      t: times >= 0 (t = 0 gives the initial condition -sin(pi x)).
      nu: the viscosity, > 0; the default is Raissi et al.'s 0.01 / pi.
      nodes: Gauss-Hermite nodes (numpy's weights overflow beyond about 360).
    Returns:
      float64 array of the broadcast shape of x and t.
    """
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


def _etdrk4_coefficients(lin, h, contour=32):
    """Kassam and Trefethen's (2005) ETDRK4 coefficients for the diagonal linear part `lin`
    and step h, their 1/L^3 cancellations averaged over a contour around each h L."""
    r = np.exp(1j * np.pi * (np.arange(1, contour + 1) - 0.5) / contour)
    lr = h * lin[:, None] + r[None, :]
    mean = lambda z: h * np.mean(z, axis=1).real  # noqa: E731
    return (np.exp(h * lin), np.exp(h * lin / 2), mean((np.exp(lr / 2) - 1) / lr),
            mean((-4 - lr + np.exp(lr) * (4 - 3 * lr + lr ** 2)) / lr ** 3),
            mean((2 + lr + np.exp(lr) * (-2 + lr)) / lr ** 3),
            mean((-4 - 3 * lr - lr ** 2 + np.exp(lr) * (4 - lr)) / lr ** 3))


def allen_cahn_spectral(x, t, diffusion=1e-4, reaction=5.0, modes=512, dt=1e-4):
    """u(x, t) of u_t = diffusion u_xx + reaction (u - u^3) on x in [-1, 1], periodic, with
    u(x, 0) = x^2 cos(pi x), for arrays x, t of one shape: Fourier pseudo-spectral in x
    (`modes` points), ETDRK4 in t (Kassam and Trefethen 2005, step `dt`, the last step to
    each requested time shortened to land on it), the trigonometric interpolant at x.

    The solution of jaxpi's Allen-Cahn benchmark (its allen_cahn.mat came from Chebfun's
    spin with the same scheme). At the defaults it is within 2.3e-5 (relative L2 on the
    201 x 101 grid) of 2048 modes with dt = 5e-5."""
    x, t = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(t, np.float64))
    if np.any(t < 0) or np.any(np.abs(x) > 1 + 1e-12):
        raise ValueError("allen_cahn_spectral: points must lie in x in [-1, 1], t >= 0")
    grid = -1.0 + 2.0 * np.arange(modes) / modes
    k = np.pi * np.fft.fftfreq(modes, 1.0 / modes)  # period 2
    lin = -diffusion * k ** 2 + reaction

    def nonlinear(v):
        return np.fft.fft(-reaction * np.fft.ifft(v).real ** 3)

    def step(v, c):
        e, e2, q, f1, f2, f3 = c
        nv = nonlinear(v)
        a = e2 * v + q * nv
        na = nonlinear(a)
        b = e2 * v + q * na
        nb = nonlinear(b)
        cc = e2 * a + q * (2 * nb - nv)
        return e * v + nv * f1 + 2 * (na + nb) * f2 + nonlinear(cc) * f3

    full = _etdrk4_coefficients(lin, dt)
    v, now = np.fft.fft(grid ** 2 * np.cos(np.pi * grid)), 0.0
    out = np.empty(x.shape)
    for time in np.unique(t):
        while now + dt <= time + 1e-12 * dt:
            v, now = step(v, full), now + dt
        w = v if time - now <= 1e-12 else step(v, _etdrk4_coefficients(lin, time - now))
        at = t == time
        phase = np.exp(1j * np.outer(x[at] + 1.0, k))
        out[at] = (phase @ w).real / modes
    return out
