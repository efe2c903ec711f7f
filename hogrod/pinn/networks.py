"""Input embeddings and architectures for physics-informed networks, as Keras 3 layers.

- `FourierFeatures`: random Fourier features (Tancik et al. 2020),
  gamma(x) = [cos(2 pi x B), sin(2 pi x B)], B [dim, m] fixed, B_ij ~ N(0, sigma^2) (seeded).
- `PeriodicEmbedding`: exact periodic embedding of chosen coordinates, x_i ->
  [cos(2 pi k x_i / P_i), sin(2 pi k x_i / P_i)], k = 1..harmonics; the other coordinates
  pass through. Any network after it is P_i-periodic in x_i by construction, so a periodic
  boundary condition needs no loss term.
- `FactorizedDense`: random weight factorization (Wang et al. 2022): the kernel is
  W = V diag(exp(s)) in Keras's [inputs, units] layout (diag(exp(s)) V in the paper's
  [units, inputs]); s ~ N(mu, sigma) and V = W0 / exp(s) at initialization, W0 from the
  kernel initializer, so the initial function is the plain layer's.
- `mlp_network` and `modified_mlp` (Wang, Teng, Perdikaris 2021): gin-configurable factories
  `network(input_dim, width, depth, dtype=...)` (what `pinn_experiment.network` calls), each
  with an optional `embedding` (`@fourier_features`, `@periodic_embedding`: gin factories
  of the layers above; or a layer) and
  `factorization` ((mu, sigma): every Dense a `FactorizedDense`).

Every layer computes at its own dtype: a float64 network stays float64 (its constants are
drawn in float64 and cast once; Python-number hyperparameters multiply tensors directly).
"""

import math
from typing import Callable, Optional, Tuple, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.types import DType

__all__ = ["FourierFeatures", "PeriodicEmbedding", "FactorizedDense", "fourier_features",
           "periodic_embedding", "mlp_network", "modified_mlp", "EmbeddingChain",
           "embedding_chain"]


class OutputScale(keras.layers.Layer):
    """x -> scale * x, the Python float applied at x's dtype (keras.layers.Rescaling goes
    through float32: not exact in float64)."""

    def __init__(self, scale, **kwargs):
        super().__init__(**kwargs)
        self.scale = checks.positive(scale, "scale", "OutputScale")

    def call(self, x):
        return x * self.scale

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


