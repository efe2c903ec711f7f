"""Hypergradients of a bilevel problem, by a method chosen by gin reference.

The problem: hyperparameters h, inner parameters w*(h) minimizing `inner_objective(w, h)`,
and the outer objective `outer_objective(w*(h), h)` (both scalars of the parameters, their
data closed over). Its total derivative is::

    dL_out/dh = d_h L_out + (dw*/dh)^T d_w L_out.

`hypergradient(inner_objective, outer_objective, params, hyperparams, method)` returns
`Hypergradient(value, grads, params)`: the outer value, its gradient with respect to every
leaf of `hyperparams` (structured like it) and the inner solution w used. `method` is one of

- `unrolled(optimizer, steps, truncate=None)`: ``w_K = U(...U(w_0))`` by `steps` updates
  of a `hogrod.optim` optimizer on ``g(w, h) = d_w inner_objective(w, h)``, differentiated
  exactly (reverse mode through every step: one Hessian-vector product per step). With
  ``truncate=T`` only the last T steps are differentiated (the first K - T are constants:
  truncated backprop, Shaban et al. 2019).
- `implicit(inner_optimizer, inner_steps, solve="cg", ...)`: ``w*`` reached by the inner
  optimizer, then the implicit function theorem on ``F(w, h) = g(w, h) = 0``
  (`hogrod.implicit.custom_root`, Lorraine et al. 2020)::

      dL_out/dh = d_h L_out - (d_h g)^T H^{-1} d_w L_out,   H = d_w g (the inner Hessian),

  with ``H^{-1} v`` by conjugate gradient ("cg"), any other `custom_root` solve, or the
  truncated Neumann series of `neumann_series(steps, step)`::

      H^{-1} v ~= step * sum_{k=0}^{steps} (I - step H)^k v.

  The inner solve must reach ``||g(w*)|| <= inner_tol * ||g(w_0)||`` (checked: the
  implicit gradient of a point that is not a root is wrong).
- `one_step(optimizer)`: the T1-T2 / DARTS approximation: ``w_1 = U(w_0)``, one step from
  the given params, differentiated; for sgd with rate xi::

      dL_out/dh ~= d_h L_out(w_1, h) - xi (d_h g(w_0, h))^T d_w L_out(w_1, h).

Each method is a gin-configurable factory (`hypergradient.method = @unrolled()`), never a
string switch. `params` and `hyperparams` are `tf.nest` structures of floating tensors
(`tf.Variable` leaves are read, never assigned); the objectives return scalars. A
hyperparameter the outer value does not depend on is an error naming it, never a silent
zero. Non-finite input is named too: NaN or inf in params or hyperparams (each leaf by its path), in the
inner objective at params (its data), in the outer value or the hypergradient (a diverging
inner optimizer); so is a hyperparameter whose dtype an objective cannot combine with the
params' (give it the params' dtype).

Everything works eagerly and in `tf.function` (the loops are `tf.while_loop`s), but call it
inside a `tf.function` for any real number of steps: eagerly every inner step runs op by
op, two to three orders of magnitude slower (a 2,000-step unroll of the 20-feature ridge
problem of `experiments/bench/hypergrad_ridge.py`: 136 s eagerly, 0.31 s compiled, on 2
shared CPU cores). It is not compiled inside, because the objectives are the caller's
Python (they may read numpy or Python state, which a trace would freeze).
"""

import collections
from typing import Any, Callable, List, Optional

import gin
import numpy as np
import tensorflow as tf

from hogrod import implicit as implicit_lib
from hogrod import checks, implicit_solves, linalg, optim, tree
from hogrod.implicit_solves import Solve
from hogrod.types import MatVec, Params, Tree

__all__ = ["Hypergradient", "Method", "hypergradient", "unrolled", "implicit", "one_step",
           "neumann_series"]

