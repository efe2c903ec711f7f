"""Backbones and losses for experiments: the networks of hogrod's papers and their losses.

The networks are those of the papers hogrod reproduces; the losses are what they train with.

- `dense_net(widths, activation)`: a Keras MLP; `relu_mlp` (the toy-GAN generator and
  critic) and `mlp` (Finn et al.'s sinusoid network) are dense nets with fixed choices.
- `conv4`: MAML's Omniglot network (4 x conv, BatchNorm, ReLU, then linear).
- `conv4_embedding`: Prototypical Networks' embedding network (4 x conv, BatchNorm, ReLU,
  max-pool; no classification layer), the backbone of the few-shot heads.
- `classifier`: a convolutional image classifier with a float32 head named "head".
- `deep_autoencoder`: Hinton and Salakhutdinov's deep autoencoder (784-1000-500-250-30 and
  its mirror, tanh, a linear code layer, logits out), the K-FAC and Hessian-free papers'
  benchmark.
- Losses in Keras's form `loss(y_true, y_pred) -> scalar`: `mse`, `cross_entropy` (integer
  labels, logits), `binary_cross_entropy` (0/1 labels, one logit per example).

`mlp`, `conv4`, `conv4_embedding` and `deep_autoencoder` are gin configurables (`maml_experiment.model = @mlp`,
`conv4.filters = 32`); the rest take arguments only.
"""

from typing import Callable, Optional, Sequence

import gin
import keras
import tensorflow as tf

from hogrod import checks
from hogrod.types import DType, TensorLike

__all__ = ["dense_net", "relu_mlp", "mlp", "conv4", "conv4_embedding", "deep_autoencoder",
           "classifier", "mse", "cross_entropy", "binary_cross_entropy"]


def _widths(widths, arg, where):
    try:
        widths = tuple(widths)
    except TypeError:
        widths = None
    if widths is None or len(widths) < 2:
        raise checks.ArgumentError(f"{where}: {arg} must be (inputs, hidden..., outputs), at "
                                   f"least two positive integers, got {widths!r}")
    return tuple(checks.integer(w, f"{arg}[{i}]", where, least=1) for i, w in enumerate(widths))


def dense_net(widths: Sequence[int], activation: str | Callable = "tanh",
              dtype: Optional[DType] = None, name: Optional[str] = None,
              head_name: Optional[str] = None,
              kernel_initializer: str | keras.initializers.Initializer = "glorot_uniform"
              ) -> keras.Sequential:
    """A Keras MLP: `activation` after every hidden layer, a linear output layer.

    Args:
      widths: (inputs, hidden widths..., outputs), positive integers, at least two.
      activation: the hidden layers' activation (a Keras activation name or callable).
      dtype: the inputs' and every layer's dtype (None: Keras's default policy).
      name: the model's name (None: Keras's).
      head_name: the output layer's name (None: Keras's).
      kernel_initializer: every layer's kernel initializer (a Keras initializer or its
        name); biases start at zero.

    Returns:
      A built `keras.Sequential` of input [batch, widths[0]] and output
      [batch, widths[-1]].

    Raises:
      ArgumentError: `widths` is not at least two positive integers.
    """
    widths = _widths(widths, "widths", "dense_net")
    layers = [keras.Input((widths[0],), dtype=dtype)]
    layers += [keras.layers.Dense(w, activation=activation, kernel_initializer=kernel_initializer,
                                  dtype=dtype) for w in widths[1:-1]]
    layers += [keras.layers.Dense(widths[-1], kernel_initializer=kernel_initializer, dtype=dtype,
                                  name=head_name)]
    return keras.Sequential(layers, name=name)


def relu_mlp(inputs: int, outputs: int, width: int, depth: int,
             name: Optional[str] = None) -> keras.Sequential:
    """The toy-GAN generator or critic: `depth` ReLU layers of `width` (WGAN-GP's 2-512-512-512).

    Args:
      inputs: the input dimension.
      outputs: the output dimension.
      width: each hidden layer's width.
      depth: the number of hidden layers (0: a linear map).
      name: the model's name (None: Keras's).

    Returns:
      A built `keras.Sequential` (see `dense_net`) of input [batch, inputs] and output
      [batch, outputs], at Keras's default dtype policy.

    Raises:
      ArgumentError: a size is not a positive integer (`depth` may be 0).
    """
    depth = checks.integer(depth, "depth", "relu_mlp", least=0)
    sizes = [checks.integer(v, arg, "relu_mlp", least=1)
             for v, arg in ((inputs, "inputs"), (width, "width"), (outputs, "outputs"))]
    return dense_net((sizes[0],) + (sizes[1],) * depth + (sizes[2],), "relu", name=name)


