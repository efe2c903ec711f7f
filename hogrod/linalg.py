"""Iterative solvers on a symmetric linear operator given as a product `matvec(v)`.

Conjugate gradient, the Neumann series, power iteration and Lanczos, written once for
every family.

`matvec` maps a tree of tensors (see `hogrod.tree`) to a tree of the same structure, shapes
and dtypes: an HVP `lambda v: hogrod.hvp(loss, params, v)`, a Gauss-Newton product, a
dense matrix's `lambda v: A @ v`. Each solver runs eagerly (its loop is a Python loop
then, so `matvec` may call numpy), inside `tf.function` (one `tf.while_loop`, so the
graph does not grow with the iteration count), and inside `tf.vectorized_map` (one solve
per task, each stopping at its own iteration). Small dense work on the host (the
tridiagonal eigenproblem) is left to `scipy.linalg.eigh_tridiagonal`.
"""

import collections
import inspect
import numbers
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

from hogrod import checks, tree
from hogrod.types import MatVec, Scalar, Seed, Tree

__all__ = ["cg", "CGInfo", "neumann", "NeumannInfo", "power_iteration", "lanczos",
           "LanczosResult"]

CGInfo = collections.namedtuple("CGInfo", ["iterations", "residual_norm", "curvature",
                                           "negative_curvature"])
CGInfo.__doc__ = """What a `cg` solve did.

Attributes:
    iterations: the CG steps taken, an int32 scalar tensor.
    residual_norm: ``||b - (A + damping I) x||``, the recurrence's residual, a scalar of
        b's dtype.
    curvature: ``p^T (A + damping I) p`` of the last direction examined, a scalar of b's
        dtype.
    negative_curvature: a bool scalar tensor: whether the solve stopped at a direction with
        curvature <= 0 (only with ``on_negative_curvature="stop"``).
"""

NeumannInfo = collections.namedtuple("NeumannInfo", ["terms", "term_norm", "converged"])
NeumannInfo.__doc__ = """What a `neumann` series did.

Attributes:
    terms: the terms added after the first, an int32 scalar tensor.
    term_norm: the norm of the last term, ``||(I - step (A + damping I))^terms b||``, a
        scalar of b's dtype.
    converged: a bool scalar tensor, ``term_norm <= tol ||b||`` (always False with
        ``tol = 0``, where exactly `maxiter` terms are added).
"""

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

_NEGATIVE_CURVATURE = ("raise", "stop")
# Python control flow here is on Python values only; the loops are explicit tf.while_loops.
_no_autograph = tf.autograph.experimental.do_not_convert


def _check_matvec(matvec: Callable) -> None:
    if not callable(matvec):
        raise TypeError(f"matvec must be a callable v -> A v, got {type(matvec).__name__}")


def _check_int(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)) \
            or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_tol(tol: float, name: str = "tol") -> float:
    if not isinstance(tol, (numbers.Real, np.floating)) or not 0 <= tol < np.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")
    return float(tol)


def _dtype(b: Tree, fn: str, name: str) -> tf.DType:
    leaves = tf.nest.flatten(b)
    if not leaves or any(t is None for t in leaves):
        raise ValueError(f"{fn}: {name} must be a tree of tensors, got {b!r}")
    leaves = [tf.convert_to_tensor(t) for t in leaves]
    dtypes = {t.dtype for t in leaves}
    if len(dtypes) != 1 or not leaves[0].dtype.is_floating:
        raise TypeError(f"{fn}: {name}'s leaves must share one floating dtype, got "
                        f"{sorted(d.name for d in dtypes)}")
    return leaves[0].dtype


def _product(matvec: MatVec, v: Tree, like: Tree, fn: str) -> Tree:
    """matvec(v), checked against `like` and given its exact structure (loop variables of a
    tf.while_loop keep theirs)."""
    out = matvec(v)
    tree.check_same(like, out, "the vector", f"{fn}'s matvec(v)")
    return tf.nest.pack_sequence_as(like, [tf.convert_to_tensor(t)
                                           for t in tf.nest.flatten(out)])


def _eps(dtype: tf.DType) -> float:
    return float(np.finfo(dtype.as_numpy_dtype).eps)


