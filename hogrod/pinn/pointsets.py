"""The checks `pinn_loss` makes of the point sets it fits: count, dtype and domain.

Each raises an error naming the point set and the problem; `training.pinn_loss` calls them
when it is called (the dtype and domain checks read values: not inside a compiled step).
"""

from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hogrod.pinn.problem import Problem
from hogrod.types import TensorLike

__all__ = ["one_set_per_condition", "point_sets", "check_dtypes", "check_inside"]


def one_set_per_condition(problem: Problem, names: Sequence[str],
                          condition_points: Sequence[TensorLike],
                          what: str = "condition_points") -> None:
    """One set of points per condition, in order (ValueError otherwise).

    Zipping shorter lists would drop terms.
    """
    if len(condition_points) != len(names):
        missing = names[len(condition_points):]
        detail = (f"no points for condition(s) {missing}" if missing else
                  f"{len(condition_points) - len(names)} set(s) of points beyond them")
        raise ValueError(f"pinn_loss: {what} must hold one set of points per condition of "
                         f"problem {problem.name!r}, in order {names}; got "
                         f"{len(condition_points)}: {detail}")


def point_sets(problem: Problem, points: tf.Tensor, condition_points: Sequence[tf.Tensor],
               names: Sequence[str]) -> List[Tuple[str, TensorLike]]:
    """[(what, points)]: every point set `pinn_loss` fits, named for messages."""
    sets = [("the collocation points", points)] + [
        (f"the {name!r} condition's points", x) for name, x in zip(names, condition_points)]
    if problem.data is not None:
        sets.append(("the observations' points (problem.data)",
                     np.asarray(problem.data.points)))
    return sets


def check_dtypes(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor],
                 sets: Sequence[Tuple[str, TensorLike]]) -> None:
    """Every point set of the dtype the solution computes in (TypeError otherwise).

    A float64 set with a float32 network would fail deep inside the compiled step, on the
    first op mixing the two.
    """
    points = sets[0][1]
    try:
        out = tf.convert_to_tensor(u_fn(points[:1]))
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise TypeError(f"pinn_loss: u_fn fails on the collocation points (dtype "
                        f"{points.dtype.name}) of problem {problem.name!r}; the points must "
                        f"be of the network's dtype: {e}") from e
    for what, x in sets:
        if tf.is_tensor(x) and x.dtype != out.dtype:  # the observations are cast to it
            raise TypeError(
                f"pinn_loss: {what} of problem {problem.name!r} are {x.dtype.name} but "
                f"the network computes in {out.dtype.name}: make them tf.constant(x, "
                f"{out.dtype.name}) (or build the network with dtype={x.dtype.name!r})")


def check_inside(problem: Problem, sets: Sequence[Tuple[str, TensorLike]]) -> None:
    """Every point of every set in the closed domain (ValueError otherwise).

    Asked of `domain.inside`, to within the rounding of the points' dtype.
    """
    inside = getattr(problem.domain, "inside", None)
    if inside is None:  # a geometry of one's own with only `dim`: nothing to ask
        return
    for what, x in sets:
        if tf.is_tensor(x) and not hasattr(x, "numpy"):  # symbolic: no values to check
            continue
        x64 = np.asarray(x, np.float64)
        if not len(x64):
            continue
        eps = np.finfo(np.asarray(x).dtype).eps if np.asarray(x).dtype.kind == "f" else 0.0
        tol = max(1e-9, 16 * eps) * max(1.0, float(np.abs(x64).max()))
        outside = ~np.asarray(inside(x64, tol=tol), bool)
        if outside.any():
            raise ValueError(
                f"pinn_loss: {what}: {int(outside.sum())} of {len(x64)} lie outside the "
                f"domain of problem {problem.name!r} ({problem.domain!r}), e.g. "
                f"{x64[np.argmax(outside)].tolist()}: draw them in the domain (pinn.sample, "
                "the condition's points_fn), or pass check_domain=False to fit points outside "
                "it on purpose")
