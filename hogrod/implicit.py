"""Implicit differentiation of a solver's output (bilevel optimization), in JAXopt's shape.

`@custom_root(F)` on a solver `solver(init, *args) -> x_star` whose output satisfies
`F(x_star, *args) = 0` gives `x_star` the gradient of the implicit function theorem:

    dx*/dtheta = -(dF/dx)^{-1} dF/dtheta,

so for an output cotangent v the gradient with respect to the args is

    v^T dx*/dtheta = -w^T dF/dtheta,   where (dF/dx)^T w = v.

The products by F's Jacobians are tapes on F (a VJP in x for (dF/dx)^T w, a forward
accumulator for dF/dx u where a method needs it, a VJP in the args for w^T dF/dtheta); the
solver runs outside the tape (`tf.custom_gradient`, its inputs behind `tf.stop_gradient`),
so its iterations are never differentiated and may be anything (a Python loop, numpy, a
library call).

Which args get gradients: every leaf of `args` (nested structures are fine) that is a
floating `tf.Tensor`, `tf.Variable` or numpy array. Python numbers and non-floating leaves
are static (no gradient; a Python number keeps its exactness at F's dtype). `init` gets
no gradient. A differentiable leaf that F does not depend on (its dF/dtheta is
structurally None) is a ValueError naming it when the gradient is taken, never a silent
zero: pass settings only the solver uses as Python values or through a closure. The
solver and F must not read `tf.Variable`s other than through `args` (their gradient
would be dropped): that is an error too.

The linear solve for w (`solve=`):

- "cg": conjugate gradient (`hogrod.linalg.cg`), for a symmetric positive definite
  dF/dx (F the gradient of a strictly convex inner loss). Options: maxiter (default
  10 * size(x)), tol (relative residual, default eps^0.75 of the dtype), truncated
  (default False). truncated=True asks for a deliberately approximate solve, as iMAML's
  few CG steps (Rajeswaran et al. 2019): exactly `maxiter` steps (required), or fewer if
  the residual reaches `tol` (default 0), with no check that it did; a direction of
  non-positive curvature ends the solve at the iterate before it (truncated CG of
  Steihaug) instead of raising, since a non-convex inner loss makes dF/dx indefinite
  somewhere. A non-finite result is still an error.
- "normal_cg": CG on the normal equations (dF/dx)(dF/dx)^T w = (dF/dx) v, for any
  invertible dF/dx (squares the condition number). Options: maxiter, tol.
- "neumann": w = step * sum_k (I - step (dF/dx)^T)^k v (`hogrod.linalg.neumann`),
  truncated when a term's norm is <= tol ||v||. It converges iff the spectral radius of
  I - step dF/dx is < 1 (for a symmetric positive definite dF/dx: 0 < step < 2 /
  lambda_max). Options: maxiter (default 1000), tol (default eps^0.5), step (default 1.0).
- "dense": materialize dF/dx (a tape Jacobian, size(x)^2 entries: small problems) and
  `tf.linalg.solve` its transpose; singular when sigma_min / sigma_max <= n eps.
- a callable `solve(matvec, b) -> w` with matvec(w) = (dF/dx)^T w on trees shaped
  like x (no options).

A system the method cannot solve (non-positive curvature in CG, a singular Jacobian,
a diverging or unconverged series, a non-finite result) is an error naming the
optimality function: a ValueError eagerly, a failing `tf.debugging.Assert` with the same
message in a graph. Each works eagerly, in `tf.function`, per task in
`tf.vectorized_map` and per replica under a `tf.distribute` strategy.

The solver's output is checked to be a root (`check_root=True`, the default): the implicit
gradient of a point that is not a root is wrong, silently (one Newton step short of the
root, or a fixed-point iteration caught in a cycle, gives gradients off by orders of
magnitude). The check is ||F(x*)|| <= root_tol * max(1, ||F(init)||), norms over the whole
tree, root_tol by default the square root of the dtype's machine epsilon; a failure is an
error naming the optimality function and the residual (eagerly a ValueError, in a graph
a failing Assert). It costs two evaluations of F per call. A solver that is approximate
by design (a fixed budget of proximal steps, as iMAML's) passes `check_root=False` or its
own `root_tol`.

Per task, three ways: take the gradient inside the mapped function (a tape there); map
with `tf.map_fn`; or write the solver and F for a whole batch of tasks and decorate with
`batched=True`. Batched, every tensor leaf of `init`, `args` and x has a leading task axis
(one size B), task i's solution depends only on task i's slices (Python numbers are
shared; a shared tensor goes in a closure, without gradient, or is tiled to B), and each
task gets its own root check (residual against its own ||F(init_i)||) and its own linear
solve (a `tf.vectorized_map` over tasks of the single-task solve, F evaluated on one-task
batches), so the gradient equals a loop over tasks; its failed checks are Asserts
(tf.errors.InvalidArgumentError) even eagerly. A tape outside `tf.vectorized_map`
differentiates pfor's converted ops, which drop `tf.custom_gradient`; the gradient would
then reach the solver's stopped inputs as a silent zero, so it is a LookupError ("Gradient
explicitly disabled") naming the solver and these ways.
"""

