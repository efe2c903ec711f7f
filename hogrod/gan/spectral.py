"""Spectral normalization (Miyato et al. 2018) that works through `hogrod.functional_call`
and every penalty, its power iteration advanced once per training step.

    critic = keras.Sequential([keras.Input((2,)),
                               SpectralNormalization(keras.layers.Dense(64)), ...])
    ...
    advance_power_iteration(critic)  # once per training step, however often it runs the critic

`SpectralNormalization(layer)` wraps a layer with a `kernel` (Dense, Conv*) or `embeddings`
variable. Every forward pass, in training or not, runs the layer with ``W / sigma(W)``:
``W`` reshaped to ``[-1, out]``, ``v = unit(W u)`` and ``sigma = ||W^T v||`` from the stored
vector ``u`` (one power-iteration step, not stored), differentiated in ``W`` with ``v``
held constant (``d sigma / d W = v unit(W^T v)^T``, Miyato et al.'s and
`torch.nn.utils.spectral_norm`'s gradient). The forward pass never writes: the variable
keeps the unnormalized ``W``; ``u`` changes only in `advance_power_iteration`, which moves
it one power-iteration step, ``u <- unit(W^T unit(W u))``, at the current weights. A step that
runs the critic on the real batch, the generated batch and inside a penalty (R1 at the
real data, GP at interpolates), or through `functional_call`, uses one ``sigma`` and
advances ``u`` once. Calling `advance_power_iteration` after the step's forward passes and
before its update reproduces `torch.nn.utils.spectral_norm` (one iteration per training forward); at
the start of the step it uses the newer weights. A checkpoint saves ``u`` (a
non-trainable variable, part of `functional_call`'s state).

Why not Keras's `keras.layers.SpectralNormalization` (Keras 3.15): on every call with
``training=True`` it advances its ``u`` and assigns ``W / sigma`` into the wrapped layer's
trainable kernel. So a critic called on real and generated batches and in a penalty in one
step advances ``u`` and divides the kernel once per call; the assignment cuts ``sigma``'s
dependence on ``W`` out of the gradient (the kernel is updated as if it were ``W / sigma``);
a call with ``training=False``, as every penalty calls the critic, normalizes nothing and
runs whatever kernel the last training call wrote; and under `functional_call` (Keras's
`stateless_call`) the write to the trainable kernel is discarded, ``u`` advancing once per
call in the returned state. `tests/test_gan_regularizers.py` checks these four behaviours
of the Keras layer, so this paragraph fails a test when Keras changes.

The wrapped layer runs inside a `keras.StatelessScope` that maps its kernel to ``W /
sigma`` and its other variables to their current values (the ones `functional_call`
substitutes); a layer with non-trainable state (BatchNormalization) cannot be wrapped.
Under mixed precision the kernel is rounded to the compute dtype before it is normalized.
"""

from typing import Any, Optional

import keras
import tensorflow as tf

from hogrod import train

__all__ = ["SpectralNormalization", "advance_power_iteration", "spectral_layers"]


def _unit(x: tf.Tensor) -> tf.Tensor:
    """x / ||x|| (x itself where x is 0: an all-zero kernel stays finite)."""
    n = tf.norm(x)
    return x / tf.where(n > 0, n, tf.ones_like(n))


