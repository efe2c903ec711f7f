"""The parts the weighting schemes share: their checks, NTK traces by chunks, time chunks.

`weighting.py` builds its schemes from these; each names the scheme's gin bindings in its
messages.
"""

from typing import Callable, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from hogrod import autodiff, checks
from hogrod.pinn import training
from hogrod.pinn.problem import Problem
from hogrod.types import TensorLike

__all__ = ["check_every_alpha", "terms_to_balance", "points_dtype", "jacobian_square_sum",
           "chunked_mean", "causal_chunks", "chunk_losses"]


def check_every_alpha(every: int, alpha: float, where: str) -> None:
    """Checks `every` (steps between updates) and `alpha` (the moving average's weight).

    `alpha` is the weight on the old value, in [0, 1); errors name the gin bindings.
    """
    checks.integer(every, f"{where}.every", where, least=1)
    checks.number(alpha, f"{where}.alpha", where, 0.0, 1.0, high_open=True)


def terms_to_balance(problem: Problem, gpinn: Optional[Mapping[int, float]],
                     where: str) -> List[str]:
    """The problem's term names, of which a balancing scheme needs at least two."""
    names = training.term_names(problem, gpinn)
    if len(names) < 2:
        raise ValueError(
            f"{where}: problem {problem.name!r} has the residual as its only loss term (its "
            "conditions are hard constraints), so there are no terms to balance; give it soft "
            "conditions (e.g. burgers_problem.hard_constraints = False) or choose another "
            "pinn_experiment.weighting")
    return names


def points_dtype(points: TensorLike) -> tf.DType:
    """The dtype of the collocation points (the weights' dtype)."""
    return tf.convert_to_tensor(points).dtype


def jacobian_square_sum(values_fn: Callable[[tf.Tensor], tf.Tensor],
                        variables: Sequence[tf.Variable]) -> Callable:
    """x -> (sum_j ``||d r_j / d theta||^2``, the number of values r_j = values_fn(x))."""
    def square_sum(x):
        jac = autodiff.jacobian(lambda _: values_fn(x), variables)
        rows = tf.size(jac[0]) // tf.size(variables[0])
        return tf.add_n([tf.reduce_sum(tf.square(j)) for j in jac]), rows
    return square_sum


def chunked_mean(square_sum: Callable, x: TensorLike, chunk: int) -> tf.Tensor:
    """The mean of `jacobian_square_sum`'s sums over all values, `chunk` points at a time."""
    x = tf.convert_to_tensor(x)
    n = x.shape[0]
    if n is None or n == 0:
        raise ValueError(f"ntk_trace: x must hold a known, non-zero number of points, got "
                         f"shape {x.shape}")
    parts = [square_sum(x[start:start + chunk]) for start in range(0, n, chunk)]
    return tf.add_n([s for s, _ in parts]) / tf.cast(tf.add_n([c for _, c in parts]),
                                                     parts[0][0].dtype)


def causal_chunks(problem: Problem, points: TensorLike, chunks: int,
                  where: str) -> Callable[[tf.Tensor], tf.Tensor]:
    """t -> the index of t's time chunk, after checking the problem and the points.

    The last coordinate's range is split into `chunks` equal intervals; the problem must
    have time and every chunk must hold points (ValueError otherwise).
    """
    if not problem.time_dependent:
        raise ValueError(
            f"{where}: problem {problem.name!r} has no time coordinate (Problem.time_dependent "
            "is False), and causal weighting splits the collocation points by time (the last "
            "coordinate); choose another pinn_experiment.weighting, or give the problem time "
            "as its last coordinate and time_dependent=True")
    checks.integer(chunks, f"{where}.chunks", where, least=1)
    t0, t1 = float(problem.domain.low[-1]), float(problem.domain.high[-1])

    def chunk_of(t):
        return tf.clip_by_value(tf.cast(tf.floor((t - t0) / (t1 - t0) * chunks), tf.int32),
                                0, chunks - 1)

    points = tf.convert_to_tensor(points)
    counts = np.bincount(chunk_of(points[:, -1]).numpy(), minlength=chunks)
    if counts.min() == 0:
        raise ValueError(f"{where}: {int((counts == 0).sum())} of the {chunks} time chunks hold "
                         f"no collocation point (of {points.shape[0]}); lower {where}.chunks "
                         f"or raise pinn_experiment.n_collocation")
    return chunk_of


def chunk_losses(chunk_of: Callable[[tf.Tensor], tf.Tensor], chunks: int, x: tf.Tensor,
                 squares: tf.Tensor) -> tf.Tensor:
    """The mean squared residual of each time chunk, [chunks] (an empty chunk: 0)."""
    index = chunk_of(x[:, -1])
    per_point = tf.reduce_mean(squares, axis=1)
    sums = tf.math.unsorted_segment_sum(per_point, index, chunks)
    count = tf.math.unsorted_segment_sum(tf.ones_like(per_point), index, chunks)
    return sums / tf.maximum(count, 1)
