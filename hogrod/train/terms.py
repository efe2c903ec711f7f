"""A train step's loss terms: an objective's value as named scalars, their weights and their
weighted sum (what `make_train_step` differentiates and what a step optimizer evaluates).

Terms named "monitor/..." are logged and NaN-guarded, not optimized.
"""

import math
import numbers
from typing import Any, Mapping, Optional

import keras
import tensorflow as tf

from hogrod.types import Scalar, Tensor

__all__ = ["objective_terms", "weighted_total", "check_weights", "MONITOR"]

MONITOR = "monitor/"  # terms named "monitor/..." are logged and guarded, not optimized


def objective_terms(value: Scalar | Mapping[str, Scalar]) -> dict[str, tf.Tensor]:
    """An objective's value as {name: scalar tensor}.

    Half-precision terms are promoted to float32 (the mixed-precision convention); float32
    and float64 terms keep their dtype.

    Args:
      value: an objective's value: a scalar, or a dict {name: scalar}.

    Returns:
      A dict {name: scalar tensor} (a single scalar is named "loss"), each float32 or
      float64.

    Raises:
      TypeError: a term's name is not a string.
      ValueError: a term is not a scalar; the message names it.
    """
    terms = dict(value) if isinstance(value, dict) else {"loss": value}
    out = {}
    for name, t in terms.items():
        if not isinstance(name, str):
            raise TypeError(f"loss term names must be strings, got {name!r}")
        t = tf.convert_to_tensor(t)
        if t.shape.rank != 0:
            raise ValueError(f"loss term '{name}' must be a scalar, got shape {t.shape}")
        if t.dtype != tf.float64:
            t = tf.cast(t, tf.float32)
        out[name] = t
    return out


def check_weights(weights: Optional[Mapping[str, Any]]) -> dict[str, float | Tensor]:
    """`make_train_step.weights` checked: {term: weight}, Python numbers as floats (applied
    at each term's dtype later), scalar tensors or variables as they are (read every step).

    Args:
      weights: None or a dict {term name: number or scalar tensor/variable}.

    Returns:
      The dict checked ({} for None).

    Raises:
      TypeError: not a dict, a name not a string, or a weight neither a number nor a
        scalar tensor/variable.
      ValueError: a number that is not finite.
    """
    if weights is None:
        return {}
    if not isinstance(weights, dict):
        raise TypeError(f"make_train_step.weights must be a dict {{term: weight}}, got "
                        f"{type(weights).__name__}")
    out = {}
    for name, w in weights.items():
        where = f"make_train_step.weights[{name!r}]"
        if not isinstance(name, str):
            raise TypeError(f"make_train_step.weights: term names must be strings, got {name!r}")
        if isinstance(w, numbers.Real) and not isinstance(w, bool):
            if not math.isfinite(w):
                raise ValueError(f"{where} must be finite, got {w}")
            out[name] = float(w)
        elif isinstance(w, (tf.Tensor, tf.Variable, keras.Variable)) and w.shape.rank == 0:
            out[name] = w  # e.g. a schedule's variable: read at every step
        else:
            raise TypeError(f"{where} must be a number or a scalar tensor/variable, got "
                            f"{w!r}")
    return out


def weighted_total(terms: Mapping[str, tf.Tensor],
                   weights: Mapping[str, float | Tensor]) -> tf.Tensor:
    """The weighted sum of the minimized terms.

    ``sum over name of weight * term`` over the optimized terms (not "monitor/..."), in
    float64 if any of them is float64, else float32. A Python-number weight becomes a
    tensor of that dtype directly, so 1e-4 on a float64 loss is the float64 1e-4; a tensor
    weight is cast to it.

    Args:
      terms: {name: scalar tensor}, as `objective_terms` returns them.
      weights: {name: weight}, a Python float or a scalar tensor or variable (read when
        called); a term not named has weight 1.

    Returns:
      A scalar tensor, float64 if any optimized term is, else float32.

    Raises:
      ValueError: a weight names no term, or every term is a "monitor/..." term.
    """
    unknown = sorted(set(weights) - set(terms))
    if unknown:
        raise ValueError(f"weights given for unknown loss term(s) {unknown}; the loss "
                         f"returns {sorted(terms)}")
    optimized = {n: t for n, t in terms.items() if not n.startswith(MONITOR)}
    if not optimized:
        raise ValueError(f"the loss returns only monitor terms {sorted(terms)}; nothing to "
                         "optimize")
    dtype = tf.float64 if any(t.dtype == tf.float64 for t in optimized.values()) else tf.float32
    parts = []
    for name, t in optimized.items():
        t = tf.cast(t, dtype)  # float32 -> float64 is exact
        w = weights.get(name)
        if isinstance(w, float):
            t = tf.constant(w, dtype) * t
        elif w is not None:
            t = tf.cast(w, dtype) * t
        parts.append(t)
    return tf.add_n(parts)