Hypergradient = collections.namedtuple("Hypergradient", ["value", "grads", "params"])
Hypergradient.__doc__ = """What `hypergradient` returns.

Attributes:
    value: the outer objective at the inner solution, a floating scalar tensor.
    grads: ``d value / d hyperparams``, structured like hyperparams (tensors of their
        dtypes).
    params: the inner solution the value is taken at, structured like params (tensors).
"""
#: An objective of the bilevel problem, ``objective(params, hyperparams) -> scalar``.
BilevelObjective = Callable[[Params, Tree], tf.Tensor]
_no_autograph = tf.autograph.experimental.do_not_convert


class Method:
    """A hypergradient method, built by `unrolled`, `implicit` or `one_step`.

    Called as ``method(inner_objective, outer_objective, params, hyperparams)`` (by
    `hypergradient`, which checks the arguments first), it returns a `Hypergradient`.

    Args:
        name: the method and its settings, shown by `repr`.
        fn: ``fn(inner_objective, outer_objective, params, hyperparams) -> Hypergradient``.
    """

    def __init__(self, name: str, fn: Callable[..., Hypergradient]) -> None:
        self.name, self._fn = name, fn

    def __call__(self, inner_objective: BilevelObjective, outer_objective: BilevelObjective,
                 params: Params, hyperparams: Tree) -> Hypergradient:
        return self._fn(inner_objective, outer_objective, params, hyperparams)

    def __repr__(self) -> str:
        return f"<hogrod.hypergrad method {self.name}>"


# ---- checks --------------------------------------------------------------------------------

def _check_optimizer(opt: Any, name: str, where: str) -> None:
    if not isinstance(opt, optim.Optimizer):
        raise TypeError(f"{where}: {name} must be a hogrod.optim optimizer (sgd(...), "
                        f"adam(...), ...), got {type(opt).__name__}")


def _float_tree(x: Tree, name: str, where: str) -> Tree:
    leaves = tf.nest.flatten(x)
    if not leaves:
        raise checks.ArgumentError(f"{where}: {name} has no tensors (got {x!r})")
    out = []
    for path, leaf in zip(implicit_lib.leaf_paths(x, name), leaves):
        if isinstance(leaf, tf.Variable):
            out.append(leaf)
            t = leaf
        elif isinstance(leaf, (tf.Tensor, np.ndarray)):
            t = tf.convert_to_tensor(leaf)
            out.append(t)
        else:
            raise checks.ArgumentError(
                f"{where}: {path} must be a tensor, a tf.Variable or a numpy array (a Python "
                f"number would have no gradient), got {type(leaf).__name__}")
        if not t.dtype.is_floating:
            raise checks.ArgumentError(f"{where}: {path} is {t.dtype.name}; it must be "
                                       "floating point")
    return tf.nest.pack_sequence_as(x, out)


def _call(fn: BilevelObjective, name: str, params: Params, hyperparams: Tree,
          where: str) -> tf.Tensor:
    """fn(params, hyperparams), checked to be a floating scalar; a failure on mixed dtypes
    (float32 hyperparameters with float64 params) names the hyperparameter."""
    try:
        t = tf.convert_to_tensor(fn(params, hyperparams))
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
        dtypes = {t.dtype for t in tf.nest.flatten(params)}
        if len(dtypes) == 1:
            dtype = dtypes.pop()
            for path, h in zip(implicit_lib.leaf_paths(hyperparams, "hyperparams"),
                               tf.nest.flatten(hyperparams)):
                if h.dtype != dtype:
                    reason = str(e).strip().splitlines()[0][:200]
                    raise checks.ArgumentError(
                        f"{where}: {name} failed on {path}, a {h.dtype.name} tensor, with "
                        f"params of {dtype.name} ({reason}); give {path} the params' dtype "
                        f"(tf.constant(x, tf.{dtype.name}))") from e
        raise
    if t.shape.rank != 0:
        raise ValueError(f"{where}: {name} must return a scalar, got shape {t.shape}")
    if not t.dtype.is_floating:
        raise TypeError(f"{where}: {name} must return a floating scalar, got {t.dtype.name}")
    return t


