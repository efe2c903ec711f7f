"""Stochastic trace estimators: Hutchinson and Hutch++, each with a standard error."""

from typing import Tuple, Union

import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.eigen import as_matvec
from hogrod.types import TensorLike

__all__ = ["hutchinson", "hutchpp"]


def _rademacher(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """An [n, m] matrix of independent random signs."""
    return rng.choice([-1.0, 1.0], size=(n, m))


def hutchinson(op: Union[tf.linalg.LinearOperator, TensorLike], num_samples: int = 100,
               seed: int = 0) -> Tuple[float, float]:
    """The trace by Hutchinson's estimator, with a standard error.

    tr(A) ~ mean of z^T A z over Rademacher z.

    Args:
      op: a curvature operator (anything with `matvec_flat`) or a dense symmetric matrix.
      num_samples: products (>= 2: the standard error needs two).
      seed: the probes' numpy seed.

    Returns:
      `(estimate, standard_error)`, Python floats.
    """
    num_samples = checks.integer(num_samples, "num_samples", "hutchinson", least=2)
    matvec, n = as_matvec(op)
    z = _rademacher(np.random.default_rng(seed), n, num_samples)
    samples = np.array([z[:, i] @ matvec(z[:, i]) for i in range(num_samples)])
    return float(samples.mean()), float(samples.std(ddof=1) / np.sqrt(num_samples))


def hutchpp(op: Union[tf.linalg.LinearOperator, TensorLike], num_matvecs: int = 99,
            seed: int = 0) -> Tuple[float, float]:
    """The trace by Hutch++ (Meyer et al. 2021), with a standard error.

    The exact trace on a sketched top subspace plus Hutchinson on the rest; m/3 sketch, m/3
    projection and m/3 residual products. The standard error is that of the residual
    Hutchinson part (the projected part is exact).

    Args:
      op: a curvature operator (anything with `matvec_flat`) or a dense symmetric matrix.
      num_matvecs: the budget; 3 * (num_matvecs // 3) products are used (>= 6: two
        residual samples).
      seed: the probes' numpy seed.

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
