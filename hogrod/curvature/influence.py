"""Influence functions (Koh and Liang 2017) for any Keras 3 model.

I_up,loss(z, z_test) = -grad L(z_test)^T H^{-1} grad L(z): how the test loss changes when
training example z is up-weighted; removing z changes the test loss by about
-I_up,loss / n. H is the Hessian of the mean training loss (damped CG solves H s = g).
"""

from typing import Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from hogrod.curvature.inverse import conjugate_gradient
from hogrod.curvature.likelihood import per_example_loss
from hogrod.curvature.operators import HessianOperator
from hogrod.curvature.per_example import per_example_gradients
from hogrod.types import Loss, Params, TensorLike

__all__ = ["influence"]


def influence(model: keras.Model, loss: Loss, train: Tuple[TensorLike, TensorLike],
              test: Tuple[TensorLike, TensorLike],
              damping: float = 0.0, params: Optional[Params] = None,
              tol: float = 1e-10) -> np.ndarray:
    """The [n_test, n_train] matrix of I_up,loss for every (test, train) pair.

    Each test gradient is solved against the damped Hessian of the mean training loss by
    conjugate gradient (`conjugate_gradient`, float64) and dotted with every training
    gradient (`per_example_gradients`).

    Args:
      model: a trained Keras 3 model.
      loss: a Keras loss object (its per-example value) or a per-example loss
        `loss(y_true, y_pred) -> [batch]` (include any regularizer in it, as the training
        objective did); the Hessian is of its mean over `train`.
      train: the training examples, an `(x, y)` pair of arrays or tensors (one leading
        example dimension); the Hessian is of the mean loss over them.
      test: the test examples, an `(x, y)` pair likewise.
      damping: added to the Hessian's diagonal (>= 0; needed when it is singular or
        indefinite, e.g. non-convex models).
      params: restrict to these variables (default None: `model.trainable_variables`), e.g.
        the last layer (`layer_params`).
      tol: the relative residual each conjugate-gradient solve reaches.

    Returns:
      numpy float64 [n_test, n_train]; positive = up-weighting that example raises the
      test loss (harmful), negative = helpful.

    Raises:
      ValueError: the damped Hessian is singular or indefinite (add damping).
    """
    params = list(params or model.trainable_variables)
    per_example = per_example_loss(loss, "influence")
    x, y = train
    op = HessianOperator.from_objective(
        lambda b: tf.reduce_mean(per_example(b[1], model(b[0]))), params,
        (tf.convert_to_tensor(x), tf.convert_to_tensor(y)), dtype=tf.float64)
    g_train = per_example_gradients(model, loss, x, y, params)
    g_test = per_example_gradients(model, loss, test[0], test[1], params)
    s_test = np.stack([conjugate_gradient(op, g, damping, tol)[0] for g in g_test])
    return -s_test @ g_train.T
