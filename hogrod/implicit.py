"""Implicit differentiation of a solver's output (bilevel optimization), in JAXopt's shape.

`@custom_root(F)` on a solver `solver(init, *args) -> x_star` whose output satisfies
`F(x_star, *args) = 0` gives `x_star` the gradient of the implicit function theorem::

    dx*/dtheta = -(dF/dx)^{-1} dF/dtheta,

so for an output cotangent v the gradient with respect to the args is::

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
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hogrod import checks, implicit_solves, tree
from hogrod.implicit_solves import Solve, callable_name
from hogrod.types import Tree

#: A solver ``solver(init, *args) -> x``, and what `custom_root` makes of it.
Solver = Callable[..., Tree]

__all__ = ["custom_root", "custom_fixed_point"]

_no_autograph = tf.autograph.experimental.do_not_convert
_LOST = ("{where}: the implicit gradient was lost (a tape outside tf.vectorized_map, whose "
         "converted ops drop tf.custom_gradient): take the gradient inside the mapped "
         "function, map with tf.map_fn, or decorate a solver of the whole batch with "
         "batched=True and call it on every task at once")


def _differentiable(leaf: Any) -> bool:
    if isinstance(leaf, (tf.Tensor, tf.Variable)):
        return leaf.dtype.is_floating
    return isinstance(leaf, np.ndarray) and np.issubdtype(leaf.dtype, np.floating)


def leaf_paths(structure: Tree, root: str) -> List[str]:
    """A readable path for each leaf of a `tf.nest` structure, in `tf.nest.flatten`'s order.

    Args:
        structure: a nest of dicts, lists, tuples and namedtuples.
        root: the name of the whole structure, e.g. "hyperparams".

    Returns:
        A list of strings such as ``hyperparams['s']``, ``params[1]``, ``state.mu`` (the
        bare root for a single leaf; ``root (leaf i of its tf.nest.flatten)`` where the
        dict keys cannot be sorted).
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


def _arg_names(fn: Callable, args: Sequence[Any]) -> List[str]:
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


def custom_root(optimality_fn: Callable[..., Tree], solve: Solve = "cg", *,
                check_root: bool = True, root_tol: Optional[float] = None,
                batched: bool = False, **options: Any) -> Callable[[Solver], Solver]:
    """Gives a solver's output the implicit gradient of an optimality condition.

    Decorates ``solver(init, *args) -> x`` so that x's gradient with respect to ``args`` is
    the implicit one of ``optimality_fn(x, *args) = 0`` (see the module docstring): the
    solver runs without a tape, and the gradient solves ``(dF/dx)^T w = v``.

    Args:
        optimality_fn: ``F(x, *args)`` returning a tree structured like x, zero at the
            solver's output.
        solve: the linear solve for w: "cg" (default), "normal_cg", "neumann", "dense",
            or a callable ``solve(matvec, b) -> w`` (see the module docstring).
        check_root: whether to check that the solver's output is a root,
            ``||F(x)|| <= root_tol * max(1, ||F(init)||)``; default True. False: a solver
            approximate by design, such as a fixed budget of steps, whose gradient is then
            that of the root it approximates.
        root_tol: that check's tolerance, a Python number > 0; None (default) means the
            square root of the machine epsilon of x's dtype.
        batched: whether the solver and F map a leading task axis of every tensor in init,
            args and x, each task's solution depending only on its own slices; each task
            is then checked and solved on its own (see the module docstring). Default
            False.
        **options: the named solve's maxiter (an int >= 1), tol and (for "neumann") step
            (Python numbers > 0), and truncated (a bool, for "cg"; needs maxiter).

    Returns:
        A decorator; the decorated solver has the signature of the original and returns
        x, structured like init.

    Raises:
        ArgumentError: `optimality_fn` (or the decorated solver) is not callable, `solve`
            or an option is invalid, `check_root` or `batched` is not a bool, or
            `root_tol` is not > 0.
    """
    where = f"custom_root({callable_name(optimality_fn)})"
    checks.function(optimality_fn, "optimality_fn", where, "F(x, *args)")
    implicit_solves.check_solve(solve, options, where)
    for arg, value in (("check_root", check_root), ("batched", batched)):
        if not isinstance(value, bool):
            raise checks.ArgumentError(f"{where}: {arg} must be True or False, got {value!r}")
    if root_tol is not None:
        root_tol = checks.positive(root_tol, "root_tol", where)

    def decorator(solver):
        checks.function(solver, "the decorated solver", where, "solver(init, *args) -> x")
        return _wrap(solver, optimality_fn, solve, options, check_root, root_tol, batched)

    return decorator