import functools
import inspect

import numpy as np
import tensorflow as tf

from hogrod import checks, linalg, tree

__all__ = ["custom_root", "custom_fixed_point"]

SOLVES = ("cg", "normal_cg", "neumann", "dense")
_OPTIONS = {"cg": ("maxiter", "tol", "truncated"), "normal_cg": ("maxiter", "tol"),
            "neumann": ("maxiter", "tol", "step"), "dense": ()}
_no_autograph = tf.autograph.experimental.do_not_convert
_LOST = ("{where}: the implicit gradient was lost (a tape outside tf.vectorized_map, whose "
         "converted ops drop tf.custom_gradient): take the gradient inside the mapped "
         "function, or map with tf.map_fn")


def callable_name(fn):
    """A callable's name for messages: its qualified name, else its repr.

    Args:
      fn: any callable.
    Returns:
      A string.
    """
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def check_solve(solve, options, where):
    """Checks a linear solve and its options as `custom_root` takes them.

    Args:
      solve: one of `SOLVES` or a callable solve(matvec, b) -> w.
      options: a dict of the solve's options (maxiter, tol, step, truncated).
      where: the public function (or gin binding) checked, first in the message.
    Returns:
      None.
    Raises:
      ValueError: an unknown solve, an option the solve does not take, or a bad value.
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


def ensure(ok, message):
    """A check that raises eagerly and asserts in a graph.

    Args:
      ok: a boolean scalar (a tensor or a Python bool).
      message: the error's text.
    Returns:
      [] eagerly (after raising if `ok` is false); in a graph, a list of one
      `tf.debugging.Assert` op, to be made a control dependency of the result.
    Raises:
      ValueError: eagerly, when `ok` is false.
    """
    if tf.executing_eagerly():
        if not bool(ok):
            raise ValueError(message)
        return []
    return [tf.debugging.Assert(ok, [message])]



def _eps(dtype):
    return float(np.finfo(dtype.as_numpy_dtype).eps)


def _differentiable(leaf):
    if isinstance(leaf, (tf.Tensor, tf.Variable)):
        return leaf.dtype.is_floating
    return isinstance(leaf, np.ndarray) and np.issubdtype(leaf.dtype, np.floating)


def leaf_paths(structure, root):
    """A readable path for each leaf of a `tf.nest` structure, in `tf.nest.flatten`'s order.

    Args:
      structure: a nest of dicts, lists, tuples and namedtuples.
      root: the name of the whole structure, e.g. "hyperparams".
    Returns:
      A list of strings such as `hyperparams['s']`, `params[1]`, `state.mu` (the bare root
      for a single leaf).
    """
    def walk(s, path):
        if isinstance(s, dict):
            return [p for k in sorted(s) for p in walk(s[k], f"{path}[{k!r}]")]
        if isinstance(s, tuple) and hasattr(s, "_fields"):
            return [p for k in s._fields for p in walk(getattr(s, k), f"{path}.{k}")]
        if isinstance(s, (list, tuple)):
            return [p for i, t in enumerate(s) for p in walk(t, f"{path}[{i}]")]
        return [path]

    try:
        paths = walk(structure, root)
    except TypeError:  # unsortable keys: tf.nest's own order is not ours to guess
        paths = []
    n = len(tf.nest.flatten(structure))
    if len(paths) != n:
        paths = [f"{root} (leaf {i} of its tf.nest.flatten)" for i in range(n)]
    return paths


def _arg_names(fn, args):
    """A readable name for each leaf of `args`: F's parameter name, then the path."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    except (TypeError, ValueError):
        params = []
    names = []
    for i, a in enumerate(args):
        names += leaf_paths(a, params[i] if i < len(params) else f"args[{i}]")
    return names


