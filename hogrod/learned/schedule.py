"""A learned learning-rate schedule: a few meta-parameters, SGD or Adam following them.

`learned_schedule(kind, horizon, ...)` returns a `LearnedSchedule` (a `LearnedOptimizer`):
theta holds log learning rates, so every real theta is a valid positive schedule (the
parametrization `hogrod.optim.learnable` gives a learning rate), and
``optimizer(theta).update`` takes the step of `hogrod.optim.sgd` or `hogrod.optim.adam`
at the rate ``rate(theta, t)``, t the step count before the update (0 at the first step).
With s = min(t, horizon):

- "piecewise": theta = {"log_rates": [knots]}, the log rates at `knots` steps evenly
  spaced from 0 to `horizon`; the rate is linear in s between neighbouring knots
  (interpolating the rates, not their logs) and the last knot's after `horizon`. Two knots
  are the persistent_es paper's "linear" schedule of its toy regression,
  ``exp(theta_0) (T - s)/T + exp(theta_1) s/T``; one knot is a constant rate, the same as
  ``hogrod.optim.learnable(sgd(lr), dtype, names=["learning_rate"])`` with its variable
  at theta_0.
- "polynomial": theta = {"log_rates": [2], "log_power": []}, optax's polynomial decay
  ``(r_0 - r_1) (1 - s/horizon)^p + r_1`` with ``r_i = exp(log_rates[i])`` and
  ``p = exp(log_power)``; the power's derivative at s = horizon is 0 (never 0 * log 0).

The rate and the base optimizer's constants are applied at the params' dtype, which must
be theta's; the state is the base optimizer's (`SGDState` or `AdamState`).
"""

import math
from typing import Optional

import gin
import tensorflow as tf

from hogrod import checks, optim, tree
from hogrod.learned import base
from hogrod.types import DType, Scalar, Tree

__all__ = ["KINDS", "BASES", "LearnedSchedule", "learned_schedule"]

KINDS = ("piecewise", "polynomial")
BASES = ("sgd", "adam")
_WHERE = "hogrod.learned.learned_schedule"


class LearnedSchedule(base.LearnedOptimizer):
    """A `LearnedOptimizer` whose theta is a learning-rate schedule, readable by `rate`.

    Built by `learned_schedule`.
    """

    def rate(self, theta: Tree, step: Scalar) -> tf.Tensor:
        """The learning rate the optimizer uses at step `step` (counted from 0).

        Args:
            theta: the schedule's meta-parameters.
            step: the step count, an int or an integer (or floating) scalar tensor.

        Returns:
            A scalar tensor of theta's dtype, differentiable in theta.

        Raises:
            ArgumentError: theta does not match `spec`.
        """
        leaves = self.check_theta(theta)
        return _rate(self.config, tf.nest.pack_sequence_as(self.spec, leaves), step)


def _rate(config, theta, step):
    dtype = tf.as_dtype(config["dtype"])
    horizon = tf.constant(config["horizon"], dtype)
    s = tf.minimum(tf.maximum(tf.cast(step, dtype), tf.zeros([], dtype)), horizon)
    rates = tf.exp(theta["log_rates"])
    if config["kind"] == "piecewise":
        k = config["knots"]
        if k == 1:
            return rates[0]
        u = s * tf.constant(k - 1, dtype) / horizon  # the position in knot intervals
        hats = tf.nn.relu(1 - tf.abs(u - tf.range(k, dtype=dtype)))  # interpolation weights
        return tf.reduce_sum(hats * rates)
    power = tf.exp(theta["log_power"])
    rest = 1 - s / horizon
    positive = rest > 0
    decay = tf.where(positive, tf.exp(power * tf.math.log(tf.where(positive, rest,
                                                                    tf.ones_like(rest)))),
                     tf.zeros_like(rest))
    return (rates[0] - rates[1]) * decay + rates[1]


def _base(config, rate):
    if config["base"] == "sgd":
        return optim.sgd(rate, momentum=config["momentum"])
    return optim.adam(rate, b1=config["b1"], b2=config["b2"], eps=config["eps"])