def _check_grads(grads: Tree, hyperparams: Tree, where: str) -> Tree:
    flat = tf.nest.flatten(grads)
    paths = implicit_lib.leaf_paths(hyperparams, "hyperparams")
    missing = [p for p, g in zip(paths, flat) if g is None]
    if missing:
        raise ValueError(f"{where}: the outer value does not depend on {', '.join(missing)}: "
                         "their hypergradient is undefined; remove them from hyperparams")
    return tf.nest.pack_sequence_as(hyperparams, [tf.convert_to_tensor(g) for g in flat])


def _finite(t: Tree) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(x)) for x in tf.nest.flatten(t)])


def _check_start(inner_objective: BilevelObjective, params: Params, hyperparams: Tree,
                 where: str) -> List[Any]:
    """Asserts (raises eagerly) that params, hyperparams and the inner objective at params
    are finite, each named: NaN data would otherwise surface as a wrong cause (an inner
    solve short of inner_tol) or as a NaN hypergradient."""
    asserts = []
    for name, tree_ in (("params", params), ("hyperparams", hyperparams)):
        for path, leaf in zip(implicit_lib.leaf_paths(tree_, name), tf.nest.flatten(tree_)):
            asserts += checks.require(_finite(leaf), f"{where}: {path} holds NaN or inf")
    value = _call(inner_objective, "inner_objective", params, hyperparams, where)
    asserts += checks.require(
        tf.math.is_finite(value),
        f"{where}: inner_objective(params, hyperparams) is not finite at the given params "
        "(NaN or inf in the data it closes over, or in its arithmetic)")
    return asserts


def _check_result(result: Hypergradient, where: str) -> Hypergradient:
    """The result, with its value and grads checked finite."""
    asserts = checks.require(
        _finite(result.value),
        f"{where}: outer_objective is not finite at the inner solution (NaN or inf in its "
        "data, or the inner optimizer diverged: lower its rate)")
    asserts += checks.require(
        _finite(result.grads),
        f"{where}: the hypergradient is not finite (the inner optimizer diverged, or the "
        "objectives overflow in their derivatives)")
    with tf.control_dependencies(asserts):
        return Hypergradient(*tf.nest.map_structure(tf.identity, tuple(result)))


# ---- the inner loop ------------------------------------------------------------------------

def _inner_grad(inner_objective: BilevelObjective, params: Params, hyperparams: Tree,
                where: str) -> Tree:
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = _call(inner_objective, "inner_objective", params, hyperparams, where)
    g = tape.gradient(loss, params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return g


def _inner_leaves(inner_objective: BilevelObjective, params: Params, hyperparams: Tree,
                  where: str) -> List[int]:
    """Indices of the hyperparams leaves that d_w inner_objective structurally depends on."""
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(hyperparams)]
    with tf.GradientTape() as tape:
        tape.watch(flat)
        g = _inner_grad(inner_objective, params, tf.nest.pack_sequence_as(hyperparams, flat), where)
        probe = tf.add_n([tf.reduce_sum(t) for t in tf.nest.flatten(g)])
    return [i for i, d in enumerate(tape.gradient(probe, flat)) if d is not None]


def _run(optimizer: optim.Optimizer, inner_objective: BilevelObjective, params: Params,
         state: Any, hyperparams: Tree, steps: int, where: str) -> Any:
    """`steps` optimizer updates on inner_objective from (params, state), as a tf.while_loop."""
    if steps == 0:
        return params, state

    def body(i, p, s):
        p, s = optimizer.update(_inner_grad(inner_objective, p, hyperparams, where), s, p)
        return i + 1, p, s

    _, params, state = tf.while_loop(lambda i, p, s: i < steps, body,
                                     (tf.constant(0), params, state),
                                     maximum_iterations=steps)
    return params, state


def _as_tensors(params: Params) -> Tree:
    return tf.nest.map_structure(tf.convert_to_tensor, params)


