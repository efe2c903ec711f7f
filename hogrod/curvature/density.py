"""Spectral density by stochastic Lanczos quadrature (Ubaru et al. 2017; Ghorbani et al. 2019).

Each run starts Lanczos (`hogrod.linalg.lanczos`) from a normalized Rademacher vector; the
tridiagonal matrix's eigenvalues are quadrature nodes and the squared first components of
its eigenvectors their weights (which sum to 1). The density is the run-averaged sum of
Gaussians of width `sigma` at the nodes, so it integrates to 1 over a grid that covers the
nodes.
"""

from typing import Optional, Tuple, Union

import numpy as np
import scipy.linalg
import tensorflow as tf

from hogrod import checks, linalg
from hogrod.curvature.eigen import as_matvec, host_solver
from hogrod.types import TensorLike

__all__ = ["spectral_density"]


def spectral_density(op: Union[tf.linalg.LinearOperator, TensorLike], steps: int = 50,
                     num_runs: int = 5, sigma: Optional[float] = None, grid_points: int = 1000,
                     seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The spectral density of a symmetric operator by stochastic Lanczos quadrature.

    Args:
      op: a curvature operator (anything with `matvec_flat`) or a dense symmetric matrix.
      steps: Lanczos steps per run (a fixed count >= 1, capped at n).
      num_runs: runs from independent Rademacher vectors (>= 1).
      sigma: the Gaussians' width (> 0; default None: 1% of the spectrum's span, at least
        1e-6).
      grid_points: points of the grid (>= 2), which spans the nodes +- 5 sigma.
      seed: the start vectors' numpy seed (an int >= 0).

    Returns:
      `(grid, density, nodes, weights)`, float64 numpy: the grid [grid_points], the density
      on it [grid_points], the quadrature nodes and their weights [num_runs * m], m the
      Lanczos steps per run (the weights sum to 1).
    """
    where = "spectral_density"
    steps = checks.integer(steps, "steps", where, least=1)
    num_runs = checks.integer(num_runs, "num_runs", where, least=1)
    grid_points = checks.integer(grid_points, "grid_points", where, least=2)
    checks.seed(seed, "seed", where)
    if sigma is not None:
        sigma = checks.positive(sigma, "sigma", where)
    matvec, n = as_matvec(op)
    run = host_solver(linalg.lanczos, matvec, n, k=min(steps, n))
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    for _ in range(num_runs):
        a, b, _, _ = run(tf.constant(rng.choice([-1.0, 1.0], size=n)))
        theta, S = scipy.linalg.eigh_tridiagonal(a, b)
        nodes.append(theta)
        weights.append(S[0] ** 2 / num_runs)
    nodes, weights = np.concatenate(nodes), np.concatenate(weights)
    span = nodes.max() - nodes.min()
    sigma = sigma or max(0.01 * span, 1e-6)
    grid = np.linspace(nodes.min() - 5 * sigma, nodes.max() + 5 * sigma, grid_points)
    gauss = np.exp(-0.5 * ((grid[:, None] - nodes[None]) / sigma) ** 2) / (
        sigma * np.sqrt(2 * np.pi))
    return grid, gauss @ weights, nodes, weights
