"""Nested-`tf.GradientTape` primitives: gradients, HVPs, Hessians, Jacobians.

Every function here takes a Python callable and the things to differentiate
with respect to, and returns plain tensors (or nested structures of them shaped
like the input), in the spirit of `jax.grad` / `jax.jvp`. They work eagerly and
inside a caller's `tf.function`; nothing here creates a `tf.function` of its own,
so the caller controls tracing, except `hvp_operator`, the compiled operator form of `hvp`
(traced once, where it is made).

`params` may be `tf.Variable`s, Keras 3 variables or plain tensors (of a floating dtype);
tensors are watched for you. Arguments are checked when a function is traced (types and
static shapes), and a bad one is an error naming it, so compiled callers pay nothing.
Keras 3 variables wrap a `tf.Variable` (`.value`); where TensorFlow needs the underlying
resource (forward-mode accumulators) it is unwrapped here so callers never have to.
"""

import numbers
from typing import Any, Callable, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest as _nest  # paths: dict keys must match, not just counts

from hogrod import checks, tree
from hogrod.types import OutputLoss, Params, Tensor, TensorLike, Tree

__all__ = [
    "value_and_grad",
    "grad",
    "hvp",
    "hvp_operator",
    "hessian",
    "jacobian",
    "batch_jacobian",
    "derivatives",
    "gnvp",
    "HVP_MODES",
]

HVP_MODES = ("reverse_over_reverse", "forward_over_reverse")
# What `mode="auto"` picks: forward-over-reverse is the faster mode in experiments/bench/hvp.py
# (one forward-mode pass over the gradient instead of a second tape over it; the figures are
# in experiments/RESULTS.md, "Primitives"), and no slower where the two are within noise.
_AUTO_HVP_MODE = "forward_over_reverse"
_UNCONNECTED = ("zero", "none", "raise")


def unwrap(p: Any) -> Any:
    """The object TensorFlow's autodiff tracks for `p` (a Keras 3 variable's tf.Variable)."""
    if isinstance(p, keras.Variable):
        return p.value
    return p


def _name(p: Any, index: int, arg: str = "params") -> str:
    path = getattr(p, "path", None) or getattr(p, "name", None)
    try:
        return f"{path} ({arg}[{index}])" if path else f"{arg}[{index}]"
    except Exception:  # symbolic tensors in graph mode have no usable name
        return f"{arg}[{index}]"


def _dtype(p: Any) -> tf.DType:
    """A tf.DType (a Keras 3 variable's `.dtype` is a string)."""
    return tf.as_dtype(unwrap(p).dtype)


def _scalar(value: TensorLike, what: str, fn_name: str = "fn()") -> tf.Tensor:
    value = tf.convert_to_tensor(value)
    if value.shape.rank not in (0, None):
        raise ValueError(f"{what}: {fn_name} must return a scalar, got shape {value.shape}")
    return value


def _watch(tape: tf.GradientTape, flat: Sequence[Any]) -> None:
    for p in flat:
        if not isinstance(p, (tf.Variable, keras.Variable)):
            tape.watch(p)


def fill_unconnected(grads: List[Optional[tf.Tensor]], flat: Sequence[Any], unconnected: str,
                     what: str = "value") -> List[Optional[tf.Tensor]]:
    """Apply the `unconnected` policy to a flat list of gradients."""
    if unconnected not in _UNCONNECTED:
        raise ValueError(f"unconnected must be one of {_UNCONNECTED}, got {unconnected!r}")
    missing = [i for i, g in enumerate(grads) if g is None]
    if not missing:
        return grads
    if unconnected == "raise":
        names = ", ".join(_name(flat[i], i) for i in missing)
        raise ValueError(f"The {what} does not depend on: {names}")
    if unconnected == "none":
        return grads
    return [tf.zeros_like(unwrap(p)) if g is None else g for g, p in zip(grads, flat)]


