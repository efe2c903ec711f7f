"""Few-shot classification heads: the query logits of a classifier fitted to the support
embeddings of one episode.

Embeddings are `[n, d]` (support) and `[q, d]` (query) of one floating dtype, labels an
integer `[n]` in `0..n_way-1` with every class present; each head returns the query logits
`[q, n_way]` at the embeddings' dtype and is differentiable with respect to both sets of
embeddings (and `l2`, `scale`, `bias` when they are tensors):

- `prototype_logits`: Prototypical Networks (Snell et al. 2017), minus the squared
  Euclidean distance to each class mean;
- `ridge_logits`: R2D2 (Bertinetto et al. 2019), ridge regression onto one-hot targets in
  closed form, in its Woodbury form (the cost is in the number of support examples);
- `svm_logits`: MetaOptNet-SVM (Lee et al. 2019), the Crammer-Singer multi-class SVM
  without bias (its dual's kernel plus MetaOptNet's identity by default), solved in its
  dual by accelerated projected gradient in graph and differentiated implicitly
  (`hogrod.implicit.custom_root`) at its solution, never through the solver's iterations.

Checks: static ones (ranks, dtypes, widths, `n_way`, a Python `c` or `l2`) raise
`hogrod.checks.ArgumentError` when called or traced; those on values (labels in range,
every class present, a tensor `c` or `l2` positive) raise it eagerly and are
`tf.debugging.Assert`s in a graph (`tf.errors.InvalidArgumentError` when run).
"""

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hogrod import checks, implicit, implicit_solves, linalg, tree
from hogrod.types import Scalar, TensorLike

__all__ = ["prototype_logits", "ridge_logits", "svm_logits", "SVM_MAXITER", "KERNEL_RIDGE"]

#: `svm_logits`'s default iteration limit of the dual solver.
SVM_MAXITER = 1000
#: `svm_logits`'s default ridge on the dual's kernel: MetaOptNet's code adds the identity.
KERNEL_RIDGE = 1.0


def _n_way(n_way, where):
    """A Python int >= 1, or an integer scalar tensor (checked to be >= 1 when run)."""
    if isinstance(n_way, (tf.Tensor, tf.Variable)):
        if not n_way.dtype.is_integer or n_way.shape.rank != 0:
            raise checks.ArgumentError(f"{where}: n_way must be an integer >= 1 or an integer "
                                       f"scalar tensor, got {checks.describe(n_way)}")
        return n_way
    return checks.integer(n_way, "n_way", where, least=1)


