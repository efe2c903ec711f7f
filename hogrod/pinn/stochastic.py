"""Randomized Laplacians for high-dimensional PINNs: unbiased per-point estimates of
tr(d2u/dx2) at a cost linear in the dimension d (the exact one, `partials` then `laplacian`,
takes d backward passes over a graph that itself grows with d: quadratic).

Each method draws `num_probes` directions v per point and averages a per-probe estimate:

- "hutchinson" (Hutchinson's trace estimator): v Rademacher (entries +-1, so E[v v^T] = I),
  estimate v^T H v = E[tr H]; H v by forward-over-reverse (`hogrod.hvp`, a forward-mode
  accumulator over the gradient of sum(u)). Variance of one probe: 2 sum_{i != j} H_ij^2.
- "stde" (Shi et al., NeurIPS 2024, "Stochastic Taylor Derivative Estimator", its sparse
  jets for the Laplacian, the SDGD-like coordinate sampling): for each point, `num_probes`
  <= d distinct coordinates j drawn uniformly without replacement, estimate
  d / num_probes * sum_j d2u/dx_j^2. Unbiased (each j is in the sample with probability
  num_probes / d); with num_probes = d it is the exact Laplacian. Variance:
  (d - K) / (d - 1) * (d sum_j H_jj^2 - (tr H)^2) / K for K probes.
  STDE takes each d2u/dx_j^2 as the second Taylor coefficient of t -> u(x + t e_j) (jvp of
  jvp). Here it is e_j^T (H e_j) by the same forward-over-reverse product as "hutchinson"
  (the same number): in TensorFlow 2.21 a parameter gradient through nested
  `ForwardAccumulator`s is wrong inside `tf.function` (silently; eagerly it raises an
  InternalError), so jvp-of-jvp cannot be trained through (tests/test_pinn_stochastic.py
  compares the parameter gradient with the exact Laplacian's).

Probes are independent across points and probes; `seed` (a Python int, or an integer
tensor, which can change every step inside a `tf.function` without retracing) fixes them.
The per-point estimates are [batch, 1], like `laplacian(partials(...), coords)` for a
scalar u.
"""

import numbers
from typing import Callable

import tensorflow as tf

from hogrod import autodiff, checks
from hogrod.types import Seed, TensorLike

__all__ = ["stochastic_laplacian", "laplacian_probes", "METHODS"]

METHODS = ("hutchinson", "stde")
# No tensor-dependent Python control flow here: autograph converting the autodiff chain
# below would only slow tracing (seconds per trace).
_no_autograph = tf.autograph.experimental.do_not_convert
_SALT = {m: i for i, m in enumerate(METHODS)}  # distinct probes per method for one seed


def _check(x, num_probes, method, seed):
    checks.choice(method, METHODS, "method", "stochastic_laplacian")
    checks.integer(num_probes, "num_probes", "stochastic_laplacian", least=1)
    x = tf.convert_to_tensor(x)
    if x.shape.rank != 2 or x.shape[-1] is None:
        raise ValueError(f"stochastic_laplacian: x must have shape [batch, dim] with a known "
                         f"dim, got {x.shape}")
    if not x.dtype.is_floating:
        raise TypeError(f"stochastic_laplacian: x must be floating-point, got {x.dtype.name}")
    dim = x.shape[-1]
    if method == "stde" and num_probes > dim:
        raise ValueError(f"stochastic_laplacian: method 'stde' samples num_probes distinct "
                         f"coordinates of the {dim}; num_probes = {num_probes} is more (use "
                         f"num_probes = {dim} for the exact Laplacian)")
    if isinstance(seed, bool) or not (isinstance(seed, numbers.Integral) or (
            isinstance(seed, (tf.Tensor, tf.Variable)) and seed.dtype.is_integer
            and seed.shape.rank == 0)):
        raise TypeError(f"stochastic_laplacian: seed must be an integer or an integer scalar "
                        f"tensor, got {seed!r}")
    return x


def _scalar_u(u_fn, x):
    u = tf.convert_to_tensor(u_fn(x))
    if u.shape.rank == 2 and u.shape[-1] == 1:
        u = u[:, 0]
    if u.shape.rank != 1 or not u.shape.is_compatible_with(x.shape[:1]):
        raise ValueError(f"stochastic_laplacian: u_fn(x) must have shape [batch] or [batch, 1] "
                         f"for x of shape {x.shape}, got {u.shape} (for several outputs, "
                         "estimate each: lambda x: u_fn(x)[:, j:j + 1])")
    return u


