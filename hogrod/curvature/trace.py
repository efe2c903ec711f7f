"""Stochastic trace estimators: Hutchinson and Hutch++, each with a standard error."""

import numpy as np

from hogrod import checks
from hogrod.curvature.eigen import as_matvec

__all__ = ["hutchinson", "hutchpp"]


def _rademacher(rng, n, m):
    return rng.choice([-1.0, 1.0], size=(n, m))


def hutchinson(op, num_samples=100, seed=0):
    """tr(A) ~ mean of z^T A z over Rademacher z.

    Args:
      op: a curvature operator (anything with `matvec_flat`) or a dense symmetric matrix.
      num_samples: products (>= 2: the standard error needs two).
      seed: the probes' seed.
    Returns:
      `(estimate, standard_error)`, Python floats.
    """
    num_samples = checks.integer(num_samples, "num_samples", "hutchinson", least=2)
    matvec, n = as_matvec(op)
    z = _rademacher(np.random.default_rng(seed), n, num_samples)
    samples = np.array([z[:, i] @ matvec(z[:, i]) for i in range(num_samples)])
    return float(samples.mean()), float(samples.std(ddof=1) / np.sqrt(num_samples))


def hutchpp(op, num_matvecs=99, seed=0):
    """Hutch++ (Meyer et al. 2021): exact trace on a sketched top subspace plus Hutchinson
    on the rest; m/3 sketch, m/3 projection and m/3 residual products. The standard error
    is that of the residual Hutchinson part (the projected part is exact).

    Args:
      op: a curvature operator or a dense symmetric matrix.
      num_matvecs: the budget; 3 * (num_matvecs // 3) products are used (>= 6: two
        residual samples).
      seed: the probes' seed.
    Returns:
      `(estimate, standard_error)`, Python floats.
    """
    m = checks.integer(num_matvecs, "num_matvecs", "hutchpp", least=6) // 3
    matvec, n = as_matvec(op)
    rng = np.random.default_rng(seed)
    S = _rademacher(rng, n, m)
    AS = np.stack([matvec(S[:, i]) for i in range(m)], axis=1)
    Q, _ = np.linalg.qr(AS)
    AQ = np.stack([matvec(Q[:, i]) for i in range(Q.shape[1])], axis=1)
    top = np.trace(Q.T @ AQ)
    G = _rademacher(rng, n, m)
    G -= Q @ (Q.T @ G)
    samples = np.array([G[:, i] @ (lambda w: w - Q @ (Q.T @ w))(matvec(G[:, i]))
                        for i in range(m)])
    return float(top + samples.mean()), float(samples.std(ddof=1) / np.sqrt(m))
