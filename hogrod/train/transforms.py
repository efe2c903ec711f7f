"""Gradient transforms: small functions from (grads, variables) to grads, composed with `chain`.

In the style of optax: each transform is a plain function, so a researcher adds one by
writing a function. They run inside the compiled train step on the gradient summed over
replicas (the global gradient), after loss scaling is undone.
"""

from absl import logging
import tensorflow as tf

__all__ = ["chain", "clip_by_global_norm", "clip_by_value", "zeros_for_unconnected",
           "global_norm"]


def chain(*transforms):
    """Apply transforms left to right."""
    def apply(grads, variables):
        for t in transforms:
            grads = t(grads, variables)
        return grads
    return apply


def global_norm(grads):
    """sqrt(sum of squares) over every gradient (Nones skipped), in float32."""
    squares = [tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads if g is not None]
    return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)


def clip_by_global_norm(max_norm):
    """Scale all gradients together so their global norm is at most `max_norm`."""
    if max_norm <= 0:
        raise ValueError(f"clip_by_global_norm needs max_norm > 0, got {max_norm}")

    def apply(grads, variables):
        norm = global_norm(grads)
        scale = tf.minimum(1.0, max_norm / tf.maximum(norm, 1e-12))
        return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]
    return apply


def clip_by_value(limit):
    """Clip every gradient entry to [-limit, limit]."""
    if limit <= 0:
        raise ValueError(f"clip_by_value needs limit > 0, got {limit}")

    def apply(grads, variables):
        return [None if g is None else tf.clip_by_value(g, -limit, limit) for g in grads]
    return apply


def zeros_for_unconnected(grads, variables):
    """Replace None gradients (variables the loss does not depend on) by zeros.

    Warns once per trace, naming the disconnected variables: the seeds' unconnected
    gradients, made visible instead of silently skipped by the optimizer.
    """
    missing = [v for g, v in zip(grads, variables) if g is None]
    if missing:
        names = ", ".join(getattr(v, "path", None) or v.name for v in missing)
        logging.warning("the loss does not depend on %d variable(s); their gradients are "
                        "zeros: %s", len(missing), names)
    return [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]
