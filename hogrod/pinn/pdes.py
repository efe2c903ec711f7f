"""PDE residuals as plain functions of the `partials` dict.

A `PDE` is (wanted derivatives, residual(x, d) -> [batch, m]); a new equation is a few
lines, no subclassing:

    my_pde = PDE([(), (0,), (1, 1)], lambda x, d: d[(0,)] - 0.1 * d[(1, 1)] + d[()] ** 3)

A residual's partials come from the operator jet (`jet.jet_partials`: one forward pass of
u, its first partials and each second partial or declared linear combination, `PDE.linear`)
where it applies (a Dense tanh MLP, orders <= 2, `jet_applies`), else from `partials`
(nested tapes); `residual(..., use_jet=False)` takes `partials` always. `pinn_loss` passes
these arguments down from the experiment's bindings (`pinn_experiment.use_jet`,
`pinn_experiment.jet_jit_compile`).

A problem to solve is one factory in `problems.py` (`advection` and
`advection_problem` are such a pair). Coordinates: space first, time last (x, t) for
time-dependent problems.
"""

import collections
import math
import numbers
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

import gin
import tensorflow as tf

from hogrod import checks
from hogrod.pinn import jet
from hogrod.pinn.operators import laplacian, partials
from hogrod.types import TensorLike

__all__ = ["PDE", "residual", "jet_applies", "burgers", "poisson", "heat",
           "wave", "allen_cahn", "helmholtz", "advection", "LaplacianOperator",
           "exact_laplacian", "randomized_laplacian"]

class PDE(NamedTuple):
    """An equation: the derivatives its residual reads, and the residual.

    A new equation is a few lines, no subclassing (the module docstring); `residual`
    evaluates it for a network.

    Attributes:
      wanted: the partial derivatives the residual reads, tuples of coordinate indices
        (`partials`' keys: () for u, (0,) for du/dx0, (0, 1) for d2u/dx0dx1).
      residual: `residual(x, d) -> [batch, m]` for points x [batch, dim] and d the dict of
        the wanted partials and of `linear`'s combinations, each [batch, m];
        `residual(x, d, u_fn)` with `uses_network`.
      uses_network: the residual is called as residual(x, d, u_fn), so it can apply
        operators to the network itself (a randomized Laplacian) besides d; default False.
      linear: None (the default), or {name: {partial key: Python-number coefficient}}:
        linear combinations of first and second partials that the residual reads as
        d[name] (their keys need not be in `wanted`); the operator jet carries each as one
        channel (Burgers' u_t - nu u_xx: one channel in place of two), `partials` sums them.
    """
    wanted: Sequence[Tuple[int, ...]]
    residual: Callable[..., tf.Tensor]
    uses_network: bool = False
    linear: Optional[Mapping[str, Mapping[Tuple[int, ...], float]]] = None


def jet_applies(pde: PDE, u_fn: Callable[[tf.Tensor], tf.Tensor], x: TensorLike) -> bool:
    """Whether `residual` takes the operator jet for `pde` and `u_fn` at points x.

    It does for derivatives of order <= 2, a residual that does not call the network
    itself, and `u_fn` a Dense tanh MLP computing in x's dtype (`jet.applies`: not a
    lambda, an embedding, a modified MLP, ...).

    Args:
      pde: a `PDE`.
      u_fn: the network, [batch, dim] -> [batch, m].
      x: the points, [batch, dim].
    Returns:
      True where the jet applies.
    """
    return (bool(pde.wanted or pde.linear) and not pde.uses_network
            and jet.jet_plan(pde.wanted) is not None
            and jet.applies(u_fn, tf.convert_to_tensor(x).dtype))


def _partials_path(pde, u_fn, x):
    """`partials` of the wanted keys and of `pde.linear`'s, the combinations summed."""
    combos = pde.linear or {}
    extra = [k for combo in combos.values() for k in combo]
    d = partials(u_fn, x, list(pde.wanted) + extra)
    out = {tuple(k): d[tuple(k)] for k in pde.wanted}
    for name, combo in combos.items():
        out[name] = tf.add_n([float(c) * d[tuple(k)] for k, c in combo.items()])
    return out


