"""Nested-`tf.GradientTape` primitives: gradients, HVPs, Hessians, Jacobians.

Every function here takes a Python callable and the things to differentiate
with respect to, and returns plain tensors (or nested structures of them shaped
like the input), in the spirit of `jax.grad` / `jax.jvp`. They work eagerly and
inside a caller's `tf.function`; nothing here creates a `tf.function` of its own,
so the caller controls tracing.

`params` may be `tf.Variable`s, Keras 3 variables or plain tensors; tensors are
watched for you. Keras 3 variables wrap a `tf.Variable` (`.value`); where
TensorFlow needs the underlying resource (forward-mode accumulators) it is
unwrapped here so callers never have to.
"""

import keras
import tensorflow as tf

from hogrod import tree

__all__ = [
    "value_and_grad",
    "grad",
    "hvp",
    "hessian",
    "jacobian",
    "batch_jacobian",
    "derivatives",
    "gnvp",
    "HVP_MODES",
]

HVP_MODES = ("reverse_over_reverse", "forward_over_reverse")
# Chosen by experiments/bench_hvp.py (see WORKSPACE.md, "Benchmarks"): on a quiet machine
# forward-over-reverse was the faster mode in every run (0.92-1.00x JAX's HVP against
# 1.04-1.07x for nested tapes); under heavy load the two were within noise.
_AUTO_HVP_MODE = "forward_over_reverse"
_UNCONNECTED = ("zero", "none", "raise")


def _unwrap(p):
    """The object TensorFlow's autodiff tracks for `p` (a Keras 3 variable's tf.Variable)."""
    if isinstance(p, keras.Variable):
        return p.value
    return p


def _name(p, index):
    path = getattr(p, "path", None) or getattr(p, "name", None)
    try:
        return f"{path} (params[{index}])" if path else f"params[{index}]"
    except Exception:  # symbolic tensors in graph mode have no usable name
        return f"params[{index}]"


def _watch(tape, flat):
    for p in flat:
        if not isinstance(p, (tf.Variable, keras.Variable)):
            tape.watch(p)


def _fill_unconnected(grads, flat, unconnected, what="value"):
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
    return [tf.zeros_like(_unwrap(p)) if g is None else g for g, p in zip(grads, flat)]


