"""What a PINN problem is: `Problem`, its conditions, and an inverse problem's unknowns.

A `Problem` (built with keywords; its docstring lists the fields) bundles what a PINN run
needs: a PDE, a domain, conditions (plain triples, or `Condition` objects on an operator of u,
whose misfit `condition_misfit` computes) and, when known, a reference solution. An
inverse problem is a `Problem` too: its `unknowns` are the PDE coefficients learned with
the solution (`Unknown`), its `pde_with(**coefficients) -> PDE` builds the PDE from them,
and its `data` (`Observations`) is the measured solution, a loss term of its own. `pde` is
None until `bind_unknowns` builds it from the training variables, so nothing trains an
inverse problem on the truth. The catalogue of problems is `problems.py`.
"""

import dataclasses
import functools
import math
from typing import Callable, Dict, Mapping, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from hogrod.pinn import pdes
from hogrod.pinn.geometry import Box
from hogrod.types import DType, TensorLike

__all__ = ["Problem", "Unknown", "Observations", "Condition", "condition_misfit",
           "bind_unknowns", "unknowns_report"]


class Unknown(NamedTuple):
    """A PDE coefficient an inverse problem learns with the solution.

    Attributes:
      name: the keyword `Problem.pde_with` takes it by, and the prefix of its metrics.
      initial: the value training starts from (> 0 when `positive`).
      true: the value the data came from (reported with the relative error); None (the
        default) where it is not known.
      positive: learn log(value), as Raissi et al. do for a viscosity: positive, and ~1e-3,
        far from the weights' scale, which L-BFGS handles badly in the raw value; default
        False.
    """
    name: str
    initial: float
    true: Optional[float] = None
    positive: bool = False

    def variable(self, dtype: DType = tf.float32) -> tf.Variable:
        """A trainable variable holding the initial value in its parametrization.

        Args:
          dtype: the variable's dtype (the network's); the Python float goes straight to
            it, never through float32.
        Returns:
          A scalar tf.Variable named "unknown_<name>", holding log(initial) when
          `positive`, else initial.
        Raises:
          ValueError: `positive` with an initial value <= 0.
        """
        if self.positive and not self.initial > 0:
            raise ValueError(f"Unknown {self.name!r} is positive (learned as its log): its "
                             f"initial value must be > 0, got {self.initial}")
        raw = math.log(self.initial) if self.positive else float(self.initial)
        return tf.Variable(raw, dtype=dtype, name=f"unknown_{self.name}")

    def value(self, variable: TensorLike) -> tf.Tensor:
        """The coefficient that `variable` holds.

        Args:
          variable: the variable from `variable()` (or its value).
        Returns:
          A scalar tensor of the variable's dtype, exp(variable) when `positive`, else the
          variable's value.
        """
        return tf.exp(variable) if self.positive else tf.convert_to_tensor(variable)


class Observations(NamedTuple):
    """Measured solution values, an inverse problem's data.

    Attributes:
      points: the measurement points, numpy [n, dim], in the problem's domain.
      values: the solution measured there, numpy [n, m].
    """
    points: np.ndarray
    values: np.ndarray


class Condition(tuple):
    """A condition on operator(u_fn, x) rather than on u(x).

    Its misfit is `operator(u_fn, x) - target(x)`, both [n, k] (`condition_misfit`). It
    unpacks as the plain (name, points_fn, target_fn) triple, but its third element raises
    when called: code that would compute u(x) - target(x) for it (and so ignore the
    operator) fails instead of fitting the wrong quantity. The attributes `target` and
    `operator` hold the real target and the operator.

    Args:
      name: the condition's name, its loss term's name.
      points_fn: `points_fn(n, seed, dtype=None) -> numpy [n, dim]` of `dtype` (None:
        Keras's floatx), the condition's points.
      target_fn: `target_fn(x) -> [n, k]`, TensorFlow code (it runs in the train step).
      operator: `operator(u_fn, x) -> [n, k]` (one output component, a normal derivative).
    Raises:
      TypeError: a name that is not a string or an argument that is not callable.
    """

    def __new__(cls, name, points_fn, target_fn, operator):
        if not isinstance(name, str) or not callable(points_fn) or not callable(target_fn) \
                or not callable(operator):
            raise TypeError(f"Condition(name: str, points_fn, target_fn, operator) with "
                            f"callables, got {name!r}, {points_fn!r}, {target_fn!r}, "
                            f"{operator!r}")

        def guarded(x):
            raise ValueError(f"condition {name!r} constrains operator(u_fn, x), not u(x): "
                             "compute its misfit with pinn.condition_misfit(condition, u_fn, x)")
        self = super().__new__(cls, (name, points_fn, guarded))
        self.target, self.operator = target_fn, operator
        return self

    def __reduce__(self):  # copies (dataclasses.replace, deepcopy) keep the operator
        return (Condition, (self[0], self[1], self.target, self.operator))


