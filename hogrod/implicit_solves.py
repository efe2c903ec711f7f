"""The linear solves of implicit differentiation (`hogrod.implicit`), and the checks it shares.

`hogrod.hypergrad` uses the checks too. At a root ``x*`` of an optimality function
``F(x, *args)``, the implicit gradient needs w with ``(dF/dx)^T w = v`` for an output
cotangent v. `Jacobians` gives the products by F's
Jacobians (tapes on F); `linear_solve` finds w by a named solve ("cg", "normal_cg",
"neumann", "dense": see `hogrod.implicit`) or a callable `solve(matvec, b)`, and checks
that it did: a failure is a ValueError eagerly, a failing `tf.debugging.Assert` with the
same message in a graph.
"""

from typing import Any, Callable, List, Mapping, Sequence, Union

import numpy as np
import tensorflow as tf

from hogrod import checks, linalg, tree
from hogrod.types import MatVec, Tree

#: A linear solve: one of `SOLVES` or a callable ``solve(matvec, b) -> w``.
Solve = Union[str, Callable[[MatVec, Tree], Tree]]

__all__ = ["SOLVES", "callable_name", "check_solve", "Jacobians", "linear_solve"]

SOLVES = ("cg", "normal_cg", "neumann", "dense")
_OPTIONS = {"cg": ("maxiter", "tol", "truncated"), "normal_cg": ("maxiter", "tol"),
            "neumann": ("maxiter", "tol", "step"), "dense": ()}

def callable_name(fn: Callable) -> str:
    """A callable's name for messages: its qualified name, else its name, else its repr.

    Args:
        fn: any callable.

    Returns:
        A string.
    """
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def check_solve(solve: Solve, options: Mapping[str, Any], where: str) -> None:
    """Checks a linear solve and its options as `custom_root` takes them.

    Args:
        solve: one of `SOLVES` or a callable ``solve(matvec, b) -> w``.
        options: a dict of the solve's options (maxiter, tol, step, truncated); a callable
            solve takes none.
        where: the public function (or gin binding) checked, first in the message.

    Raises:
        ArgumentError: an unknown solve, an option the solve does not take, or a bad value
            (``maxiter < 1``, ``tol <= 0``, ``step <= 0``, a non-bool truncated, truncated
            without maxiter).
    """
    if callable(solve):
        if options:
            raise checks.ArgumentError(f"{where}: options {sorted(options)} apply to the "
                                       f"named solves {SOLVES}, not to a callable solve")
        return
    if solve not in SOLVES:
        raise checks.ArgumentError(f"{where}: solve must be one of {SOLVES} or a callable "
                                   f"solve(matvec, b) -> x, got {solve!r}")
    unknown = sorted(set(options) - set(_OPTIONS[solve]))
    if unknown:
        raise checks.ArgumentError(f"{where}: unknown options {unknown} for solve={solve!r}; "
                                   f"it takes {list(_OPTIONS[solve])}")
    if "maxiter" in options:
        checks.integer(options["maxiter"], "maxiter", where, least=1)
    if "tol" in options:  # the solve is checked to reach it: 0 would never be reached
        checks.positive(options["tol"], "tol", where)
    if "truncated" in options:
        if not isinstance(options["truncated"], bool):
            raise checks.ArgumentError(f"{where}: truncated must be True or False, got "
                                       f"{options['truncated']!r}")
        if options["truncated"] and "maxiter" not in options:
            raise checks.ArgumentError(f"{where}: truncated=True runs a fixed number of CG "
                                       "steps: give maxiter")
    if "step" in options:
        checks.positive(options["step"], "step", where)



def _eps(dtype: tf.DType) -> float:
    return float(np.finfo(dtype.as_numpy_dtype).eps)