def densify(g: Any) -> Any:
    """`g` as a dense tensor if it is a `tf.IndexedSlices` (an embedding's gradient), else `g`."""
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def value_and_grad(fn: Callable[[], TensorLike], params: Params,
                   unconnected: str = "zero") -> Tuple[tf.Tensor, Tree]:
    """Value of `fn()` and its gradient with respect to `params`.

    Tensors among `params` are watched for you; a sparse gradient (`tf.IndexedSlices`) is
    made dense.

    Args:
        fn: a callable of no arguments returning a scalar (rank 0) tensor.
        params: a variable, tensor, or nested structure of them, of floating (or complex)
            dtypes.
        unconnected: what a param `fn` does not depend on gets: "zero" (default: zeros of
            its shape), "none" (None) or "raise" (a ValueError naming them).

    Returns:
        A tuple ``(value, grads)``: the scalar ``fn()`` and the gradient, structured like
        `params`.

    Raises:
        ArgumentError: `params` is empty or holds a non-differentiable leaf.
        ValueError: ``fn()`` is not a scalar, `unconnected` is not one of the three, or
            (with "raise") ``fn()`` does not depend on some params.
    """
    flat = checks.params(params, "value_and_grad")
    with tf.GradientTape() as tape:
        _watch(tape, flat)
        value = _scalar(fn(), "value_and_grad")
    grads = [densify(g) for g in tape.gradient(value, flat)]
    grads = fill_unconnected(grads, flat, unconnected)
    return value, tf.nest.pack_sequence_as(params, grads)


def grad(fn: Callable[[], TensorLike], params: Params, unconnected: str = "zero") -> Tree:
    """The gradient of the scalar `fn()` with respect to `params` (see `value_and_grad`).

    Args:
        fn: a callable of no arguments returning a scalar (rank 0) tensor.
        params: a variable, tensor, or nested structure of them, of floating (or complex)
            dtypes.
        unconnected: what a param `fn` does not depend on gets: "zero" (default: zeros of
            its shape), "none" (None) or "raise" (a ValueError naming them).

    Returns:
        The gradient, structured like `params`.

    Raises:
        ArgumentError: `params` is empty or holds a non-differentiable leaf.
        ValueError: ``fn()`` is not a scalar, `unconnected` is not one of the three, or
            (with "raise") ``fn()`` does not depend on some params.
    """
    return value_and_grad(fn, params, unconnected)[1]


def _check_vector(params: Params, vector: Tree,
                  what: str) -> Tuple[List[Any], List[tf.Tensor]]:
    """(flat params, flat vector): the vector structured and shaped like the params, each
    part a tensor of its param's dtype. Numbers and numpy arrays are converted at the
    param's dtype; a tensor of another dtype is an error (casting would hide a precision
    loss or a mix-up)."""
    flat_p = checks.params(params, what)
    try:
        tf.nest.assert_same_structure(params, vector, check_types=False)
        same = ([k for k, _ in _nest.flatten_with_joined_string_paths(params)]
                == [k for k, _ in _nest.flatten_with_joined_string_paths(vector)])
    except (ValueError, TypeError):
        same = False
    if not same:
        raise ValueError(f"{what}: vector must be structured like params; params is "
                         f"{checks.describe(params)} ({len(flat_p)} parts) and vector is "
                         f"{checks.describe(vector)} ({len(tf.nest.flatten(vector))} parts)") from None
    flat_v = []
    for i, (p, v) in enumerate(zip(flat_p, tf.nest.flatten(vector))):
        dtype = _dtype(p)
        if isinstance(v, (numbers.Number, np.ndarray, np.generic)) and not isinstance(v, bool):
            v = tf.constant(np.asarray(v, dtype.as_numpy_dtype))
        elif isinstance(v, (tf.Variable, keras.Variable)):
            v = tf.convert_to_tensor(unwrap(v))
        elif not isinstance(v, tf.Tensor):
            raise TypeError(f"{what}: vector[{i}] (for {_name(p, i)}) must be a tensor, a number "
                            f"or a numpy array, got {type(v).__name__}")
        if v.dtype != dtype:
            raise TypeError(f"{what}: vector[{i}] has dtype {v.dtype.name} but {_name(p, i)} has "
                            f"dtype {dtype.name}; cast the vector (tf.cast(v, {dtype.name!r}))")
        if not v.shape.is_compatible_with(p.shape):
            raise ValueError(f"{what}: vector[{i}] has shape {v.shape} but {_name(p, i)} has "
                             f"shape {p.shape}")
        flat_v.append(v)
    return flat_p, flat_v


