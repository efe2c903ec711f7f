"""The extreme eigenpairs of a symmetric operator: power iteration and Lanczos
(`hogrod.linalg.power_iteration`, `hogrod.linalg.lanczos`)."""

import collections
from typing import Callable, Optional, Tuple

import tensorflow as tf

from hogrod import checks, tree
from hogrod.linalg.common import _dtype, _eps, _no_autograph, _product
from hogrod.types import MatVec, Seed, Tree

LanczosResult = collections.namedtuple("LanczosResult", ["alphas", "betas", "basis",
                                                         "residual_beta"])
LanczosResult.__doc__ = """The outcome of `m` steps of `lanczos`.

Attributes:
    alphas: ``[m]``, the diagonal of the tridiagonal ``T = Q^T A Q``.
    betas: ``[m - 1]``, the off-diagonal of ``T``.
    basis: the tree of Lanczos vectors ``q_0 .. q_{m-1}`` (the rows of ``Q^T``), of v0's
        structure, each leaf with a leading axis of length ``m``.
    residual_beta: ``beta_m = ||r_m||``, the size of the residual
        ``A Q^T - Q^T T = beta_m q_m e_m^T`` (0 when the Krylov space is invariant), a
        scalar of v0's dtype.
"""


@_no_autograph
def power_iteration(matvec: MatVec, v0: Optional[Tree] = None, maxiter: int = 100,
                    tol: float = 0.0, like: Optional[Tree] = None,
                    seed: Optional[Seed] = None) -> Tuple[tf.Tensor, Tree]:
    """The eigenvalue of largest magnitude of a symmetric A, and its eigenvector.

    From ``v_0 = v0 / ||v0||`` (or a standard normal tree ``tree.normal_like(like, seed)``),
    each step is::

        w = A v_{k-1},  lambda_k = v_{k-1}^T w,  v_k = w / ||w||,

    for `maxiter` products, or until ``abs(lambda_k - lambda_{k-1}) <= tol abs(lambda_k)``
    (``tol > 0``). It converges when the largest ``abs(eigenvalue)`` is unique, at the rate
    of the ratio of the two largest ``abs(eigenvalues)``; ``lambda_k`` is signed. A product
    ``w = 0`` (v in A's null space) stops with ``lambda = 0``.

    Args:
        matvec: ``v -> A v`` on trees structured like the start vector.
        v0: the start, a nonzero tree of floating tensors of one dtype; or None (default)
            with `like` and `seed` for a random start.
        maxiter: the most products, a Python int >= 1; default 100.
        tol: the relative tolerance on successive eigenvalue estimates, a Python number
            >= 0; default 0, which runs `maxiter` products.
        like: with `seed` and no `v0`: the tree whose structure, shapes and dtypes the
            random standard normal start takes.
        seed: with `like` and no `v0`: the start's stateless seed, an int or a shape-``[2]``
            integer tensor (`hogrod.tree.normal_like`).

    Returns:
        A tuple ``(eigenvalue, eigenvector)``: ``lambda_k``, a scalar of the start's dtype,
        and ``v_k``, a unit-norm tree of the start's structure.

    Raises:
        TypeError: `matvec` is not callable, or the start's leaves do not share one
            floating dtype.
        ValueError: both or neither of `v0` and (`like`, `seed`) are given, `maxiter` or
            `tol` is invalid, a product does not match the start, or (eagerly) the start
            is zero.
    """
    checks.function(matvec, "matvec", "power_iteration", "matvec(v) -> A v")
    if (v0 is None) == (like is None and seed is None):
        raise ValueError("power_iteration: pass either v0 (the start vector) or like and seed "
                         "(a random start shaped like `like`), not both")
    if v0 is None:
        if like is None or seed is None:
            raise ValueError("power_iteration: a random start needs both like and seed")
        v0 = tree.normal_like(like, seed)
    dtype = _dtype(v0, "power_iteration", "v0")
    maxiter = checks.integer(maxiter, "maxiter", "power_iteration", 1)
    tol = checks.nonnegative(tol, "tol", "power_iteration")
    v0 = tf.nest.map_structure(tf.convert_to_tensor, v0)
    v0_norm = tree.norm(v0)
    checks.require(v0_norm > 0, "power_iteration: v0 is zero", error=ValueError)
    v = tree.scale(1 / v0_norm, v0)
    zero = tf.zeros([], dtype)

    def cond(i, v, lam, done):
        return tf.logical_and(i < maxiter, tf.logical_not(done))

    def body(i, v, lam, done):
        w = _product(matvec, v, v, "power_iteration")
        new, w_norm = tree.dot(v, w), tree.norm(w)
        null = tf.equal(w_norm, 0.0)
        v = tree.scale(tf.where(null, zero, 1 / tf.where(null, tf.ones_like(w_norm), w_norm)), w)
        converged = tf.abs(new - lam) <= tol * tf.abs(new) if tol > 0 else tf.constant(False)
        return i + 1, v, new, tf.logical_or(null, converged)

    _, v, lam, _ = tf.while_loop(cond, body, (tf.constant(0), v, zero, tf.constant(False)),
                                 maximum_iterations=maxiter)
    return lam, v


def _stacked_shape(k: int, t: tf.Tensor) -> object:
    if t.shape.is_fully_defined():
        return [k] + t.shape.as_list()
    return tf.concat([[k], tf.shape(t)], 0)