def _build(config, theta_in):
    dtype = tf.as_dtype(config["dtype"])

    def update(grads, state, params):
        for i, leaf in enumerate(tree.leaves(params, "params", f"{_WHERE}: update")):
            if leaf.dtype != dtype:
                raise checks.ArgumentError(
                    f"{_WHERE}: update: params leaf {i} is {leaf.dtype.name} but theta is "
                    f"{dtype.name}; build it with learned_schedule(dtype='{leaf.dtype.name}') "
                    "(theta is never cast: a cast would round it)")
        theta = tf.nest.map_structure(tf.convert_to_tensor, theta_in)
        count = getattr(state, "count", None)
        if count is None:
            raise TypeError(f"{_WHERE}: update: state must be what optimizer(theta).init "
                            f"returns, got {type(state).__name__}")
        return _base(config, _rate(config, theta, count)).update(grads, state, params)

    def init(params):
        return _base(config, 0.0).init(params)

    return optim.Optimizer(init, update, f"learned_schedule_{config['base']}", None)


def _spec(config):
    dtype = tf.as_dtype(config["dtype"])
    if config["kind"] == "piecewise":
        return {"log_rates": tf.TensorSpec([config["knots"]], dtype)}
    return {"log_power": tf.TensorSpec([], dtype), "log_rates": tf.TensorSpec([2], dtype)}


def _init(config, seed):
    del seed  # the starting schedule is the configured one
    dtype = tf.as_dtype(config["dtype"])
    first, last = math.log(config["initial_rate"]), math.log(config["final_rate"])
    if config["kind"] == "polynomial":
        return {"log_power": tf.constant(math.log(config["power"]), dtype),
                "log_rates": tf.constant([first, last], dtype)}
    k = config["knots"]
    logs = [first + (last - first) * j / (k - 1) for j in range(k)] if k > 1 else [first]
    return {"log_rates": tf.constant(logs, dtype)}


def _check_config(kind, horizon, knots, initial_rate, final_rate, power, base_name, momentum,
                  b1, b2, eps, dtype):
    checks.choice(kind, KINDS, "kind", _WHERE)
    checks.choice(base_name, BASES, "base", _WHERE)
    dtype = base.float_dtype(dtype, _WHERE)
    initial_rate = checks.positive(initial_rate, "initial_rate", _WHERE)
    return dict(
        kind=kind, horizon=checks.integer(horizon, "horizon", _WHERE, least=1),
        knots=checks.integer(knots, "knots", _WHERE, least=1), initial_rate=initial_rate,
        final_rate=initial_rate if final_rate is None else checks.positive(
            final_rate, "final_rate", _WHERE),
        power=checks.positive(power, "power", _WHERE), base=base_name,
        momentum=checks.probability(momentum, "momentum", _WHERE),
        b1=checks.number(b1, "b1", _WHERE, 0.0, 1.0, high_open=True),
        b2=checks.number(b2, "b2", _WHERE, 0.0, 1.0, high_open=True),
        eps=checks.positive(eps, "eps", _WHERE), dtype=dtype.name)


@gin.configurable(module="hogrod.learned")
def learned_schedule(kind: str = "piecewise", horizon: int = 100, knots: int = 2,
                     initial_rate: float = 0.01, final_rate: Optional[float] = None,
                     power: float = 1.0, base: str = "sgd", momentum: float = 0.0,
                     b1: float = 0.9, b2: float = 0.999, eps: float = 1e-7,
                     dtype: DType = "float32") -> LearnedSchedule:
    """A learned learning-rate schedule (the module docstring has the formulas).

    Args:
        kind: "piecewise" (linear between `knots` evenly spaced knots) or "polynomial".
        horizon: the step at which the schedule reaches its last value, an int >= 1 (the
            meta-training horizon); default 100.
        knots: the piecewise schedule's number of knots (its parameters), an int >= 1;
            default 2. Unused by "polynomial".
        initial_rate: the rate at step 0 of the starting schedule, > 0; default 0.01.
        final_rate: the rate at `horizon` of the starting schedule, > 0; None (default):
            `initial_rate` (a constant start; the knots in between are log-linear).
        power: the polynomial schedule's starting power, > 0; default 1 (linear).
        base: the optimizer following the rate, "sgd" (default) or "adam".
        momentum: sgd's momentum, in [0, 1]; default 0.
        b1: adam's first moment decay, in [0, 1); default 0.9.
        b2: adam's second moment decay, in [0, 1); default 0.999.
        eps: adam's epsilon, > 0; default 1e-7.
        dtype: theta's dtype, which must be the params'; default "float32".

    Returns:
        A `LearnedSchedule` named "learned_schedule".

    Raises:
        ArgumentError: a setting is out of range or of the wrong type (named).
    """
    config = _check_config(kind, horizon, knots, initial_rate, final_rate, power, base,
                           momentum, b1, b2, eps, dtype)
    return LearnedSchedule("learned_schedule", config, _spec(config),
                           lambda seed: _init(config, seed),
                           lambda theta: _build(config, theta),
                           lambda params: _base(config, 0.0).init(params))
