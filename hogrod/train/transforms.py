"""Gradient transforms: small functions from (grads, variables) to grads, composed with `chain`.

In the style of optax: each transform is a plain function, so a researcher adds one by
writing a function. They run inside the compiled train step on the gradient summed over
replicas (the global gradient), after loss scaling is undone.

A transform is `transform(grads, variables) -> grads`: `grads` a list with one gradient (or
None) per variable of `variables`, in that order; it returns a list of the same length.
"""

from typing import Callable, Optional, Sequence

from absl import logging
import tensorflow as tf

__all__ = ["chain", "clip_by_global_norm", "clip_by_value", "zeros_for_unconnected",
           "global_norm"]


def chain(*transforms: Callable[..., list]) -> Callable[..., list]:
    """Compose gradient transforms, applied left to right.

    Args:
      *transforms: transforms `transform(grads, variables) -> grads`; the first sees the
        gradient, each next one the previous one's result.

    Returns:
      The transform `apply(grads, variables) -> grads` applying them in order (none: the
      gradients unchanged).
    """
    def apply(grads, variables):
        for t in transforms:
            grads = t(grads, variables)
        return grads
    return apply


def _norm_dtype(grads):
    """float64 if any gradient is float64, else float32 (half precision squared in float32)."""
    return tf.float64 if any(g is not None and g.dtype == tf.float64 for g in grads) \
        else tf.float32


def global_norm(grads: Sequence[Optional[tf.Tensor]]) -> tf.Tensor:
    """The global norm: sqrt(sum of squares) over every entry of every gradient.

    Args:
      grads: gradients of any shapes and float dtypes; Nones are skipped.

    Returns:
      A scalar tensor, float64 if any gradient is float64 (a float64 model's norm exact to
      its rounding), else float32 (half-precision gradients squared in float32); 0.0 when
      every gradient is None or there are none.
    """
    dtype = _norm_dtype(grads)
    squares = [tf.reduce_sum(tf.square(tf.cast(g, dtype))) for g in grads if g is not None]
    return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)


def clip_by_global_norm(max_norm: float) -> Callable[..., list]:
    """A transform scaling all gradients together so their global norm is at most `max_norm`.

    Every gradient is multiplied by ``min(1, max_norm / global_norm(grads))`` (the scale is
    computed at the norm's dtype, float64 for float64 gradients, then cast to each
    gradient's dtype); Nones stay None.

    Args:
      max_norm: the largest global norm allowed, > 0.

    Returns:
      The transform `apply(grads, variables) -> grads`.

    Raises:
      ValueError: `max_norm` is not > 0.
    """
    if max_norm <= 0:
        raise ValueError(f"clip_by_global_norm needs max_norm > 0, got {max_norm}")

    def apply(grads, variables):
        norm = global_norm(grads)
        one, limit = tf.constant(1.0, norm.dtype), tf.constant(max_norm, norm.dtype)
        scale = tf.minimum(one, limit / tf.maximum(norm, tf.constant(1e-12, norm.dtype)))
        return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]
    return apply


def clip_by_value(limit: float) -> Callable[..., list]:
    """A transform clipping every gradient entry to [-limit, limit].

    Args:
      limit: the largest absolute value of an entry, > 0.

    Returns:
      The transform `apply(grads, variables) -> grads`; Nones stay None.

    Raises:
      ValueError: `limit` is not > 0.
    """
    if limit <= 0:
        raise ValueError(f"clip_by_value needs limit > 0, got {limit}")

    def apply(grads, variables):
        return [None if g is None else tf.clip_by_value(g, -limit, limit) for g in grads]
    return apply


def zeros_for_unconnected(grads: Sequence[Optional[tf.Tensor]],
                          variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
    """Replace None gradients (variables the loss does not depend on) by zeros.

    Warns once per trace, naming the disconnected variables: unconnected gradients made
    visible instead of silently skipped by the optimizer.

    Args:
      grads: one gradient or None per variable, in the order of `variables`.
      variables: the variables the gradients are of.

    Returns:
      The gradients, each None replaced by `tf.zeros_like` of its variable.
    """
    missing = [v for g, v in zip(grads, variables) if g is None]
    if missing:
        names = ", ".join(getattr(v, "path", None) or v.name for v in missing)
        logging.warning("the loss does not depend on %d variable(s); their gradients are "
                        "zeros: %s", len(missing), names)
    return [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]