@_no_autograph
def cg(matvec: MatVec, b: Tree, x0: Optional[Tree] = None, maxiter: Optional[int] = None,
       tol: float = 1e-6, damping: Scalar = 0.0,
       on_negative_curvature: str = "raise") -> Tuple[Tree, CGInfo]:
    """Conjugate gradient for ``(A + damping I) x = b``, A symmetric.

    From ``x_0`` (zeros by default), ``r_0 = b - (A + damping I) x_0``, ``p_0 = r_0``, each
    step is::

        alpha = r^T r / p^T (A + damping I) p,  x += alpha p,  r -= alpha (A + damping I) p,
        p = r + (r_new^T r_new / r^T r) p,

    until ``||r|| <= tol ||b||`` or `maxiter` steps. CG needs ``A + damping I`` positive
    definite: a direction of curvature
    ``p^T (A + damping I) p <= 100 eps ||p||^2 max(abs(Rayleigh quotient seen))``
    (non-positive up to rounding: an indefinite or singular system) either

    - "raise": is an error naming the curvature found (a ValueError eagerly; in a graph a
      `tf.debugging.Assert` that fails when the graph runs, with the same message), or
    - "stop": ends the solve at the iterate reached before that direction, the truncated
      CG of Steihaug (``info.negative_curvature`` says so).

    A non-finite curvature (a NaN product) raises in "raise" mode; in "stop" mode it is
    carried into x, so a NaN guard downstream sees it.

    Args:
        matvec: ``v -> A v`` on trees structured like `b`; its result is checked to have
            `b`'s structure, shapes and dtypes.
        b: the right-hand side, a tree of floating tensors of one dtype.
        x0: the starting iterate, a tree like `b`; None (default) starts from zeros.
        maxiter: the most steps, a Python int >= 1; None (default) means ``10 * size(b)``.
        tol: the relative residual tolerance, a Python number >= 0; default 1e-6 (0 runs
            until the residual is exactly 0 or `maxiter`).
        damping: added to A's diagonal: a Python number (applied at b's dtype) or a scalar
            tensor of b's dtype; default 0.
        on_negative_curvature: "raise" (default) or "stop", as above.

    Returns:
        A tuple ``(x, info)``: the solution ``x``, a tree of `b`'s structure, and a
        `CGInfo`.

    Raises:
        TypeError: `matvec` is not callable, or `b`'s leaves do not share one floating
            dtype.
        ValueError: `on_negative_curvature`, `maxiter` or `tol` is invalid, `b` is empty,
            `x0` or a product does not match `b`, or (eagerly, with "raise") a direction
            of non-positive curvature is met.
        FloatingPointError: eagerly, with "raise", a non-finite curvature is met.
    """
    _check_matvec(matvec)
    if on_negative_curvature not in _NEGATIVE_CURVATURE:
        raise ValueError(f"on_negative_curvature must be one of {_NEGATIVE_CURVATURE}, got "
                         f"{on_negative_curvature!r}")
    dtype = _dtype(b, "cg", "b")
    b = tf.nest.map_structure(tf.convert_to_tensor, b)
    maxiter = 10 * tree.size(b) if maxiter is None else _check_int(maxiter, "maxiter", 1)
    tol = _check_tol(tol)
    raise_ = on_negative_curvature == "raise"
    threshold = 100 * _eps(dtype)

    def damped(v):
        av = _product(matvec, v, b, "cg")
        if isinstance(damping, (numbers.Number, np.number)) and damping == 0:
            return av
        return tree.axpy(damping, v, av)

    if x0 is None:
        x, r = tree.zeros_like(b), b
    else:
        tree.check_same(b, x0, "b", "x0")
        x = tf.nest.pack_sequence_as(b, [tf.convert_to_tensor(t) for t in tf.nest.flatten(x0)])
        r = tree.sub(b, damped(x))
    rr = tree.dot(r, r)
    stop_rr = tol ** 2 * tree.dot(b, b)
    zero = tf.zeros([], dtype)
    state = (tf.constant(0), x, r, r, rr, zero, zero, rr <= stop_rr, tf.constant(False))

    def cond(i, x, r, p, rr, pap, rq_max, done, negative):
        return tf.logical_and(i < maxiter, tf.logical_not(done))

    def body(i, x, r, p, rr, pap, rq_max, done, negative):
        ap = damped(p)
        pap, pp = tree.dot(p, ap), tree.dot(p, p)
        rq_max = tf.maximum(rq_max, tf.abs(pap) / pp)
        finite = tf.math.is_finite(pap)
        curved = pap > threshold * pp * rq_max
        if raise_:
            _assert_curvature(finite, curved, pap, pp, i, damping)
            step = tf.constant(True)
        else:
            step = tf.logical_or(curved, tf.logical_not(finite))
        one = tf.ones_like(pap)
        alpha = tf.where(step, rr / tf.where(step, pap, one), tf.zeros_like(pap))
        x = tree.axpy(alpha, p, x)
        r = tree.axpy(-alpha, ap, r)
        rr_new = tree.dot(r, r)
        beta = tf.where(step, rr_new / tf.where(rr > 0, rr, one), tf.zeros_like(pap))
        p = tree.axpy(beta, p, r)
        negative = tf.logical_not(step)
        done = tf.logical_or(tf.logical_or(negative, rr_new <= stop_rr), tf.logical_not(finite))
        i = i + tf.cast(step, tf.int32)
        rr = tf.where(step, rr_new, rr)
        return i, x, r, p, rr, pap, rq_max, done, negative

    i, x, _, _, rr, pap, _, _, negative = tf.while_loop(cond, body, state,
                                                        maximum_iterations=maxiter)
    return x, CGInfo(i, tf.sqrt(rr), pap, negative)