class SpectralNormalization(keras.layers.Wrapper):
    """A layer whose kernel is divided by its largest singular value in every forward pass.

    The estimate comes from a stored power-iteration vector ``u`` (a non-trainable
    variable), advanced only by `advance_power_iteration` (see the module docstring).

    Args:
      layer: the layer wrapped, with a `kernel` (Dense, Conv1D/2D/3D, ...) or `embeddings`
        variable and no non-trainable variables.
      **kwargs: `keras.layers.Wrapper`'s (name, dtype, ...).
    """

    def __init__(self, layer: keras.layers.Layer, **kwargs: Any) -> None:
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(f"SpectralNormalization wraps a Keras layer, got "
                            f"{type(layer).__name__}")
        super().__init__(layer, **kwargs)

    def _kernel(self) -> keras.Variable:
        for name in ("kernel", "embeddings"):
            if hasattr(self.layer, name):
                kernel = getattr(self.layer, name)
                if not isinstance(kernel, keras.Variable):
                    raise ValueError(f"SpectralNormalization: {type(self.layer).__name__}."
                                     f"{name} is not a variable (a LoRA or quantized layer?)")
                return kernel
        raise ValueError(f"SpectralNormalization: {type(self.layer).__name__} has neither a "
                         "kernel nor embeddings to normalize")

    def build(self, input_shape: Optional[Any] = None) -> None:
        """Build the wrapped layer and the power-iteration vector u.

        Args:
          input_shape: the input's shape.

        Raises:
          ValueError: the layer has no kernel, or has non-trainable variables (its updates
            would be lost).
        """
        super().build(input_shape)
        if self.layer.non_trainable_variables:
            raise ValueError(f"SpectralNormalization: {type(self.layer).__name__} has "
                             "non-trainable variables, whose updates the normalized call "
                             "would lose; wrap a layer without state (Dense, Conv)")
        kernel = self._kernel()
        self.vector_u = self.add_weight(
            shape=(kernel.shape[-1],), initializer=keras.initializers.RandomNormal(),
            trainable=False, name="power_iteration_u", dtype=kernel.dtype)
        self.built = True

    def _matrix(self, kernel):
        return tf.reshape(kernel, [-1, kernel.shape[-1]])

    def sigma(self, kernel: Optional[tf.Tensor] = None) -> tf.Tensor:
        """The largest singular value's estimate ``||W^T unit(W u)||`` the forward pass uses.

        Differentiable in the kernel, with ``unit(W u)`` held constant.

        Args:
          kernel: the kernel's value; None: the variable's current value (or the one
            `functional_call` substitutes).

        Returns:
          A scalar of the kernel's dtype.
        """
        w = self._matrix(tf.convert_to_tensor(self._kernel().value if kernel is None
                                              else kernel))
        u = tf.cast(tf.convert_to_tensor(self.vector_u.value), w.dtype)
        v = tf.stop_gradient(_unit(tf.linalg.matvec(w, u)))
        squared = tf.reduce_sum(tf.square(tf.linalg.matvec(w, v, transpose_a=True)))
        positive = squared > 0  # sqrt with a finite gradient at an all-zero kernel
        return tf.where(positive, tf.sqrt(tf.where(positive, squared, 1.0)), 1.0)

    def next_u(self) -> tf.Tensor:
        """One power-iteration step from u at the current weights, ``unit(W^T unit(W u))``.

        Returns:
          The vector `advance_power_iteration` stores, [out], u's dtype.
        """
        w = self._matrix(tf.convert_to_tensor(self._kernel().value))
        u = tf.cast(tf.convert_to_tensor(self.vector_u.value), w.dtype)
        v = _unit(tf.linalg.matvec(w, u))
        return tf.cast(_unit(tf.linalg.matvec(w, v, transpose_a=True)), self.vector_u.dtype)

    def call(self, inputs: Any, training: Optional[bool] = None) -> Any:
        """The wrapped layer on `inputs` with its kernel divided by `sigma`.

        Args:
          inputs: the layer's inputs.
          training: passed on by Keras to the wrapped layer's call context.

        Returns:
          The wrapped layer's outputs.
        """
        kernel = self._kernel()
        w = tf.convert_to_tensor(kernel.value)
        normalized = w / self.sigma(w)
        # every variable of the wrapped layer mapped, the ones functional_call substitutes
        # included: a nested scope does not see the outer scope's mapping
        mapping = [(v, normalized if v is kernel else tf.convert_to_tensor(v.value))
                   for v in self.layer.variables]
        with keras.StatelessScope(state_mapping=mapping):
            return self.layer(inputs)

    def compute_output_shape(self, input_shape: Any) -> Any:
        """The wrapped layer's output shape.

        Args:
          input_shape: the input's shape.

        Returns:
          The wrapped layer's output shape.
        """
        return self.layer.compute_output_shape(input_shape)


def spectral_layers(model: keras.layers.Layer) -> list:
    """Every `SpectralNormalization` layer in `model` (itself included), nested ones too.

    Args:
      model: a Keras layer or model.

    Returns:
      The layers, in Keras's depth-first order.

    Raises:
      TypeError: `model` is not a Keras layer.
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(f"spectral_layers: model must be a Keras layer or model, got "
                        f"{type(model).__name__}")
    return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
            if isinstance(layer, SpectralNormalization)]


def advance_power_iteration(model: keras.layers.Layer) -> int:
    """Move every `SpectralNormalization` vector u in `model` one power-iteration step.

    Call it once per training step (in a `tf.function` or eagerly, in a strategy's replica
    context or outside one): ``u <- unit(W^T unit(W u))`` at the current weights. Every
    replica computes the same vector from the mirrored weights; `hogrod.train.assign`
    writes it.

    Args:
      model: a built Keras layer or model.

    Returns:
      The number of layers advanced (0: the model has none).

    Raises:
      TypeError: `model` is not a Keras layer.
    """
    layers = [layer for layer in spectral_layers(model) if layer.built]
    if layers:
        train.assign([layer.vector_u for layer in layers], [layer.next_u() for layer in layers])
    return len(layers)
