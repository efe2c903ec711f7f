"""The PES paper's synthetic inner problems (Vicol, Metz, Sohl-Dickstein, ICML 2021), as
`InnerProblem` factories, written from google-research's `persistent_es` code.

- `influence_balancing` (`influence_balancing.py`, after the UORO paper): the linear
  system ``s <- A s + theta * c`` in n dimensions, ``A = a I + b U`` (U the superdiagonal
  shift), ``c`` a vector of `positives` ones then minus ones, from the all-ones state;
  the loss ``1/2 (s_0 - 1)^2`` at the end of each truncation (`meta_objective="last"`).
  Its steady state's first entry is ``s_0 = theta * sum_i c_i b^i / (1 - a)^(i + 1)``
  (2 theta sum(c) for a = b = 1/2), so the long-run loss is minimized at
  `influence_balancing_optimum` (-1/6 for the paper's n = 23, 10 positives). A step's
  direct effect on s_0 has the sign of c_0 = +1, its influence through the later entries
  the opposite: short truncations see only the first and point the wrong way.
- `toy_regression` (`toy_regression.py`): SGD with a learned learning-rate schedule on the
  2-D loss ``sqrt(x_0^2 + 5) - sqrt(5) + sin(x_1)^2 exp(-5 x_0^2) + 0.25 |x_1 - 100|`` from
  x = (1, 1); theta = (log lr at step 0, log lr at step T), the rate interpolated
  linearly between ``exp(theta_0)`` and ``exp(theta_1)`` over the horizon T; the
  meta-objective the mean loss over a truncation's steps (the paper's sum, over K).
"""

from typing import Tuple

import gin
import tensorflow as tf

from hogrod import checks
from hogrod.learned.problem import InnerProblem
from hogrod.types import DType, Tree

__all__ = ["influence_balancing", "influence_balancing_optimum", "toy_regression",
           "toy_regression_loss"]


def _dtype(dtype: DType, where: str) -> tf.DType:
    dtype = tf.as_dtype(dtype)
    if not dtype.is_floating:
        raise checks.ArgumentError(f"{where}: dtype must be floating, got {dtype.name}")
    return dtype


def _one_number(theta: Tree, where: str) -> tf.Tensor:
    """Theta as a scalar: one tensor with one entry (the paper's shape [1])."""
    flat = tf.nest.flatten(theta)
    if len(flat) != 1 or flat[0].shape.num_elements() != 1:
        raise checks.ArgumentError(f"{where}: theta must be one tensor of one entry (shape "
                                   f"[1]), got {checks.describe(theta)}")
    return tf.reshape(flat[0], [])


@gin.configurable(module="hogrod.learned")
def influence_balancing(n: int = 23, positives: int = 10, diagonal: float = 0.5,
                        superdiagonal: float = 0.5, dtype: DType = "float64"
                        ) -> InnerProblem:
    """The influence-balancing linear system (the PES paper's Figure 4).

    The state is ``s`` (``[n]``, all ones at the start); theta one tensor of shape ``[1]``.

    Args:
        n: the state's dimension, an int >= 2; default 23.
        positives: how many leading entries of c are +1 (the rest -1), an int in
            ``[0, n]``; default 10.
        diagonal: a, A's diagonal; default 0.5.
        superdiagonal: b, A's superdiagonal; default 0.5.
        dtype: the state's dtype; default float64.

    Returns:
        The `InnerProblem` (``meta_objective="last"``; init independent of its seed).

    Raises:
        ArgumentError: a count or coefficient out of range, or a non-floating dtype.
    """
    where = "hogrod.learned.influence_balancing"
    n = checks.integer(n, "n", where, least=2)
    positives = checks.integer(positives, "positives", where, least=0, most=n)
    a = checks.number(diagonal, "diagonal", where)
    b = checks.number(superdiagonal, "superdiagonal", where)
    dtype = _dtype(dtype, where)

    def init(seed):
        return tf.ones([n], dtype)

    def step(state, theta, batch):
        c = tf.constant([1.0] * positives + [-1.0] * (n - positives), dtype)
        shifted = tf.concat([state[1:], tf.zeros([1], dtype)], 0)  # (U s)_i = s_{i+1}
        return (tf.constant(a, dtype) * state + tf.constant(b, dtype) * shifted
                + _one_number(theta, where) * c)

    def objective(state, batch):
        return tf.constant(0.5, dtype) * tf.square(state[0] - tf.constant(1.0, dtype))

    return InnerProblem(init, step, objective, meta_objective="last")


