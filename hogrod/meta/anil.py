"""ANIL (Raghu et al. 2020): MAML adapting only the head."""

import gin
import keras

from hogrod import checks
from hogrod.meta.common import Algorithm
from hogrod.meta.inner import check_rate
from hogrod.meta.maml import unrolled
from hogrod.types import Loss, Scalar

__all__ = ["anil"]


def _head_mask(model, head_layers):
    """Which trainable variables belong to the last `head_layers` layers with weights."""
    weighted = [layer for layer in model.layers if layer.trainable_variables]
    if not weighted:
        raise ValueError("hogrod.meta.anil: the model has no layers with trainable weights "
                         "(not built?)")
    try:
        checks.integer(head_layers, "head_layers", "hogrod.meta.anil", least=1,
                       most=len(weighted))
    except checks.ArgumentError as e:
        raise checks.ArgumentError(
            f"{e}; the model's layers with trainable weights: "
            f"{[layer.name for layer in weighted]} (layers without weights, such as "
            "activations, pooling or dropout, do not count)") from None
    head = {id(v) for layer in weighted[-head_layers:] for v in layer.trainable_variables}
    return [id(v) in head for v in model.trainable_variables]


@gin.configurable
def anil(model: keras.Model, loss: Loss, inner_lr: Scalar = 0.01, inner_steps: int = 1,
         head_layers: int = 1, first_order: bool = False,
         task_map: str = "vectorized") -> Algorithm:
    """ANIL: adapt only the last `head_layers` layers with trainable weights.

    Layers without weights (activations, pooling, dropout) are not counted; the body is
    meta-learned through the head's adaptation but never adapted itself.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the head's inner rate.
      inner_steps: inner steps per task (>= 1).
      head_layers: how many of the last layers with trainable weights are adapted (>= 1,
        at most the number of such layers).
      first_order: treat the inner gradients as constants.
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      an `Algorithm`.

    Raises:
      ValueError: the model has no layers with trainable weights (not built).
      hogrod.checks.ArgumentError: a bad `head_layers` (the message lists the layers with
        weights), `loss`, `task_map` or `inner_steps`.
    """
    check_rate(inner_lr, "inner_lr", "anil")
    rates = [inner_lr if m else None for m in _head_mask(model, head_layers)]
    return unrolled(model, loss, rates, inner_steps, first_order, task_map, where="anil")
