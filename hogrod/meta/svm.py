"""The Crammer-Singer multi-class SVM's dual, solved in graph and differentiated implicitly:
the solver of `hogrod.meta.svm_logits` and `hogrod.meta.metaoptnet`.

The primal (Crammer and Singer 2001, no bias; Lee et al. 2019): with x_i the support
embeddings and y_i their labels,
``min_W 1/2 sum_k ||w_k||**2 + c sum_i xi_i`` subject to
``w_{y_i} . x_i - w_k . x_i >= 1 - delta(k, y_i) - xi_i`` for every i and k. Its dual, over
alpha `[n, n_way]`, as MetaOptNet writes it:
``min 1/2 sum_k ||sum_i alpha_ik x_i||**2 + r/2 ||alpha||**2 - sum_i alpha_{i,y_i}``
subject to ``alpha_ik <= c delta(k, y_i)`` and ``sum_k alpha_ik = 0`` for every i; then
``w_k = sum_i alpha_ik x_i``. Its kernel is ``K = X X^T + r I`` (r: `kernel_ridge`).

The solver: the batched interior-point method of `hogrod.linalg.simplex_qp` on the slacks
``S = c Y - alpha`` (each row on a simplex of radius c), Mehrotra's predictor-corrector as in
MetaOptNet's own solver (qpth), its Newton systems solved by the Kronecker structure of the
dual's Hessian (m Cholesky factorizations of `n x n` per iteration, not one of `n m`), every
task of an episode at once; once its barrier has fallen far enough, each iteration polishes a
candidate (the equality-constrained QP on the guessed free coordinates, solved exactly) and
the first candidate whose optimality residual F meets the goal below is the solution. In one
traced `tf.while_loop`, always in float64 (the solution and its gradient cast back to the
embeddings' dtype): at float32's precision the residual cannot be driven far enough for the
active set (which bounds hold) to be right, and a wrong active set gives a gradient off by
percents with no error.

The optimality residual F (the KKT conditions reduced to the free coordinates of alpha,
alpha_ik < c delta(k, y_i)): with P the projection onto the directions that keep every
active bound and every row's sum, ``F(alpha) = P (K (P alpha + r) - Y) + (I - P) alpha - r``
(Y one-hot, r the part of alpha the constraints fix) plus a term ``min(lambda, 0)`` on the
active coordinates (lambda their bounds' multipliers, positive at the optimum, where the
term and its derivative vanish), zero only at the optimum. The implicit-function gradient
of alpha is ``-(dF/dX)^T w`` with ``(dF/dalpha) w = v``; the Jacobian ``P K P + I - P`` is
the identity off the range of P and, on it, the system of the polishing step (the
equality-constrained QP on the free coordinates), so w is solved directly by the same
block structure (`hogrod.linalg.simplex_kkt_solve`), and checked.

The stopping rule and the root check. The dual with penalty c and kernel K is c times the
dual with penalty 1 and kernel c K (alpha = c beta), and F is the same function of beta
there (its first term is the gradient ``K alpha - Y = (c K) beta - Y``; the others vanish
at the solver's feasible iterates). Near the solution ``F = (P K P + I - P)(alpha -
alpha*)``, whose part on the free coordinates has K's scale, while alpha* has c's: so
``||alpha - alpha*|| / c`` is about ``||F|| / (c lambda_min(K))``. A goal on ||F|| that does
not scale with c ||K|| bounds nothing when c ||K|| is small (at c = 1e-8 it is met after a
few iterations, logits 10-20% off). The goal is therefore

    ``||F(alpha)|| <= tol * min(1, c ||K||_2) * max(1, ||F(0)||)``

(||F(0)|| = sqrt(n (n_way - 1)), whatever c): where c ||K||_2 >= 1 (MetaOptNet's C = 0.1
on embeddings of norm above about 3) a goal relative to ||F(0)||; below, scaled with the
residual's own scale. In both regimes the error of alpha relative to c is then at most
about ``tol sqrt(n_way - 1)`` times K's condition number. The solver stops at that goal or
after `maxiter` iterations, and its output is checked against twice the goal (an error
naming `maxiter` and `tol` if it stopped short), so a gradient is never taken at a point
that is not the solution to the stated tolerance.
"""

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hogrod import checks, linalg
from hogrod.types import Scalar

