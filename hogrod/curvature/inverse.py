"""Inverse-Hessian-vector products: damped conjugate gradient and LiSSA."""

import numpy as np

from hogrod.curvature.eigen import as_matvec

__all__ = ["conjugate_gradient", "lissa"]


def conjugate_gradient(op, b, damping=0.0, tol=1e-8, max_iterations=None):
    """Solve (A + damping I) x = b by CG; returns (x, iterations).

    A must be positive definite once damped: a curvature p^T (A + damping I) p <= 0 (a
    singular or indefinite system) is an error that says so, never a silent NaN.
    """
    matvec, n = as_matvec(op)
    b = np.asarray(b, np.float64)
    x = np.zeros(n)
    r = b.copy()
    p = r.copy()
    rr = r @ r
    bnorm = np.sqrt(rr)
    if bnorm == 0:
        return x, 0
    for i in range(max_iterations or 10 * n):
        ap = matvec(p) + damping * p
        curvature = p @ ap
        if curvature <= 1e-14 * (p @ p) * max(1.0, bnorm):
            raise ValueError(
                f"conjugate_gradient: p^T (A + {damping} I) p = {curvature:.3e} <= 0 at iteration "
                f"{i}: the system is singular or indefinite; add damping (> 0) or use a "
                "positive definite operator (e.g. Gauss-Newton)")
        alpha = rr / curvature
        x += alpha * p
        r -= alpha * ap
        rr_new = r @ r
        if np.sqrt(rr_new) <= tol * bnorm:
            return x, i + 1
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, i + 1


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
