"""TRPO's update, written on callables so it runs on one device or over replicas alike.

`natural_step(gradient, fvp, max_kl, ...)` is the step of maximal surrogate improvement
under the quadratic model of the mean KL: ``s = (F + damping I)^-1 g`` by conjugate
gradient (`hogrod.linalg.cg`) on Fisher-vector products, scaled to
``s sqrt(2 max_kl / s^T (F + damping I) s)`` (the quadratic KL of the step is `max_kl`).
`line_search(evaluate, params, step, surrogate, max_kl, ...)` backtracks along it:
``params + ratio**k step`` for k = 0, 1, ... is accepted at the first k whose surrogate
improves on the current one and whose mean KL is at most `max_kl`; where none is, the
parameters stay. The Fisher-vector product is usually `hogrod.hvp` of the mean KL between
the current policy (held fixed) and the one at `params`, whose Hessian at the current
parameters is the Fisher matrix (pytorch-maml-rl's `hessian_vector_product`).
"""

from typing import Callable, NamedTuple, Tuple

import tensorflow as tf

from hogrod import checks, linalg, tree
from hogrod.types import MatVec, Params, Tree

__all__ = ["NaturalStep", "LineSearch", "natural_step", "line_search"]


class NaturalStep(NamedTuple):
    """What `natural_step` reports besides the step.

    Attributes:
      scale: the factor ``sqrt(2 max_kl / s^T (F + damping I) s)`` applied to the CG
        solution s.
      quadratic: ``s^T (F + damping I) s``, the damped Fisher norm of the solution.
      iterations: the CG iterations run.
    """

    scale: tf.Tensor
    quadratic: tf.Tensor
    iterations: tf.Tensor


class LineSearch(NamedTuple):
    """What `line_search` reports.

    Attributes:
      accepted: whether a step was accepted (else the parameters are unchanged).
      fraction: the fraction ``ratio**k`` of the step taken (0 where none was accepted).
      surrogate: the surrogate at the returned parameters.
      kl: the mean KL at the returned parameters (0 where none was accepted).
      tries: the points evaluated.
    """

    accepted: tf.Tensor
    fraction: tf.Tensor
    surrogate: tf.Tensor
    kl: tf.Tensor
    tries: tf.Tensor


def natural_step(gradient: Tree, fvp: MatVec, max_kl: float, maxiter: int = 10,
                 damping: float = 1e-5, tol: float = 1e-10) -> Tuple[Tree, NaturalStep]:
    """TRPO's full step: the natural gradient scaled to a quadratic KL of `max_kl`.

    Args:
      gradient: g, the gradient of the surrogate (to be MAXIMIZED), a tree of floating
        tensors of one dtype.
      fvp: ``v -> F v``, the Fisher (mean-KL Hessian) product on trees like `gradient`.
      max_kl: the KL bound, a Python number > 0, applied at the gradient's dtype.
      maxiter: the most CG iterations, an int >= 1 (10 in TRPO and MAML).
      damping: added to F's diagonal in the solve and in the step's norm, a Python
        number >= 0.
      tol: CG's relative residual tolerance, >= 0.

    Returns:
      `(step, info)`: the step ``s sqrt(2 max_kl / s^T (F + damping I) s)``, a tree like
      `gradient`, and a `NaturalStep`.

    Raises:
      ArgumentError: `max_kl`, `maxiter` or `damping` out of range.
    """
    where = "natural_step"
    max_kl = checks.positive(max_kl, "max_kl", where)
    maxiter = checks.integer(maxiter, "maxiter", where, 1)
    damping = checks.nonnegative(damping, "damping", where)
    g = tf.nest.map_structure(tf.convert_to_tensor, gradient)
    dtype = tf.nest.flatten(g)[0].dtype
    s, info = linalg.cg(fvp, g, maxiter=maxiter, tol=tol, damping=damping,
                        on_negative_curvature="stop")
    quadratic = tree.dot(s, tree.axpy(tf.constant(damping, dtype), s, fvp(s)))
    # a zero gradient (nothing to gain) takes no step, rather than 0 / 0
    positive = quadratic > 0
    scale = tf.where(positive, tf.sqrt(tf.constant(2 * max_kl, dtype)
                                       / tf.where(positive, quadratic, tf.ones_like(quadratic))),
                     tf.zeros_like(quadratic))
    return tree.scale(scale, s), NaturalStep(scale, quadratic, info.iterations)


def line_search(evaluate: Callable[[Params], Tuple[tf.Tensor, tf.Tensor]], params: Params,
                step: Params, surrogate: tf.Tensor, max_kl: float, maxiter: int = 15,
                ratio: float = 0.8) -> Tuple[Params, LineSearch]:
    """The backtracking line search of TRPO along `step`.

    Tries ``params + ratio**k step`` for k = 0 .. maxiter-1 (the full step first) and
    returns the first whose
    surrogate is above `surrogate` (strictly) and whose mean KL is at most `max_kl`, both
    finite; the parameters unchanged where no try is.

    Args:
      evaluate: ``candidate -> (surrogate, kl)``, scalars: the surrogate (MAXIMIZED) and
        the mean KL from the current policy at candidate parameters.
      params: the current parameters, a list of tensors.
      step: the full step, structured like `params`.
      surrogate: the surrogate at `params`, a scalar.
      max_kl: the KL bound, a Python number > 0.
      maxiter: the most tries, an int >= 1 (15 in pytorch-maml-rl); the search stops at the
        first accepted.
      ratio: the backtracking factor, in (0, 1) (0.8 in pytorch-maml-rl).

    Returns:
      `(new_params, info)`: the accepted parameters (or `params`) and a `LineSearch`.

    Raises:
      ArgumentError: `max_kl`, `maxiter` or `ratio` out of range.
    """
    where = "line_search"
    max_kl = checks.positive(max_kl, "max_kl", where)
    maxiter = checks.integer(maxiter, "maxiter", where, 1)
    ratio = checks.number(ratio, "ratio", where, 0.0, 1.0, low_open=True, high_open=True)
    params = [tf.convert_to_tensor(p) for p in params]
    step = [tf.convert_to_tensor(s) for s in step]
    dtype = params[0].dtype
    surrogate = tf.convert_to_tensor(surrogate)
    bound = tf.constant(max_kl, dtype)

    def body(k, found, fraction, value, kl):
        frac = tf.pow(tf.constant(ratio, dtype), tf.cast(k, dtype))
        value, kl = evaluate([p + frac * s for p, s in zip(params, step)])
        ok = (tf.math.is_finite(value) & tf.math.is_finite(kl) & (value > surrogate)
              & (kl <= bound))
        return k + 1, ok, frac, value, kl

    zero = tf.zeros([], dtype)
    k, found, fraction, value, kl = tf.while_loop(
        lambda k, found, *_: (k < maxiter) & tf.logical_not(found), body,
        (tf.constant(0), tf.constant(False), zero, surrogate, zero))
    fraction = tf.where(found, fraction, zero)
    new = [p + fraction * s for p, s in zip(params, step)]
    return new, LineSearch(found, fraction, tf.where(found, value, surrogate),
                           tf.where(found, kl, zero), k)