__all__ = ["svm_dual", "SVM_MAXITER", "KERNEL_RIDGE", "SOLVE_DTYPE", "DEFAULT_TOL"]

#: `svm_logits`'s default iteration limit of the dual solver (interior-point iterations:
#: tens reach float64's precision).
SVM_MAXITER = 100
#: `svm_logits`'s default ridge on the dual's kernel: MetaOptNet's code adds the identity.
KERNEL_RIDGE = 1.0
#: The dtype the dual is solved and differentiated at, whatever the embeddings'.
SOLVE_DTYPE = tf.float64
#: The solver's default tolerance: half the square root of float64's machine epsilon (the
#: root check, at twice it, is then at the library's default, the square root).
DEFAULT_TOL = 0.5 * float(np.finfo(np.float64).eps) ** 0.5


# No Python control flow on tensors here: AutoGraph's conversion of it and of the implicit
# differentiation it calls would only multiply a caller's trace time (by about 4).
@tf.autograph.experimental.do_not_convert
def svm_dual(support: tf.Tensor, labels: tf.Tensor, n_way: Scalar, c: float, maxiter: int,
             tol: Optional[float], batched: bool, asserts: Sequence = (),
             where: str = "hogrod.meta.svm_logits",
             kernel_ridge: float = KERNEL_RIDGE) -> tf.Tensor:
    """The Crammer-Singer dual solution alpha `[..., n, n_way]` (see the module docstring),
    with its implicit gradient with respect to `support`.

    Args:
      support: X, `[n, d]` (or `[tasks, n, d]` when batched), floating, checked by the
        caller (`heads.episode`); its values are checked finite here.
      labels: int32 `[n]` (or `[tasks, n]`), checked.
      n_way: the number of classes (a Python int or an integer scalar tensor).
      c: the slack penalty, a Python number > 0.
      maxiter: the solver's iteration limit, an int >= 1.
      tol: the solver's tolerance (see the module docstring), > 0; None: `DEFAULT_TOL`.
      batched: whether support and labels carry a leading task axis. Every leading axis
        is a batch of tasks either way, each solved, checked and differentiated on its own
        (one batched solve).
      asserts: value checks to run first.
      where: the public function, first in messages (`hogrod.meta.metaoptnet`'s messages
        also name its gin bindings).
      kernel_ridge: r >= 0, the dual's kernel ``X X^T + r I``.

    Returns:
      alpha, at support's dtype.

    Raises:
      ArgumentError: `c` or `tol` not positive, `maxiter` < 1, `kernel_ridge` negative,
        or (eagerly; an Assert in a graph) support embeddings not finite.
      ValueError: (eagerly; an Assert in a graph) the solver stopped by `maxiter` short of
        its goal, or the implicit gradient's linear solve failed.
    """
    c = checks.positive(c, "c", where)
    ridge = checks.nonnegative(kernel_ridge, "kernel_ridge", where)
    maxiter = checks.integer(maxiter, "maxiter", where, least=1)
    tol = DEFAULT_TOL if tol is None else checks.positive(tol, "tol", where)
    given = support.dtype
    finite = checks.require(
        tf.reduce_all(tf.math.is_finite(support)),
        f"{where}: the support embeddings have NaN or infinite entries"
        + ("" if where.endswith("svm_logits") else " (the model's outputs on the support "
           "set)") + "; the SVM needs finite ones")
    # the gradient's linear solve is checked at the embeddings' precision (the output
    # gradient arrives at it)
    solve_tol = float(np.finfo(given.as_numpy_dtype).eps) ** 0.75
    one_hot = tf.one_hot(labels, tf.cast(n_way, tf.int32), dtype=SOLVE_DTYPE)
    del batched  # every task of a leading axis is solved, checked and differentiated alone

    @tf.custom_gradient
    def solve(x):
        args = (tf.zeros_like(one_hot), tf.stop_gradient(x), one_hot,
                tf.constant(c, SOLVE_DTYPE), tf.constant(maxiter),
                tf.constant(tol, SOLVE_DTYPE), tf.constant(ridge, SOLVE_DTYPE))
        # eagerly, the loop as one traced function (an eager while loop runs op by op)
        alpha, residual, goal = (_solve_traced(*args) if tf.executing_eagerly()
                                 else _solve_dual(*args))
        alpha = _converged(alpha, residual, goal, maxiter, tol, where)

        def gradient(v):
            # the implicit-function gradient -(dF/dX)^T w at the solution, (dF/dalpha) w = v
            w = _implicit_solve(alpha, x, one_hot, c, ridge, v, solve_tol, where)
            with tf.GradientTape() as tape:
                tape.watch(x)
                f = _kkt(alpha, x, one_hot, c, ridge)
            return -tape.gradient(f, x, output_gradients=w)

        return alpha, gradient

    support = tf.cast(_with(list(asserts) + finite, support), SOLVE_DTYPE)  # gradient flows
    return tf.cast(solve(support), given)