def _stateless_seed(seed, method):
    seed = tf.cast(seed, tf.int64)
    return tf.stack([seed, tf.constant(_SALT[method], tf.int64)])


def _directions(x, num_probes, seed, method):
    """[num_probes, batch, dim] directions at x's dtype, and the factor for each probe."""
    batch, dim = tf.shape(x)[0], x.shape[-1]
    key = _stateless_seed(seed, method)
    if method == "stde":
        keys = tf.random.stateless_uniform(tf.stack([batch, dim]), key)
        coords = tf.argsort(keys, axis=1)[:, :num_probes]  # a uniform random subset per point
        v = tf.one_hot(tf.transpose(coords), dim, dtype=x.dtype)  # [probes, batch, dim]
        return v, float(dim)
    signs = tf.random.stateless_uniform(tf.stack([num_probes, batch, dim]), key, minval=0,
                                        maxval=2, dtype=tf.int32)
    return tf.cast(2 * signs - 1, x.dtype), 1.0


def _quadratic_form_reverse(u_fn, xs, vs):
    """v^T H v per row by forward-over-reverse: H v = hvp of sum(u) in x (rows independent)."""
    hv = autodiff.hvp(lambda: tf.reduce_sum(_scalar_u(u_fn, xs)), xs, vs,
                      mode="forward_over_reverse")
    return tf.reduce_sum(vs * hv, axis=1)


@_no_autograph
def laplacian_probes(u_fn: Callable[[tf.Tensor], tf.Tensor], x: TensorLike, num_probes: int,
                     seed: Seed = 0, method: str = "hutchinson") -> tf.Tensor:
    """The per-probe estimates of the Laplacian, whose mean is `stochastic_laplacian`.

    Their spread gives its standard error (for "stde", times the finite-population factor
    (d - K) / (d - 1) on the variance: coordinates are drawn without replacement). See the
    module docstring for the methods.

    Args:
      u_fn: [batch, dim] -> [batch] or [batch, 1], applied pointwise.
      x: points [batch, dim] (floating; the estimates have its dtype).
      num_probes: random directions per point, >= 1 (for "stde", at most dim).
      seed: an integer or integer scalar tensor; the same seed gives the same probes.
      method: "hutchinson" or "stde".
    Returns:
      [num_probes, batch, 1] of x's dtype.
    Raises:
      ArgumentError: a bad `method` or `num_probes`.
      ValueError: x not [batch, dim] with a known dim, more "stde" probes than dim, or u_fn
        not scalar.
      TypeError: x not floating, or a seed that is not an integer (scalar tensor).
    """
    x = _check(x, num_probes, method, seed)
    dim = x.shape[-1]
    v, factor = _directions(x, num_probes, seed, method)
    xs = tf.reshape(tf.tile(x[None], [num_probes, 1, 1]), [-1, dim])  # every probe in one pass
    vs = tf.reshape(v, [-1, dim])
    q = _quadratic_form_reverse(u_fn, xs, vs)
    return factor * tf.reshape(q, [num_probes, -1, 1])


@_no_autograph
def stochastic_laplacian(u_fn: Callable[[tf.Tensor], tf.Tensor], x: TensorLike,
                         num_probes: int, seed: Seed = 0,
                         method: str = "hutchinson") -> tf.Tensor:
    """Unbiased per-point estimates of the Laplacian of a scalar network u.

    The Laplacian is ``sum_i d2u/dx_i^2``; each estimate averages `num_probes` per-probe
    estimates (`laplacian_probes`) at a cost linear in the dimension.

    Args:
      u_fn: [batch, dim] -> [batch] or [batch, 1], applied pointwise.
      x: points [batch, dim] (floating; the estimates have its dtype).
      num_probes: random directions per point, >= 1 (for "stde", at most dim).
      seed: an integer or integer scalar tensor (which can change every step inside a
        `tf.function` without retracing); the same seed gives the same probes.
      method: "hutchinson" (Rademacher probes) or "stde" (coordinates sampled without
        replacement); the module docstring gives each one's variance.
    Returns:
      [batch, 1] of x's dtype, like `laplacian(partials(...), coords)` for a scalar u.
    Raises:
      ArgumentError: a bad `method` or `num_probes`.
      ValueError: x not [batch, dim] with a known dim, more "stde" probes than dim, or u_fn
        not scalar.
      TypeError: x not floating, or a seed that is not an integer (scalar tensor).
    """
    return tf.reduce_mean(laplacian_probes(u_fn, x, num_probes, seed, method), axis=0)