@_no_autograph
def lanczos(matvec: MatVec, v0: Tree, k: int, reorthogonalize: bool = True,
            stop: Optional[Callable[[tf.Tensor, tf.Tensor, tf.Tensor], object]] = None,
            breakdown_rtol: Optional[float] = None) -> LanczosResult:
    """`k` steps of the Lanczos process from `v0`.

    It builds an orthonormal basis ``Q`` of the Krylov space
    ``span{v0, A v0, .., A^{k-1} v0}`` and the tridiagonal ``T = Q^T A Q``. With
    ``q_0 = v0 / ||v0||``, step ``j`` computes ``w = A q_j``, ``alpha_j = q_j^T w``,
    removes the components along ``q_j`` and ``q_{j-1}`` (with `reorthogonalize`, along
    every ``q_i``, twice: classical Gram-Schmidt repeated, which keeps ``Q`` orthonormal in
    floating point), sets ``beta_j = ||w||`` and ``q_{j+1} = w / beta_j``. The extreme
    eigenvalues of ``T`` (the Ritz values; use
    ``scipy.linalg.eigh_tridiagonal(alphas, betas)`` on the host) converge to A's first.

    It stops early, with ``m < k`` steps, when
    ``beta_j <= breakdown_rtol * max_i(abs(alpha_i) + beta_i)`` (the Krylov space is
    invariant: T's eigenvalues are exact eigenvalues of A), or when
    ``stop(alphas, betas, beta)`` is true.

    Args:
        matvec: ``v -> A v`` on trees structured like `v0`.
        v0: the start, a nonzero tree of floating tensors of one dtype.
        k: the most Lanczos steps, a Python int >= 1.
        reorthogonalize: whether to orthogonalize each new vector against the whole basis
            (twice); default True. False keeps the three-term recurrence only.
        stop: an optional early stop ``stop(alphas, betas, beta) -> bool``, given the
            tridiagonal so far (``alphas[:j + 1]``, ``betas[:j]``) and ``beta_j``; it
            returns a Python bool eagerly, a bool tensor in a graph. None (default): no
            early stop but the breakdown.
        breakdown_rtol: the relative breakdown threshold, a Python number >= 0; None
            (default) means 1000 eps of v0's dtype.

    Returns:
        A `LanczosResult` ``(alphas [m], betas [m - 1], basis, residual_beta)``; ``basis``
        has v0's structure, each leaf with a leading axis of length ``m``.

    Raises:
        TypeError: `matvec` or `stop` is not callable, or v0's leaves do not share one
            floating dtype.
        ValueError: `k` or `breakdown_rtol` is invalid, a product does not match `v0`, or
            (eagerly) `v0` is zero.
    """
    checks.function(matvec, "matvec", "lanczos", "matvec(v) -> A v")
    k = checks.integer(k, "k", "lanczos", 1)
    dtype = _dtype(v0, "lanczos", "v0")
    if stop is not None and not callable(stop):
        raise TypeError(f"lanczos: stop must be a callable (alphas, betas, beta) -> bool, got "
                        f"{type(stop).__name__}")
    rtol = 1000 * _eps(dtype) if breakdown_rtol is None else checks.nonnegative(
        breakdown_rtol, "breakdown_rtol", "lanczos")
    v0 = tf.nest.map_structure(tf.convert_to_tensor, v0)
    v0_norm = tree.norm(v0)
    checks.require(v0_norm > 0, "lanczos: v0 is zero", error=ValueError)
    q = tree.scale(1 / v0_norm, v0)
    basis = tf.nest.map_structure(lambda t: tf.zeros(_stacked_shape(k, t), dtype), q)
    zero = tf.zeros([], dtype)

    def project(basis, w):  # w - Q^T (Q w)
        coeffs = tf.add_n([tf.tensordot(tf.reshape(qs, [k, -1]), tf.reshape(x, [-1]), 1)
                           for qs, x in zip(tf.nest.flatten(basis), tf.nest.flatten(w))])
        return tree.sub(w, tf.nest.map_structure(lambda qs: tf.tensordot(coeffs, qs, 1),
                                                 basis))

    def cond(j, q, q_prev, basis, alphas, betas, beta, anorm, done):
        return tf.logical_and(j < k, tf.logical_not(done))

    def body(j, q, q_prev, basis, alphas, betas, beta_prev, anorm, done):
        basis = tf.nest.map_structure(
            lambda qs, x: tf.tensor_scatter_nd_update(qs, [[j]], x[None]), basis, q)
        w = _product(matvec, q, q, "lanczos")
        alpha = tree.dot(q, w)
        if reorthogonalize:
            w = project(basis, project(basis, w))
        else:
            w = tree.axpy(-beta_prev, q_prev, tree.axpy(-alpha, q, w))
        beta = tree.norm(w)
        alphas = tf.tensor_scatter_nd_update(alphas, [[j]], [alpha])
        anorm = tf.maximum(anorm, tf.abs(alpha) + beta + beta_prev)
        done = beta <= rtol * anorm
        if stop is not None:
            asked = tf.reshape(tf.cast(stop(alphas[:j + 1], betas[:j], beta), tf.bool), [])
            done = tf.logical_or(done, asked)
        betas = tf.tensor_scatter_nd_update(betas, [[j]], [beta])
        safe = tf.where(done, tf.ones_like(beta), beta)
        return j + 1, tree.scale(1 / safe, w), q, basis, alphas, betas, beta, anorm, done

    state = (tf.constant(0), q, tree.zeros_like(q), basis, tf.zeros([k], dtype),
             tf.zeros([k], dtype), zero, zero, tf.constant(False))
    m, _, _, basis, alphas, betas, beta, _, _ = tf.while_loop(cond, body, state,
                                                              maximum_iterations=k)
    return LanczosResult(alphas[:m], betas[:m - 1],
                         tf.nest.map_structure(lambda qs: qs[:m], basis), beta)