def hvp(fn: Callable[[], TensorLike], params: Params, vector: Tree,
        mode: str = "auto") -> Tree:
    """Hessian-vector product ``H v`` of the scalar `fn()` with respect to `params`.

    Args:
        fn: a callable of no arguments returning a scalar (rank 0) tensor.
        params: variables / tensors (nested structure) of floating dtypes.
        vector: a structure like `params` (the v in ``H v``; dict keys must match too):
            tensors of the params' shapes and dtypes, or numbers / numpy arrays (converted
            at the params' dtypes).
        mode: "reverse_over_reverse" (nested tapes: ``d/dp <grad f, v>``),
            "forward_over_reverse" (a `tf.autodiff.ForwardAccumulator` pushing v through
            the gradient computation) or "auto" (default: the faster one on the reference
            benchmark, ``experiments/bench/hvp.py``, forward-over-reverse).

    Returns:
        ``H v``, structured like `params`. Params `fn` does not depend on get zeros.

    Raises:
        ArgumentError: `params` is empty or holds a non-differentiable leaf.
        ValueError: `mode` is unknown, ``fn()`` is not a scalar, or `vector` is not
            structured or shaped like `params`.
        TypeError: a part of `vector` is a tensor of another dtype than its param, or not
            a tensor, number or array.
    """
    if mode == "auto":
        mode = _AUTO_HVP_MODE
    if mode not in HVP_MODES:
        raise ValueError(f"mode must be 'auto' or one of {HVP_MODES}, got {mode!r}")
    flat_p, flat_v = _check_vector(params, vector, "hvp")
    if mode == "reverse_over_reverse":
        with tf.GradientTape() as outer:
            _watch(outer, flat_p)
            with tf.GradientTape() as inner:
                _watch(inner, flat_p)
                value = _scalar(fn(), "hvp")
            grads = fill_unconnected(inner.gradient(value, flat_p), flat_p, "zero")
            dot = tree.dot([densify(g) for g in grads], flat_v)
        out = outer.gradient(dot, flat_p)
    else:
        primals = [unwrap(p) for p in flat_p]
        with tf.autodiff.ForwardAccumulator(primals, flat_v) as acc:
            with tf.GradientTape() as tape:
                _watch(tape, flat_p)
                value = _scalar(fn(), "hvp")
            grads = tape.gradient(value, flat_p)
        out = [None if g is None else acc.jvp(densify(g)) for g in grads]
    out = fill_unconnected([densify(g) for g in out], flat_p, "zero")
    return tf.nest.pack_sequence_as(params, out)


