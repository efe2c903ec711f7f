"""The inner problem a truncated unroll trains: how a particle starts, steps and is scored."""

from typing import Callable, NamedTuple, Optional

__all__ = ["InnerProblem"]


class InnerProblem(NamedTuple):
    """An inner problem, one particle's view: pure functions of tensors.

    Attributes:
        init: ``init(seed) -> state``, a nest of tensors for ONE particle; `seed` a ``[2]``
            int stateless seed.
        step: ``step(state, theta, batch) -> state``, one inner step (the same structure,
            shapes and dtypes).
        objective: ``objective(state, batch) -> scalar``, the inner loss at `state`.
        batch: ``batch(seed, t)``, the batch of inner step t for a particle whose data seed
            is `seed`; None: the batch is ``()``.
        meta_objective: a truncation's meta-loss: "sum" (the mean over its steps) or "last"
            (its last step's objective).
    """

    init: Callable
    step: Callable
    objective: Callable
    batch: Optional[Callable] = None
    meta_objective: str = "sum"
