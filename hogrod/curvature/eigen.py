"""Top-k eigenpairs of a symmetric curvature operator: Lanczos (default) and power iteration.

Both work on any operator with `matvec_flat(vector)` (the operators of this package) or a
dense symmetric matrix, keep their bookkeeping in float64 numpy, and return
`(eigenvalues, eigenvectors, num_matvecs)`, eigenvalues sorted from the requested end.
"""

import numpy as np
import scipy.linalg
import tensorflow as tf
from absl import logging

__all__ = ["lanczos", "power_iteration", "as_matvec"]


def as_matvec(op):
    """(matvec on float64 numpy vectors, n) for an operator or a dense matrix.

    A product that is not finite (a NaN/inf loss, or weights that overflowed) is an error
    naming the operator, so no estimator returns a silent NaN.
    """
    if hasattr(op, "matvec_flat"):
        dtype, name = op.dtype, op.name
        raw = lambda v: op.matvec_flat(tf.constant(v, dtype)).numpy().astype(np.float64)  # noqa
        n = int(op.shape[0])
    else:
        a = np.asarray(op, np.float64)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"expected a curvature operator or a square matrix, got shape "
                             f"{a.shape}")
        raw, n, name = (lambda v: a @ v), a.shape[0], "matrix"

    def matvec(v):
        w = raw(v)
        if not np.all(np.isfinite(w)):
            raise FloatingPointError(f"{name}: the product with a finite vector is not finite "
                                     f"({int(np.sum(~np.isfinite(w)))} of {n} entries); check the "
                                     "loss and the parameters for NaN/inf")
        return w
    return matvec, n


def _check_k(k, n):
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the operator's dimension n={n}")


def lanczos(op, k=1, which="largest", tol=1e-6, max_iterations=None, seed=0):
    """Lanczos with full reorthogonalization.

    Args:
      op: a curvature operator (or a dense symmetric matrix).
      k: how many eigenpairs.
      which: "largest" (algebraically largest) or "smallest" (most negative).
      tol: stop when every wanted Ritz pair has residual |beta_m s_mi| <= tol * |theta_i|.
      max_iterations: Krylov dimension cap (default min(n, 10k + 100)); reaching it
        before `tol` logs a warning (tol=0: run exactly that many iterations).
      seed: the start vector's seed.
    """
    matvec, n = as_matvec(op)
    _check_k(k, n)
    if which not in ("largest", "smallest"):
        raise ValueError(f"which must be 'largest' or 'smallest', got {which!r}")
    m_max = min(n, max_iterations or 10 * k + 100)
    q = np.random.default_rng(seed).standard_normal(n)
    Q = np.zeros((m_max, n))
    Q[0] = q / np.linalg.norm(q)
    alphas, betas, count = [], [], 0
    for j in range(m_max):
        w = matvec(Q[j])
        count += 1
        alphas.append(Q[j] @ w)
        w -= Q[: j + 1].T @ (Q[: j + 1] @ w)  # full reorthogonalization, twice for safety
        w -= Q[: j + 1].T @ (Q[: j + 1] @ w)
        beta = np.linalg.norm(w)
        if j + 1 >= k:
            theta, S = scipy.linalg.eigh_tridiagonal(np.array(alphas), np.array(betas))
            order = np.argsort(theta)[::-1] if which == "largest" else np.argsort(theta)
            wanted = order[:k]
            residual = np.abs(beta * S[-1, wanted])
            converged = np.all(residual <= tol * np.maximum(np.abs(theta[wanted]), 1e-12))
            if tol > 0 and j + 1 == m_max and not converged and m_max < n:
                logging.warning("lanczos: %d iterations without reaching tol=%g (largest "
                                "relative residual %.2e)", m_max, tol, np.max(
                                    residual / np.maximum(np.abs(theta[wanted]), 1e-12)))
            if converged or j + 1 == m_max or beta < 1e-12 * max(1.0, abs(alphas[0])):
                vectors = Q[: j + 1].T @ S[:, wanted]
                return theta[wanted], vectors, count
        betas.append(beta)
        Q[j + 1] = w / beta
    raise AssertionError("unreachable")


def power_iteration(op, k=1, which="largest", tol=1e-6, max_iterations=1000, seed=0):
    """Power iteration with deflation: one eigenpair at a time, each projected out.

    "largest" finds the largest-magnitude eigenvalues (the largest ones for a PSD
    operator); "smallest" shifts by the largest eigenvalue to find the most negative.
    """
    matvec, n = as_matvec(op)
    _check_k(k, n)
    rng = np.random.default_rng(seed)
    count, shift = 0, 0.0
    if which == "smallest":
        top, _, c = power_iteration(op, 1, "largest", tol, max_iterations, seed)
        count += c
        shift = abs(top[0])
    elif which != "largest":
        raise ValueError(f"which must be 'largest' or 'smallest', got {which!r}")
    values, vectors = [], []
    for _ in range(k):
        v = rng.standard_normal(n)
        v /= np.linalg.norm(v)
        lam = 0.0
        for _ in range(max_iterations):
            for u in vectors:
                v -= (u @ v) * u
            w = matvec(v) - shift * v
            count += 1
            for u, l in zip(vectors, values):
                w -= (l - shift) * (u @ v) * u
            new = v @ w
            norm = np.linalg.norm(w)
            if norm == 0:
                break
            v = w / norm
            if abs(new - lam) <= tol * max(abs(new), 1e-12):
                lam = new
                break
            lam = new
        values.append(lam + shift)
        vectors.append(v)
    return np.array(values), np.stack(vectors, axis=1), count