def residual(pde: PDE, u_fn: Callable[[tf.Tensor], tf.Tensor], x: TensorLike,
             use_jet: bool = True, jit_compile: bool = True) -> tf.Tensor:
    """The residual of `pde` for the network `u_fn` at the points x.

    Both derivative paths can be differentiated again in x (gPINN's terms) and in the
    weights, and agree to rounding.

    Args:
      pde: a `PDE`.
      u_fn: the network (or the solution through a hard-constraint transform), [batch, dim]
        -> [batch, m].
      x: the points, [batch, dim], of the network's dtype.
      use_jet: True: the partials by the forward operator jet (`jet.jet_partials`: one pass
        carrying u, its first partials and each wanted second partial or `PDE.linear`
        combination) wherever it applies (`jet_applies`), else by `partials` (nested
        tapes); False: `partials` always.
      jit_compile: inside a `tf.function` (a train step), evaluate the jet in an inner
        XLA-compiled function (bench_pinn: 1.8x DeepXDE with it, 1.2x without; the whole
        step under XLA is slower on the `partials` fallback, so only the jet is compiled).
        Eager calls never compile: XLA's compile per new shape costs seconds that one
        evaluation does not win back.
    Returns:
      The residual, [batch, m], of x's dtype.
    Raises:
      ArgumentError: `use_jet` or `jit_compile` not a bool.
      ValueError: the residual function gives another shape, or a bad `PDE.linear`.
    """
    x = tf.convert_to_tensor(x)
    if not isinstance(use_jet, bool) or not isinstance(jit_compile, bool):
        raise checks.ArgumentError(f"residual: use_jet and jit_compile must be True or False, got "
                                   f"{use_jet!r} and {jit_compile!r}")
    jet.check_linear(x, pde.linear)
    if not (pde.wanted or pde.linear):
        d = {}
    elif use_jet and jet_applies(pde, u_fn, x):
        d = jet.jet_partials(u_fn, x, pde.wanted, pde.linear,
                             jit_compile=jit_compile and tf.inside_function())
    else:
        d = _partials_path(pde, u_fn, x)
    out = pde.residual(x, d, u_fn) if pde.uses_network else pde.residual(x, d)
    if out.shape.rank != 2 or out.shape[0] != x.shape[0]:
        raise ValueError(f"the residual must have shape [batch, m] = [{x.shape[0]}, m], got "
                         f"{out.shape}")
    return out


def _constant(c):
    """A coefficient the operator jet can carry as a constant (a number, not a callable or
    a tensor)."""
    return isinstance(c, numbers.Real) and not isinstance(c, bool)


@gin.configurable
def burgers(nu=0.01 / math.pi):
    """u_t + u u_x - nu u_xx = 0 on (x, t); nu may be a callable (a learned coefficient,
    read at every evaluation). A number nu: u_t - nu u_xx is one linear channel."""
    if _constant(nu):
        return PDE([(), (0,)], lambda x, d: d["linear"] + d[()] * d[(0,)],
                   linear={"linear": {(1,): 1.0, (0, 0): -nu}})
    return PDE([(), (0,), (1,), (0, 0)],
               lambda x, d: d[(1,)] + d[()] * d[(0,)] - (nu() if callable(nu) else nu) * d[(0, 0)])


@gin.configurable
def poisson(dim=2, source=None):
    """Laplacian u = f(x) on n-D space; source(x) -> [batch, 1] (default: the one whose
    solution is prod_i sin(pi x_i), f = -dim pi^2 prod_i sin(pi x_i))."""
    if source is None:
        source = lambda x: -dim * math.pi ** 2 * tf.reduce_prod(  # noqa: E731
            tf.sin(math.pi * x), axis=1, keepdims=True)
    return PDE([], lambda x, d: d["laplacian"] - source(x),
               linear={"laplacian": {(i, i): 1.0 for i in range(dim)}})


@gin.configurable
def heat(dim=1, alpha=1.0):
    """u_t = alpha Laplacian_x u on (x_1..x_dim, t)."""
    if _constant(alpha):
        return PDE([], lambda x, d: d["linear"],
                   linear={"linear": {(dim,): 1.0, **{(i, i): -alpha for i in range(dim)}}})
    return PDE([(dim,)] + [(i, i) for i in range(dim)],
               lambda x, d: d[(dim,)] - alpha * laplacian(d, range(dim)))