def _target(name, target_fn, x):
    """target_fn(x), or an error naming the condition where it is numpy code.

    Numpy code fails on the symbolic points of a compiled step.
    """
    try:
        return target_fn(x)
    except NotImplementedError as e:
        if "symbolic" not in str(e):
            raise
        raise TypeError(f"condition {name!r}: its target_fn {target_fn!r} runs numpy on the "
                        "points, but it runs inside the compiled train step, where the points "
                        "are symbolic tensors: write it with TensorFlow ops (tf.sin, not "
                        f"np.sin) ({e})") from e


def condition_misfit(condition: tuple, u_fn: Callable[[tf.Tensor], tf.Tensor],
                     x: TensorLike) -> tf.Tensor:
    """The pointwise misfit of one condition.

    Args:
      condition: a (name, points_fn, target_fn) triple or a `Condition`; `target_fn` is
        TensorFlow code.
      u_fn: the solution, [n, dim] -> [n, m].
      x: the condition's points, [n, dim].
    Returns:
      The misfit [n, k], u_fn(x) - target(x) for a triple and operator(u_fn, x) -
      target(x) for a `Condition`.
    Raises:
      ValueError: a `Condition`'s operator and target differ in shape.
      TypeError: the target is numpy code called on symbolic points (in a compiled step).
    """
    if not isinstance(condition, Condition):
        return u_fn(x) - _target(condition[0], condition[2], x)
    value = condition.operator(u_fn, x)
    target = _target(condition[0], condition.target, x)
    if value.shape.rank != 2 or not value.shape.is_compatible_with(target.shape):
        raise ValueError(f"condition {condition[0]!r}: its operator gives shape {value.shape} "
                         f"but its target {target.shape}; both must be [n, k]")
    return value - target