def _densify(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def value_and_grad(fn, params, unconnected="zero"):
    """Value of `fn()` and its gradient with respect to `params`.

    Args:
      fn: a callable of no arguments returning a scalar tensor.
      params: a variable, tensor, or nested structure of them.
      unconnected: "zero" (zeros for params `fn` does not depend on), "none"
        (None for those) or "raise" (a ValueError naming them).

    Returns:
      `(value, grads)` with `grads` structured like `params`.
    """
    flat = tf.nest.flatten(params)
    with tf.GradientTape() as tape:
        _watch(tape, flat)
        value = fn()
    value = tf.convert_to_tensor(value)
    if value.shape.rank not in (0, None):
        raise ValueError(f"fn() must return a scalar, got shape {value.shape}")
    grads = [_densify(g) for g in tape.gradient(value, flat)]
    grads = _fill_unconnected(grads, flat, unconnected)
    return value, tf.nest.pack_sequence_as(params, grads)


def grad(fn, params, unconnected="zero"):
    """The gradient of the scalar `fn()` with respect to `params` (see `value_and_grad`)."""
    return value_and_grad(fn, params, unconnected)[1]


def _check_vector(params, vector):
    try:
        tf.nest.assert_same_structure(params, vector)
    except (ValueError, TypeError) as e:
        raise ValueError(f"vector must be structured like params: {e}") from None
    flat_p, flat_v = tf.nest.flatten(params), tf.nest.flatten(vector)
    for i, (p, v) in enumerate(zip(flat_p, flat_v)):
        if not tf.TensorShape(v.shape).is_compatible_with(p.shape):
            raise ValueError(
                f"vector shape {v.shape} does not match {_name(p, i)} of shape {p.shape}")
    return flat_p, flat_v


def hvp(fn, params, vector, mode="auto"):
    """Hessian-vector product H v of the scalar `fn()` with respect to `params`.

    Args:
      fn: a callable of no arguments returning a scalar.
      params: variables / tensors (nested structure).
      vector: a structure like `params` (the v in H v).
      mode: "reverse_over_reverse" (nested tapes: d/dp <grad f, v>),
        "forward_over_reverse" (a `tf.autodiff.ForwardAccumulator` pushing v
        through the gradient computation) or "auto" (the faster one on the
        reference benchmark, `experiments/bench_hvp.py`).

    Returns:
      H v, structured like `params`. Params `fn` does not depend on get zeros.
    """
    if mode == "auto":
        mode = _AUTO_HVP_MODE
    if mode not in HVP_MODES:
        raise ValueError(f"mode must be 'auto' or one of {HVP_MODES}, got {mode!r}")
    flat_p, flat_v = _check_vector(params, vector)
    flat_v = [tf.cast(v, _unwrap(p).dtype) for p, v in zip(flat_p, flat_v)]
    if mode == "reverse_over_reverse":
        with tf.GradientTape() as outer:
            _watch(outer, flat_p)
            with tf.GradientTape() as inner:
                _watch(inner, flat_p)
                value = fn()
            grads = _fill_unconnected(inner.gradient(value, flat_p), flat_p, "zero")
            dot = tree.dot([_densify(g) for g in grads], flat_v)
        out = outer.gradient(dot, flat_p)
    else:
        primals = [_unwrap(p) for p in flat_p]
        with tf.autodiff.ForwardAccumulator(primals, flat_v) as acc:
            with tf.GradientTape() as tape:
                _watch(tape, flat_p)
                value = fn()
            grads = tape.gradient(value, flat_p)
        out = [None if g is None else acc.jvp(_densify(g)) for g in grads]
    out = _fill_unconnected([_densify(g) for g in out], flat_p, "zero")
    return tf.nest.pack_sequence_as(params, out)


def hessian(fn, params):
    """The dense Hessian of the scalar `fn()`, shape [n, n], n = total size of params.

    Params are flattened (row-major) and concatenated in `tf.nest.flatten`
    order; meant for small problems and as an oracle for the matrix-free tools.
    """
    flat = tf.nest.flatten(params)
    with tf.GradientTape(persistent=True) as outer:
        _watch(outer, flat)
        with tf.GradientTape() as inner:
            _watch(inner, flat)
            value = fn()
        grads = _fill_unconnected(inner.gradient(value, flat), flat, "zero")
        flat_grad = tf.concat([tf.reshape(_densify(g), [-1]) for g in grads], axis=0)
    n = flat_grad.shape[0]
    blocks = outer.jacobian(flat_grad, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO,
                            experimental_use_pfor=True)
    del outer
    rows = [tf.reshape(b, [n if n is not None else -1, -1]) for b in blocks]
    return tf.concat(rows, axis=1)


def jacobian(fn, x):
    """Jacobian of `fn(x)` with respect to `x`: shape `fn(x).shape + x.shape`.

    `x` may be a nested structure; the result is then structured like `x`.
    """
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.jacobian(y, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def batch_jacobian(fn, x):
    """Per-example Jacobian: for y = fn(x) with y[i] depending only on x[i],
    returns dy[i]/dx[i] of shape [batch] + y.shape[1:] + x.shape[1:]."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.batch_jacobian(y, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def derivatives(fn, x, order):
    """`[f'(x), f''(x), ..., f^(order)(x)]` of an elementwise `fn`, by nested tapes.

    For elementwise f the gradient of sum(f(x)) is f'(x) elementwise, so each
    level differentiates the previous one; x*x*x gives [3x**2, 6x, 6, 0, ...].
    (Beware `x ** 3` at x = 0 beyond order 3: TensorFlow's Pow gradient there is
    0 * x**-1, a NaN; write powers as products where the tower must go that high.)
    """
    if int(order) != order or order < 1:
        raise ValueError(f"order must be a positive integer, got {order!r}")
    x = tf.convert_to_tensor(x)
    tapes, derivs = [], []
    try:
        for _ in range(order):  # outermost first
            tape = tf.GradientTape()
            tape.__enter__()
            tape.watch(x)
            tapes.append(tape)
        current = fn(x)
        while tapes:  # innermost first; outer tapes record each gradient
            tape = tapes.pop()
            tape.__exit__(None, None, None)
            current = tape.gradient(current, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            derivs.append(current)
    finally:
        for tape in reversed(tapes):
            tape.__exit__(None, None, None)
    return derivs


def gnvp(model_fn, loss_fn, params, vector):
    """Gauss-Newton-vector product G v = J^T H_L J v.

    The generalized Gauss-Newton matrix of a loss L(z(params)), where z are the
    model outputs, J = dz/dparams and H_L = d^2 L / dz^2. It is positive
    semi-definite for convex losses (MSE, cross-entropy on logits), which makes
    it the curvature used by second-order optimizers and influence functions.

    Args:
      model_fn: a callable of no arguments returning the model output z
        (any shape; depends on `params`).
      loss_fn: a callable taking z and returning a scalar loss.
      params: variables / tensors (nested structure).
      vector: a structure like `params`.

    Returns:
      G v, structured like `params`.
    """
    flat_p, flat_v = _check_vector(params, vector)
    flat_v = [tf.cast(v, _unwrap(p).dtype) for p, v in zip(flat_p, flat_v)]
    primals = [_unwrap(p) for p in flat_p]
    with tf.GradientTape() as tape:
        _watch(tape, flat_p)
        with tf.autodiff.ForwardAccumulator(primals, flat_v) as acc:
            z = model_fn()
        jv = acc.jvp(z, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    z_const = tf.stop_gradient(z)
    hjv = hvp(lambda: loss_fn(z_const), z_const, tf.stop_gradient(jv),
              mode="reverse_over_reverse")
    out = tape.gradient(z, flat_p, output_gradients=hjv)
    out = _fill_unconnected([_densify(g) for g in out], flat_p, "zero")
    return tf.nest.pack_sequence_as(params, out)
