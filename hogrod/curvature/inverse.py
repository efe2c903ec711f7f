"""Inverse-Hessian-vector products: damped conjugate gradient (`hogrod.linalg.cg`) and LiSSA."""

import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import linalg
from hogrod.curvature.eigen import as_matvec, host_solver

__all__ = ["conjugate_gradient", "lissa"]


def conjugate_gradient(op, b, damping=0.0, tol=1e-8, max_iterations=None):
    """Solve (A + damping I) x = b by CG; returns (x, iterations).

    A must be positive definite once damped: a curvature p^T (A + damping I) p <= 0 (a
    singular or indefinite system) is an error that says so, never a silent NaN. Stopping
    at `max_iterations` (default 10 n) before ||r|| <= tol ||b|| logs a warning.
    """
    matvec, n = as_matvec(op)
    b = np.asarray(b, np.float64)
    if b.shape != (n,):
        raise ValueError(f"conjugate_gradient: b has shape {b.shape}, the operator needs ({n},)")
    maxiter = max_iterations or 10 * n
    run = host_solver(linalg.cg, matvec, n, maxiter=maxiter, tol=tol, damping=float(damping),
                      on_negative_curvature="stop")
    x, info = run(tf.constant(b))
    if info.negative_curvature:
        raise ValueError(
            f"conjugate_gradient: p^T (A + {damping} I) p = {info.curvature:.3e} <= 0 at "
            f"iteration {info.iterations}: the system is singular or indefinite; add damping "
            "(> 0) or use a positive definite operator (e.g. Gauss-Newton)")
    if info.residual_norm > tol * np.linalg.norm(b):
        logging.warning("conjugate_gradient: %d iterations without reaching tol=%g (relative "
                        "residual %.2e)", info.iterations, tol,
                        info.residual_norm / np.linalg.norm(b))
    return x, int(info.iterations)


def lissa(op, b, damping=0.01, scale=10.0, depth=200, repeats=1):
    """LiSSA (Agarwal et al. 2017): the truncated Neumann series of (A + damping I)^{-1} b,
    h_j = b + (1 - damping/scale) h_{j-1} - A h_{j-1} / scale, result h / scale.

    `scale` must exceed the largest eigenvalue of A for the series to converge; the
    estimate is averaged over `repeats` runs (repeats > 1 helps with minibatch operators).
    """
    matvec, n = as_matvec(op)
    b = np.asarray(b, np.float64)
    estimates = []
    for _ in range(repeats):
        h = b.copy()
        bound = np.linalg.norm(b)
        for j in range(depth):
            h = b + (1 - damping / scale) * h - matvec(h) / scale
            # A convergent series (spectral radius <= 1) keeps ||h_j|| <= (j + 2) ||b||.
            if not np.all(np.isfinite(h)) or np.linalg.norm(h) > 10 * (j + 2) * bound:
                raise ValueError(f"lissa diverged: scale={scale} must exceed the largest "
                                 "eigenvalue of the operator")
        estimates.append(h / scale)
    return np.mean(estimates, axis=0)