def _with(asserts, t):
    with tf.control_dependencies(asserts):
        return tf.identity(t)


def _converged(alpha, residual, goal, maxiter, tol, where):
    """alpha, checked to be the dual's solution to twice the solver's goal (per task)."""
    ok = tf.logical_and(tf.math.is_finite(residual), residual <= 2 * goal)
    found = ""
    if tf.executing_eagerly() and not bool(tf.reduce_all(ok)):
        worst = int(tf.argmax(tf.reshape(residual / goal, [-1])))
        found = (f" (||F|| = {float(tf.reshape(residual, [-1])[worst]):.3e} against "
                 f"{float(tf.reshape(2 * goal, [-1])[worst]):.3e})")
    gin = (" (gin: metaoptnet.maxiter, metaoptnet.tol, metaoptnet.kernel_ridge)"
           if where.endswith("metaoptnet") else "")
    asserts = checks.require(
        ok, f"{where}: the SVM's dual solver stopped at maxiter={maxiter} iterations short "
            f"of its tolerance tol={tol:.3g}{found}, so its solution and gradient would be "
            "wrong: raise maxiter, or raise tol for a looser solve (kernel_ridge > 0 also "
            f"conditions the dual better on embeddings of large norm){gin}",
        error=ValueError, data=["||F|| =", residual, "2 * goal =", 2 * goal])
    # and NaN where it failed: XLA compiles an Assert to nothing, and a NaN reaches the
    # train step's guard
    nan = tf.constant(np.nan, alpha.dtype)
    return _with(asserts, tf.where(ok[..., None, None], alpha, nan))


def _implicit_solve(alpha, support, one_hot, c, ridge, v, tol, where):
    """w with ``(P K P + I - P) w = v``, the Jacobian of F at the solution alpha (symmetric):
    on the range of P, ``P K u = P v`` is the equality-constrained system of the free
    coordinates (`hogrod.linalg.simplex_kkt_solve`, solved directly); off it, the identity.
    Checked, else an error: a small backward error, ``||P (K u - v)|| <= tol (||v|| +
    ||K|| ||u||)``, and a condition number, estimated as ``||K|| ||u|| / ||v||``, below
    ``1 / (100 n eps)`` (a singular block, solved with the solve's shift of ``10 n eps
    ||K||``, reaches ``1 / (10 n eps)``)."""
    bound = tf.constant(c, alpha.dtype) * one_hot
    free = tf.cast(bound - alpha > 0, alpha.dtype)
    gram = _kernel(support, tf.constant(ridge, alpha.dtype))

    def project(a):  # P: each row centred on its free coordinates, zero elsewhere
        return free * (a - tf.reduce_sum(free * a, -1, keepdims=True)
                       / tf.reduce_sum(free, -1, keepdims=True))

    u = linalg.simplex_kkt_solve(gram, free, v, tf.zeros_like(v[..., 0]))
    residual = tf.norm(project(tf.linalg.matmul(gram, u) - v), axis=[-2, -1])
    size = tf.norm(v, axis=[-2, -1])
    image = tf.norm(gram, axis=[-2, -1]) * tf.norm(u, axis=[-2, -1])  # ||K|| ||u||
    n = tf.cast(tf.shape(v)[-2], v.dtype)
    ok = tf.reduce_all([tf.math.is_finite(residual), residual <= tol * (size + image),
                        image * 100 * n * np.finfo(np.float64).eps <= size], axis=0)
    asserts = checks.require(
        ok, f"{where}: the implicit gradient's linear solve missed tol={tol:.1e}: either the "
            "dual solution is not unique (support embeddings linearly dependent, e.g. more "
            "support examples than the embedding width, with kernel_ridge 0) or the system is "
            "too ill-conditioned (embeddings of large norm against kernel_ridge: a larger "
            "kernel_ridge helps)", error=ValueError,
        data=["residual =", residual, "||K|| ||u|| =", image, "||v|| =", size])
    w = tf.where(ok[..., None, None], u + v - project(v), tf.constant(np.nan, v.dtype))
    return _with(asserts, w)  # NaN where it failed: under XLA the Assert is compiled away