def custom_fixed_point(fixed_point_fn: Callable[..., Tree], solve: Solve = "cg", *,
                       check_root: bool = True, root_tol: Optional[float] = None,
                       batched: bool = False, **options: Any) -> Callable[[Solver], Solver]:
    """`custom_root` for a solver of ``x = T(x, *args)``.

    The optimality function is ``F(x, *args) = x - T(x, *args)`` (this sign makes
    ``dF/dx = I - dT/dx`` positive definite for a symmetric contraction ``dT/dx``, as "cg"
    needs; the gradient does not depend on it). With ``solve="neumann"`` and step 1 the
    series is ``w = sum_k (dT/dx^T)^k v``, convergent when T is a contraction. The root
    check is ``||x - T(x)|| <= root_tol * max(1, ||init - T(init)||)``: an iteration
    caught in a cycle fails it.

    Args:
        fixed_point_fn: ``T(x, *args)`` returning a tree structured like x.
        solve: the linear solve, as `custom_root`'s; default "cg".
        check_root: whether to check that the output is a fixed point, as above; default
            True.
        root_tol: that check's tolerance, as `custom_root`'s; default None.
        batched: as `custom_root`'s; default False.
        **options: the named solve's options, as `custom_root`'s.

    Returns:
        A decorator; the decorated solver has the signature of the original.

    Raises:
        ArgumentError: `fixed_point_fn` is not callable, or an argument is invalid as in
            `custom_root`.
    """
    checks.function(fixed_point_fn, "fixed_point_fn", "custom_fixed_point", "T(x, *args)")

    def optimality_fn(x, *args):
        return tree.sub(x, fixed_point_fn(x, *args))

    optimality_fn.__qualname__ = f"x - {callable_name(fixed_point_fn)}(x)"
    try:
        optimality_fn.__signature__ = inspect.signature(fixed_point_fn)
    except (TypeError, ValueError):
        pass
    return custom_root(optimality_fn, solve, check_root=check_root, root_tol=root_tol,
                       batched=batched, **options)


def _norms(f: Tree, batched: bool) -> tf.Tensor:
    """||f|| over the whole tree, or per task (a [B] vector) when batched."""
    if not batched:
        return tree.norm(f)
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.reshape(tf.square(t), [tf.shape(t)[0], -1]), 1)
                             for t in tf.nest.flatten(f)]))


def _check_root(fn: Callable[..., Tree], x: Tree, init: Tree, args: Sequence[Any],
                root_tol: Optional[float], batched: bool, where: str) -> Tree:
    """x, with the check that it is a root of fn (an Assert dependency in a graph)."""
    dtype = tf.nest.flatten(x)[0].dtype
    tol = root_tol if root_tol is not None else float(np.finfo(dtype.as_numpy_dtype).eps) ** 0.5
    init = tf.nest.map_structure(lambda i, t: tf.cast(i, t.dtype), init, x)
    f_x, f_0 = (fn(at, *args) for at in (x, init))
    tree.check_same(x, f_x, "x", f"{where}: the optimality function's output")
    residual, start = _norms(f_x, batched), _norms(f_0, batched)
    bound = tf.constant(tol, residual.dtype) * tf.maximum(tf.ones_like(start), start)
    ok = tf.logical_and(tf.math.is_finite(residual), residual <= bound)
    text = (f"{where}: the solver did not return a root of the optimality function "
            "(||F(x)|| > root_tol * max(1, ||F(init)||){}), so its implicit gradient would be "
            "wrong: run the solver to convergence, or pass root_tol (now {:.3g}) or "
            "check_root=False for a solver approximate by design")
    if tf.executing_eagerly():
        if not bool(tf.reduce_all(ok)):
            k = int(tf.argmin(tf.cast(ok, tf.int32))) if batched else None
            pick = (lambda t: float(t[k])) if batched else float
            found = (f": ||F(x)|| = {pick(residual):.3e}, bound {pick(bound):.3e}"
                     + (f" (task {k})" if batched else ""))
            raise ValueError(text.format(found, tol))
        return x
    asserts = [tf.debugging.Assert(tf.reduce_all(ok), [
        text.format("", tol), "||F(x)|| =", residual, "bound =", bound])]
    with tf.control_dependencies(asserts):
        return tf.nest.map_structure(tf.identity, x)


