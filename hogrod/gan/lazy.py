"""Lazy regularization (StyleGAN2, Karras et al. 2020): a regularizer computed only every
`lazy_every` steps, multiplied by `lazy_every` on the steps it is computed.

The factor keeps the regularizer's average weight per step what it is when it runs every
step; dropping it (a known trap) weakens the regularizer `lazy_every`-fold. StyleGAN2 also
rescales Adam's rate and betas by ``lazy_every / (lazy_every + 1)`` because it updates in
separate regularization steps; here the term joins the step's own loss, so there is nothing
to rescale. A regularizer with state (`hogrod.gan.generator_penalties`) keeps its state on
the steps it skips (StyleGAN2 updates its path-length mean only when it regularizes).

Under a tf.distribute strategy with several replicas in sync, a regularizer with state is
computed on every step and its term and state kept on the due steps only: it all-reduces to
keep its state the same on every replica (the path-length mean), and MirroredStrategy cannot
all-reduce inside a `tf.cond`. The result is the lazy one; only the saving is lost.

`offset` staggers two regularizers over the interval (R3GAN's lazy variant computes R1 on
the steps ``i % lazy_every == 0`` and R2 on ``i % lazy_every == lazy_every // 2``).
"""

from typing import Any, Callable, Optional, Tuple, Union

import tensorflow as tf

from hogrod import checks
from hogrod.types import DType, Scalar, Tree

__all__ = ["lazy_term"]


def lazy_term(compute: Callable[[], Any], step: Scalar, lazy_every: int, dtype: DType,
              *, state: Optional[Tree] = None, offset: int = 0
              ) -> Union[tf.Tensor, Tuple[tf.Tensor, Tree]]:
    """A regularizer's term for training step `step`, computed every `lazy_every` steps.

    On the steps with ``step % lazy_every == offset`` the term is ``lazy_every * value``,
    `value` from `compute()`; on the others it is zero and `compute` does not run (one
    `tf.cond`, so inside `tf.function` nothing is traced twice). `lazy_every` 1: every step,
    no cond.

    Args:
      compute: ``compute() -> value`` (a scalar), or, with `state`, ``compute() -> (value,
        new_state)`` (a generator penalty's `apply`).
      step: the step counter (a Python int or an integer tensor, e.g. the optimizer's
        `iterations`).
      lazy_every: the interval, an integer >= 1.
      dtype: the term's floating dtype (the zero of the skipped steps has it; `value` is
        cast to it).
      state: the regularizer's state, returned unchanged on the skipped steps; None for a
        regularizer without state.
      offset: the step in each interval the term is computed on, 0 <= offset < lazy_every.

    Returns:
      The term, a scalar of `dtype`; with `state`, the pair ``(term, state)``.

    Raises:
      ArgumentError: `lazy_every` is not an integer >= 1, `offset` is out of range or
        `dtype` is not floating.
    """
    lazy_every = checks.integer(lazy_every, "lazy_every", "lazy_term", least=1)
    offset = checks.integer(offset, "offset", "lazy_term", most=lazy_every - 1)
    dtype = tf.as_dtype(dtype)
    if not dtype.is_floating:
        raise checks.ArgumentError(f"lazy_term: dtype must be floating, got {dtype.name}")

    def due():
        out = compute()
        if state is None:
            return lazy_every * tf.cast(out, dtype)
        value, new_state = out
        tf.nest.assert_same_structure(state, new_state)
        return lazy_every * tf.cast(value, dtype), new_state

    if lazy_every == 1:
        return due()

    def skipped():
        zero = tf.zeros([], dtype)
        if state is None:
            return zero
        # tf.cond needs tensors on both branches: the state passed through unchanged
        return zero, tf.nest.map_structure(tf.identity, state)

    step = tf.convert_to_tensor(step)
    if not step.dtype.is_integer:
        raise checks.ArgumentError(f"lazy_term: step must be an integer step counter, got "
                                   f"dtype {step.dtype.name}")
    is_due = tf.equal(step % lazy_every, tf.cast(offset, step.dtype))
    ctx = tf.distribute.get_replica_context()
    if state is not None and tf.nest.flatten(state) and ctx is not None \
            and ctx.num_replicas_in_sync > 1:
        # a regularizer with state all-reduces to keep it one on every replica, and
        # MirroredStrategy cannot all-reduce inside a tf.cond: computed, then kept or not
        value, new_state = due()
        keep = lambda new, old: tf.where(is_due, new, tf.cast(old, new.dtype))  # noqa: E731
        return (tf.where(is_due, value, tf.zeros([], dtype)),
                tf.nest.map_structure(keep, new_state, state))
    return tf.cond(is_due, due, skipped)