def _kkt(alpha, support, one_hot, c, ridge):
    """The reduced KKT residual F(alpha) (zero exactly at the dual solution).

    Per example i, the free set S_i = {k : alpha_ik < c delta(k, y_i)} (at least one k,
    since the slacks b = c one_hot - alpha sum to c); P_i centers a row on S_i and zeroes
    it elsewhere; r_i is c delta(k, y_i) on the active coordinates and, on S_i, the value
    that makes the row sum zero spread evenly. The sets are constants of the tape. On the
    active coordinates a term ``min(lambda_ik, 0)`` (lambda the bound's multiplier) makes
    the residual zero only at the optimum, not at every point that the reduced equations
    hold at (alpha = 0 among them). The kernel is ``X X^T + ridge I``.
    """
    c = c if isinstance(c, tf.Tensor) else tf.constant(c, alpha.dtype)  # exact at float64
    ridge = ridge if isinstance(ridge, tf.Tensor) else tf.constant(ridge, alpha.dtype)
    bound = c * one_hot
    free = tf.stop_gradient(tf.cast(bound - alpha > 0, alpha.dtype))
    count = tf.reduce_sum(free, -1, keepdims=True)

    def project(a):
        return free * (a - tf.reduce_sum(free * a, -1, keepdims=True) / count)

    fixed = (1 - free) * bound
    r = fixed - free * tf.reduce_sum(fixed, -1, keepdims=True) / count
    gram = _kernel(support, ridge)
    # the multipliers of the active bounds, mean_S(g) - g_k, must be >= 0; where they are
    # (strictly, at a solution) this term and its derivative are zero
    g = tf.linalg.matmul(gram, alpha) - one_hot
    multipliers = tf.reduce_sum(free * g, -1, keepdims=True) / count - g
    signs = (1 - free) * tf.minimum(multipliers, tf.zeros_like(multipliers))
    return (project(tf.linalg.matmul(gram, project(alpha) + r) - one_hot) + alpha - project(alpha)
            - r + signs)


def _kernel(support, ridge):
    """``X X^T + ridge I`` `[..., n, n]` of support X `[..., n, d]`."""
    gram = tf.linalg.matmul(support, support, transpose_b=True)
    return gram + ridge * tf.eye(tf.shape(gram)[-1], dtype=gram.dtype)


def _solve_dual(init, support, one_hot, c, maxiter, tol, ridge):
    """The dual by `hogrod.linalg.simplex_qp` on its slacks ``S = c Y - alpha`` (rows on
    simplices of radius c), each polished candidate accepted where ``||F|| <= goal = tol *
    min(1, c ||K||_2) * max(1, ||F(init)||)`` per task (see the module docstring), or
    `maxiter` interior-point iterations; never differentiated. c, maxiter, tol and ridge are
    tensors (one trace serves every value). Returns alpha, ||F(alpha)|| and the goal, per
    task."""
    bound = c * one_hot
    gram = _kernel(support, ridge)
    top = tf.linalg.eigvalsh(gram)[..., -1]  # ||K||_2: K is positive semi-definite

    def residual(a):
        return tf.norm(_kkt(a, support, one_hot, c, ridge), axis=[-2, -1])

    start = residual(init)
    goal = (tol * tf.minimum(tf.ones_like(top), c * top)
            * tf.maximum(tf.ones_like(start), start))
    # in the slacks the objective is 1/2 sum_k s_k^T K s_k + <Y - K c Y, S> + constant
    result = linalg.simplex_qp(gram, one_hot - tf.linalg.matmul(gram, bound), c, maxiter,
                               lambda s: residual(bound - s) <= goal)
    alpha = bound - result.solution  # exactly the bound where a slack is exactly zero
    return alpha, residual(alpha), goal


# Traced once per input signature (shapes generalized: reduce_retracing), for eager calls.
_solve_traced = tf.function(_solve_dual, reduce_retracing=True, autograph=False)
