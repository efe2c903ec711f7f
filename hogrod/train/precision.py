"""Mixed precision: Keras 3's `mixed_float16` policy and a loss-scaled optimizer.

    optimizer = mixed_precision(keras.optimizers.Adam(1e-3))   # sets the global policy
    model = build_model()                                       # layers compute in float16
    step = make_train_step(loss_fn, optimizer, model.trainable_variables)

Variables stay float32; `make_train_step` scales the loss before the tape's gradient and
unscales after, so small float16 gradients do not underflow; the dynamic scale halves on
overflow (that step is skipped) and grows after a run of finite steps.
"""

import keras

__all__ = ["mixed_precision"]


def mixed_precision(optimizer, policy="mixed_float16"):
    """Set the global Keras dtype policy and wrap `optimizer` for loss scaling.

    Call it before building the model. policy "mixed_bfloat16" needs no loss scaling and
    returns the optimizer unwrapped; "float32" restores full precision.
    """
    keras.mixed_precision.set_global_policy(policy)
    if policy == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
