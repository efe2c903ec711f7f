"""Few-shot classification heads: the query logits of a classifier fitted to the support
embeddings of one episode.

Embeddings are `[n, d]` (support) and `[q, d]` (query) of one floating dtype (tensors or
arrays alike: a float64 query with float32 support is an error, never a cast), labels an
integer `[n]` in `0..n_way-1` with every class present; each head returns the query logits
`[q, n_way]` at the embeddings' dtype and is differentiable with respect to both sets of
embeddings (and `l2`, `scale`, `bias` when they are tensors):

- `prototype_logits`: Prototypical Networks (Snell et al. 2017), minus the squared
  Euclidean distance to each class mean;
- `ridge_logits`: R2D2 (Bertinetto et al. 2019), ridge regression onto one-hot targets in
  closed form, by the smaller of its two linear systems (`d x d` primal, `n x n` Woodbury);
- `svm_logits`: MetaOptNet-SVM (Lee et al. 2019), the Crammer-Singer multi-class SVM
  without bias (its dual's kernel plus MetaOptNet's identity by default), solved in its
  dual in float64 by a batched interior-point method in graph and differentiated implicitly
  at its solution (the implicit-function theorem), never through the solver's iterations
  (`hogrod.meta.svm`).

Checks: static ones (ranks, dtypes, widths, `n_way`, a Python `c` or `l2`) raise
`hogrod.checks.ArgumentError` when called or traced; those on values (labels in range,
every class present, a tensor `c` or `l2` positive, finite support embeddings for the SVM)
raise it eagerly and are `tf.debugging.Assert`s in a graph (`tf.errors.InvalidArgumentError`
when run).
"""

from typing import Optional

import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.meta import svm
from hogrod.types import Scalar, TensorLike

__all__ = ["prototype_logits", "ridge_logits", "svm_logits"]


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
    # each converted at its own dtype (Python numbers in float64), so a query of another
    # dtype than the support's is an error, not a cast (an array's as a tensor's)
    xs = checks.floating(support_embeddings, "support_embeddings", where)
    xq = checks.floating(query_embeddings, "query_embeddings", where)
    ys = tf.convert_to_tensor(support_labels)
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
    # a tensor n_way's value is printed after a graph assertion's message, not its repr
    known = tf.get_static_value(n_way_t)
    stated = f"n_way={int(known)}" if known is not None else "n_way below"
    data = ["n_way =", n_way_t]
    asserts = checks.require(n_way_t >= 1, f"{where}: n_way must be >= 1 ({stated})",
                             data=data)
    asserts += checks.require(tf.logical_and(ys >= 0, ys < n_way_t),
                              f"{where}: support_labels must be in 0..n_way-1 ({stated})",
                              data=data)
    with tf.control_dependencies(asserts):  # one_hot maps a label out of range to zeros
        one_hot = tf.one_hot(ys, n_way_t, dtype=xs.dtype)
    counts = tf.reduce_sum(one_hot, axis=-2)
    asserts += checks.require(counts > 0, f"{where}: a class in 0..n_way-1 ({stated}) has no "
                              "support example; every class needs at least one", data=data)
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
    ``W = argmin ||X W - Y||**2 + l2 ||W||**2``, ``(X^T X + l2 I)^{-1} X^T Y`` (primal, a
    `[d, d]` system) ``= X^T (X X^T + l2 I)^{-1} Y`` (Woodbury, `[n, n]`), by Cholesky on the
    smaller of the two (`ridge_weights`); the logits are ``scale * (query W) + bias``
    (Bertinetto et al. 2019).

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
    weights = _with(asserts + more, ridge_weights(xs, one_hot, l2))
    return affine(tf.linalg.matmul(xq, weights), scale, bias)


