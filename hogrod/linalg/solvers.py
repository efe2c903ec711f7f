"""The linear solvers: conjugate gradient and the Neumann series (`hogrod.linalg.cg`,
`hogrod.linalg.neumann`)."""

import collections
import collections.abc
import inspect
import numbers
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from hogrod import checks, tree
from hogrod.linalg.common import _dtype, _eps, _no_autograph, _product
from hogrod.types import MatVec, Scalar, Tree

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

_NEGATIVE_CURVATURE = ("raise", "stop")


CGIterates = collections.namedtuple("CGIterates", ["iterates", "steps", "quadratic"])
CGIterates.__doc__ = """The iterates a `cg` solve kept (its `keep=` argument).

Attributes:
    iterates: a tree like b, each leaf with a leading axis of ``len(keep)``: entry j is the
        iterate after ``keep[j]`` steps, or the last iterate where the solve stopped
        earlier (then every later entry is that iterate too).
    steps: the steps each entry took, ``min(keep[j], info.iterations)``, int32
        ``[len(keep)]``.
    quadratic: the quadratic CG minimizes at each entry,
        ``1/2 x^T (A + damping I) x - b^T x``, ``[len(keep)]`` of b's dtype, from CG's
        recurrences (no further product; exact up to rounding).
"""


@_no_autograph
def cg(matvec: MatVec, b: Tree, x0: Optional[Tree] = None, maxiter: Optional[int] = None,
       tol: Scalar = 1e-6, damping: Scalar = 0.0, on_negative_curvature: str = "raise",
       preconditioner: Optional[MatVec] = None, keep: Optional[Sequence[int]] = None
       ) -> Union[Tuple[Tree, CGInfo], Tuple[Tree, CGInfo, CGIterates]]:
    """Conjugate gradient for ``(A + damping I) x = b``, A symmetric.

    From ``x_0`` (zeros by default), ``r_0 = b - (A + damping I) x_0``, ``p_0 = r_0``, each
    step is::

        alpha = r^T r / p^T (A + damping I) p,  x += alpha p,  r -= alpha (A + damping I) p,
        p = r + (r_new^T r_new / r^T r) p,

    until ``||r|| <= tol ||b||`` or `maxiter` steps. With a `preconditioner` (``v -> M^{-1}
    v``, M symmetric positive definite) it is preconditioned CG: ``z = M^{-1} r``,
    ``p_0 = z_0`` and ``r^T z`` in place of ``r^T r`` in alpha and beta, the iterates
    those of CG on ``M^{-1/2} (A + damping I) M^{-1/2}``; the stopping test stays on
    ``||r||``. CG needs ``A + damping I`` positive definite: a direction of curvature
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
        tol: the relative residual tolerance: a Python number >= 0 or a scalar tensor
            (cast to b's dtype; a tolerance computed in the graph, such as a forcing
            sequence); default 1e-6 (0 runs until the residual is exactly 0 or `maxiter`).
        damping: added to A's diagonal: a Python number (applied at b's dtype) or a scalar
            tensor of b's dtype; default 0.
        on_negative_curvature: "raise" (default) or "stop", as above.
        preconditioner: ``v -> M^{-1} v`` on trees like `b`, M symmetric positive definite;
            None (default): no preconditioning.
        keep: step counts whose iterates to keep (Martens' CG backtracking), Python ints
            >= 0 in increasing order; None (default) keeps none. With it the result has a
            third entry, a `CGIterates`.

    Returns:
        A tuple ``(x, info)``: the solution ``x``, a tree of `b`'s structure, and a
        `CGInfo`; with `keep`, ``(x, info, kept)``, `kept` a `CGIterates`.

    Raises:
        TypeError: `matvec` or `preconditioner` is not callable, or `b`'s leaves do not
            share one floating dtype.
        ValueError: `on_negative_curvature`, `maxiter`, `tol` or `keep` is invalid, `b` is
            empty, `x0` or a product does not match `b`, or (eagerly, with "raise") a
            direction of non-positive curvature is met.
        FloatingPointError: eagerly, with "raise", a non-finite curvature is met.
    """
    checks.function(matvec, "matvec", "cg", "matvec(v) -> A v")
    if on_negative_curvature not in _NEGATIVE_CURVATURE:
        raise ValueError(f"on_negative_curvature must be one of {_NEGATIVE_CURVATURE}, got "
                         f"{on_negative_curvature!r}")
    dtype = _dtype(b, "cg", "b")
    b = tf.nest.map_structure(tf.convert_to_tensor, b)
    maxiter = 10 * tree.size(b) if maxiter is None else checks.integer(maxiter, "maxiter",
                                                                       "cg", 1)
    tol = tf.cast(tol, dtype) if tf.is_tensor(tol) else checks.nonnegative(tol, "tol", "cg")
    if preconditioner is not None:
        checks.function(preconditioner, "preconditioner", "cg", "preconditioner(v) -> M^-1 v")
    keep = None if keep is None else _check_keep(keep)
    raise_ = on_negative_curvature == "raise"
    threshold = 100 * _eps(dtype)

    def damped(v):
        av = _product(matvec, v, b, "cg")
        if isinstance(damping, (numbers.Number, np.number)) and damping == 0:
            return av
        return tree.axpy(damping, v, av)

    def precondition(r):
        return r if preconditioner is None else _product(preconditioner, r, b, "cg")

    if x0 is None:
        x, r = tree.zeros_like(b), b
    else:
        tree.check_same(b, x0, "b", "x0")
        x = tf.nest.pack_sequence_as(b, [tf.convert_to_tensor(t) for t in tf.nest.flatten(x0)])
        r = tree.sub(b, damped(x))
    z = precondition(r)
    rr = tree.dot(r, r)
    stop_rr = tol ** 2 * tree.dot(b, b) if not tf.is_tensor(tol) else tol * tol * tree.dot(b, b)
    zero = tf.zeros([], dtype)
    # the extra loop state: r^T z (preconditioned), the quadratic and the kept iterates
    extra = () if preconditioner is None else (tree.dot(r, z),)
    if keep is not None:
        extra += _kept_start(x, r, b, keep)
    state = (tf.constant(0), x, r, z, rr, zero, zero, rr <= stop_rr, tf.constant(False)) + extra

    def cond(i, x, r, p, rr, pap, rq_max, done, negative, *extra):
        return tf.logical_and(i < maxiter, tf.logical_not(done))

    def body(i, x, r, p, rr, pap, rq_max, done, negative, *extra):
        rz = rr if preconditioner is None else extra[0]
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
        alpha = tf.where(step, rz / tf.where(step, pap, one), tf.zeros_like(pap))
        x = tree.axpy(alpha, p, x)
        r = tree.axpy(-alpha, ap, r)
        rr_new = tree.dot(r, r)
        z = precondition(r)
        rz_new = rr_new if preconditioner is None else tree.dot(r, z)
        beta = tf.where(step, rz_new / tf.where(rz > 0, rz, one), tf.zeros_like(pap))
        p = tree.axpy(beta, p, z)
        negative = tf.logical_not(step)
        done = tf.logical_or(tf.logical_or(negative, rr_new <= stop_rr), tf.logical_not(finite))
        i = i + tf.cast(step, tf.int32)
        rr = tf.where(step, rr_new, rr)
        out = (i, x, r, p, rr, pap, rq_max, done, negative)
        if preconditioner is not None:
            out += (tf.where(step, rz_new, rz),)
        if keep is not None:
            # each step lowers the quadratic by alpha r^T z / 2
            out += _kept_update(extra[-3:], keep, i, x, extra[-3] - alpha * rz / 2)
        return out

    final = tf.while_loop(cond, body, state, maximum_iterations=maxiter)
    i, x, _, _, rr, pap, _, _, negative = final[:9]
    info = CGInfo(i, tf.sqrt(rr), pap, negative)
    if keep is None:
        return x, info
    _, iterates, quadratic = final[-3:]
    return x, info, CGIterates(iterates, tf.minimum(tf.constant(keep), i), quadratic)