def hvp_operator(fn: Callable[[], TensorLike], params: Params, mode: str = "auto",
                 jit_compile: bool = False) -> Callable[[Tree], Tree]:
    """The Hessian of the scalar `fn()` as a compiled product ``v -> H v``: `hvp`, traced once.

    The fast way to take many HVPs at the same `params` (an eigensolver's, CG's, a
    benchmark's). `hvp` inside a caller's `tf.function` pays that function's per-call
    matching of its arguments to a trace on every product; this operator traces `hvp` once,
    here, for the params' shapes and dtypes, and calls that graph directly
    (``experiments/bench/hvp.py``: the path ahead of JAX's ``jit(jvp(grad))``). Variables
    in `params` (and those `fn` reads) are read at each product, so the operator follows
    their updates; plain tensors are captured at their values now.

    Args:
        fn: a callable of no arguments returning a scalar (rank 0) tensor, traceable by
            `tf.function` (traced here, once).
        params: variables / tensors (nested structure) of floating dtypes, of fully known
            shapes.
        mode: as `hvp`'s ("auto": forward-over-reverse).
        jit_compile: compile the product with XLA (the first product compiles it).

    Returns:
        ``matvec(vector) -> H v``, `vector` structured like `params` (checked as `hvp`
        checks it: tensors of the params' dtypes and shapes, numbers or numpy arrays), the
        product structured like `params`. It may be called eagerly or inside a
        `tf.function`.

    Raises:
        ArgumentError: `params` is empty, holds a non-differentiable leaf or a leaf of
            unknown shape, or `jit_compile` is not a bool.
        ValueError: `mode` is unknown or ``fn()`` is not a scalar (at the trace, here);
            from `matvec`, `vector` not structured or shaped like `params`.
        TypeError: from `matvec`, a part of `vector` of another dtype than its param.
    """
    where = "hvp_operator"
    if mode != "auto" and mode not in HVP_MODES:
        raise ValueError(f"{where}: mode must be 'auto' or one of {HVP_MODES}, got {mode!r}")
    checks.boolean(jit_compile, "jit_compile", where)
    flat_p = checks.params(params, where)
    specs = []
    for i, p in enumerate(flat_p):
        shape = tf.TensorShape(p.shape)
        if not shape.is_fully_defined():
            raise checks.ArgumentError(f"{where}: {_name(p, i)} has shape {shape}, not fully "
                                       "known; the operator is traced once for fixed shapes")
        specs.append(tf.TensorSpec(shape, _dtype(p)))

    def product(*flat_v):
        vector = tf.nest.pack_sequence_as(params, list(flat_v))
        return tf.nest.flatten(hvp(fn, params, vector, mode=mode))

    # reduce_retracing off: one concrete function, called directly, never matched again
    concrete = tf.function(product, jit_compile=jit_compile,
                           autograph=False).get_concrete_function(*specs)

    paths = [k for k, _ in _nest.flatten_with_joined_string_paths(params)]

    def matvec(vector: Tree) -> Tree:
        flat_v = _fast_vector(paths, vector, specs)
        if flat_v is None:  # anything but tensors of the params' dtypes and shapes
            flat_v = _check_vector(params, vector, f"{where}'s matvec")[1]
        return tf.nest.pack_sequence_as(params, concrete(*flat_v))

    return matvec


def _fast_vector(paths: List[str], vector: Tree, specs: List[tf.TensorSpec]) -> Optional[list]:
    """The flat vector if its paths are the params' and its leaves tensors of their specs."""
    leaves = _nest.flatten_with_joined_string_paths(vector)
    if [k for k, _ in leaves] != paths:
        return None
    flat_v = [v for _, v in leaves]
    same = all(isinstance(v, tf.Tensor) and v.dtype == s.dtype and v.shape == s.shape
               for v, s in zip(flat_v, specs))
    return flat_v if same else None


def hessian(fn: Callable[[], TensorLike], params: Params) -> tf.Tensor:
    """The dense Hessian of the scalar `fn()`, shape ``[n, n]``, n the total size of params.

    Params are flattened (row-major) and concatenated in `tf.nest.flatten` order (the order
    of `hogrod.tree.flatten`); meant for small problems and as an oracle for the
    matrix-free tools. Params `fn` does not depend on get zero rows and columns.

    Args:
        fn: a callable of no arguments returning a scalar (rank 0) tensor.
        params: variables / tensors (nested structure) of floating dtypes.

    Returns:
        The ``[n, n]`` Hessian, of the params' dtype.

    Raises:
        ArgumentError: `params` is empty or holds a non-differentiable leaf.
        ValueError: ``fn()`` is not a scalar.
    """
    flat = checks.params(params, "hessian")
    with tf.GradientTape(persistent=True) as outer:
        _watch(outer, flat)
        with tf.GradientTape() as inner:
            _watch(inner, flat)
            value = _scalar(fn(), "hessian")
        grads = fill_unconnected(inner.gradient(value, flat), flat, "zero")
        flat_grad = tf.concat([tf.reshape(densify(g), [-1]) for g in grads], axis=0)
    n = flat_grad.shape[0]
    blocks = outer.jacobian(flat_grad, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO,
                            experimental_use_pfor=True)
    del outer
    rows = [tf.reshape(b, [n if n is not None else -1, -1]) for b in blocks]
    return tf.concat(rows, axis=1)


