"""Mixed precision: Keras 3's `mixed_float16` policy and a loss-scaled optimizer.

    with precision_policy("mixed_float16"):
        model = build_model()                                    # layers compute in float16
        optimizer = mixed_precision(keras.optimizers.Adam(1e-3)) # loss scaling
    step = make_train_step(objective, optimizer, model.trainable_variables)

Nothing here changes Keras's global dtype policy for good: `precision_policy` sets it only
inside its `with` block (a layer keeps the policy it was built under), and restores the
previous one on exit. A layer can also be given its policy directly,
`keras.layers.Dense(8, dtype=keras.DTypePolicy("mixed_float16"))`.

Variables stay float32; `make_train_step` scales the loss before the tape's gradient and
unscales after, so small float16 gradients do not underflow; the dynamic scale halves on
overflow (that step is skipped) and grows after a run of finite steps.
"""

import contextlib
import warnings
from typing import Iterator

import keras

from hogrod.train.protocol import StepOptimizer

__all__ = ["mixed_precision", "precision_policy"]


def _policy(policy: str | keras.DTypePolicy, argument: str) -> keras.DTypePolicy:
    if isinstance(policy, keras.DTypePolicy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"{argument} must be a Keras dtype policy name ('mixed_float16', "
                        f"'mixed_bfloat16', 'float32', ...) or a keras.DTypePolicy, got "
                        f"{type(policy).__name__}")
    try:
        return keras.DTypePolicy(policy)
    except ValueError as e:
        raise ValueError(f"{argument}: {e}") from None


def mixed_precision(optimizer: keras.optimizers.Optimizer,
                    policy: str | keras.DTypePolicy = "mixed_float16"
                    ) -> keras.optimizers.Optimizer:
    """`optimizer` as a model computing under `policy` needs it: loss-scaled for float16.

    The optimizer is wrapped in `keras.optimizers.LossScaleOptimizer` when the policy
    computes in float16, else returned as it is ("mixed_bfloat16" and "float32" need no
    loss scaling).

    It does not set any dtype policy: build the model inside `precision_policy(policy)`
    (or give its layers `dtype=keras.DTypePolicy(policy)`). Called where the global policy
    computes in another dtype (`mixed_precision(opt)` then building the model outside
    `precision_policy`), it warns (`UserWarning`) that a model built there is not mixed.

    Args:
      optimizer: the Keras optimizer to train with; not already a LossScaleOptimizer.
      policy: a Keras dtype policy or its name ("mixed_float16", "mixed_bfloat16",
        "float32", ...), the one the model is built under.

    Returns:
      `keras.optimizers.LossScaleOptimizer(optimizer)` (dynamic loss scale) if `policy`
      computes in float16, else `optimizer` itself.

    Raises:
      TypeError: `optimizer` is not a Keras optimizer, or `policy` not a name or policy.
      ValueError: `optimizer` is already a LossScaleOptimizer, or `policy` is an unknown
        name.
    """
    policy = _policy(policy, "mixed_precision's policy")
    if isinstance(optimizer, StepOptimizer):
        raise TypeError(
            f"mixed_precision: {type(optimizer).__name__} is a step optimizer, which does not "
            "support loss scaling (its curvature and line searches evaluate the unscaled "
            "objective); train it under train.precision_policy('mixed_bfloat16') or in "
            "float32 (K-FAC keeps half-precision models' factors in float32)")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"mixed_precision's optimizer must be a keras.optimizers.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError("mixed_precision's optimizer is already a LossScaleOptimizer: pass "
                         "the inner optimizer")
    current = keras.config.dtype_policy()
    if current.compute_dtype != policy.compute_dtype:
        warnings.warn(
            f"mixed_precision({policy.name!r}) does not set Keras's dtype policy, and the "
            f"global policy is {current.name!r}: a model built now computes in "
            f"{current.compute_dtype}. Build it inside train.precision_policy({policy.name!r}) "
            "(and call mixed_precision there)", UserWarning, stacklevel=2)
    if policy.compute_dtype == "float16":
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


@contextlib.contextmanager
def precision_policy(policy: str | keras.DTypePolicy) -> Iterator[keras.DTypePolicy]:
    """A context manager: within its block, Keras's global dtype policy is `policy`.

    The layers built in the block compute in the policy's dtype (and keep it after); on
    exit, even by an exception, the previous global policy is back.

    Args:
      policy: a Keras dtype policy or its name ("mixed_float16", "mixed_bfloat16",
        "float32", ...).

    Yields:
      The policy, as a `keras.DTypePolicy`.

    Raises:
      TypeError: `policy` is not a name or a policy.
      ValueError: `policy` is an unknown name.
    """
    policy = _policy(policy, "precision_policy's policy")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield policy
    finally:
        keras.config.set_dtype_policy(previous)