def _unroll(optimizer: optim.Optimizer, steps: int, truncate: int,
            where: str) -> Callable[..., Hypergradient]:
    @_no_autograph
    def method(inner_objective, outer_objective, params, hyperparams):
        params = _as_tensors(params)
        state = optimizer.init(params)
        with tf.GradientTape() as tape:
            tape.watch(hyperparams)
            with tape.stop_recording():  # the first K - T steps are constants
                params, state = _run(optimizer, inner_objective, params, state, hyperparams,
                                     steps - truncate, where)
            params, state = _run(optimizer, inner_objective, params, state, hyperparams, truncate,
                                 where)
            value = _call(outer_objective, "outer_objective", params, hyperparams, where)
        grads = tape.gradient(value, hyperparams)
        return Hypergradient(value, _check_grads(grads, hyperparams, where), params)

    return method


# ---- the methods ---------------------------------------------------------------------------

@gin.configurable(module="hogrod.hypergrad")
def unrolled(optimizer: optim.Optimizer, steps: int, truncate: Optional[int] = None) -> Method:
    """Differentiates through `steps` updates of `optimizer`, or only the last `truncate`.

    The inner loop is a `tf.while_loop` of ``optimizer.update`` on the gradient of the
    inner objective, from the given params and ``optimizer.init(params)``; the first
    ``steps - truncate`` updates are not recorded (truncated backprop).

    Args:
        optimizer: a `hogrod.optim` optimizer (``sgd(...)``, ``adam(...)``, ...).
        steps: the number of inner updates, a Python int >= 1.
        truncate: how many of the last updates are differentiated, a Python int with
            ``1 <= truncate <= steps``; None (default) means all `steps`.

    Returns:
        The `Method`, for `hypergradient`.

    Raises:
        TypeError: `optimizer` is not a `hogrod.optim` optimizer.
        ArgumentError: `steps` or `truncate` is not an int >= 1.
        ValueError: ``truncate > steps``.
    """
    where = "hogrod.hypergrad.unrolled"
    _check_optimizer(optimizer, "optimizer", where)
    checks.integer(steps, "steps", where, least=1)
    if truncate is None:
        truncate = steps
    checks.integer(truncate, "truncate", where, least=1)
    if truncate > steps:
        raise ValueError(f"{where}: truncate={truncate} must be <= steps={steps}")
    return Method(f"unrolled(steps={steps}, truncate={truncate})",
                  _unroll(optimizer, steps, truncate, where))


@gin.configurable(module="hogrod.hypergrad")
def one_step(optimizer: optim.Optimizer) -> Method:
    """T1-T2 / DARTS: differentiates one update of `optimizer` from the given params.

    Args:
        optimizer: a `hogrod.optim` optimizer (``sgd(xi)`` gives the DARTS formula of the
            module docstring).

    Returns:
        The `Method`, for `hypergradient`.

    Raises:
        TypeError: `optimizer` is not a `hogrod.optim` optimizer.
    """
    where = "hogrod.hypergrad.one_step"
    _check_optimizer(optimizer, "optimizer", where)
    return Method("one_step", _unroll(optimizer, 1, 1, where))


@gin.configurable(module="hogrod.hypergrad")
def neumann_series(steps: int, step: float = 1.0) -> Callable[[MatVec, Tree], Tree]:
    """The truncated Neumann series of Lorraine et al. (2020), a solve for `implicit`.

    ``H^{-1} b ~= step * sum_{k=0}^{steps} (I - step H)^k b``, exactly `steps` terms after
    the first (`hogrod.linalg.neumann` with tol 0; no convergence check: for one use
    ``solve="neumann"``). It converges as `steps` grows iff the spectral radius of
    ``I - step H`` is < 1 (``0 < step < 2 / lambda_max`` for ``H > 0``).

    Args:
        steps: the number of terms after the first, a Python int >= 0 (a fixed count).
        step: the series' step size, a finite Python number > 0 (applied at b's dtype);
            default 1.

    Returns:
        A callable ``solve(matvec, b)`` returning the truncated series, a tree like b.

    Raises:
        ArgumentError: `steps` is not an int >= 0, or `step` not a finite number > 0.
    """
    where = "hogrod.hypergrad.neumann_series"
    steps = checks.integer(steps, "steps", where, least=0)
    step = checks.positive(step, "step", where)

    def solve(matvec, b):
        return linalg.neumann(matvec, b, steps, tol=0.0, step=step)[0]

    solve.__qualname__ = f"neumann_series(steps={steps}, step={step})"
    return solve


