"""Inverse-Hessian-vector products: damped conjugate gradient (`hogrod.linalg.cg`) and LiSSA."""

import inspect
from typing import Callable, Optional, Tuple, Union

import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import checks, linalg
from hogrod.curvature.eigen import as_matvec, host_solver
from hogrod.types import TensorLike

__all__ = ["conjugate_gradient", "lissa"]


def _takes_index(matvec: Callable[..., np.ndarray]) -> bool:
    """Whether a host product is `matvec(v, k)` rather than `matvec(v)`."""
    try:
        inspect.signature(matvec).bind(None)
        return False
    except TypeError:
        return True
    except ValueError:  # no signature (a builtin): takes v alone
        return False


def conjugate_gradient(op: Union[tf.linalg.LinearOperator, TensorLike], b: TensorLike,
                       damping: float = 0.0, tol: float = 1e-8,
                       maxiter: Optional[int] = None) -> Tuple[np.ndarray, int]:
    """Solves (A + damping I) x = b by conjugate gradient (`hogrod.linalg.cg`).

    A must be positive definite once damped: a curvature p^T (A + damping I) p <= 0 (a
    singular or indefinite system) is an error that says so, never a silent NaN. Stopping
    at `maxiter` before ||r|| <= tol ||b|| logs a warning.

    Args:
      op: a curvature operator (anything with `matvec_flat`) or a dense symmetric matrix.
      b: the right-hand side, a vector of length n.
      damping: added to A's diagonal (>= 0).
      tol: the relative residual to reach (>= 0).
      maxiter: the most iterations (an int >= 1; default None: 10 n).

    Returns:
      `(x, iterations)`: x float64 numpy [n], the iterations run (an int).

    Raises:
      ArgumentError: an argument out of its range, or `b` not of shape [n].
      ValueError: a curvature ``p^T (A + damping I) p <= 0`` (singular or indefinite).
    """
    where = "conjugate_gradient"
    damping = checks.nonnegative(damping, "damping", where)
    tol = checks.nonnegative(tol, "tol", where)
    matvec, n = as_matvec(op)
    b = np.asarray(b, np.float64)
    if b.shape != (n,):
        raise checks.ArgumentError(f"{where}: b has shape {b.shape}, the operator needs ({n},)")
    maxiter = 10 * n if maxiter is None else checks.integer(maxiter, "maxiter", where, least=1)
    run = host_solver(linalg.cg, matvec, n, maxiter=maxiter, tol=tol, damping=damping,
                      on_negative_curvature="stop")
    x, info = run(tf.constant(b))
    if info.negative_curvature:
        raise ValueError(
            f"{where}: p^T (A + {damping} I) p = {info.curvature:.3e} <= 0 at "
            f"iteration {info.iterations}: the system is singular or indefinite; add damping "
            "(> 0) or use a positive definite operator (e.g. Gauss-Newton)")
    if info.residual_norm > tol * np.linalg.norm(b):
        logging.warning("%s: %d iterations without reaching tol=%g (relative residual %.2e)",
                        where, info.iterations, tol, info.residual_norm / np.linalg.norm(b))
    return x, int(info.iterations)


def lissa(op: Union[tf.linalg.LinearOperator, TensorLike, Callable[..., np.ndarray]],
          b: TensorLike, damping: float = 0.01, scale: float = 10.0, maxiter: int = 200,
          tol: float = 0.0, repeats: int = 1) -> np.ndarray:
    """The truncated Neumann series of (A + damping I)^{-1} b: LiSSA (Agarwal et al. 2017).

    `hogrod.linalg.neumann` with step 1 / scale: h_j = b + (1 - damping/scale) h_{j-1} -
    A h_{j-1} / scale, result h / scale. `scale` must exceed the largest eigenvalue of
    A + damping I for the series to converge; a term growing past 10 ||b|| (impossible
    when it converges) is an error naming `scale`.

    Args:
      op: a curvature operator or a dense symmetric matrix, or a host product on float64
        numpy vectors `matvec(v)` or `matvec(v, k)`, k the term's index (distinct over the
        repeats): a stochastic product drawing a fresh minibatch per term.
      b: the right-hand side, a vector of length n (required length for a callable `op`).
      damping: added to A's diagonal (>= 0).
      scale: the series' scale, > 0.
      maxiter: the most terms after the first (>= 0).
      tol: stop once a term's norm is <= tol ||b|| (0 runs all `maxiter` terms).
      repeats: runs averaged (>= 1; > 1 helps with minibatch products).

    Returns:
      The estimate of (A + damping I)^{-1} b, float64 numpy [n].

    Raises:
      ArgumentError: an argument out of its range, or `b` not of shape [n].
      ValueError: the series diverged (`scale` too small).
    """
    where = "lissa"
    damping = checks.nonnegative(damping, "damping", where)
    scale = checks.positive(scale, "scale", where)
    maxiter = checks.integer(maxiter, "maxiter", where)
    tol = checks.nonnegative(tol, "tol", where)
    repeats = checks.integer(repeats, "repeats", where, least=1)
    b = np.asarray(b, np.float64)
    indexed = False
    if callable(op) and not hasattr(op, "matvec_flat") and not isinstance(op, np.ndarray):
        product, n, indexed = op, b.shape[0], _takes_index(op)
    else:
        product, n = as_matvec(op)
    if b.shape != (n,):
        raise checks.ArgumentError(f"{where}: b has shape {b.shape}, the operator needs ({n},)")
    bound = 10 * np.linalg.norm(b)
    offset = [0]

    def matvec(v, *k):  # a convergent series' terms never grow past ||b||
        if not np.all(np.isfinite(v)) or np.linalg.norm(v) > bound:
            raise ValueError(f"{where} diverged: scale={scale} must exceed the largest "
                                     "eigenvalue of the operator (plus damping)")
        return product(v, k[0] + offset[0]) if indexed else product(v)

    run = host_solver(linalg.neumann, matvec, n, indexed=True, maxiter=maxiter, tol=tol,
                      step=1.0 / scale, damping=damping)
    estimates = []
    for r in range(repeats):
        offset[0] = r * (maxiter + 1)
        x, _ = run(tf.constant(b))
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{where} diverged: scale={scale} must exceed the largest "
                                     "eigenvalue of the operator (plus damping)")
        estimates.append(x)
    return np.mean(estimates, axis=0)
