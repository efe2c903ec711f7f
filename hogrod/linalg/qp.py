"""A batched primal-dual interior-point solver for quadratic programs whose rows lie on
simplices and whose Hessian is one kernel per column:

    ``min_S 1/2 sum_k S[:, k]^T K S[:, k] + <Q, S>``  subject to  ``S >= 0``,
    ``sum_k S[i, k] = radius`` for every row i,

S and Q `[..., n, m]`, K `[..., n, n]` symmetric positive definite (semi-definite where the
solution is unique), leading axes a batch of independent problems (the tasks of an
episode). The Crammer-Singer SVM's dual is one (`hogrod.meta.svm`).

The method: Mehrotra's predictor-corrector (Nocedal and Wright 2006, ch. 16.6; qpth's
batched solver, Amos and Kolter 2017, is the same method on a dense KKT system), from the
strictly feasible point ``S = radius / m``, multipliers making the start dual feasible.
Its Newton system is not formed densely (it has ``n m + n`` unknowns): the Hessian
``I_m (x) K`` plus the barrier's diagonal is block diagonal over the m columns, each block
``K + diag(z_k / s_k)`` factored by Cholesky and inverted (m batched `n x n` systems), and
the row-sum constraints are eliminated through their `n x n` Schur complement
``sum_k (K + diag(z_k / s_k))^{-1}``. One iteration costs about ``3 m n^3`` flops, all in
batched dense kernels; tens of iterations reach float64's precision.

Polishing. An interior point never lies on a bound, so it is not the solution; once the
barrier parameter has fallen by `polish_gap`, each iteration guesses the active set (the
bounds whose multiplier outweighs their slack, each scaled), solves the equality-
constrained QP on the free coordinates exactly (the same block structure, one step of
iterative refinement) and hands the candidate to `accept`; the first accepted candidate of
a problem is its solution and freezes it. A wrong guess is rejected by `accept` and the
interior point iterates on, so the result is always a point `accept` certified, or the
problem is reported unaccepted after `maxiter` iterations (never a silent truncation).
"""

import collections
from typing import Callable

import numpy as np
import tensorflow as tf

__all__ = ["simplex_qp", "SimplexQP", "simplex_kkt_solve"]

# Explicit tf.while_loop / tf.cond only: no Python control flow on tensors to convert.
_no_autograph = tf.autograph.experimental.do_not_convert

#: The fraction of the way to the boundary an interior-point step may go.
_TO_BOUNDARY = 0.99


SimplexQP = collections.namedtuple("SimplexQP", ["solution", "accepted", "iterations"])
SimplexQP.__doc__ = """What `simplex_qp` returns.

Attributes:
    solution: S ``[..., n, m]``: an accepted candidate per problem (exactly 0 on its active
        bounds), or the last interior point where none was accepted.
    accepted: bool ``[...]``, whether `accept` certified the problem's solution.
    iterations: int32 scalar, the interior-point iterations run (for the whole batch).
"""


def _eye_like(h):
    return tf.broadcast_to(tf.eye(tf.shape(h)[-1], dtype=h.dtype), tf.shape(h))


def _factor(kernel, diagonal, mask):
    """The inverses P_k `[..., m, n, n]` of the column blocks and the Cholesky factor of
    their Schur complement ``sum_k P_k``.

    With mask M_k (1: a free coordinate of column k, 0: fixed at zero) the block is
    ``M_k K M_k + diag(1 - M_k + d_k)``: block diagonal between free and fixed coordinates,
    so ``P_k = M_k H_k^{-1} M_k`` (its fixed part, the identity, masked off) maps a
    right-hand side on the free coordinates to their solution.
    """
    outer = mask[..., :, None] * mask[..., None, :]
    blocks = kernel[..., None, :, :] * outer + tf.linalg.diag(1 - mask + diagonal)
    # H^{-1} = L^{-T} L^{-1}: one triangular solve and a product (cheaper than two solves)
    lower = tf.linalg.triangular_solve(tf.linalg.cholesky(blocks), _eye_like(blocks))
    inverse = tf.linalg.matmul(lower, lower, transpose_a=True) * outer
    return inverse, tf.linalg.cholesky(tf.reduce_sum(inverse, axis=-3))


