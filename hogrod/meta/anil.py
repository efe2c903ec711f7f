"""ANIL (Raghu et al. 2020): MAML adapting only the head."""

import gin

from hogrod import checks
from hogrod.meta.maml import unrolled

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
def anil(model, loss, inner_lr=0.01, inner_steps=1, head_layers=1, first_order=False,
         task_map="vectorized"):
    """ANIL: adapt only the last `head_layers` layers with trainable weights (layers
    without weights are not counted); the body is meta-learned through the head's
    adaptation but never adapted itself.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred) -> scalar`.
      inner_lr: the head's inner rate.
      inner_steps: inner steps per task (>= 1).
      head_layers: how many of the last layers with trainable weights are adapted.
      first_order: treat the inner gradients as constants.
      task_map: 'vectorized', 'sequential' or 'recomputed' (see `hogrod.meta.maml`).

    Returns:
      an `Algorithm`.
    """
    rates = [inner_lr if m else None for m in _head_mask(model, head_layers)]
    return unrolled(model, loss, rates, inner_steps, first_order, task_map, where="anil")