@gin.configurable(module="hogrod.hypergrad")
def implicit(inner_optimizer: optim.Optimizer, inner_steps: int, solve: Solve = "cg",
             inner_tol: float = 1e-6, maxiter: Optional[int] = None,
             tol: Optional[float] = None, step: Optional[float] = None) -> Method:
    """Implicit differentiation at the inner optimum (see the module docstring).

    The inner solve is run without a tape, then `hogrod.implicit.custom_root` on the
    inner gradient gives the hypergradient of the hyperparameters the inner gradient
    depends on; the others get theirs from the outer objective alone.

    Args:
        inner_optimizer: the `hogrod.optim` optimizer of the inner solve.
        inner_steps: the inner solve's number of updates from params (not
            differentiated), a Python int >= 1.
        solve: "cg" (default; H symmetric positive definite: a strictly convex inner
            loss), "normal_cg", "neumann", "dense" (`custom_root`'s checked solves), or a
            callable ``solve(matvec, b)`` such as `neumann_series(steps, step)`.
        inner_tol: the inner solve must reach
            ``||g(w*)|| <= inner_tol * ||g(w_0)||`` (checked when the method runs); a
            Python number > 0, default 1e-6.
        maxiter: `custom_root`'s maxiter for a named solve; None (default): its default.
        tol: `custom_root`'s tol for a named solve; None (default): its default.
        step: `custom_root`'s step for "neumann"; None (default): its default.

    Returns:
        The `Method`, for `hypergradient`.

    Raises:
        TypeError: `inner_optimizer` is not a `hogrod.optim` optimizer.
        ArgumentError: `inner_steps` or `inner_tol` is out of range.
        ValueError: `solve` or its options (`maxiter`, `tol`, `step`) are invalid; the
            message names the gin bindings.
    """
    where = "hogrod.hypergrad.implicit"
    _check_optimizer(inner_optimizer, "inner_optimizer", where)
    checks.integer(inner_steps, "inner_steps", where, least=1)
    inner_tol = checks.positive(inner_tol, "inner_tol", where)
    options = {k: v for k, v in (("maxiter", maxiter), ("tol", tol), ("step", step))
               if v is not None}
    try:
        implicit_solves.check_solve(solve, options, where)
    except ValueError as e:
        raise ValueError(f"{e} (gin: hogrod.hypergrad.implicit.solve / .maxiter / .tol / "
                         ".step)") from None

    @_no_autograph
    def method(inner_objective, outer_objective, params, hyperparams):
        params = _as_tensors(params)
        flat = tf.nest.flatten(hyperparams)
        # custom_root differentiates only the leaves the inner gradient depends on (it refuses
        # others); a leaf only the outer loss reads gets its gradient from the outer tape.
        inner_idx = _inner_leaves(inner_objective, params, hyperparams, where)
        fixed = [tf.stop_gradient(tf.convert_to_tensor(t)) for t in flat]

        def full(h_inner):
            leaves = list(fixed)
            for i, t in zip(inner_idx, h_inner):
                leaves[i] = t
            return tf.nest.pack_sequence_as(hyperparams, leaves)

        def optimality(w, h_inner):  # F(w, h) = d_w inner_objective(w, h)
            return _inner_grad(inner_objective, w, full(h_inner), where)

        def solver(w0, h_inner):
            h = full(h_inner)
            w, _ = _run(inner_optimizer, inner_objective, w0, inner_optimizer.init(w0), h,
                        inner_steps, where)
            g0 = tree.norm(_inner_grad(inner_objective, w0, h, where))
            g = tree.norm(_inner_grad(inner_objective, w, h, where))
            finite = tf.math.is_finite(g)
            asserts = checks.require(
                tf.logical_or(tf.logical_not(finite), g <= inner_tol * g0),
                f"{where}: the inner solve did not reach ||grad|| <= inner_tol={inner_tol} * "
                f"||grad at params|| in inner_steps={inner_steps} steps of inner_optimizer; "
                "raise inner_steps or tune it")
            asserts += checks.require(
                finite, f"{where}: the inner solve diverged (its gradient is not finite after "
                        f"inner_steps={inner_steps} steps): lower inner_optimizer's rate")
            with tf.control_dependencies(asserts):
                return tf.nest.map_structure(tf.identity, w)

        # The solver checks its own root against inner_tol (relative to the start), with a
        # message naming inner_steps: custom_root's check would be a second, different one.
        root = implicit_lib.custom_root(optimality, solve, check_root=False,
                                        **options)(solver)
        with tf.GradientTape() as tape:
            tape.watch(hyperparams)
            h_inner = [tf.convert_to_tensor(flat[i]) for i in inner_idx]
            w = root(params, h_inner) if inner_idx else solver(params, [])
            value = _call(outer_objective, "outer_objective", w, hyperparams, where)
        grads = tape.gradient(value, hyperparams)
        return Hypergradient(value, _check_grads(grads, hyperparams, where), w)

    name = solve if isinstance(solve, str) else implicit_solves.callable_name(solve)
    return Method(f"implicit(solve={name})", method)


