"""Differentiable optimizers as pure functions, in the spirit of optax (bilevel
optimization, learned inner optimizers).

`opt = adam(1e-3)`; `state = opt.init(params)`; `new_params, new_state =
opt.update(grads, state, params)`. Nothing is assigned: the update is a function of
(grads, state, params, hyperparameters), differentiable with respect to each, so an inner
loop written with it can be differentiated by an outer tape (MAML with an inner Adam,
hyperparameter gradients). One step is the update formula of the Keras 3 optimizer of the
same name and settings, evaluated at the params' dtype: in float64 it equals that formula
in numpy float64 exactly (to rounding), and Keras's own step to 1e-12 only when the
hyperparameters are float32 numbers, since Keras rounds its hyperparameters to float32;
see `hogrod.optim.optimizers` for the formulas, what equals what, and the zero-gradient
treatment.

`learnable(optimizer, dtype)` turns its Python-number hyperparameters into trainable
variables (log learning rate, logit b1, ...). The constructors are gin-configurable as
`hogrod.optim.adam` etc.: `maml.inner_optimizer = @hogrod.optim.adam()` with
`hogrod.optim.adam.learning_rate = 0.01`.
"""

from hogrod.optim.learnable import LEARNED_BY_DEFAULT, learnable
from hogrod.optim.optimizers import (AdamState, Logit, Optimizer, RMSPropState, SGDState,
                                     adam, adamw, rmsprop, safe_sqrt, sgd)

__all__ = ["Optimizer", "Logit", "SGDState", "AdamState", "RMSPropState", "sgd", "adam", "adamw",
           "rmsprop", "safe_sqrt", "learnable", "LEARNED_BY_DEFAULT"]