class FourierFeatures(keras.layers.Layer):
    """gamma(x) = [cos(2 pi x B), sin(2 pi x B)]: [batch, dim] -> [batch, 2 num_features].

    B [dim, num_features] is fixed (a non-trainable weight, so checkpoints keep it), drawn
    from N(0, sigma^2) in float64 by numpy's generator with `seed`, then cast once to the
    layer's dtype."""

    def __init__(self, num_features=64, sigma=1.0, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.num_features = checks.integer(num_features, "num_features", "FourierFeatures", least=1)
        self.sigma = checks.positive(sigma, "sigma", "FourierFeatures")
        self.seed = checks.seed(seed, "seed", "FourierFeatures")

    def frequencies(self, dim):
        """B as a float64 numpy array [dim, num_features]."""
        rng = np.random.default_rng(self.seed)
        return self.sigma * rng.standard_normal((dim, self.num_features))

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim is None:
            raise ValueError("FourierFeatures needs a known input dimension")
        self.b = self.add_weight(shape=(dim, self.num_features), initializer="zeros",
                                 trainable=False, name="frequencies")
        self.b.assign(self.frequencies(dim).astype(self.b.dtype))

    def call(self, x):
        z = (2.0 * math.pi) * tf.matmul(x, self.b)
        return tf.concat([tf.cos(z), tf.sin(z)], axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (2 * self.num_features,)

    def get_config(self):
        return dict(super().get_config(), num_features=self.num_features, sigma=self.sigma,
                    seed=self.seed)


class PeriodicEmbedding(keras.layers.Layer):
    """Coordinates not in `periods` first (in order), then for each coordinate i in
    `periods` (in the dict's order) cos(2 pi k x_i / P_i), sin(2 pi k x_i / P_i) for
    k = 1..harmonics.

    periods: {coordinate index: period P > 0}, e.g. {0: 2.0} for x in [-1, 1] periodic."""

    def __init__(self, periods, harmonics=1, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(periods, dict) or not periods:
            raise ValueError("PeriodicEmbedding.periods must be a non-empty dict {coordinate "
                             f"index: period}}, got {periods!r}")
        for i, p in periods.items():
            checks.integer(i, f"periods: coordinate {i!r}", "PeriodicEmbedding")
            checks.positive(p, f"periods[{i}]", "PeriodicEmbedding")
        self.periods = {int(i): float(p) for i, p in periods.items()}
        self.harmonics = checks.integer(harmonics, "harmonics", "PeriodicEmbedding", least=1)

    def build(self, input_shape):
        dim = input_shape[-1]
        bad = [i for i in self.periods if dim is None or i >= dim]
        if bad:
            raise ValueError(f"PeriodicEmbedding.periods names coordinate {bad[0]} but the "
                             f"input has dimension {dim}")
        self.dim = dim

    def call(self, x):
        parts = [x[:, i:i + 1] for i in range(self.dim) if i not in self.periods]
        for i, period in self.periods.items():
            for k in range(1, self.harmonics + 1):
                z = x[:, i:i + 1] * (2.0 * math.pi * k / period)
                parts += [tf.cos(z), tf.sin(z)]
        return tf.concat(parts, axis=-1)

    def compute_output_shape(self, input_shape):
        dim = input_shape[-1]
        return tuple(input_shape[:-1]) + (dim - len(self.periods)
                                          + 2 * self.harmonics * len(self.periods),)

    def get_config(self):
        return dict(super().get_config(), periods=self.periods, harmonics=self.harmonics)


class FactorizedDense(keras.layers.Layer):
    """activation(x V diag(exp(s)) + b): a Dense layer with random weight factorization.

    mu, sigma: s ~ N(mu, sigma) per unit at initialization (Wang et al.: mu = 1, sigma = 0.1
    or 0.5); V = W0 / exp(s) with W0 from `kernel_initializer`."""

    def __init__(self, units, activation=None, mu=1.0, sigma=0.1,
                 kernel_initializer="glorot_normal", **kwargs):
        super().__init__(**kwargs)
        self.units = checks.integer(units, "units", "FactorizedDense", least=1)
        self.activation = keras.activations.get(activation)
        self.mu = checks.number(mu, "mu", "FactorizedDense")
        self.sigma = checks.positive(sigma, "sigma", "FactorizedDense")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.v = self.add_weight(shape=(dim, self.units), initializer=self.kernel_initializer,
                                 name="v")
        self.s = self.add_weight(shape=(self.units,), name="s", initializer=(
            keras.initializers.RandomNormal(mean=self.mu, stddev=self.sigma)))
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias")
        self.v.assign(self.v / tf.exp(self.s))  # the initial kernel is W0

    @property
    def kernel(self):
        """W = V diag(exp(s)), [inputs, units]."""
        return self.v * tf.exp(self.s)

    def call(self, x):
        return self.activation(tf.matmul(x, self.kernel) + self.bias)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return dict(super().get_config(), units=self.units,
                    activation=keras.activations.serialize(self.activation), mu=self.mu,
                    sigma=self.sigma,
                    kernel_initializer=keras.initializers.serialize(self.kernel_initializer))


@gin.configurable
def fourier_features(num_features=64, sigma=1.0, seed=0, dtype=None):
    """A `FourierFeatures` layer: the gin factory for a network's `embedding`
    (`modified_mlp.embedding = @fourier_features`)."""
    return FourierFeatures(num_features, sigma, seed, dtype=dtype)


@gin.configurable
def periodic_embedding(periods, harmonics=1, dtype=None):
    """A `PeriodicEmbedding` layer: the gin factory for a network's `embedding`
    (`mlp_network.embedding = @periodic_embedding`, `periodic_embedding.periods = {0: 2.0}`)."""
    if not isinstance(periods, dict) or not periods:
        raise ValueError("periodic_embedding.periods must be a non-empty dict {coordinate "
                         f"index: period}} (e.g. {{0: 2.0}}), got {periods!r}")
    return PeriodicEmbedding(periods, harmonics, dtype=dtype)


class EmbeddingChain(keras.layers.Layer):
    """Embeddings applied in order (jaxpi: a periodic embedding of x, then Fourier
    features of its output and t)."""

    def __init__(self, parts, **kwargs):
        super().__init__(**kwargs)
        if not parts or not all(isinstance(p, keras.layers.Layer) for p in parts):
            raise TypeError(f"EmbeddingChain needs a non-empty list of Keras layers, got "
                            f"{parts!r}")
        self.parts = list(parts)

    def build(self, input_shape):
        # each part built eagerly in order: Keras's default build runs `call` in a stateless
        # scope, which drops FourierFeatures' assignment of its frequencies (all zero)
        for part in self.parts:
            part.build(input_shape)
            input_shape = part.compute_output_shape(input_shape)

    def call(self, x):
        for part in self.parts:
            x = part(x)
        return x

    def compute_output_shape(self, input_shape):
        for part in self.parts:
            input_shape = part.compute_output_shape(input_shape)
        return input_shape


@gin.configurable
def embedding_chain(embeddings, dtype=None):
    """An `EmbeddingChain` of layer factories applied in order, the gin factory for a
    network's `embedding`: `modified_mlp.embedding = @embedding_chain`,
    `embedding_chain.embeddings = [@periodic_embedding, @fourier_features]`."""
    if not isinstance(embeddings, (list, tuple)) or not embeddings:
        raise ValueError(f"embedding_chain.embeddings must be a non-empty list of embedding "
                         f"factories (e.g. [@periodic_embedding, @fourier_features]), got "
                         f"{embeddings!r}")
    return EmbeddingChain([_embedding(e, dtype) for e in embeddings], dtype=dtype)


def _dense(units, activation, factorization, dtype, name=None):
    if factorization is None:
        return keras.layers.Dense(units, activation=activation, dtype=dtype, name=name,
                                  kernel_initializer="glorot_normal")
    if not (isinstance(factorization, (tuple, list)) and len(factorization) == 2):
        raise ValueError("factorization must be None or (mu, sigma) for the random weight "
                         f"factorization's s ~ N(mu, sigma), got {factorization!r}")
    mu, sigma = factorization
    return FactorizedDense(units, activation, mu=mu, sigma=sigma, dtype=dtype, name=name)


def _embedding(embedding, dtype):
    """A layer from `embedding`: a layer (at the network's dtype) or a factory called with
    dtype= (a gin reference such as @fourier_features)."""
    if embedding is None:
        return None
    if isinstance(embedding, keras.layers.Layer):
        layer = embedding
    elif callable(embedding):
        layer = embedding(dtype=dtype)
    else:
        raise TypeError(f"embedding must be a Keras layer or a layer factory (a gin reference "
                        f"such as @fourier_features), got {type(embedding).__name__}")
    want = keras.backend.standardize_dtype(dtype or keras.config.floatx())
    if layer.compute_dtype != want:
        raise ValueError(f"the embedding layer computes in {layer.compute_dtype} but the "
                         f"network in {want}: build it with dtype={want!r}")
    return layer


def _check(input_dim, width, depth, what):
    for arg, value in (("input_dim", input_dim), ("width", width), ("depth", depth)):
        checks.integer(value, arg, what, least=1)


def _embedded_input(input_dim, embedding, dtype):
    """(the keras.Input, the input after the embedding if there is one)."""
    x = keras.Input((input_dim,), dtype=dtype)
    emb = _embedding(embedding, dtype)
    return x, (x if emb is None else emb(x))


@gin.configurable
def mlp_network(input_dim: int, width: int = 20, depth: int = 8, outputs: int = 1,
                activation: Union[str, Callable] = "tanh",
                embedding: Optional[Union[keras.layers.Layer,
                                          Callable[..., keras.layers.Layer]]] = None,
                factorization: Optional[Tuple[float, float]] = None, dtype: Optional[DType] = None,
                name: Optional[str] = None,
                output_scale: Optional[float] = None) -> keras.Model:
    """A multilayer perceptron: an optional embedding, hidden Dense layers, a linear output.

    `depth` hidden Dense layers of `width` with `activation` (Glorot-normal kernels), then a
    linear output Dense of `outputs`; every layer computes at `dtype`.

    Args:
      input_dim: the input dimension (space, then time), >= 1.
      width: the hidden layers' width, >= 1.
      depth: the number of hidden layers, >= 1.
      outputs: the output size m, >= 1.
      activation: the hidden layers' activation, a Keras name or callable.
      embedding: None, a Keras layer at the network's dtype, or a factory called with
        `dtype=` (`@fourier_features`, `@periodic_embedding`, `@embedding_chain`) applied
        to the input first.
      factorization: None, or (mu, sigma): every Dense a `FactorizedDense` with
        s ~ N(mu, sigma).
      dtype: the network's dtype; None for Keras's floatx.
      name: the model's name; None for Keras's default.
      output_scale: None, or a fixed factor > 0 on the output (the solution's typical
        size), applied at the network's dtype: a solution far from O(1) (with a large
        constant part) is otherwise fitted by saturating the tanh units, which then pass no
        gradient to learn its variation.
    Returns:
      A keras.Model [batch, input_dim] -> [batch, outputs].
    Raises:
      ArgumentError: a bad `input_dim`, `width`, `depth` or `outputs` or `output_scale`.
      ValueError: a malformed `factorization`, or an embedding of another dtype.
      TypeError: an embedding that is neither a layer nor a factory.
    """
    _check(input_dim, width, depth, "mlp_network")
    x, h = _embedded_input(input_dim, embedding, dtype)
    for _ in range(depth):
        h = _dense(width, activation, factorization, dtype)(h)
    out = _dense(checks.integer(outputs, "outputs", "mlp_network", least=1), None, factorization,
                 dtype)(h)
    if output_scale is not None:
        out = OutputScale(checks.positive(output_scale, "mlp_network.output_scale", "mlp_network"),
                          dtype=dtype)(out)
    return keras.Model(x, out, name=name)


@gin.configurable
def modified_mlp(input_dim: int, width: int = 20, depth: int = 8, outputs: int = 1,
                 activation: Union[str, Callable] = "tanh",
                 embedding: Optional[Union[keras.layers.Layer,
                                           Callable[..., keras.layers.Layer]]] = None,
                 factorization: Optional[Tuple[float, float]] = None, dtype: Optional[DType] = None,
                 name: Optional[str] = None) -> keras.Model:
    """The modified MLP of Wang, Teng and Perdikaris (2021): gated mixing of two encoders.

    With H_0 the (embedded) input::

        U = act(H_0 W_u + b_u),  V = act(H_0 W_v + b_v),
        Z_k = act(H_{k-1} W_k + b_k),  H_k = (1 - Z_k) * U + Z_k * V,  k = 1..depth,
        u = H_depth W + b.

    Layers are named "encoder_u", "encoder_v", "gate_1".."gate_depth" and "head".

    Args:
      input_dim: the input dimension (space, then time), >= 1.
      width: the hidden layers' width, >= 1.
      depth: the number of hidden layers, >= 1.
      outputs: the output size m, >= 1.
      activation: the hidden layers' activation, a Keras name or callable.
      embedding: None, a Keras layer at the network's dtype, or a factory called with
        `dtype=` (`@fourier_features`, `@periodic_embedding`, `@embedding_chain`) applied
        to the input first.
      factorization: None, or (mu, sigma): every Dense a `FactorizedDense` with
        s ~ N(mu, sigma).
      dtype: the network's dtype; None for Keras's floatx.
      name: the model's name; None for Keras's default.
    Returns:
      A keras.Model [batch, input_dim] -> [batch, outputs].
    Raises:
      ArgumentError: a bad `input_dim`, `width`, `depth` or `outputs`.
      ValueError: a malformed `factorization`, or an embedding of another dtype.
      TypeError: an embedding that is neither a layer nor a factory.
    """
    _check(input_dim, width, depth, "modified_mlp")
    x, h = _embedded_input(input_dim, embedding, dtype)
    u = _dense(width, activation, factorization, dtype, "encoder_u")(h)
    v = _dense(width, activation, factorization, dtype, "encoder_v")(h)
    for k in range(1, depth + 1):
        z = _dense(width, activation, factorization, dtype, f"gate_{k}")(h)
        h = keras.layers.Lambda(lambda a: (1.0 - a[0]) * a[1] + a[0] * a[2], dtype=dtype,
                                name=f"mix_{k}")([z, u, v])
    out = _dense(checks.integer(outputs, "outputs", "modified_mlp", least=1), None, factorization,
                 dtype, "head")(h)
    return keras.Model(x, out, name=name)