def jacobian(fn: Callable[[Tree], Tensor], x: Tree) -> Tree:
    """Jacobian of `fn(x)` with respect to `x`: shape ``fn(x).shape + x.shape``.

    Args:
        fn: a callable ``fn(x) -> tensor`` (any shape).
        x: a tensor or variable of a floating dtype, or a nested structure of them.

    Returns:
        The Jacobian, of shape ``fn(x).shape + x.shape``; for a nested `x`, a structure
        like `x` of such blocks. Parts of `x` that ``fn(x)`` does not depend on get zeros.

    Raises:
        ArgumentError: `x` is empty or holds a non-differentiable leaf.
    """
    # the tf.Variable inside a Keras 3 variable is what a tape can watch and track
    sources = tf.nest.pack_sequence_as(x, [unwrap(p) for p in checks.params(x, "jacobian",
                                                                              "x")])
    with tf.GradientTape() as tape:
        tape.watch(sources)
        y = fn(x)
    return tape.jacobian(y, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def batch_jacobian(fn: Callable[[tf.Tensor], TensorLike], x: tf.Tensor) -> tf.Tensor:
    """Per-example Jacobian ``dy[i]/dx[i]`` for ``y = fn(x)``, ``y[i]`` depending on ``x[i]``.

    Args:
        fn: a callable ``fn(x) -> y`` keeping x's batch axis; ``y[i]`` must depend on
            ``x[i]`` only (not checked: a cross-example dependence is dropped).
        x: one tensor of a floating dtype, shape ``[batch, ...]``.

    Returns:
        The Jacobians, shape ``[batch] + y.shape[1:] + x.shape[1:]``.

    Raises:
        TypeError: `x` is a nested structure.
        ArgumentError: `x` is not a floating-point tensor.
        ValueError: `x` is a scalar, or ``fn(x)`` does not keep x's batch axis.
    """
    if tf.nest.is_nested(x):
        raise TypeError(f"batch_jacobian: x must be one tensor of shape [batch, ...], got "
                        f"{checks.describe(x)}")
    checks.params(x, "batch_jacobian", "x")
    if x.shape.rank == 0:
        raise ValueError("batch_jacobian: x must have a batch axis, got a scalar")
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.convert_to_tensor(fn(x))
    if y.shape.rank == 0 or not y.shape[:1].is_compatible_with(x.shape[:1]):
        raise ValueError(f"batch_jacobian: fn(x) must keep x's batch axis: x has shape "
                         f"{x.shape} and fn(x) has shape {y.shape}")
    return tape.batch_jacobian(y, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def derivatives(fn: Callable[[tf.Tensor], TensorLike], x: TensorLike,
                order: int) -> List[tf.Tensor]:
    """``[f'(x), f''(x), ..., f^(order)(x)]`` of an elementwise `fn`, by nested tapes.

    For elementwise f the gradient of ``sum(f(x))`` is ``f'(x)`` elementwise, so each level
    differentiates the previous one; ``x * x * x`` gives ``[3 x**2, 6 x, 6, 0, ...]``.
    (Beware ``x ** 3`` at ``x = 0`` beyond order 3: TensorFlow's Pow gradient there is
    ``0 * x**-1``, a NaN; write powers as products where the tower must go that high.)

    Args:
        fn: an elementwise callable ``fn(x) -> tensor of x's shape``.
        x: the points, a tensor (or number / array, converted) of a floating dtype.
        order: the highest derivative, a Python int >= 1.

    Returns:
        A list of `order` tensors shaped like `x`: the k-th is the k-th derivative
        (zeros where ``fn`` no longer depends on x).

    Raises:
        ValueError: `order` is not a positive integer, or ``fn(x)`` is not shaped like
            `x`.
        ArgumentError: `x` is not of a floating dtype.
    """
    if not isinstance(order, numbers.Integral) or isinstance(order, bool) or order < 1:
        raise ValueError(f"derivatives: order must be a positive integer, got {order!r}")
    x = tf.convert_to_tensor(x)
    checks.params(x, "derivatives", "x")
    tapes, derivs = [], []
    try:
        for _ in range(order):  # outermost first
            tape = tf.GradientTape()
            tape.__enter__()
            tape.watch(x)
            tapes.append(tape)
        current = tf.convert_to_tensor(fn(x))
        if not current.shape.is_compatible_with(x.shape):
            raise ValueError(f"derivatives: fn must be elementwise, but fn(x) has shape "
                             f"{current.shape} for x of shape {x.shape}")
        while tapes:  # innermost first; outer tapes record each gradient
            tape = tapes.pop()
            tape.__exit__(None, None, None)
            current = tape.gradient(current, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            derivs.append(current)
    finally:
        for tape in reversed(tapes):
            tape.__exit__(None, None, None)
    return derivs


def gnvp(model_fn: Callable[[], TensorLike], output_loss: OutputLoss, params: Params,
         vector: Tree) -> Tree:
    """Gauss-Newton-vector product ``G v = J^T H_L J v``.

    The generalized Gauss-Newton matrix of a loss ``L(z(params))``, where z are the model
    outputs, ``J = dz/dparams`` and ``H_L = d^2 L / dz^2``. It is positive semi-definite
    for convex losses (MSE, cross-entropy on logits), which makes it the curvature used by
    second-order optimizers and influence functions.

    Args:
        model_fn: a callable of no arguments returning the model output z (any shape, a
            floating dtype; depends on `params`).
        output_loss: a loss of the model output alone, ``output_loss(z) -> scalar``
            (labels closed over); a Keras loss is ``lambda z: loss(y_true, z)``.
        params: variables / tensors (nested structure) of floating dtypes.
        vector: a structure like `params` (as for `hvp`).

    Returns:
        ``G v``, structured like `params`; params the output does not depend on get
        zeros.

    Raises:
        ArgumentError: `params` is empty or holds a non-differentiable leaf.
        ValueError: `vector` is not structured or shaped like `params`, or
            ``output_loss(z)`` is not a scalar.
        TypeError: ``model_fn()`` is not floating point, or a part of `vector` has
            another dtype than its param.
    """
    flat_p, flat_v = _check_vector(params, vector, "gnvp")
    primals = [unwrap(p) for p in flat_p]
    with tf.GradientTape() as tape:
        _watch(tape, flat_p)
        with tf.autodiff.ForwardAccumulator(primals, flat_v) as acc:
            z = tf.convert_to_tensor(model_fn())
        if not (z.dtype.is_floating or z.dtype.is_complex):
            raise TypeError(f"gnvp: model_fn() must return floating-point outputs, got dtype "
                            f"{z.dtype.name}")
        jv = acc.jvp(z, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    z_const = tf.stop_gradient(z)
    hjv = hvp(lambda: _scalar(output_loss(z_const), "gnvp", "output_loss(z)"), z_const,
              tf.stop_gradient(jv), mode="reverse_over_reverse")
    out = tape.gradient(z, flat_p, output_gradients=hjv)
    out = fill_unconnected([densify(g) for g in out], flat_p, "zero")
    return tf.nest.pack_sequence_as(params, out)