class Jacobians:
    """Products by F's Jacobians at ``(x, args)``, F checked to map x to a tree like x.

    Args:
        fn: ``F(x, *args)``.
        x: the root, a tree of tensors.
        rebuild: maps the differentiable leaves to F's args (a tuple).
        diff: the differentiable leaves (tensors).
        where: the caller, first in every message.
    """

    def __init__(self, fn: Callable[..., Tree], x: Tree,
                 rebuild: Callable[[Sequence[tf.Tensor]], tuple], diff: List[tf.Tensor],
                 where: str) -> None:
        self.fn, self.x, self.rebuild, self.diff, self.where = fn, x, rebuild, diff, where

    def _f(self, x: Tree, diff: Sequence[tf.Tensor]) -> Tree:
        f = self.fn(x, *self.rebuild(diff))
        tree.check_same(self.x, f, "x", f"{self.where}: the optimality function's output")
        return tf.nest.pack_sequence_as(self.x, [tf.convert_to_tensor(t)
                                                 for t in tf.nest.flatten(f)])

    def vjp_x(self, w: Tree) -> Tree:  # (dF/dx)^T w
        with tf.GradientTape() as tape:
            tape.watch(self.x)
            f = self._f(self.x, self.diff)
        return tape.gradient(f, self.x, output_gradients=w,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def jvp_x(self, u: Tree) -> Tree:  # (dF/dx) u
        with tf.autodiff.ForwardAccumulator(self.x, u) as acc:
            f = self._f(self.x, self.diff)
        return acc.jvp(f, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def vjp_args(self, w: Tree) -> List[Any]:  # w^T dF/dtheta, None where F does not depend on a leaf
        with tf.GradientTape() as tape:  # watching accessed variables, to refuse them
            tape.watch(self.diff)
            f = self._f(self.x, self.diff)
        hidden = [v.name for v in tape.watched_variables()]
        if hidden:
            raise ValueError(f"{self.where}: the optimality function reads trainable "
                             f"variables {hidden} that are not passed as args; their implicit "
                             "gradient would be dropped: pass them as args")
        return tape.gradient(f, self.diff, output_gradients=w)

    def dense(self) -> tf.Tensor:  # dF/dx as a [n, n] matrix over flattened x
        flat = tree.flatten(self.x)
        with tf.GradientTape() as tape:
            tape.watch(flat)
            f = tree.flatten(self._f(tree.unflatten(flat, self.x), self.diff))
        return tape.jacobian(f, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def _finish(w: Tree, asserts: List[Any]) -> Tree:
    with tf.control_dependencies(asserts):
        return tf.nest.map_structure(tf.identity, w)


def _solve_cg_truncated(matvec: MatVec, b: Tree, maxiter: int, tol: float,
                        where: str) -> Tree:
    w, _ = linalg.cg(matvec, b, maxiter=maxiter, tol=tol, on_negative_curvature="stop")
    asserts = checks.require(
        tf.math.is_finite(tree.norm(w)),
        f"{where}: the truncated CG solution of (dF/dx)^T w = v is not finite "
        "(NaN/inf in F or in the output gradient?)")
    return _finish(w, asserts)


def _solve_cg(matvec: MatVec, b: Tree, maxiter: int, tol: float, where: str,
              what: str) -> Tree:
    w, info = linalg.cg(matvec, b, maxiter=maxiter, tol=tol, on_negative_curvature="stop")
    b_norm = tree.norm(b)
    asserts = checks.require(
        tf.logical_not(info.negative_curvature),
        f"{where}: CG met non-positive curvature in {what}: the system is "
        "singular or indefinite; solve='cg' needs a symmetric positive definite "
        "dF/dx (use 'normal_cg' or 'dense' otherwise)")
    asserts += checks.require(
        tf.math.is_finite(tree.norm(w)),
        f"{where}: the CG solution of {what} is not finite (NaN/inf in F?)")
    asserts += checks.require(
        info.residual_norm <= tol * b_norm,
        f"{where}: CG did not reach tol={tol} on {what} in maxiter={maxiter} "
        "steps; raise maxiter or tol")
    return _finish(w, asserts)


def _solve_neumann(matvec: MatVec, b: Tree, maxiter: int, tol: float, step: float,
                   where: str) -> Tree:
    w, info = linalg.neumann(matvec, b, maxiter, tol=tol, step=step)
    asserts = checks.require(
        info.converged,
        f"{where}: the Neumann series did not converge to tol={tol} in "
        f"maxiter={maxiter} terms: it converges iff the spectral radius of "
        f"I - {step} * dF/dx is < 1 (choose step, or another solve)")
    return _finish(w, asserts)


def _solve_dense(jac: Jacobians, b: Tree, where: str) -> Tree:
    a = jac.dense()
    n = a.shape[0]
    sigma = tf.linalg.svd(a, compute_uv=False)  # the LU op itself fails on exact singularity
    rcond = sigma[-1] / sigma[0]
    asserts = checks.require(
        tf.logical_and(tf.math.is_finite(rcond),
        rcond > n * _eps(a.dtype)),
        f"{where}: dF/dx is singular (or nearly: sigma_min / sigma_max <= n eps), so "
        "x* is not an isolated root and has no implicit gradient")
    with tf.control_dependencies(asserts):
        w = tf.linalg.solve(tf.transpose(a), tree.flatten(b)[:, None])[:, 0]
    return tree.unflatten(w, b)


def linear_solve(solve: Solve, options: Mapping[str, Any], jac: Jacobians, b: Tree,
                 where: str) -> Tree:
    """The solution w of ``(dF/dx)^T w = b``, checked.

    Args:
        solve: one of `SOLVES` or a callable ``solve(matvec, b) -> w``.
        options: the solve's options (checked by `check_solve`).
        jac: a `Jacobians` at the root.
        b: the right-hand side, a tree like x.
        where: the caller, first in every message.

    Returns:
        w, a tree like b (in a graph, with the solve's Asserts as control dependencies).

    Raises:
        ValueError: eagerly, the solve failed its check (non-positive curvature, no
            convergence, a singular dF/dx, a non-finite result), or a callable solve's
            output is not structured like b.
    """
    dtype = tf.nest.flatten(b)[0].dtype
    if callable(solve):
        w = solve(jac.vjp_x, b)
        tree.check_same(b, w, "b", f"{where}: the callable solve's output")
        return w
    if solve == "dense":
        return _solve_dense(jac, b, where)
    n = tree.size(b)
    if solve == "neumann":
        return _solve_neumann(jac.vjp_x, b, options.get("maxiter", 1000),
                              float(options.get("tol", _eps(dtype) ** 0.5)),
                              float(options.get("step", 1.0)), where)
    maxiter = options.get("maxiter", 10 * n)
    if options.get("truncated", False):
        return _solve_cg_truncated(jac.vjp_x, b, maxiter, float(options.get("tol", 0.0)),
                                   where)
    tol = float(options.get("tol", _eps(dtype) ** 0.75))
    if solve == "cg":
        return _solve_cg(jac.vjp_x, b, maxiter, tol, where, "(dF/dx)^T w = v")
    # normal_cg: (dF/dx)(dF/dx)^T w = (dF/dx) b
    w = _solve_cg(lambda w: jac.jvp_x(jac.vjp_x(w)), jac.jvp_x(b), maxiter, tol, where,
                  "the normal equations (dF/dx)(dF/dx)^T w = (dF/dx) v")
    # A singular dF/dx leaves the normal equations consistent while (dF/dx)^T w = v has no
    # solution: check the residual of the system itself (to sqrt(tol): the normal equations
    # square the condition number).
    residual = tree.norm(tree.sub(jac.vjp_x(w), b))
    asserts = checks.require(
        residual <= tol ** 0.5 * tree.norm(b),
        f"{where}: (dF/dx)^T w = v has no solution to sqrt(tol)={tol ** 0.5:.1e} "
        "(residual after normal_cg too large): dF/dx is singular or too "
        "ill-conditioned for normal_cg")
    return _finish(w, asserts)