def ridge_weights(support: tf.Tensor, one_hot: tf.Tensor, l2: tf.Tensor) -> tf.Tensor:
    """The ridge solution W `[..., d, n_way]` by Cholesky on the smaller system: the primal
    ``(X^T X + l2 I_d) W = X^T Y`` where n > d, the Woodbury form ``W = X^T (X X^T + l2
    I_n)^{-1} Y`` otherwise.

    The two are equal in exact arithmetic, not in floating point: with n > d, ``X X^T`` has
    rank at most d, so ``X X^T + l2 I_n`` has condition number about ``||X||**2 / l2``,
    beyond float32 at a small l2 (NaN logits at l2 = 1e-6, 7% off at 1e-5 with 25 support
    examples in 4 dimensions), where the primal's is that of ``X^T X`` alone.

    Args:
      support: X, `[..., n, d]` floating.
      one_hot: Y, `[..., n, n_way]` at X's dtype.
      l2: the ridge penalty, a scalar tensor at X's dtype.

    Returns:
      W, at X's dtype.
    """
    def primal():
        gram = tf.linalg.matmul(support, support, transpose_a=True)  # [..., d, d]
        eye = tf.eye(tf.shape(gram)[-1], dtype=gram.dtype)
        return tf.linalg.cholesky_solve(tf.linalg.cholesky(gram + l2 * eye),
                                        tf.linalg.matmul(support, one_hot, transpose_a=True))

    def woodbury():
        gram = tf.linalg.matmul(support, support, transpose_b=True)  # [..., n, n]
        eye = tf.eye(tf.shape(gram)[-1], dtype=gram.dtype)
        dual = tf.linalg.cholesky_solve(tf.linalg.cholesky(gram + l2 * eye), one_hot)
        return tf.linalg.matmul(support, dual, transpose_a=True)

    n, d = support.shape[-2], support.shape[-1]
    if n is not None and d is not None:
        return primal() if n > d else woodbury()
    shape = tf.shape(support)
    return tf.cond(shape[-2] > shape[-1], primal, woodbury)


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
               maxiter: int = svm.SVM_MAXITER, tol: Optional[float] = None,
               kernel_ridge: float = svm.KERNEL_RIDGE) -> tf.Tensor:
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

    The dual is solved in float64 whatever the embeddings' dtype (the solution and its
    gradient cast back), by a primal-dual interior-point method (`hogrod.linalg.simplex_qp`,
    Mehrotra's predictor-corrector, as MetaOptNet's qpth) whose polished candidates (the
    active bounds held exactly) are accepted once the optimality residual F is at most
    ``tol * min(1, c ||K||_2) * max(1, ||F(0)||)`` (K the dual's kernel: the residual's
    scale, so a small `c` is solved to the same relative accuracy as a large one), or
    until `maxiter` iterations have run; a solve stopped short of twice that is an error
    naming `maxiter` and `tol`, never a wrong gradient. Its gradient is implicit
    (the implicit-function theorem) on the KKT conditions reduced to the free coordinates
    of the solution. `hogrod.meta.svm` derives the rule and describes the solver.

    With r = 0 the dual solution (and its gradient) is unique when ``X X^T`` is
    nonsingular, the support embeddings linearly independent (so n <= d). Otherwise the
    SVM's weights are still unique but the dual is not, and the implicit solve may fail (an
    error naming it). On embeddings of large norm the kernel's condition number grows as
    their squared norm over r (the interior-point method's iterations grow slowly with it,
    `maxiter`).

    Args:
      support_embeddings: `[n, d]` floating, finite.
      support_labels: integer `[n]` in `0..n_way-1`, every class at least once.
      query_embeddings: `[q, d]`, the support's dtype and width.
      n_way: the number of classes, a Python int >= 1 (or an integer scalar tensor).
      c: the slack penalty C, a Python number > 0 (MetaOptNet's default 0.1).
      maxiter: the solver's interior-point iteration limit (>= 1; default
        `hogrod.meta.svm.SVM_MAXITER`, 100; tens of iterations reach the default `tol`).
      tol: the solver's relative tolerance on the optimality residual (above), > 0; None:
        half the square root of float64's machine epsilon, 7.5e-9.
      kernel_ridge: r >= 0, added to the dual's kernel's diagonal (see above); default
        `hogrod.meta.svm.KERNEL_RIDGE` (1.0, MetaOptNet's).

    Returns:
      The logits, `[q, n_way]` at the embeddings' dtype.

    Raises:
      ArgumentError: mismatched ranks, dtypes or widths, a label outside `0..n_way-1`, a
        class without support examples, support embeddings not finite, `c` or `tol` not
        positive, `maxiter` < 1, `kernel_ridge` negative.
      ValueError: the solver stopped by `maxiter` short of `tol`, or the implicit
        gradient's linear solve failed (in a graph, these and the value checks are
        Asserts).
    """
    where = "hogrod.meta.svm_logits"
    xs, ys, xq, _, _, asserts = episode(support_embeddings, support_labels, query_embeddings,
                                        n_way, where)
    alpha = svm.svm_dual(xs, ys, n_way, c, maxiter, tol, batched=False, asserts=asserts,
                         where=where, kernel_ridge=kernel_ridge)
    return tf.linalg.matmul(xq, tf.linalg.matmul(xs, alpha, transpose_a=True))  # query W^T