class _Jacobians:
    """Products by F's Jacobians at (x, args), F checked to map x to a tree like x."""

    def __init__(self, fn, x, rebuild, diff, where):
        self.fn, self.x, self.rebuild, self.diff, self.where = fn, x, rebuild, diff, where

    def _f(self, x, diff):
        f = self.fn(x, *self.rebuild(diff))
        tree.check_same(self.x, f, "x", f"{self.where}: the optimality function's output")
        return tf.nest.pack_sequence_as(self.x, [tf.convert_to_tensor(t)
                                                 for t in tf.nest.flatten(f)])

    def vjp_x(self, w):  # (dF/dx)^T w
        with tf.GradientTape() as tape:
            tape.watch(self.x)
            f = self._f(self.x, self.diff)
        return tape.gradient(f, self.x, output_gradients=w,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def jvp_x(self, u):  # (dF/dx) u
        with tf.autodiff.ForwardAccumulator(self.x, u) as acc:
            f = self._f(self.x, self.diff)
        return acc.jvp(f, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def vjp_args(self, w):  # w^T dF/dtheta, None where F does not depend on a leaf
        with tf.GradientTape() as tape:  # watching accessed variables, to refuse them
            tape.watch(self.diff)
            f = self._f(self.x, self.diff)
        hidden = [v.name for v in tape.watched_variables()]
        if hidden:
            raise ValueError(f"{self.where}: the optimality function reads trainable "
                             f"variables {hidden} that are not passed as args; their implicit "
                             "gradient would be dropped: pass them as args")
        return tape.gradient(f, self.diff, output_gradients=w)

    def dense(self):  # dF/dx as a [n, n] matrix over flattened x
        flat = tree.flatten(self.x)
        with tf.GradientTape() as tape:
            tape.watch(flat)
            f = tree.flatten(self._f(tree.unflatten(flat, self.x), self.diff))
        return tape.jacobian(f, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def _finish(w, asserts):
    with tf.control_dependencies(asserts):
        return tf.nest.map_structure(tf.identity, w)


def _solve_cg_truncated(matvec, b, maxiter, tol, where):
    w, _ = linalg.cg(matvec, b, maxiter=maxiter, tol=tol, on_negative_curvature="stop")
    asserts = ensure(tf.math.is_finite(tree.norm(w)),
                     f"{where}: the truncated CG solution of (dF/dx)^T w = v is not finite "
                     "(NaN/inf in F or in the output gradient?)")
    return _finish(w, asserts)


def _solve_cg(matvec, b, maxiter, tol, where, what):
    w, info = linalg.cg(matvec, b, maxiter=maxiter, tol=tol, on_negative_curvature="stop")
    b_norm = tree.norm(b)
    asserts = ensure(tf.logical_not(info.negative_curvature),
                     f"{where}: CG met non-positive curvature in {what}: the system is "
                     "singular or indefinite; solve='cg' needs a symmetric positive definite "
                     "dF/dx (use 'normal_cg' or 'dense' otherwise)")
    asserts += ensure(tf.math.is_finite(tree.norm(w)),
                      f"{where}: the CG solution of {what} is not finite (NaN/inf in F?)")
    asserts += ensure(info.residual_norm <= tol * b_norm,
                      f"{where}: CG did not reach tol={tol} on {what} in maxiter={maxiter} "
                      "steps; raise maxiter or tol")
    return _finish(w, asserts)


def _solve_neumann(matvec, b, maxiter, tol, step, where):
    w, info = linalg.neumann(matvec, b, maxiter, tol=tol, step=step)
    asserts = ensure(info.converged,
                     f"{where}: the Neumann series did not converge to tol={tol} in "
                     f"maxiter={maxiter} terms: it converges iff the spectral radius of "
                     f"I - {step} * dF/dx is < 1 (choose step, or another solve)")
    return _finish(w, asserts)


def _solve_dense(jac, b, where):
    a = jac.dense()
    n = a.shape[0]
    sigma = tf.linalg.svd(a, compute_uv=False)  # the LU op itself fails on exact singularity
    rcond = sigma[-1] / sigma[0]
    asserts = ensure(tf.logical_and(tf.math.is_finite(rcond),
                                    rcond > n * _eps(a.dtype)),
                     f"{where}: dF/dx is singular (or nearly: sigma_min / sigma_max <= n eps), so "
                     "x* is not an isolated root and has no implicit gradient")
    with tf.control_dependencies(asserts):
        w = tf.linalg.solve(tf.transpose(a), tree.flatten(b)[:, None])[:, 0]
    return tree.unflatten(w, b)


def _linear_solve(solve, options, jac, b, where):
    """w with (dF/dx)^T w = b."""
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
    asserts = ensure(residual <= tol ** 0.5 * tree.norm(b),
                     f"{where}: (dF/dx)^T w = v has no solution to sqrt(tol)={tol ** 0.5:.1e} "
                     "(residual after normal_cg too large): dF/dx is singular or too "
                     "ill-conditioned for normal_cg")
    return _finish(w, asserts)


def custom_root(optimality_fn, solve="cg", **options):
    """Decorate `solver(init, *args) -> x` so that x's gradient with respect to `args` is
    the implicit one of `optimality_fn(x, *args) = 0` (see the module docstring).

    Args:
      optimality_fn: F(x, *args) -> a tree structured like x, zero at the solver's output.
      solve: "cg", "normal_cg", "neumann", "dense", or a callable solve(matvec, b) -> w.
      **options: maxiter, tol (and step for "neumann"), as Python numbers; truncated
        (a bool) for "cg".
    Returns:
      A decorator; the decorated solver has the signature of the original.
    """
    if not callable(optimality_fn):
        raise TypeError(f"custom_root: optimality_fn must be a callable F(x, *args), got "
                        f"{type(optimality_fn).__name__}")
    check_solve(solve, options, f"custom_root({callable_name(optimality_fn)})")

    def decorator(solver):
        if not callable(solver):
            raise TypeError(f"custom_root: the decorated solver must be callable, got "
                            f"{type(solver).__name__}")
        return _wrap(solver, optimality_fn, solve, options)

    return decorator


def custom_fixed_point(fixed_point_fn, solve="cg", **options):
    """`custom_root` for a solver of x = T(x, *args): the optimality function is
    F(x, *args) = x - T(x, *args) (this sign makes dF/dx = I - dT/dx positive definite for
    a symmetric contraction dT/dx, as "cg" needs; the gradient does not depend on it).
    With solve="neumann" and step 1 the series is w = sum_k (dT/dx^T)^k v, convergent when
    T is a contraction."""
    if not callable(fixed_point_fn):
        raise TypeError(f"custom_fixed_point: fixed_point_fn must be a callable "
                        f"T(x, *args), got {type(fixed_point_fn).__name__}")

    def optimality_fn(x, *args):
        return tree.sub(x, fixed_point_fn(x, *args))

    optimality_fn.__qualname__ = f"x - {callable_name(fixed_point_fn)}(x)"
    try:
        optimality_fn.__signature__ = inspect.signature(fixed_point_fn)
    except (TypeError, ValueError):
        pass
    return custom_root(optimality_fn, solve, **options)


def _wrap(solver, fn, solve, options):
    where = (f"implicit gradient of {callable_name(solver)} by optimality function "
             f"{callable_name(fn)}")

    # Not converted by AutoGraph (nor is the backward pass, converted with it when a
    # caller's tf.function converts the tape's code): the Python branches on the solve
    # and the checks are static, and conversion would only slow the trace.
    @_no_autograph
    @functools.wraps(solver)
    def wrapped(init, *args):
        flat = tf.nest.flatten(args)
        idx = [i for i, leaf in enumerate(flat) if _differentiable(leaf)]
        names = _arg_names(fn, args)
        diff = [tf.convert_to_tensor(flat[i]) for i in idx]
        init_ = tf.nest.map_structure(
            lambda t: tf.stop_gradient(t) if isinstance(t, (tf.Tensor, tf.Variable)) else t,
            init)

        def rebuild(leaves):
            new = list(flat)
            for i, t in zip(idx, leaves):
                new[i] = t
            return tf.nest.pack_sequence_as(args, new)

        def forward(diff):
            x = solver(init_, *rebuild([tf.stop_gradient(t) for t in diff]))
            tree.check_same(init, x, "init", f"{callable_name(solver)}'s output (it must return x "
                                             "alone, structured like init)")
            return tf.nest.pack_sequence_as(init, [tf.convert_to_tensor(t)
                                                   for t in tf.nest.flatten(x)])

        if not diff:
            return forward(diff)

        @tf.custom_gradient
        def run(*diff):
            x = forward(list(diff))
            # grad_fn bypasses this op. Where the override is lost (a tape outside
            # tf.vectorized_map differentiates pfor's converted ops, which drop it), the
            # gradient would reach the solver's stopped inputs as a silent zero: an error.
            x_flat = [tf.raw_ops.PreventGradient(input=t, message=_LOST.format(where=where))
                      for t in tf.nest.flatten(x)]

            @_no_autograph
            def grad_fn(*dys, variables=None):
                if variables:
                    raise ValueError(f"{where}: the solver or the optimality function reads "
                                     f"variables {[v.name for v in variables]} that are not "
                                     "passed as args; their gradient would be dropped: pass "
                                     "them as args")
                v = tf.nest.pack_sequence_as(x, [tf.zeros_like(t) if d is None else d
                                                 for d, t in zip(dys, x_flat)])
                xs = tf.nest.map_structure(tf.stop_gradient, x)
                jac = _Jacobians(fn, xs, rebuild, [tf.stop_gradient(t) for t in diff], where)
                w = _linear_solve(solve, options, jac, v, where)
                grads = jac.vjp_args(w)
                missing = [names[i] for g, i in zip(grads, idx) if g is None]
                if missing:
                    raise ValueError(f"{where}: the optimality function does not depend on "
                                     f"argument(s) {missing}, so their implicit gradient "
                                     "is undefined; pass them as Python values or through a "
                                     "closure if only the solver uses them")
                return [-tf.convert_to_tensor(g) for g in grads]

            return x_flat, grad_fn

        return tf.nest.pack_sequence_as(init, run(*diff))

    return wrapped