@gin.configurable
def wave(c=1.0):
    """u_tt = c^2 u_xx on (x, t)."""
    if _constant(c):
        return PDE([], lambda x, d: d["linear"], linear={"linear": {(1, 1): 1.0, (0, 0): -c ** 2}})
    return PDE([(1, 1), (0, 0)], lambda x, d: d[(1, 1)] - c ** 2 * d[(0, 0)])


@gin.configurable
def allen_cahn(diffusion=1e-4, reaction=5.0):
    """u_t - diffusion u_xx + reaction (u^3 - u) = 0 on (x, t)."""
    if _constant(diffusion):
        return PDE([()], lambda x, d: d["linear"] + reaction * (d[()] ** 3 - d[()]),
                   linear={"linear": {(1,): 1.0, (0, 0): -diffusion}})
    return PDE([(), (1,), (0, 0)],
               lambda x, d: d[(1,)] - diffusion * d[(0, 0)] + reaction * (d[()] ** 3 - d[()]))


@gin.configurable
def helmholtz(k=1.0, dim=2, source=None):
    """Laplacian u + k^2 u = f(x); default f from the solution prod_i sin(pi x_i)."""
    if source is None:
        source = lambda x: (k ** 2 - dim * math.pi ** 2) * tf.reduce_prod(  # noqa: E731
            tf.sin(math.pi * x), axis=1, keepdims=True)
    return PDE([()], lambda x, d: d["laplacian"] + k ** 2 * d[()] - source(x),
               linear={"laplacian": {(i, i): 1.0 for i in range(dim)}})


@gin.configurable
def advection(c=1.0):
    """u_t + c u_x = 0 on (x, t)."""
    if _constant(c):
        return PDE([], lambda x, d: d["linear"], linear={"linear": {(1,): 1.0, (0,): c}})
    return PDE([(0,), (1,)], lambda x, d: d[(1,)] + c * d[(0,)])


class LaplacianOperator(collections.namedtuple("LaplacianOperator",
                                               ["name", "apply", "stochastic"])):
    """A Laplacian of a scalar network: `apply(u_fn, x) -> [batch, 1]`; `stochastic`: an
    unbiased random estimate (with a new seed at every call), whose loss L-BFGS cannot
    line-search."""


@gin.configurable
def exact_laplacian():
    """The exact Laplacian sum_i d2u/dx_i^2 by `partials` (one backward pass per
    coordinate: the graph, its tracing time and the cost per point grow with d^2)."""
    def apply(u_fn, x):
        dim = x.shape[-1]
        return laplacian(partials(u_fn, x, [(i, i) for i in range(dim)]), range(dim))
    return LaplacianOperator("exact", apply, False)


@gin.configurable
def randomized_laplacian(num_probes=16, method="hutchinson", seed=0):
    """`stochastic_laplacian` (Hutchinson or STDE, `num_probes` per point) with a new seed
    at every call: an int64 counter variable starting at `seed`, moved by the call itself,
    so a compiled train step draws new probes each step without retracing."""
    from hogrod.pinn.stochastic import METHODS, stochastic_laplacian  # stochastic imports autodiff
    checks.choice(method, METHODS, "randomized_laplacian.method", "randomized_laplacian")
    checks.integer(num_probes, "randomized_laplacian.num_probes", "randomized_laplacian",
                   least=1)
    seed = checks.seed(seed, "randomized_laplacian.seed", "randomized_laplacian")
    counter = tf.Variable(int(seed), dtype=tf.int64, trainable=False, name="laplacian_seed",
                          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def apply(u_fn, x):
        return stochastic_laplacian(u_fn, x, num_probes, seed=counter.assign_add(1),
                                    method=method)
    return LaplacianOperator(f"randomized_{method}_{num_probes}", apply, True)


def check_laplacian(laplacian_factory, where):
    """The `LaplacianOperator` that the binding `where` (a factory by reference) builds."""
    if not callable(laplacian_factory):
        raise TypeError(f"{where} must be a Laplacian factory by reference (@exact_laplacian or "
                        f"@randomized_laplacian), got {laplacian_factory!r}")
    op = laplacian_factory()
    if not isinstance(op, LaplacianOperator):
        raise TypeError(f"{where} must build a pinn.LaplacianOperator (@exact_laplacian or "
                        f"@randomized_laplacian), got {type(op).__name__} from "
                        f"{laplacian_factory!r}")
    return op