def _solve(factors, v, w):
    """(dS^T, dy) of ``H_k ds_k - M_k dy = v_k`` (every column k) and ``sum_k M_k ds_k = w``,
    v `[..., m, n]` (zero off the free coordinates), w `[..., n]`."""
    inverse, schur = factors
    pv = tf.linalg.matvec(inverse, v)
    dy = tf.linalg.cholesky_solve(schur, (w - tf.reduce_sum(pv, axis=-2))[..., None])[..., 0]
    return pv + tf.linalg.matvec(inverse, tf.broadcast_to(dy[..., None, :], tf.shape(v))), dy


def _max_step(x, dx):
    """The largest a <= 1 with x + a dx >= 0, per problem `[...]`."""
    negative = dx < 0
    ratio = tf.where(negative, -x / tf.where(negative, dx, -tf.ones_like(dx)),
                     tf.ones_like(x))
    return tf.minimum(tf.reduce_min(ratio, axis=[-2, -1]), 1)


def _per_problem(t):
    return t[..., None, None]


def _gap(s, z):
    """The mean complementarity ``mean(s z)`` per problem (the barrier parameter)."""
    return tf.reduce_mean(s * z, axis=[-2, -1])


def _kkt_solve(kernel, mask, v, w):
    """`simplex_kkt_solve` with mask, v and the solution `[..., m, n]` (column blocks)."""
    eps = np.finfo(kernel.dtype.as_numpy_dtype).eps
    n = tf.cast(tf.shape(kernel)[-1], kernel.dtype)
    shift = _per_problem(10 * n * eps * tf.reduce_max(tf.linalg.diag_part(kernel), axis=-1))
    factors = _factor(kernel, shift * mask, mask)
    u, y = _solve(factors, v * mask, w)
    # one step of iterative refinement on the same factors (the shift's effect removed)
    residual = mask * (tf.linalg.matmul(u, kernel) - y[..., None, :] - v)
    fix, _ = _solve(factors, -residual, w - tf.reduce_sum(u, axis=-2))
    return (u + fix) * mask


def simplex_kkt_solve(kernel: tf.Tensor, mask: tf.Tensor, v: tf.Tensor,
                      w: tf.Tensor) -> tf.Tensor:
    """The equality-constrained system of `simplex_qp` on the free coordinates (mask 1):
    U `[..., n, m]` zero off them, with ``sum_k U[i, k] = w_i`` and, on them,
    ``(K U)[i, k] - y_i = V[i, k]`` for some y `[..., n]`: the polishing step's system, and
    the implicit gradient's (the Jacobian of the reduced KKT conditions on its range).

    Solved directly (per column a Cholesky factorization of ``K`` on its free coordinates
    and the identity elsewhere, the row sums through their `n x n` Schur complement), with
    one step of iterative refinement.

    Args:
      kernel: K `[..., n, n]`, symmetric positive definite on every column's free set.
      mask: `[..., n, m]` at K's dtype, 1 on the free coordinates, 0 elsewhere; every row
        with at least one free coordinate.
      v: V `[..., n, m]` (read on the free coordinates only).
      w: the rows' sums `[..., n]`.

    Returns:
      U.
    """
    transpose = tf.linalg.matrix_transpose
    return transpose(_kkt_solve(kernel, transpose(mask), transpose(v), w))