def _check_keep(keep: Sequence[int]) -> Tuple[int, ...]:
    """`keep` as a tuple of increasing Python ints >= 0."""
    if isinstance(keep, (str, bytes)) or not isinstance(keep, collections.abc.Sequence) \
            or not keep:
        raise checks.ArgumentError(f"cg: keep must be a non-empty sequence of step counts, "
                                   f"got {keep!r}")
    out = tuple(checks.integer(k, f"keep[{j}]", "cg") for j, k in enumerate(keep))
    if any(a >= b for a, b in zip(out, out[1:])):
        raise checks.ArgumentError(f"cg: keep must be increasing, got {keep!r}")
    return out


def _kept_start(x: Tree, r: Tree, b: Tree, keep: Tuple[int, ...]) -> tuple:
    """The loop state of the kept iterates: the quadratic at x_0, ``-1/2 x_0^T (b + r_0)``,
    and every entry x_0."""
    quadratic = -tree.dot(x, tree.add(b, r)) / 2
    iterates = tf.nest.map_structure(lambda t: tf.stack([t] * len(keep)), x)
    return quadratic, iterates, tf.fill([len(keep)], quadratic)


def _kept_update(kept: tuple, keep: Tuple[int, ...], i: tf.Tensor, x: Tree,
                 quadratic: tf.Tensor) -> tuple:
    """After step i, the entries kept at >= i steps hold x (the later ones until reached)."""
    _, iterates, values = kept
    open_ = tf.constant(keep) >= i

    def put(stack, t):
        mask = tf.reshape(open_, [len(keep)] + [1] * t.shape.rank)
        return tf.where(mask, t[None], stack)

    return (quadratic, tf.nest.map_structure(put, iterates, x),
            tf.where(open_, quadratic, values))


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
    checks.function(matvec, "matvec", "neumann", "matvec(v) -> A v")
    dtype = _dtype(b, "neumann", "b")
    b = tf.nest.map_structure(tf.convert_to_tensor, b)
    maxiter = checks.integer(maxiter, "maxiter", "neumann", 0)
    tol = checks.nonnegative(tol, "tol", "neumann")
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
