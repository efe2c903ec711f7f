"""Run any built Keras 3 model with substitute weights.

`functional_call(model, params, x)` evaluates `model(x)` as if its trainable
variables held the tensors in `params`. Because the params are ordinary
tensors, an outer `tf.GradientTape` sees through them: this is what MAML's
inner loop, per-example tricks and hypernetworks need. It is built on Keras 3's
own `Model.stateless_call`, so every layer Keras supports works, and the
model's variables are never written.

Non-trainable state (BatchNormalization moving statistics, the seed state of
Dropout and other random layers) is threaded explicitly: pass `state` (a list
of tensors ordered like `model.non_trainable_variables`, e.g. from
`model_state(model)`) and get `(outputs, new_state)` back; leave it out and the
model's current state is read and only outputs are returned.

Importing hogrod makes Keras's normalization statistics differentiable to every order.
Keras's TensorFlow backend takes the variance of BatchNormalization (on batch statistics),
LayerNormalization, GroupNormalization and `keras.ops.moments` from `tf.nn.moments`, which
stops the gradient through the mean inside the variance. That leaves first derivatives
exact (the variance's derivative in the mean is zero) but drops terms of every second
derivative: MAML's meta-gradient and iMAML's Hessian-vector products through BatchNorm, a
gradient penalty through a LayerNorm critic, a PDE residual's second derivatives through
LayerNorm, any Hessian of such a model. hogrod replaces Keras's moments function (a private
one; the import fails naming the pinned Keras if it is gone) by one computing the same
values without the stop.
"""

import importlib

from typing import Any, List, Optional, Sequence, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

from hogrod.types import Tensor, TensorLike

__all__ = ["functional_call", "model_state", "trainable_values"]


def model_state(model: keras.Model) -> List[tf.Tensor]:
    """The model's current non-trainable state, as a list of tensors.

    Args:
        model: a built Keras 3 model (or layer).

    Returns:
        The values of ``model.non_trainable_variables`` (BatchNormalization statistics, the
        seed state of random layers), in that order: the `state` `functional_call` takes.
    """
    return [tf.convert_to_tensor(v.value) for v in model.non_trainable_variables]


def trainable_values(model: keras.Model) -> List[tf.Tensor]:
    """The model's current trainable weights, as a list of tensors.

    A fresh copy (`tf.identity`) for functional use: later writes to the variables do not
    change it.

    Args:
        model: a built Keras 3 model (or layer).

    Returns:
        The values of ``model.trainable_variables``, in that order: the `params`
        `functional_call` takes.
    """
    return [tf.identity(v.value) for v in model.trainable_variables]


def _check(variables: Sequence[Any], values: Sequence[Any], kind: str) -> None:
    if len(values) != len(variables):
        names = ", ".join(v.path for v in variables)
        raise ValueError(
            f"functional_call got {len(values)} {kind} tensors but the model has "
            f"{len(variables)} {kind} variables: [{names}]")
    for i, (var, val) in enumerate(zip(variables, values)):
        if not isinstance(val, (tf.Tensor, tf.Variable, keras.Variable, np.ndarray)):
            raise TypeError(f"functional_call: {kind} tensor {i} (for variable '{var.path}') "
                            f"must be a tensor or a numpy array, got {type(val).__name__}")
        if isinstance(val, tf.Tensor) and tf.as_dtype(val.dtype) != tf.as_dtype(var.dtype):
            # Keras would cast it: an integer loses its gradient, float64 its precision
            raise TypeError(f"functional_call: {kind} tensor {i} has dtype {val.dtype.name} but "
                            f"variable '{var.path}' has dtype {tf.as_dtype(var.dtype).name}; "
                            "cast it first")
        shape = tf.TensorShape(val.shape)
        if not shape.is_compatible_with(var.shape):
            raise ValueError(
                f"functional_call: {kind} tensor {i} has shape {shape.as_list()} but "
                f"variable '{var.path}' (layer '{var.path.rsplit('/', 1)[0]}') has shape "
                f"{list(var.shape)}")