def episode(support_embeddings: TensorLike, support_labels: TensorLike,
            query_embeddings: TensorLike, n_way: Scalar, where: str) -> tuple:
    """The checked inputs of a head, with one-hot support targets.

    Args:
      support_embeddings: `[..., n, d]` floating.
      support_labels: `[..., n]` integer in `0..n_way-1`, every class present.
      query_embeddings: `[..., q, d]` of the support's dtype.
      n_way: the number of classes (a Python int or an integer scalar tensor).
      where: the public function, first in every message.

    Returns:
      `(support, labels, query, one_hot, counts, asserts)`: the embeddings as tensors, the
      labels as int32, the one-hot targets `[..., n, n_way]` and per-class counts
      `[..., n_way]` at the embeddings' dtype, and the value checks (`[]` eagerly).
    """
    n_way = _n_way(n_way, where)
    xs = tf.convert_to_tensor(support_embeddings)
    xq = tf.convert_to_tensor(query_embeddings, dtype_hint=xs.dtype)
    ys = tf.convert_to_tensor(support_labels)
    if not xs.dtype.is_floating:
        raise checks.ArgumentError(f"{where}: support_embeddings must be floating, got "
                                   f"{checks.describe(xs)}")
    if xq.dtype != xs.dtype:
        raise checks.ArgumentError(f"{where}: query_embeddings must have the support "
                                   f"embeddings' dtype {xs.dtype.name}, got "
                                   f"{checks.describe(xq)}")
    if not ys.dtype.is_integer:
        raise checks.ArgumentError(f"{where}: support_labels must be integers in "
                                   f"0..n_way-1, got {checks.describe(ys)}")
    if xs.shape.rank is not None and xs.shape.rank < 2:
        raise checks.ArgumentError(f"{where}: support_embeddings must be [n, d], got "
                                   f"{checks.describe(xs)}")
    if xs.shape.rank is not None and xq.shape.rank is not None and (
            xq.shape.rank != xs.shape.rank or ys.shape.rank != xs.shape.rank - 1):
        raise checks.ArgumentError(f"{where}: support_embeddings [n, d], support_labels [n] "
                                   f"and query_embeddings [q, d] expected, got "
                                   f"{checks.describe([xs, ys, xq])}")
    width, query_width = xs.shape[-1], xq.shape[-1]
    if width is not None and query_width is not None and width != query_width:
        raise checks.ArgumentError(f"{where}: the embeddings' widths differ: support_embeddings "
                                   f"{checks.describe(xs)}, query_embeddings "
                                   f"{checks.describe(xq)}")
    if not xs.shape[:-1].is_compatible_with(ys.shape):
        raise checks.ArgumentError(f"{where}: support_labels must have one label per support "
                                   f"embedding, got {checks.describe(ys)} for "
                                   f"{checks.describe(xs)}")
    ys = tf.cast(ys, tf.int32)
    n_way_t = tf.cast(n_way, tf.int32)
    asserts = checks.require(n_way_t >= 1, f"{where}: n_way must be >= 1")
    asserts += checks.require(tf.logical_and(ys >= 0, ys < n_way_t),
                              f"{where}: support_labels must be in 0..n_way-1 (n_way={n_way})")
    with tf.control_dependencies(asserts):  # one_hot maps a label out of range to zeros
        one_hot = tf.one_hot(ys, n_way_t, dtype=xs.dtype)
    counts = tf.reduce_sum(one_hot, axis=-2)
    asserts += checks.require(counts > 0, f"{where}: a class in 0..n_way-1 (n_way={n_way}) "
                              "has no support example; every class needs at least one")
    return xs, ys, xq, one_hot, counts, asserts


def _positive(value, arg, dtype, where):
    """A Python number (checked > 0) at `dtype`, or a tensor (asserted > 0), and the checks."""
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        value = tf.cast(value, dtype)
        return value, checks.require(value > 0, f"{where}: {arg} must be positive")
    return tf.constant(checks.positive(value, arg, where), dtype), []


def _with(asserts, t):
    with tf.control_dependencies(asserts):
        return tf.identity(t)


def prototype_logits(support_embeddings: TensorLike, support_labels: TensorLike,
                     query_embeddings: TensorLike, n_way: Scalar) -> tf.Tensor:
    """Prototypical Networks' logits: minus the squared distance to each class mean.

    The prototype of class k is the mean of the support embeddings labelled k; the logit of
    query j for class k is ``-||query_j - prototype_k||**2`` (Snell et al. 2017), so the
    argmax is the nearest class mean.

    Args:
      support_embeddings: `[n, d]` floating.
      support_labels: integer `[n]` in `0..n_way-1`, every class at least once.
      query_embeddings: `[q, d]`, the support's dtype and width.
      n_way: the number of classes, a Python int >= 1 (or an integer scalar tensor).

    Returns:
      The logits, `[q, n_way]` at the embeddings' dtype.

    Raises:
      ArgumentError: mismatched ranks, dtypes or widths, a label outside `0..n_way-1` or a
        class without support examples (in a graph the value checks are Asserts).
    """
    xs, _, xq, one_hot, counts, asserts = episode(
        support_embeddings, support_labels, query_embeddings, n_way,
        "hogrod.meta.prototype_logits")
    prototypes = _with(asserts, prototypes_of(xs, one_hot, counts))
    return distance_logits(xq, prototypes)