@dataclasses.dataclass(frozen=True, kw_only=True)
class Problem:
    """A PDE problem: what a PINN run needs, built with keywords and checked when built.

    Attributes:
      name: the problem's name (in messages and metrics).
      domain: a `Box` or another geometry (space first, time last), or a geometry of one's
        own with an integer `dim` (docs/guide).
      pde: the `PDE` (residual and the derivatives it needs); None for an inverse problem
        until `bind_unknowns`.
      conditions: (name, points_fn(n, seed, dtype=None) -> x, target_fn(x) -> u) triples,
        each a soft penalty term mean((u(x) - target(x))^2), or `Condition` objects
        (`condition_misfit` computes either). `points_fn` is numpy code run once before
        training: numpy [n, dim] of `dtype` (None: Keras's floatx; the built-in ones draw
        in float64 and cast once, so a float64 run's points never pass through float32);
        `target_fn` is TensorFlow code (`tf.sin`, not `np.sin`): it runs in the compiled
        train step on symbolic tensors. Stored as a tuple.
      transform: None, or a hard constraint `transform(x, net_out) -> u` built so that u
        satisfies the initial/boundary conditions exactly (then `conditions` can be empty).
      reference: None, or numpy code `reference(x) -> u` on numpy points [n, dim] (run
        outside training, on the grid).
      grid: None, or the evaluation points, [n, dim].
      grid_shape: None, or the mesh shape of `grid` (n = prod(grid_shape)) to plot it.
      unknowns: the `Unknown` coefficients of an inverse problem (distinct names); () for
        a forward problem. Stored as a tuple.
      pde_with: None, or `pde_with(**{name: coefficient}) -> PDE` for an inverse problem
        (given exactly when `unknowns` is).
      data: None, or the `Observations` of an inverse problem (a loss term "data").
      time_dependent: the last coordinate is time (what causal weighting needs).
    Raises:
      TypeError: a domain without an integer `dim`, or a non-bool `time_dependent`.
      ValueError: a malformed condition, unknown or data; unknowns without pde_with (or
        the reverse); no PDE for a forward problem; a grid of the wrong shape.
    """

    name: str
    domain: Box  # or a geometry of one's own with an integer `dim` (docs/guide)
    pde: Optional[pdes.PDE] = None
    conditions: tuple = ()
    transform: Optional[Callable] = None
    reference: Optional[Callable] = None
    grid: Optional[np.ndarray] = None
    grid_shape: Optional[tuple] = None
    unknowns: tuple = ()
    pde_with: Optional[Callable[..., pdes.PDE]] = None
    data: Optional[Observations] = None
    time_dependent: bool = False  # the last coordinate is time

    def __post_init__(self):
        where = f"Problem {self.name!r}"
        if not isinstance(getattr(self.domain, "dim", None), int):
            raise TypeError(f"{where}: domain must be a pinn.Box or a geometry of your own "
                            f"with an integer `dim`, got {type(self.domain).__name__}")
        object.__setattr__(self, "conditions", tuple(self.conditions))
        object.__setattr__(self, "unknowns", tuple(self.unknowns))
        for c in self.conditions:
            if not (isinstance(c, tuple) and len(c) == 3 and isinstance(c[0], str)):
                raise ValueError(f"{where}: each condition must be (name, points_fn, "
                                 f"target_fn), got {c!r}")
        if not isinstance(self.time_dependent, bool):
            raise TypeError(f"{where}: time_dependent must be True or False, got "
                            f"{self.time_dependent!r}")
        names = [u.name for u in self.unknowns]
        if not all(isinstance(u, Unknown) for u in self.unknowns) or len(set(names)) < len(names):
            raise ValueError(f"{where}: unknowns must be pinn.Unknown's with distinct names, "
                             f"got {self.unknowns!r}")
        if bool(self.unknowns) != (self.pde_with is not None):
            raise ValueError(f"{where}: unknowns and pde_with go together (pde_with(**{{name: "
                             f"coefficient}}) builds the PDE from the unknowns)")
        if self.pde is None and not self.unknowns:
            raise ValueError(f"{where}: a PDE is required (pde=...), or unknowns and pde_with "
                             "for an inverse problem")
        # grid: evaluation points [n, dim]; grid_shape, when the points form a mesh to plot
        if self.grid_shape is not None and self.grid is None:
            raise ValueError(f"{where}: grid_shape {self.grid_shape} without a grid")
        if self.grid is not None and (
                np.ndim(self.grid) != 2 or np.shape(self.grid)[1] != self.domain.dim or (
                    self.grid_shape is not None
                    and len(self.grid) != int(np.prod(self.grid_shape)))):
            raise ValueError(f"{where}: grid must be [n, {self.domain.dim}] points (n = "
                             f"prod(grid_shape) when grid_shape is given), got grid of shape "
                             f"{np.shape(self.grid)} and grid_shape {self.grid_shape}")
        if self.data is not None:
            x, y = (np.asarray(a) for a in self.data)
            if x.ndim != 2 or x.shape[1] != self.domain.dim or y.ndim != 2 or len(y) != len(x):
                raise ValueError(f"{where}: data must be Observations(points [n, "
                                 f"{self.domain.dim}], values [n, m]), got shapes {x.shape} "
                                 f"and {y.shape}")

    @functools.cached_property
    def reference_on_grid(self) -> Optional[np.ndarray]:
        """`reference(grid)` as a read-only array, computed once per problem (a Cole-Hopf
        quadrature on Burgers' grid takes most of a second, and training measures the error
        often); None without a reference or a grid."""
        if self.reference is None or self.grid is None:
            return None
        ref = np.array(self.reference(self.grid))
        ref.flags.writeable = False
        return ref


def bind_unknowns(problem: Problem, variables: Mapping[str, tf.Variable]) -> Problem:
    """The inverse problem with its `pde` built from the unknowns' variables.

    The coefficients are read from the variables at every evaluation of the residual, so
    training moves them.

    Args:
      problem: a `Problem` with `unknowns` and `pde_with`.
      variables: {unknown's name: the variable from `Unknown.variable`}, one per unknown.
    Returns:
      A copy of `problem` with `pde = problem.pde_with(**coefficients)`.
    Raises:
      ValueError: variables for other names than the problem's unknowns.
    """
    names = sorted(u.name for u in problem.unknowns)
    if sorted(variables) != names:
        raise ValueError(f"bind_unknowns: problem {problem.name!r} has unknowns {names}, "
                         f"got variables for {sorted(variables)}")
    coefficients = {u.name: (lambda u=u: u.value(variables[u.name])) for u in problem.unknowns}
    return dataclasses.replace(problem, pde=problem.pde_with(**coefficients))


def unknowns_report(problem: Problem,
                    variables: Mapping[str, tf.Variable]) -> Dict[str, float]:
    """The learned value of each unknown, and its error where the true value is known.

    Args:
      problem: a `Problem` with `unknowns`.
      variables: {unknown's name: its variable from `Unknown.variable`}.
    Returns:
      A dict holding, for each unknown, its learned value under its name, and where its
      true value is known, that value under name_true and ``abs(learned - true) /
      abs(true)`` under name_rel_err.
    """
    out = {}
    for u in problem.unknowns:
        value = out[u.name] = float(u.value(variables[u.name]))
        if u.true is not None:
            out[f"{u.name}_true"] = u.true
            out[f"{u.name}_rel_err"] = abs(value - u.true) / abs(u.true)
    return out