def influence_balancing_optimum(n: int = 23, positives: int = 10, diagonal: float = 0.5,
                                superdiagonal: float = 0.5) -> float:
    """The theta whose steady state has ``s_0 = 1``: influence balancing's optimum.

    Args:
        n: the state's dimension, as `influence_balancing`.
        positives: the leading +1 entries of c, as `influence_balancing`.
        diagonal: a, with ``|a| < 1`` (a steady state exists).
        superdiagonal: b.

    Returns:
        ``1 / sum_i c_i b^i / (1 - a)^(i + 1)`` (-1/6 for the defaults).

    Raises:
        ArgumentError: ``|a| >= 1`` or the sum is 0 (no theta reaches s_0 = 1).
    """
    where = "hogrod.learned.influence_balancing_optimum"
    a = checks.number(diagonal, "diagonal", where, -1.0, 1.0, low_open=True, high_open=True)
    b = checks.number(superdiagonal, "superdiagonal", where)
    total = sum((1.0 if i < positives else -1.0) * b ** i / (1 - a) ** (i + 1)
                for i in range(n))
    if total == 0:
        raise checks.ArgumentError(f"{where}: the steady state's s_0 does not depend on "
                                   "theta for these settings")
    return 1.0 / total


def toy_regression_loss(x: tf.Tensor) -> tf.Tensor:
    """The PES paper's 2-D inner loss, ``sqrt(x0^2 + 5) - sqrt(5) + sin(x1)^2 exp(-5 x0^2)
    + 0.25 |x1 - 100|``.

    Args:
        x: a ``[2]`` floating tensor.

    Returns:
        The scalar loss, in x's dtype.
    """
    dtype = x.dtype
    five = tf.constant(5.0, dtype)
    return (tf.sqrt(tf.square(x[0]) + five) - tf.sqrt(five)
            + tf.square(tf.sin(x[1])) * tf.exp(-five * tf.square(x[0]))
            + tf.constant(0.25, dtype) * tf.abs(x[1] - tf.constant(100.0, dtype)))


@gin.configurable(module="hogrod.learned")
def toy_regression(horizon: int = 100, start: Tuple[float, float] = (1.0, 1.0),
                   weight_decay: float = 1e-10, dtype: DType = "float64") -> InnerProblem:
    """SGD on `toy_regression_loss` with a learned linear learning-rate schedule.

    The state is ``(x, t)``: the point (``[2]``) and the step count (a scalar of x's
    dtype). Theta is one tensor of shape ``[2]``: the log learning rates at step 0 and at
    step `horizon` (the rate at step t is ``exp(theta_0) (T - t) / T + exp(theta_1) t / T``);
    a step is ``x <- x - lr (grad + weight_decay x)``, the objective the loss at x.

    Args:
        horizon: T, the steps of an inner run the schedule spans, an int >= 1 (give the
            estimators the same horizon); default 100.
        start: the initial point; default (1, 1).
        weight_decay: the L2 coefficient of the paper's SGD; default 1e-10.
        dtype: the state's dtype; default float64.

    Returns:
        The `InnerProblem` (``meta_objective="sum"``; init independent of its seed).

    Raises:
        ArgumentError: `horizon` not a positive int, `start` not two numbers,
            `weight_decay` negative, or a non-floating dtype.
    """
    where = "hogrod.learned.toy_regression"
    horizon = checks.integer(horizon, "horizon", where, least=1)
    if len(tuple(start)) != 2:
        raise checks.ArgumentError(f"{where}: start must be two numbers, got {start!r}")
    start = [checks.number(v, f"start[{i}]", where) for i, v in enumerate(start)]
    weight_decay = checks.nonnegative(weight_decay, "weight_decay", where)
    dtype = _dtype(dtype, where)

    def init(seed):
        return tf.constant(start, dtype), tf.constant(0.0, dtype)

    def step(state, theta, batch):
        x, t = state
        flat = tf.nest.flatten(theta)
        if len(flat) != 1 or flat[0].shape.as_list() != [2]:
            raise checks.ArgumentError(f"{where}: theta must be one tensor of shape [2] (log "
                                       f"rates at 0 and T), got {checks.describe(theta)}")
        rates = tf.exp(flat[0])
        big_t = tf.constant(float(horizon), dtype)
        lr = rates[0] * (big_t - t) / big_t + rates[1] * t / big_t
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = toy_regression_loss(x)
        g = tape.gradient(loss, x) + tf.constant(weight_decay, dtype) * x
        return x - lr * g, t + tf.constant(1.0, dtype)

    def objective(state, batch):
        return toy_regression_loss(state[0])

    return InnerProblem(init, step, objective, meta_objective="sum")