@gin.configurable
def mlp(input_dim: int = 1, widths: Sequence[int] = (40, 40), outputs: int = 1,
        activation: str | Callable = "relu", init_stddev: Optional[float] = None
        ) -> keras.Sequential:
    """The sinusoid network of Finn et al.: 1-40-40-1, ReLU.

    Args:
      input_dim: the input dimension.
      widths: the hidden widths.
      outputs: the output dimension.
      activation: the hidden layers' activation (a Keras activation name or callable).
      init_stddev: kernels from a truncated normal with this deviation and zero biases, as
        Finn et al.'s code (0.01); None: Keras's Glorot uniform.

    Returns:
      A built `keras.Sequential` (see `dense_net`) of input [batch, input_dim] and output
      [batch, outputs].

    Raises:
      ArgumentError: a width is not a positive integer, or `init_stddev` not positive.
    """
    if init_stddev is None:
        init = "glorot_uniform"
    else:
        init = keras.initializers.TruncatedNormal(
            stddev=checks.positive(init_stddev, "mlp.init_stddev", "mlp"))
    try:
        hidden = tuple(widths)
    except TypeError:
        raise checks.ArgumentError(f"mlp: mlp.widths must be a sequence of hidden widths, got "
                                   f"{widths!r}") from None
    return dense_net(_widths((input_dim, *hidden, outputs), "(input_dim, *widths, outputs)",
                             "mlp"), activation, kernel_initializer=init)


@gin.configurable
def conv4(image_size: int = 28, channels: int = 1, filters: int = 64,
          n_way: int = 5) -> keras.Sequential:
    """MAML's Omniglot network: 4 x (3x3 conv stride 2, BatchNorm, ReLU), then linear.

    Args:
      image_size: the input images' height and width.
      channels: the input images' channels.
      filters: each convolution's filters.
      n_way: the number of classes (the output width).

    Returns:
      A built `keras.Sequential` of input [batch, image_size, image_size, channels] and
      output logits [batch, n_way].

    Raises:
      ArgumentError: a size is not a positive integer.
    """
    image_size, channels, filters, n_way = (
        checks.integer(v, f"conv4.{arg}", "conv4", least=1)
        for v, arg in ((image_size, "image_size"), (channels, "channels"),
                       (filters, "filters"), (n_way, "n_way")))
    layers = [keras.Input((image_size, image_size, channels))]
    for _ in range(4):
        layers += [keras.layers.Conv2D(filters, 3, strides=2, padding="same"),
                   keras.layers.BatchNormalization(), keras.layers.ReLU()]
    layers += [keras.layers.Flatten(), keras.layers.Dense(n_way)]
    return keras.Sequential(layers)


@gin.configurable
def conv4_embedding(image_size: int = 28, channels: int = 1,
                    filters: int = 64) -> keras.Sequential:
    """Prototypical Networks' embedding network (Snell et al. 2017), no classification layer.

    4 x (3x3 convolution of `filters` filters, 'same' padding, BatchNorm, ReLU, 2x2 max-pool
    with 'valid' padding: the side halves, rounded down), then flattened. On 28x28 Omniglot
    the side goes 28, 14, 7, 3, 1: a 64-d embedding with 64 filters. The few-shot heads
    (`hogrod.meta.protonet`, `r2d2`, `metaoptnet`) take it; MAML's classifier is `conv4`.

    Args:
      image_size: the input images' height and width (>= 16, so four poolings leave a side
        of at least 1).
      channels: the input images' channels.
      filters: each convolution's filters.

    Returns:
      A built `keras.Sequential` of input [batch, image_size, image_size, channels] and
      output embeddings [batch, filters * side**2], side = image_size halved (rounded
      down) four times.

    Raises:
      ArgumentError: a size is not a positive integer, or `image_size` is below 16.
    """
    where = "conv4_embedding"
    image_size = checks.integer(image_size, "conv4_embedding.image_size", where, least=16)
    channels, filters = (checks.integer(v, f"conv4_embedding.{arg}", where, least=1)
                         for v, arg in ((channels, "channels"), (filters, "filters")))
    layers = [keras.Input((image_size, image_size, channels))]
    for _ in range(4):
        layers += [keras.layers.Conv2D(filters, 3, padding="same"),
                   keras.layers.BatchNormalization(), keras.layers.ReLU(),
                   keras.layers.MaxPooling2D(2)]
    layers += [keras.layers.Flatten()]
    return keras.Sequential(layers)