def _check_input_precision(model: keras.Model, args: Tuple[Any, ...]) -> None:
    """A float64 model behind a float32 `keras.Input` rounds float64 inputs to float32
    (Keras casts inputs to the Input's dtype): refuse that rather than lose the precision."""
    inputs = getattr(model, "inputs", None) or []
    weights = {tf.as_dtype(v.dtype) for v in model.trainable_variables if
               tf.as_dtype(v.dtype).is_floating}
    given = [getattr(a, "dtype", None) for a in tf.nest.flatten(args)]
    for i, (t, g) in enumerate(zip(inputs, given)):
        dtype = tf.as_dtype(t.dtype)
        if g is None or not dtype.is_floating or not tf.as_dtype(g).is_floating:
            continue
        g = tf.as_dtype(g)
        if g.size > dtype.size and any(w.size > dtype.size for w in weights):
            raise TypeError(
                f"functional_call: model '{model.name}' has {g.name} weights and is given "
                f"{g.name} input {i}, but its keras.Input is {dtype.name}, so the input would "
                f"be rounded to {dtype.name} before the first layer; build the model with "
                f"keras.Input(..., dtype='{g.name}')")


def _exact_moments(x, axes, keepdims=False):
    """`tf.nn.moments` without its stop_gradient on the mean inside the variance."""
    mean = tf.reduce_mean(x, axes, keepdims=True)
    variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axes, keepdims=True)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


# Process-wide rather than inside hogrod's own calls: a model called directly under nested
# tapes (a critic's gradient penalty, a PINN's residual, `hogrod.hessian` of a loss) meets
# the same statistics, and a graph traced before or after gets the same derivatives.
_KERAS_NN = importlib.import_module("keras.src.backend.tensorflow.nn")
if not callable(getattr(_KERAS_NN, "_compute_moments", None)):
    raise ImportError(
        "hogrod: this Keras has no keras.src.backend.tensorflow.nn._compute_moments, through "
        "which hogrod makes normalization statistics exact to second order; install the "
        "Keras version pyproject.toml pins")
_KERAS_NN._compute_moments = _exact_moments


def functional_call(model: keras.Model, params: Sequence[TensorLike], *args: Any,
                    training: bool = False, state: Optional[Sequence[TensorLike]] = None,
                    **kwargs: Any) -> Union[Any, Tuple[Any, List[Tensor]]]:
    """`model(*args)` with `params` substituted for `model.trainable_variables`.

    The model's variables are neither read for the weights nor written.

    Args:
        model: a built Keras 3 model (or layer).
        params: a sequence of tensors (or numpy arrays), one per trainable variable, in
            ``model.trainable_variables`` order, of the variables' shapes and dtypes.
        *args: the model's inputs. A float64 model behind a float32 `keras.Input` refuses
            float64 inputs (Keras would round them).
        training: passed to the model's call (BatchNorm batch statistics, Dropout);
            default False.
        state: optional list of tensors for ``model.non_trainable_variables`` (e.g. from
            `model_state`); None (default) reads the model's current state.
        **kwargs: other keyword arguments of the model's call (e.g. `mask`).

    Returns:
        The model's outputs if `state` is None, else a tuple ``(outputs, new_state)``, with
        ``new_state`` the list of non-trainable values after the call.

    Raises:
        ValueError: the model is not built, or the number or shapes of `params` / `state`
            do not match the variables.
        TypeError: a value is not a tensor or array, a tensor's dtype differs from its
            variable's, or an input would lose precision to the `keras.Input` dtype.
    """
    if not model.built:
        raise ValueError(
            f"functional_call needs a built model; call '{model.name}' once on an input "
            "or build it first")
    _check_input_precision(model, args)
    params = list(params)
    _check(model.trainable_variables, params, "trainable")
    given_state = state is not None
    state = model_state(model) if state is None else list(state)
    _check(model.non_trainable_variables, state, "non-trainable")
    outputs, new_state = model.stateless_call(params, state, *args, training=training,
                                              **kwargs)
    if given_state:
        return outputs, list(new_state)
    return outputs