@_no_autograph
def simplex_qp(kernel: tf.Tensor, linear: tf.Tensor, radius: tf.Tensor, maxiter: tf.Tensor,
               accept: Callable[[tf.Tensor], tf.Tensor],
               polish_gap: float = 1e-6) -> SimplexQP:
    """Solves ``min 1/2 sum_k S_k^T K S_k + <Q, S>`` over rows of S on simplices of
    `radius` (see the module docstring), by a batched interior-point method with polishing.

    Not differentiable (differentiate its solution implicitly, `hogrod.implicit`); one
    `tf.while_loop`, so it traces once inside a `tf.function` for every `maxiter`.

    Args:
      kernel: K `[..., n, n]`, floating, symmetric positive definite.
      linear: Q `[..., n, m]`, K's dtype.
      radius: the rows' sum, a positive scalar tensor at K's dtype.
      maxiter: the interior-point iteration limit, an int32 scalar tensor >= 1.
      accept: ``accept(S) -> bool [...]``: whether a polished candidate `[..., n, m]`
        (exactly zero on its guessed active bounds) is the solution, to the caller's
        tolerance; the caller's certificate (a KKT residual).
      polish_gap: candidates are polished once the mean complementarity ``mean(s z)`` has
        fallen to this fraction of its start.

    Returns:
      `SimplexQP(solution, accepted, iterations)`.
    """
    dtype = kernel.dtype
    linear_t = tf.linalg.matrix_transpose(linear)  # [..., m, n]: one row per column block
    m = tf.cast(tf.shape(linear_t)[-2], dtype)
    eps = tf.constant(np.finfo(dtype.as_numpy_dtype).eps, dtype)
    diagonal = tf.linalg.diag_part(kernel)
    scale = tf.reduce_max(diagonal, axis=-1)  # about ||K||
    n = tf.cast(tf.shape(kernel)[-1], dtype)
    # keeps every block's Cholesky factor defined under rounding (K semi-definite); the
    # polished candidate's refinement step removes its effect
    shift = _per_problem(10 * n * eps * scale)
    # the scale of the multipliers (Q's) and of the slacks (radius): guesses compare the two
    z_scale = _per_problem(tf.maximum(tf.reduce_max(tf.abs(linear_t), axis=[-2, -1]),
                                      tf.constant(1, dtype)))
    largest = _per_problem(scale) / (eps * eps)  # a bound on z / s: barrier terms stay finite

    def gradient(s_t):
        return tf.linalg.matmul(s_t, kernel) + linear_t  # (K S + Q)^T, K symmetric

    s0 = tf.ones_like(linear_t) * radius / m
    g0 = gradient(s0)
    y0 = tf.reduce_min(g0, axis=-2) - z_scale[..., 0]
    z0 = g0 - y0[..., None, :]  # >= z_scale: the start is dual feasible
    mu0 = _gap(s0, z0)

    def step(s, z, y):
        residual_d = gradient(s) - y[..., None, :] - z
        residual_p = tf.reduce_sum(s, axis=-2) - radius
        mu = _gap(s, z)
        factors = _factor(kernel, tf.minimum(z / s, largest) + shift, tf.ones_like(s))

        def direction(complementarity):
            ds, dy = _solve(factors, -residual_d - complementarity / s, -residual_p)
            return ds, -(complementarity + z * ds) / s, dy

        ds, dz, _ = direction(s * z)  # predictor (affine scaling)
        a = _per_problem(tf.minimum(_max_step(s, ds), _max_step(z, dz)))
        sigma = (_gap(s + a * ds, z + a * dz) / mu) ** 3
        ds, dz, dy = direction(s * z + ds * dz - _per_problem(sigma * mu))  # corrector
        a = tf.minimum(_max_step(s, ds), _max_step(z, dz)) * _TO_BOUNDARY
        return s + _per_problem(a) * ds, z + _per_problem(a) * dz, y + a[..., None] * dy

    def polish(s, z):
        """The equality-constrained QP on the guessed free coordinates, solved exactly."""
        score = s * z_scale - z * radius
        free = tf.logical_or(score >= 0, score >= tf.reduce_max(score, axis=-2, keepdims=True))
        return _kkt_solve(kernel, tf.cast(free, dtype), -linear_t,
                          tf.ones_like(s[..., 0, :]) * radius)

    def cond(i, s, z, y, best, done):
        return tf.logical_and(i < maxiter, tf.logical_not(tf.reduce_all(done)))

    def body(i, s, z, y, best, done):
        s_new, z_new, y_new = step(s, z, y)
        ready = tf.logical_and(tf.logical_not(done), _gap(s_new, z_new) <= polish_gap * mu0)

        def attempt():
            cand = polish(s_new, z_new)
            ok = tf.logical_and(ready, accept(tf.linalg.matrix_transpose(cand)))
            return tf.where(_per_problem(ok), cand, best), tf.logical_or(done, ok)

        best, done_new = tf.cond(tf.reduce_any(ready), attempt, lambda: (best, done))
        keep = _per_problem(done)  # a solved problem's state stays as it was
        return (i + 1, tf.where(keep, s, s_new), tf.where(keep, z, z_new),
                tf.where(done[..., None], y, y_new), best, done_new)

    done0 = tf.zeros_like(mu0, dtype=tf.bool)
    i, s, _, _, best, done = tf.while_loop(
        cond, body, (tf.constant(0), s0, z0, y0, s0, done0))
    solution = tf.where(_per_problem(done), best, s)
    return SimplexQP(tf.linalg.matrix_transpose(solution), done, i)