@gin.configurable(module="hogrod.hypergrad",
                  denylist=["inner_objective", "outer_objective", "params", "hyperparams"])
def hypergradient(inner_objective: BilevelObjective, outer_objective: BilevelObjective,
                  params: Params, hyperparams: Tree, method: Method) -> Hypergradient:
    """``d outer_objective(w(h), h) / dh`` by `method` (`unrolled`, `implicit`, `one_step`).

    Args:
        inner_objective: ``(params, hyperparams) -> scalar``, minimized over params: the
            inner training objective (its data closed over).
        outer_objective: ``(params, hyperparams) -> scalar``, the outer objective at the
            inner solution (a validation loss), minimized over hyperparams by the caller.
        params: the inner starting point, a `tf.nest` structure of floating tensors,
            variables (read, never assigned) or numpy arrays.
        hyperparams: a `tf.nest` structure of floating tensors, variables or numpy arrays,
            of the params' dtype.
        method: a `Method` built by `unrolled(...)`, `implicit(...)` or `one_step(...)`.

    Returns:
        A `Hypergradient` ``(value, grads, params)``: the outer value,
        ``d value / d hyperparams`` (structured like hyperparams) and the inner solution
        the value is taken at.

    Raises:
        TypeError: an objective is not callable, `method` is not a `Method`, or an
            objective returns a non-floating value.
        ArgumentError: params or hyperparams is empty, holds a non-floating leaf or a
            Python number, or a hyperparameter's dtype cannot be combined with the params'.
        ValueError: an objective does not return a scalar, the outer value does not
            depend on a hyperparameter, or (eagerly) a check fails: NaN or inf in params,
            hyperparams, the inner objective, the outer value or the hypergradient.
    """
    where = "hogrod.hypergrad.hypergradient"
    for name, fn in (("inner_objective", inner_objective),
                     ("outer_objective", outer_objective)):
        if not callable(fn):
            raise TypeError(f"{where}: {name} must be a callable (params, hyperparams) -> "
                            f"scalar, got {type(fn).__name__}")
    if not isinstance(method, Method):
        raise TypeError(f"{where}: method must be built by hogrod.hypergrad.unrolled(...), "
                        f"implicit(...) or one_step(...) (gin: hypergradient.method = "
                        f"@hogrod.hypergrad.unrolled()), got {method!r}")
    params = _float_tree(params, "params", where)
    hyperparams = _float_tree(hyperparams, "hyperparams", where)
    asserts = _check_start(inner_objective, params, hyperparams, where)
    with tf.control_dependencies(asserts):  # in a graph, the method runs after the checks
        params = tf.nest.map_structure(tf.identity, params)
    return _check_result(method(inner_objective, outer_objective, params, hyperparams), where)