@gin.configurable
def deep_autoencoder(inputs: int = 784, widths: Sequence[int] = (1000, 500, 250, 30),
                     activation: str | Callable = "tanh") -> keras.Sequential:
    """Hinton and Salakhutdinov's (2006) deep autoencoder, as the K-FAC and HF papers train it.

    The encoder `inputs -> widths[0] -> ... -> widths[-1]` (the code layer, linear), then its
    mirror `widths[-2] -> ... -> widths[0] -> inputs`; `activation` after every other layer;
    the output is logits (train it with a sigmoid cross-entropy on pixels in [0, 1]).

    Args:
      inputs: the flattened input's size (28x28 images: 784).
      widths: the encoder's widths, the code's last (the papers': 1000, 500, 250, 30).
      activation: the hidden layers' activation (a Keras activation name or callable).

    Returns:
      A built `keras.Sequential` of input [batch, inputs] and output logits [batch, inputs]
      at Keras's default dtype policy, every kernel Glorot-uniform, every bias zero.

    Raises:
      ArgumentError: a size is not a positive integer, or `widths` is empty.
    """
    sizes = _widths((inputs, *widths), "(inputs, *widths)", "deep_autoencoder")
    encoder, code = sizes[1:-1], sizes[-1]
    layers = [keras.Input((sizes[0],))]
    layers += [keras.layers.Dense(w, activation=activation) for w in encoder]
    layers += [keras.layers.Dense(code)]  # the code layer is linear
    layers += [keras.layers.Dense(w, activation=activation) for w in reversed(encoder)]
    layers += [keras.layers.Dense(sizes[0])]
    return keras.Sequential(layers, name="deep_autoencoder")


def classifier(input_shape: Sequence[int], num_classes: int, conv_filters: Sequence[int],
               hidden: Sequence[int]) -> keras.Sequential:
    """An image classifier: a convolutional backbone and a linear head named "head".

    The backbone is stride-2 3x3 ReLU convolutions (no padding), a flatten, then ReLU dense
    layers; the head is kept in float32 under a mixed-precision policy.

    Args:
      input_shape: one example's shape (height, width, channels), or (features,) without
        convolutions.
      num_classes: the head's width.
      conv_filters: each convolution's filters, in order (empty: none).
      hidden: each dense layer's width, in order (empty: none).

    Returns:
      A built `keras.Sequential` giving float32 logits [batch, num_classes].

    Raises:
      ArgumentError: a width or count is not a positive integer.
    """
    num_classes = checks.integer(num_classes, "num_classes", "classifier", least=1)
    conv_filters = [checks.integer(f, f"conv_filters[{i}]", "classifier", least=1)
                    for i, f in enumerate(conv_filters)]
    hidden = [checks.integer(h, f"hidden[{i}]", "classifier", least=1)
              for i, h in enumerate(hidden)]
    backbone = [keras.Input(tuple(input_shape))]
    backbone += [keras.layers.Conv2D(f, 3, strides=2, activation="relu") for f in conv_filters]
    backbone += [keras.layers.Flatten()]
    backbone += [keras.layers.Dense(h, activation="relu") for h in hidden]
    return keras.Sequential(backbone + [keras.layers.Dense(num_classes, name="head",
                                                           dtype="float32")])


def mse(y_true: TensorLike, y_pred: tf.Tensor) -> tf.Tensor:
    """Mean squared error over every element.

    Args:
      y_true: the targets.
      y_pred: the predictions, y_true's shape (or one it broadcasts with).

    Returns:
      A scalar, y_pred's dtype.
    """
    return tf.reduce_mean((y_true - y_pred) ** 2)


def cross_entropy(y_true: TensorLike, y_pred: tf.Tensor) -> tf.Tensor:
    """Mean softmax cross-entropy of integer labels under logits.

    Args:
      y_true: integer labels [batch].
      y_pred: logits [batch, classes].

    Returns:
      A scalar, the logits' dtype.
    """
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(y_true, tf.int32), logits=y_pred))


def binary_cross_entropy(y_true: TensorLike, y_pred: tf.Tensor) -> tf.Tensor:
    """Mean logistic loss of 0/1 labels under one logit per example.

    The logistic-regression form: its Hessian has a closed form.

    Args:
      y_true: 0/1 labels [batch].
      y_pred: logits [batch, 1].

    Returns:
      A scalar, the logits' dtype.

    Raises:
      ValueError: the logits are not [batch, 1].
    """
    if y_pred.shape.rank != 2 or y_pred.shape[-1] != 1:
        raise ValueError(f"binary_cross_entropy wants logits y_pred of shape [batch, 1], got "
                         f"{y_pred.shape}")
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        tf.cast(y_true, y_pred.dtype), y_pred[:, 0]))