def prototypes_of(support: tf.Tensor, one_hot: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """Class means `[..., n_way, d]` of support `[..., n, d]` under one-hot `[..., n, n_way]`.

    Args:
      support: the support embeddings.
      one_hot: the one-hot targets.
      counts: examples per class `[..., n_way]` (all > 0).

    Returns:
      The prototypes.
    """
    return tf.linalg.matmul(one_hot, support, transpose_a=True) / counts[..., None]


def distance_logits(query: tf.Tensor, prototypes: tf.Tensor) -> tf.Tensor:
    """``-||query_j - prototype_k||**2`` as `[..., q, n_way]`.

    Args:
      query: `[..., q, d]`.
      prototypes: `[..., n_way, d]`.

    Returns:
      The logits.
    """
    cross = tf.linalg.matmul(query, prototypes, transpose_b=True)
    return (2 * cross - tf.reduce_sum(tf.square(query), -1)[..., :, None]
            - tf.reduce_sum(tf.square(prototypes), -1)[..., None, :])


def ridge_logits(support_embeddings: TensorLike, support_labels: TensorLike,
                 query_embeddings: TensorLike, n_way: Scalar, l2: Scalar = 1.0,
                 scale: Optional[Scalar] = None, bias: Optional[Scalar] = None) -> tf.Tensor:
    """R2D2's logits: ridge regression onto one-hot targets, solved in closed form.

    With X the support `[n, d]` and Y its one-hot targets `[n, n_way]`, the ridge solution
    ``W = argmin ||X W - Y||**2 + l2 ||W||**2 = X^T (X X^T + l2 I)^{-1} Y`` (the Woodbury
    form: one `[n, n]` Cholesky solve, the cost in the number of support examples, not in
    d); the logits are ``scale * (query W) + bias`` (Bertinetto et al. 2019).

    Args:
      support_embeddings: `[n, d]` floating.
      support_labels: integer `[n]` in `0..n_way-1`, every class at least once.
      query_embeddings: `[q, d]`, the support's dtype and width.
      n_way: the number of classes, a Python int >= 1 (or an integer scalar tensor).
      l2: the ridge penalty, > 0: a Python number (applied at the embeddings' dtype) or a
        scalar tensor (differentiable; asserted positive when run).
      scale: a factor of the logits (a number or a scalar tensor); None: 1.
      bias: added to every logit (a number or a scalar tensor); None: 0.

    Returns:
      The logits, `[q, n_way]` at the embeddings' dtype.

    Raises:
      ArgumentError: mismatched ranks, dtypes or widths, a label outside `0..n_way-1`, a
        class without support examples, or `l2` not positive.
    """
    where = "hogrod.meta.ridge_logits"
    xs, _, xq, one_hot, _, asserts = episode(support_embeddings, support_labels,
                                             query_embeddings, n_way, where)
    l2, more = _positive(l2, "l2", xs.dtype, where)
    cross = tf.linalg.matmul(xq, xs, transpose_b=True)  # [q, n]: the cost is in n, not d
    logits = _with(asserts + more, tf.linalg.matmul(cross, ridge_dual(xs, one_hot, l2)))
    return affine(logits, scale, bias)


def ridge_dual(support: tf.Tensor, one_hot: tf.Tensor, l2: tf.Tensor) -> tf.Tensor:
    """``(X X^T + l2 I)^{-1} Y`` `[..., n, n_way]` by Cholesky (the Woodbury form's solve).

    Args:
      support: X, `[..., n, d]`.
      one_hot: Y, `[..., n, n_way]`.
      l2: the ridge penalty, a scalar tensor at X's dtype.

    Returns:
      The dual coefficients A: the ridge weights are ``X^T A``.
    """
    gram = tf.linalg.matmul(support, support, transpose_b=True)
    n = tf.shape(gram)[-1]
    chol = tf.linalg.cholesky(gram + l2 * tf.eye(n, dtype=gram.dtype))
    return tf.linalg.cholesky_solve(chol, one_hot)


def affine(logits: tf.Tensor, scale: Optional[Scalar], bias: Optional[Scalar]) -> tf.Tensor:
    """``scale * logits + bias`` (None: 1 and 0), numbers applied at the logits' dtype.

    Args:
      logits: a tensor.
      scale: None, a Python number or a scalar tensor.
      bias: None, a Python number or a scalar tensor.

    Returns:
      The transformed logits.
    """
    def at(v):
        if isinstance(v, (tf.Tensor, tf.Variable, np.ndarray)):
            return tf.cast(v, logits.dtype)
        return tf.constant(checks.number(v, "scale or bias", "hogrod.meta.ridge_logits"),
                           logits.dtype)
    if scale is not None:
        logits = at(scale) * logits
    if bias is not None:
        logits = logits + at(bias)
    return logits


def svm_logits(support_embeddings: TensorLike, support_labels: TensorLike,
               query_embeddings: TensorLike, n_way: Scalar, c: float = 0.1,
               maxiter: int = SVM_MAXITER, tol: Optional[float] = None,
               kernel_ridge: float = KERNEL_RIDGE,
               solve_dtype: Optional[str] = None) -> tf.Tensor:
    """MetaOptNet-SVM's logits: a Crammer-Singer multi-class SVM fitted to the support.

    The primal (Crammer and Singer 2001, no bias; Lee et al. 2019): with x_i the support
    embeddings and y_i their labels,
    ``min_W 1/2 sum_k ||w_k||**2 + c sum_i xi_i`` subject to
    ``w_{y_i} . x_i - w_k . x_i >= 1 - delta(k, y_i) - xi_i`` for every i and k, so
    ``xi_i = max_k (1 - delta(k, y_i) + w_k . x_i - w_{y_i} . x_i) >= 0``: `c` multiplies
    the sum of the slacks. Its dual, over alpha `[n, n_way]`, as MetaOptNet writes it:
    ``min 1/2 sum_k ||sum_i alpha_ik x_i||**2 - sum_i alpha_{i,y_i}`` subject to
    ``alpha_ik <= c delta(k, y_i)`` and ``sum_k alpha_ik = 0`` for every i; then
    ``w_k = sum_i alpha_ik x_i`` and the logits are ``query W^T`` `[q, n_way]`.

    `kernel_ridge` (r) adds ``r/2 ||alpha||**2`` to the dual, its kernel ``X X^T + r I``
    in place of ``X X^T``, as MetaOptNet's code does (r = 1, "to avoid PSD errors" of its QP
    solver): the SVM of the support embeddings each extended by ``sqrt(r)`` times a unit
    vector of its own (zero for the queries, so the logits are still ``query W^T``). The dual
    is then strongly convex: its solution, and so the implicit gradient, is unique even
    when the support embeddings are linearly dependent (repeated examples, more examples
    than the embedding width), where with r = 0 the gradient's linear solve may fail. r = 0
    is the plain Crammer-Singer SVM.

    The dual is solved by projected gradient with Nesterov acceleration and adaptive
    restart (O'Donoghue and Candes 2015), step 1 / the largest eigenvalue of the kernel,
    each example's row projected onto its constraint set (a projection onto a simplex of
    radius c), from alpha = 0, in a `tf.while_loop` (one traced loop) until the
    optimality residual below is at most ``tol * max(1, ||F(0)||)`` or `maxiter`
    iterations have run. Its gradient is implicit (`hogrod.implicit.custom_root`) on the
    KKT conditions reduced to the free coordinates of the solution (alpha_ik < c
    delta(k, y_i)): with P the projection onto the directions that keep every active bound
    and every row's sum, ``F(alpha) = P (K (P alpha + r) - Y) + (I - P) alpha - r`` (K the
    kernel applied per class, Y one-hot, r the part of alpha the constraints fix), whose
    Jacobian ``P K P + I - P`` is symmetric, so the linear solve is conjugate gradient; a
    term ``min(lambda, 0)`` on the active coordinates (lambda their bounds' multipliers,
    positive at the optimum, where the term and its derivative vanish) makes F zero only at
    the optimum. The root check is on, at ``2 tol``: a solver stopped by `maxiter` short
    of `tol` is an error, never a wrong gradient.

    With r = 0 the dual solution (and its gradient) is unique when ``X X^T`` is
    nonsingular, the support embeddings linearly independent (so n <= d). Otherwise the
    SVM's weights are still unique but the dual is not, and the implicit solve may fail (an
    error naming it).

    `solve_dtype` computes the dual and its implicit gradient at a wider dtype than the
    embeddings' (float64 for float32 embeddings), the solution cast back: the solver aims
    at the wider dtype's default tolerance within `maxiter`; the root check and the
    gradient's linear solve are at the embeddings'. On embeddings of large norm the
    kernel's condition number grows as their squared norm over `kernel_ridge`, and in
    float32 the solver or the gradient's linear solve stops short of its tolerance (an
    error). Meta-training makes the norms grow, so a long float32 run needs it. Even where
    float32 converges, its tolerance can leave the active set wrong and the gradient far
    from the exact one; the wider solve, aiming tighter, comes much closer.

    Args:
      support_embeddings: `[n, d]` floating.
      support_labels: integer `[n]` in `0..n_way-1`, every class at least once.
      query_embeddings: `[q, d]`, the support's dtype and width.
      n_way: the number of classes, a Python int >= 1 (or an integer scalar tensor).
      c: the slack penalty C, a Python number > 0 (MetaOptNet's default 0.1), applied at
        the embeddings' dtype.
      maxiter: the solver's iteration limit (>= 1; default `SVM_MAXITER`, 1000).
      tol: the solver's tolerance on the optimality residual, > 0; None: half the square
        root of the embeddings' machine epsilon (so the root check runs at the library's
        default, the square root).
      kernel_ridge: r >= 0, added to the dual's kernel's diagonal (see above), applied at
        the embeddings' dtype; default `KERNEL_RIDGE` (1.0, MetaOptNet's).
      solve_dtype: the dtype the dual is solved and differentiated at ('float64' or a
        `tf.DType`), at least as wide as the embeddings'; None: the embeddings' dtype.

    Returns:
      The logits, `[q, n_way]` at the embeddings' dtype.

    Raises:
      ArgumentError: mismatched ranks, dtypes or widths, a label outside `0..n_way-1`, a
        class without support examples, `c` or `tol` not positive, `maxiter` < 1,
        `kernel_ridge` negative, `solve_dtype` not a floating dtype at least as wide as
        the embeddings'.
    """
    where = "hogrod.meta.svm_logits"
    xs, ys, xq, _, _, asserts = episode(support_embeddings, support_labels, query_embeddings,
                                        n_way, where)
    alpha = svm_dual(xs, ys, n_way, c, maxiter, tol, batched=False, asserts=asserts,
                     where=where, kernel_ridge=kernel_ridge, solve_dtype=solve_dtype)
    return tf.linalg.matmul(xq, tf.linalg.matmul(xs, alpha, transpose_a=True))  # query W^T


# No Python control flow on tensors here: AutoGraph's conversion of it and of the implicit
# differentiation it calls would only multiply a caller's trace time (by about 4).
@tf.autograph.experimental.do_not_convert
def svm_dual(support: tf.Tensor, labels: tf.Tensor, n_way: Scalar, c: float, maxiter: int,
             tol: Optional[float], batched: bool, asserts: Sequence = (),
             where: str = "hogrod.meta.svm_logits",
             kernel_ridge: float = KERNEL_RIDGE,
             solve_dtype: Optional[str] = None) -> tf.Tensor:
    """The Crammer-Singer dual solution alpha `[..., n, n_way]` (see `svm_logits`), with its
    implicit gradient with respect to `support`.

    Args:
      support: X, `[n, d]` (or `[tasks, n, d]` when batched), checked.
      labels: int32 `[n]` (or `[tasks, n]`), checked.
      n_way: the number of classes (a Python int or an integer scalar tensor).
      c: the slack penalty, a Python number > 0.
      maxiter: the solver's iteration limit.
      tol: the solver's tolerance, or None.
      batched: a leading task axis on support and labels, each task checked and
        differentiated on its own (`hogrod.implicit.custom_root`'s batched).
      asserts: value checks to run first.
      where: the public function, in messages.
      kernel_ridge: r >= 0, the dual's kernel ``X X^T + r I``.
      solve_dtype: the dtype to solve and differentiate at, or None (support's).

    Returns:
      alpha, at support's dtype.
    """
    dtype = solve_dtype_of(solve_dtype, support.dtype, where)
    c = checks.positive(c, "c", where)
    ridge = checks.nonnegative(kernel_ridge, "kernel_ridge", where)
    maxiter = checks.integer(maxiter, "maxiter", where, least=1)
    # the checks are at the embeddings' precision; a wider dtype's solver aims at its own
    # default as well, within maxiter: at float32's tolerance the active set and the
    # multipliers may still be wrong, and the gradient's linear solve then fail
    eps = float(np.finfo(support.dtype.as_numpy_dtype).eps)
    tol = 0.5 * eps ** 0.5 if tol is None else checks.positive(tol, "tol", where)
    solve_tol = tol if dtype == support.dtype else min(
        tol, 0.5 * float(np.finfo(dtype.as_numpy_dtype).eps) ** 0.5)

    def optimality(alpha, x, y):
        return _kkt(alpha, x, _one_hot(y), c, ridge)

    def _one_hot(y):
        return tf.one_hot(y, tf.cast(n_way, tf.int32), dtype=dtype)

    # CG's limit: 10 x the system's size, bounded by n^2 where n_way is not static
    n = support.shape[-2] if support.shape[-2] is not None else 1000
    cg_maxiter = 10 * n * (n_way if isinstance(n_way, int) else n)

    @implicit.custom_root(optimality, solve=_cg(cg_maxiter, eps ** 0.75, where),
                          root_tol=2 * tol, batched=batched)
    def solve(init, x, y):
        args = (init, x, _one_hot(y), tf.constant(c, dtype), tf.constant(maxiter),
                tf.constant(solve_tol, dtype), tf.constant(ridge, dtype))
        # eagerly, the loop as one traced function (an eager while loop runs op by op)
        return _solve_traced(*args) if tf.executing_eagerly() else _solve_dual(*args)

    given = support.dtype
    support = tf.cast(_with(list(asserts), support), dtype)  # the gradient flows back
    return tf.cast(solve(tf.zeros_like(_one_hot(labels)), support, labels), given)


def solve_dtype_of(solve_dtype, dtype: tf.DType, where: str) -> tf.DType:
    """`solve_dtype` as a `tf.DType` (None: `dtype`), checked to be floating and at least
    as wide as `dtype`."""
    if solve_dtype is None:
        return dtype
    try:
        wide = tf.as_dtype(solve_dtype)
    except TypeError:
        wide = None
    if wide is None or not wide.is_floating or wide.size < dtype.size:
        raise checks.ArgumentError(f"{where}: solve_dtype must be None or a floating dtype at "
                                   f"least as wide as the embeddings' {dtype.name} (e.g. "
                                   f"'float64'), got {solve_dtype!r}")
    return wide


def _cg(maxiter, tol, where):
    """The implicit gradient's linear solve: conjugate gradient on the symmetric Jacobian
    ``P K P + I - P``, checked (a callable solve: the system's size may be dynamic, the
    number of classes read from the labels)."""
    def solve(matvec, b):
        w, info = linalg.cg(matvec, b, maxiter=maxiter, tol=tol, on_negative_curvature="stop")
        ok = tf.logical_and(tf.logical_not(info.negative_curvature),
                            tf.logical_and(tf.math.is_finite(info.residual_norm),
                                           info.residual_norm <= tol * tree.norm(b)))
        asserts = checks.require(
            ok, f"{where}: the implicit gradient's CG solve did not reach tol={tol:.1e} in "
                f"{maxiter} steps or met non-positive curvature: either the dual solution is "
                "not unique (support embeddings linearly dependent, e.g. more support "
                "examples than the embedding width, with kernel_ridge 0) or the system is too "
                f"ill-conditioned for {tf.nest.flatten(b)[0].dtype.name} (embeddings of "
                "large norm against kernel_ridge; a larger kernel_ridge or solve_dtype='float64' "
                "help)")
        with tf.control_dependencies(asserts):
            return tf.nest.map_structure(tf.identity, w)
    return solve


def _project(v, bound, c):
    """Each row of v projected onto {a : a <= bound, sum(a) = 0} (bound = c one_hot): with
    b = bound - a, the Euclidean projection of bound - v onto the simplex {b >= 0, sum b =
    c} (sort-based, Held et al. 1974)."""
    z = bound - v
    s = tf.sort(z, axis=-1, direction="DESCENDING")
    k = tf.cast(tf.range(1, tf.shape(z)[-1] + 1), z.dtype)
    cumulative = tf.cumsum(s, axis=-1) - c
    rho = tf.reduce_sum(tf.cast(s - cumulative / k > 0, tf.int32), axis=-1, keepdims=True)
    theta = tf.gather(cumulative, rho - 1, batch_dims=len(z.shape) - 1) / tf.cast(rho, z.dtype)
    return bound - tf.maximum(z - theta, 0)


def _kkt(alpha, support, one_hot, c, ridge):
    """The reduced KKT residual F(alpha) of `svm_logits` (zero exactly at the dual solution).

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
    """Accelerated projected gradient on the dual (see `svm_logits`), until ||F|| <= tol *
    max(1, ||F(init)||) per task or `maxiter` iterations; never differentiated. c,
    maxiter, tol and ridge are tensors (one trace serves every value)."""
    dtype = support.dtype
    bound = c * one_hot
    gram = _kernel(support, ridge)
    top = tf.linalg.eigvalsh(gram)[..., -1:]
    step = 1 / tf.maximum(top, tf.constant(np.finfo(dtype.as_numpy_dtype).tiny, dtype))
    step = step[..., None]  # [..., 1, 1]

    def residual(a):
        return tf.norm(_kkt(a, support, one_hot, c, ridge), axis=[-2, -1])

    goal = tol * tf.maximum(tf.ones_like(residual(init)), residual(init))

    def cond(i, x, y, t):
        return tf.logical_and(i < maxiter, tf.reduce_any(residual(x) > goal))

    def body(i, x, y, t):
        new = _project(y - step * (tf.linalg.matmul(gram, y) - one_hot), bound, c)
        t_new = (1 + tf.sqrt(1 + 4 * t * t)) / 2
        # adaptive restart: momentum off where the step went against the last move
        restart = tf.reduce_sum((y - new) * (new - x), axis=[-2, -1], keepdims=True) > 0
        momentum = tf.where(restart, tf.zeros_like(t), (t - 1) / t_new)
        t_new = tf.where(restart, tf.ones_like(t_new), t_new)
        return i + 1, new, new + momentum * (new - x), t_new

    t0 = tf.ones_like(goal)[..., None, None]
    _, alpha, _, _ = tf.while_loop(cond, body, (tf.constant(0), init, init, t0))
    return alpha


# Traced once per input signature (shapes generalized: reduce_retracing), for eager calls.
_solve_traced = tf.function(_solve_dual, reduce_retracing=True, autograph=False)