def _takes_index(matvec: Callable) -> bool:
    """Whether `matvec` is `matvec(v, k)` (a fresh product per term, as LiSSA's minibatches)
    rather than `matvec(v)`."""
    try:
        sig = inspect.signature(matvec)
    except (TypeError, ValueError):  # builtins without a signature take v alone
        return False
    try:
        sig.bind(None)
        return False
    except TypeError:
        pass
    try:
        sig.bind(None, 0)
        return True
    except TypeError:
        return False


@_no_autograph
def neumann(matvec: Callable[..., Tree], b: Tree, maxiter: int, tol: float = 0.0,
            step: Scalar = 1.0, damping: Scalar = 0.0) -> Tuple[Tree, NeumannInfo]:
    """The Neumann series of ``(A + damping I)^{-1} b``, written once for every family.

    It computes::

        x = step * sum_{k=0}^{K} (I - step (A + damping I))^k b,

    each term the previous one times ``(I - step (A + damping I))``, stopping after
    `maxiter` terms beyond the first or once a term's norm is ``<= tol ||b||``. It
    converges iff the spectral radius of ``I - step (A + damping I)`` is < 1
    (``0 < step < 2 / lambda_max`` for a positive definite ``A + damping I``). It is the
    truncated series of hypergradients (Lorraine et al. 2020: ``tol = 0``, exactly
    `maxiter` terms), an implicit solve with a convergence check (``tol > 0``;
    ``info.converged``), and LiSSA (Agarwal et al. 2017: ``step = 1 / scale``,
    ``matvec(v, k)`` drawing a fresh minibatch for term k).

    Args:
        matvec: ``v -> A v``, or ``(v, k) -> A_k v`` with k the term's index (an int32
            scalar tensor, 0 for the product giving the second term), on trees structured
            like `b`.
        b: the right-hand side, a tree of floating tensors of one dtype.
        maxiter: the most terms after the first, a Python int >= 0.
        tol: stop once a term's norm is ``<= tol ||b||``: a Python number >= 0; default 0,
            which runs all `maxiter` terms.
        step: the series' step: a Python number > 0 (applied at b's dtype) or a scalar
            tensor (cast to b's dtype); default 1.
        damping: added to A's diagonal: a Python number >= 0 or a scalar tensor of b's
            dtype; default 0.

    Returns:
        A tuple ``(x, info)``: ``x``, a tree of `b`'s structure, and a `NeumannInfo`.

    Raises:
        TypeError: `matvec` is not callable, or `b`'s leaves do not share one floating
            dtype.
        ValueError: `maxiter`, `tol`, `step` or `damping` is out of range, `b` is empty,
            or a product does not match `b`.
    """
    _check_matvec(matvec)
    dtype = _dtype(b, "neumann", "b")
    b = tf.nest.map_structure(tf.convert_to_tensor, b)
    maxiter = _check_int(maxiter, "maxiter", 0)
    tol = _check_tol(tol)
    for name, value in (("step", step), ("damping", damping)):
        if isinstance(value, (numbers.Number, np.number)) and (
                isinstance(value, bool) or not np.isfinite(value) or value < 0
                or (name == "step" and value == 0)):
            raise ValueError(f"neumann: {name} must be a finite number "
                             f"{'> 0' if name == 'step' else '>= 0'}, got {value!r}")
    indexed = _takes_index(matvec)
    step_t = tf.cast(step, dtype) if tf.is_tensor(step) else tf.constant(step, dtype)

    def next_term(k, term):
        av = _product(matvec if not indexed else (lambda v: matvec(v, k)), term, b, "neumann")
        if not (isinstance(damping, (numbers.Number, np.number)) and damping == 0):
            av = tree.axpy(damping, term, av)
        return tree.axpy(-step_t, av, term)

    b_norm = tree.norm(b)
    stop = tol * b_norm

    def cond(k, x, term, term_norm):
        return tf.logical_and(k < maxiter, term_norm > stop)

    def body(k, x, term, term_norm):
        term = next_term(k, term)
        return k + 1, tree.add(x, term), term, tree.norm(term)

    k, x, _, term_norm = tf.while_loop(cond, body, (tf.constant(0), b, b, b_norm),
                                       maximum_iterations=maxiter)
    converged = tf.logical_and(tf.math.is_finite(term_norm), term_norm <= stop)
    if tol == 0:
        converged = tf.constant(False)
    return tree.scale(step_t, x), NeumannInfo(k, term_norm, converged)