def _check_batch(named: Sequence[Any], where: str) -> None:
    """Every tensor in `named` ((name, leaf) pairs) has one leading task axis (statically,
    where the shape is known)."""
    sizes = {}
    for name, t in named:
        if not _is_tensor(t):
            continue
        if t.shape.rank == 0:
            raise checks.ArgumentError(f"{where}: batched=True needs a leading task axis on "
                                       f"every tensor, but {name} is a scalar")
        if t.shape[0] is not None:
            sizes.setdefault(int(t.shape[0]), name)
    if len(sizes) > 1:
        raise checks.ArgumentError(f"{where}: batched=True needs one leading task axis, but "
                                   f"the sizes differ: {sizes} (size: first tensor with it)")


def _is_tensor(leaf: Any) -> bool:
    return isinstance(leaf, (tf.Tensor, tf.Variable, np.ndarray))


def _replaced(args: Tuple, flat: List[Any], idx: List[int], leaves: Sequence[Any]) -> Tuple:
    """`args` with its flat leaves at positions `idx` replaced by `leaves`."""
    new = list(flat)
    for i, t in zip(idx, leaves):
        new[i] = t
    return tf.nest.pack_sequence_as(args, new)


def _args_vjp(f: Callable[..., Tree], xs: Tree, v: Tree, rebuild: Callable, leaves: List,
              solve: Solve, options: dict, names: List[str], where: str) -> List[tf.Tensor]:
    """The implicit gradient of the differentiable args, ``-(dF/dargs)^T w`` where
    ``(dF/dx)^T w = v`` (the linear system solved by `solve`)."""
    jac = implicit_solves.Jacobians(f, xs, rebuild, leaves, where)
    w = implicit_solves.linear_solve(solve, options, jac, v, where)
    grads = jac.vjp_args(w)
    missing = [name for g, name in zip(grads, names) if g is None]
    if missing:
        raise ValueError(f"{where}: the optimality function does not depend on "
                         f"argument(s) {missing}, so their implicit gradient is undefined; "
                         "pass them as Python values or through a closure if only the "
                         "solver uses them")
    return [-tf.convert_to_tensor(g) for g in grads]


def _per_task_vjp(fn: Callable[..., Tree], args: Tuple, flat: List[Any], idx: List[int],
                  xs: Tree, v: Tree, stopped: List[tf.Tensor],
                  vjp: Callable[..., List[tf.Tensor]]) -> List[tf.Tensor]:
    """`vjp` per task (batched=True): F on one-task batches of the task's own slices (every
    tensor of args has the task axis; Python values are shared)."""
    others = [i for i, leaf in enumerate(flat) if _is_tensor(leaf) and i not in idx]

    def task(elems):
        x_i, v_i, diff_i, other_i = elems

        def rebuild_i(leaves):
            return _replaced(args, flat, idx + others,
                             [t[None] for t in list(leaves) + list(other_i)])

        def fn_i(x, *a):
            f = fn(tf.nest.map_structure(lambda t: t[None], x), *a)
            return tf.nest.map_structure(lambda t: tf.convert_to_tensor(t)[0], f)

        return vjp(fn_i, x_i, v_i, rebuild_i, diff_i)

    return tf.vectorized_map(task, (xs, v, stopped,
                                    [tf.convert_to_tensor(flat[i]) for i in others]))


def _wrap(solver: Solver, fn: Callable[..., Tree], solve: Solve, options: dict,
          check_root: bool, root_tol: Optional[float], batched: bool) -> Solver:
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

        def rebuild(leaves):  # args with the differentiable leaves replaced
            return _replaced(args, flat, idx, leaves)

        named = list(zip(names, flat)) + [("init", t) for t in tf.nest.flatten(init)]
        if batched:  # before the solver, whose own shape errors would say less
            _check_batch(named, where)

        def forward(diff):
            args_ = rebuild([tf.stop_gradient(t) for t in diff])
            x = solver(init_, *args_)
            tree.check_same(init, x, "init", f"{callable_name(solver)}'s output (it must "
                                             "return x alone, structured like init)")
            x = tf.nest.pack_sequence_as(init, [tf.convert_to_tensor(t)
                                                for t in tf.nest.flatten(x)])
            if batched:
                _check_batch(named + [("x", t) for t in tf.nest.flatten(x)], where)
            if check_root:
                x = _check_root(fn, x, init_, args_, root_tol, batched, where)
            return x

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
                stopped = [tf.stop_gradient(t) for t in diff]
                vjp = functools.partial(_args_vjp, solve=solve, options=options,
                                        names=[names[i] for i in idx], where=where)
                if not batched:
                    return vjp(fn, xs, v, rebuild, stopped)
                return _per_task_vjp(fn, args, flat, idx, xs, v, stopped, vjp)

            return x_flat, grad_fn

        return tf.nest.pack_sequence_as(init, run(*diff))

    return wrapped
