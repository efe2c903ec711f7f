"""Derivatives of a network u(x) with respect to its input coordinates, over a batch.

`partials(u_fn, x, wanted)` evaluates every partial derivative a residual needs in one pass:
each wanted derivative is a tuple of coordinate indices ((): u itself, (0,): du/dx0,
(0, 1): d2u/dx0dx1, (1, 1, 1): d3u/dx1^3, ...). Derivatives share their prefixes (u_x and
u_xx reuse the same first backward pass; u_x and u_t come from one backward pass), mixed
partials are symmetric ((1, 0) is (0, 1)), and each points' derivatives depend only on that
point (the network is applied pointwise), so one backward pass of sum(u[:, j]) gives
du_j/dx for the whole batch. Reverse-over-reverse: one tape per derivative order.
"""

import numbers
from typing import Callable, Dict, Iterable, Mapping, Sequence, Tuple

import tensorflow as tf

from hogrod.types import TensorLike

__all__ = ["partials", "laplacian", "divergence"]


def _key(k):
    return tuple(sorted(k))


def partials(u_fn: Callable[[tf.Tensor], TensorLike], x: TensorLike,
             wanted: Iterable[Sequence[int]]) -> Dict[Tuple[int, ...], tf.Tensor]:
    """Every partial derivative in `wanted` of the network at the points x, in one pass.

    Reverse-over-reverse (one tape per derivative order); derivatives share their prefixes
    and mixed partials are symmetric (the module docstring).

    Args:
      u_fn: the network, [batch, dim] -> [batch] or [batch, m], applied pointwise.
      x: collocation points, [batch, dim].
      wanted: tuples of coordinate indices, each in [0, dim): () for u, (0,) for du/dx0,
        (0, 1) for d2u/dx0dx1, ...
    Returns:
      A dict mapping each key as given in `wanted` (a tuple) to a tensor [batch, m] of x's
      dtype (a [batch] u becomes [batch, 1]).
    Raises:
      ValueError: x not [batch, dim], a key that is not a tuple of integers or holds an
        index outside [0, dim), or u_fn(x) of another shape than [batch] or [batch, m].
    """
    x = tf.convert_to_tensor(x)
    keys = check_wanted(x, wanted)
    needed = {()} | {k[:i] for k in keys.values() for i in range(len(k) + 1)}
    order = max(map(len, needed))
    cache, sums, tapes = {}, {}, []

    def store(key, value):  # the column sums are taken while the next order's tape records
        cache[key] = value
        if any(len(k) > len(key) and k[:len(key)] == key for k in needed):
            sums[key] = [tf.reduce_sum(value[:, j]) for j in range(value.shape[-1])]

    try:
        # One tape per derivative order, outermost first, each entered before u is evaluated.
        # The innermost is closed first and differentiates u; the tapes still open record
        # that gradient for the next order. Every gradient is taken outside its own tape's
        # context, so no gradient op is recorded that no later order needs (the costly
        # pattern TensorFlow warns about for persistent tapes).
        for _ in range(order):
            tape = tf.GradientTape(persistent=True)  # several outputs and keys per order
            tape.__enter__()
            tape.watch(x)
            tapes.append(tape)
        u = tf.convert_to_tensor(u_fn(x))
        if u.shape.rank not in (1, 2) or not u.shape[:1].is_compatible_with(x.shape[:1]):
            raise ValueError(f"u_fn(x) must have shape [batch] or [batch, m] for points x of "
                             f"shape {x.shape}, got {u.shape}")
        store((), u[:, None] if u.shape.rank == 1 else u)
        for level in range(1, order + 1):
            tape = tapes.pop()
            tape.__exit__(None, None, None)
            grads = {}
            for key in sorted(k for k in needed if len(k) == level):
                parent = key[:-1]
                if parent not in grads:  # one backward pass per output gives every coordinate
                    grads[parent] = [tape.gradient(
                        total, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)
                        for total in sums[parent]]
                store(key, tf.stack([g[:, key[-1]] for g in grads[parent]], axis=1))
            del tape
    finally:
        for tape in reversed(tapes):
            tape.__exit__(None, None, None)
    return {k: cache[v] for k, v in keys.items()}


def check_wanted(x: tf.Tensor,
                 wanted: Iterable[Sequence[int]]) -> Dict[Tuple[int, ...], Tuple[int, ...]]:
    """The wanted derivatives of `partials`, checked, with their sorted keys.

    Args:
      x: the points, [batch, dim].
      wanted: tuples of coordinate indices in [0, dim).
    Returns:
      A dict mapping each key as given (a tuple) to the key sorted.
    Raises:
      ValueError: x of another rank than 2, or a bad key (named in the message).
    """
    if x.shape.rank != 2:
        raise ValueError(f"collocation points must have shape [batch, dim], got {x.shape}")
    dim = x.shape[-1]
    wanted = list(wanted)  # iterated twice below
    for k in wanted:
        if not isinstance(k, (tuple, list)) or not all(isinstance(i, numbers.Integral) for i in k):
            raise ValueError(f"each wanted derivative is a tuple of coordinate indices (e.g. "
                             f"(0,) for du/dx0, (0, 0) for d2u/dx0^2, () for u), got {k!r}")
    keys = {k: _key(k) for k in map(tuple, wanted)}
    for k in keys.values():
        bad = [i for i in k if not 0 <= i < dim]
        if bad:
            raise ValueError(f"coordinate index {bad[0]} in derivative {k} is outside the input "
                             f"dimension {dim}")
    return keys


def laplacian(d: Mapping[Tuple[int, ...], tf.Tensor], coords: Iterable[int]) -> tf.Tensor:
    """The Laplacian ``sum_i d2u/dx_i^2`` over `coords`, from a `partials` dict.

    Args:
      d: `partials`' dict, holding the key (i, i) for each i in `coords`.
      coords: the coordinate indices summed over (e.g. `range(dim)`, or the space
        coordinates only of a space-time problem).
    Returns:
      [batch, m], the sum of the d[(i, i)].
    """
    return tf.add_n([d[(i, i)] for i in coords])


def divergence(d: Mapping[Tuple[int, ...], tf.Tensor], coords: Sequence[int]) -> tf.Tensor:
    """The divergence ``sum_i du_i/dx_{coords[i]}`` of a vector-valued u.

    Args:
      d: `partials`' dict, holding the key (c,) for each c in `coords`; its values are
        [batch, m] with m >= len(coords).
      coords: the coordinate paired with each output: output i with coordinate coords[i].
    Returns:
      [batch, 1].
    """
    return tf.add_n([d[(c,)][:, i:i + 1] for i, c in enumerate(coords)])
