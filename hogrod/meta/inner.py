"""The inner loop of gradient-based meta-learning, as one pure function.

`adapt` takes a few gradient steps on a support set starting from `params` and returns
the fast weights, a list of tensors shaped like `model.trainable_variables`. Nothing is
assigned: the model runs through `hogrod.functional_call`, so an outer tape that watched
the starting params differentiates through every inner step (the exact second-order MAML
meta-gradient), or through none of the inner gradients when `first_order=True`.
"""

import tensorflow as tf

import hogrod

__all__ = ["adapt", "initial_params"]


def initial_params(model):
    """The model's trainable variables read as tensors (recorded by any enclosing tape)."""
    return [tf.convert_to_tensor(v) for v in model.trainable_variables]


def _rates(inner_lr, step, params):
    lr = inner_lr(step) if callable(inner_lr) else inner_lr
    if isinstance(lr, (list, tuple)):
        if len(lr) != len(params):
            raise ValueError(f"inner_lr has {len(lr)} entries but there are {len(params)} "
                             "params; give one rate (or None to freeze) per param")
        return list(lr)
    return [lr] * len(params)


def adapt(model, loss_fn, support, inner_lr, steps=1, first_order=False, params=None,
          training=True):
    """Fast weights after `steps` gradient steps on `support`.

    Args:
      model: a built Keras 3 model.
      loss_fn: `loss_fn(y_true, y_pred) -> scalar`.
      support: `(x, y)`.
      inner_lr: a scalar; or a list with one rate per param (a scalar or a tensor
        broadcastable to the param, as Meta-SGD learns; None freezes that param, as ANIL
        does for the body); or a callable `inner_lr(step)` returning either (MAML++'s
        per-step rates).
      steps: number of inner gradient steps.
      first_order: stop gradients through the inner gradients (FOMAML).
      params: starting weights; None means the model's trainable variables, read under
        the caller's tape so the meta-gradient reaches them.
      training: passed to the model (True: BatchNorm uses the support batch's statistics,
        the transductive setting of MAML).

    Returns:
      the fast weights, a list of tensors in `model.trainable_variables` order.
    """
    x, y = support
    fast = initial_params(model) if params is None else list(params)
    for step in range(steps):
        rates = _rates(inner_lr, step, fast)
        active = [i for i, r in enumerate(rates) if r is not None]

        def support_loss(sub, fast=fast):
            full = list(fast)
            for i, p in zip(active, sub):
                full[i] = p
            return loss_fn(y, hogrod.functional_call(model, full, x, training=training))

        sub = [fast[i] for i in active]
        grads = hogrod.grad(lambda: support_loss(sub), sub)
        if first_order:
            grads = [tf.stop_gradient(g) for g in grads]
        fast = list(fast)
        for i, g in zip(active, grads):
            fast[i] = fast[i] - tf.cast(rates[i], g.dtype) * g
    return fast