def _assert_curvature(finite: tf.Tensor, curved: tf.Tensor, pap: tf.Tensor, pp: tf.Tensor,
                      i: tf.Tensor, damping: Scalar) -> None:
    """Raise (eagerly) or assert (in a graph) that a CG direction has positive curvature."""
    shown = damping if isinstance(damping, (numbers.Number, np.number)) else "damping"
    what = f"p^T (A + {shown} I) p"
    fix = ("the system is singular or indefinite; add damping (> 0), use a positive definite "
           "operator (e.g. Gauss-Newton), or pass on_negative_curvature='stop' to keep the "
           "iterate reached")
    if tf.executing_eagerly():
        if not bool(finite):
            raise FloatingPointError(f"cg: {what} = {float(pap)} is not finite at iteration "
                                     f"{int(i)}: check matvec and b for NaN/inf")
        if not bool(curved):
            raise ValueError(f"cg: non-positive curvature {what} = {float(pap):.6e} (|p|^2 = "
                             f"{float(pp):.3e}) at iteration {int(i)}: {fix}")
        return
    tf.debugging.Assert(finite, [f"cg: {what} is not finite; check matvec and b for NaN/inf;"
                                 " curvature, iteration:", pap, i])
    tf.debugging.Assert(tf.logical_or(curved, tf.logical_not(finite)), [
        f"cg: non-positive curvature: {fix}. curvature {what}, |p|^2, iteration:", pap, pp, i])


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
    _check_matvec(matvec)
    if (v0 is None) == (like is None and seed is None):
        raise ValueError("power_iteration: pass either v0 (the start vector) or like and seed "
                         "(a random start shaped like `like`), not both")
    if v0 is None:
        if like is None or seed is None:
            raise ValueError("power_iteration: a random start needs both like and seed")
        v0 = tree.normal_like(like, seed)
    dtype = _dtype(v0, "power_iteration", "v0")
    maxiter = _check_int(maxiter, "maxiter", 1)
    tol = _check_tol(tol)
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
    _check_matvec(matvec)
    k = _check_int(k, "k", 1)
    dtype = _dtype(v0, "lanczos", "v0")
    if stop is not None and not callable(stop):
        raise TypeError(f"lanczos: stop must be a callable (alphas, betas, beta) -> bool, got "
                        f"{type(stop).__name__}")
    rtol = 1000 * _eps(dtype) if breakdown_rtol is None else _check_tol(breakdown_rtol,
                                                                          "breakdown_rtol")
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
