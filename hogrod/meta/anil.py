"""ANIL (Raghu et al. 2020): MAML adapting only the head."""

import gin

from hogrod.meta.common import resolve_task_map
from hogrod.meta.maml import unrolled

__all__ = ["anil"]


def _head_mask(model, head_layers):
    """Which trainable variables belong to the last `head_layers` layers with weights."""
    weighted = [layer for layer in model.layers if layer.trainable_variables]
    if isinstance(head_layers, bool) or not isinstance(head_layers, int) or not (
            1 <= head_layers <= len(weighted)):
        raise ValueError(
            f"anil.head_layers must be an integer from 1 to {len(weighted)} (the model's "
            f"layers with trainable weights: {[layer.name for layer in weighted]}), got "
            f"{head_layers!r}; layers without weights (activations, pooling, dropout) do "
            "not count")
    head = {id(v) for layer in weighted[-head_layers:] for v in layer.trainable_variables}
    return [id(v) in head for v in model.trainable_variables]


@gin.configurable
def anil(model, loss_fn, inner_lr=0.01, inner_steps=1, head_layers=1, first_order=False,
         task_map=None, vectorize=None, recompute=None):
    """ANIL: adapt only the last `head_layers` layers with trainable weights (layers
    without weights are not counted); the body is meta-learned through the head's
    adaptation but never adapted itself."""
    mode = resolve_task_map("anil", task_map, vectorize, recompute)
    rates = [inner_lr if m else None for m in _head_mask(model, head_layers)]
    return unrolled(model, loss_fn, rates, inner_steps, first_order, mode)
