"""Generator penalties: regularizers of the generator, with their state explicit.

A generator penalty is a pair, like a `hogrod.optim` optimizer:

    penalty = path_length_penalty(decay=0.01, batch_shrink=2)    # GeneratorPenalty
    state = penalty.init(tf.float32)                              # a dict of tensors
    value, state = penalty.apply(generator, latent, state, noise=None)

- `generator`: the callable regularized, from its latent input `[batch, ...]` to samples
  `[batch, ...]` (StyleGAN2 regularizes the synthesis network on w: pass it and w);
- `value`: the unweighted scalar the generator minimizes (the trainer weights it);
- `state`: what the penalty carries from step to step (the path-length mean), passed in
  and returned, never stored: a trainer keeps it (`hogrod.train.state_variable`), a
  checkpoint saves it, and `lazy_term` keeps it on the steps it skips;
- `noise`: the step's random numbers, keyed by `GENERATOR_NOISE_KEYS` (each optional: drawn
  here when missing), so that tf.data can draw them and a tf.distribute strategy shards
  them with the data: "path_length": standard normal, the generated batch's shape (the
  full batch: the penalty takes its rows as it takes the latent's); "latent_perturbation":
  standard normal, the latent's shape.

The factories are gin-configurable; a trainer takes one by evaluated reference
(``generator_penalty = @path_length_penalty()``, ``path_length_penalty.decay = 0.01``), and
a bad hyperparameter is refused when the factory is called, naming it.
"""

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import gin
import tensorflow as tf

from hogrod import checks, train
from hogrod.gan.penalties import _safe_norm
from hogrod.types import DType, TensorLike

__all__ = ["GeneratorPenalty", "GENERATOR_NOISE_KEYS", "path_length_penalty",
           "latent_consistency_penalty", "path_lengths"]

GENERATOR_NOISE_KEYS = ("path_length", "latent_perturbation")

State = Dict[str, tf.Tensor]
# the generator regularized: latent codes [batch, ...] to samples [batch, ...]
Generator = Callable[[tf.Tensor], tf.Tensor]


class GeneratorPenalty(NamedTuple):
    """A generator penalty with explicit state (see the module docstring).

    Attributes:
      init: ``init(dtype) -> state``, the state before the first step (a dict of tensors of
        `dtype`; ``{}`` for a penalty without state).
      apply: ``apply(generator, latent, state, *, noise=None) -> (value, new_state)``.
    """
    init: Callable[[DType], State]
    apply: Callable[..., Tuple[tf.Tensor, State]]


def _noise(noise: Any, where: str) -> Dict[str, Any]:
    if noise is None:
        return {}
    if not hasattr(noise, "get") or not hasattr(noise, "keys"):
        raise TypeError(f"{where}: noise must be a dict of random numbers (keys "
                        f"{GENERATOR_NOISE_KEYS}) or None, got {type(noise).__name__}")
    unknown = sorted(set(noise.keys()) - set(GENERATOR_NOISE_KEYS))
    if unknown:  # a misspelt key would otherwise be drawn here instead, silently
        raise ValueError(f"{where}: unknown noise key(s) {unknown}; generator penalties read "
                         f"{GENERATOR_NOISE_KEYS}")
    return noise


def _given(noise, key, ref, where, rows=None):
    """noise[key] checked to have `ref`'s shape (after taking `rows`), in ref's dtype;
    standard normal drawn here when the batch brought none."""
    x = noise.get(key)
    if x is None:
        return tf.random.normal(tf.shape(ref), dtype=ref.dtype)
    x = checks.floating(x, f"noise['{key}']", where)
    if rows is not None:
        x = rows(x)
    if not x.shape.is_compatible_with(ref.shape):
        raise ValueError(f"{where}: noise['{key}'] must have the shape {ref.shape.as_list()} "
                         f"(after the batch shrink), got {x.shape.as_list()}")
    return tf.cast(x, ref.dtype)


def _pixels(samples: tf.Tensor) -> tf.Tensor:
    """StyleGAN2's pixel count: H * W of channels-last images [batch, H, W, C] (every axis
    but the batch and the last), the width d of vectors [batch, d]."""
    axes = tf.shape(samples)[1:] if samples.shape.rank == 2 else tf.shape(samples)[1:-1]
    return tf.reduce_prod(axes)


def _lengths(generator, w, projection, where):
    """Each example's ||J_w^T y|| with y = projection(samples) (made inside the tape, once
    the samples' shape is known: one generator call)."""
    if w.shape.rank is None or w.shape.rank < 2:
        raise ValueError(f"{where}: the latent codes must be a batch [batch, ...], got shape "
                         f"{w.shape}")
    with tf.GradientTape() as tape:
        tape.watch(w)
        samples = tf.convert_to_tensor(generator(w))
        if samples.shape.rank is None or samples.shape.rank < 2 \
                or not samples.shape[:1].is_compatible_with(w.shape[:1]):
            raise ValueError(f"{where}: the generator must map a batch of {w.shape[0]} latent "
                             f"codes to a batch of samples [batch, ...], got shape "
                             f"{samples.shape}")
        y = tf.stop_gradient(tf.cast(projection(samples), samples.dtype))
        total = tf.reduce_sum(samples * y)
    grad = tape.gradient(total, w, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    if grad.dtype in (tf.float16, tf.bfloat16):  # mixed precision: reduce in float32
        grad = tf.cast(grad, tf.float32)
    squared = tf.reduce_sum(tf.square(grad), axis=-1)
    if squared.shape.rank > 1:  # StyleGAN2's [batch, layers, w_dim]: mean over the layers
        squared = tf.reduce_mean(squared, axis=list(range(1, squared.shape.rank)))
    return _safe_norm(squared)


def path_lengths(generator: Generator, latent: TensorLike, y: TensorLike) -> tf.Tensor:
    """Each example's ``||J_w^T y||``: the norm of the latent gradient of ``<G(w)_i, y_i>``.

    For a latent of rank 3 (StyleGAN2's w broadcast to layers, [batch, layers, w_dim]) the
    squared norm is summed over the last axis and averaged over the layers, as StyleGAN2.
    Safe at a zero gradient (value 0, gradient 0: no NaN from the square root). The
    gradient is taken with an inner tape, so an outer tape differentiates through it.

    Args:
      generator: the callable regularized, latent codes to samples; example i's sample
        must depend on latent i only.
      latent: the latent codes w, [batch, ...].
      y: the projection, the samples' shape (StyleGAN2: N(0, I) / sqrt(pixels)).

    Returns:
      A tensor [batch] (float32 for half precision).

    Raises:
      ValueError: the generator does not keep the latent's batch size, or `y` has another
        shape than the samples.
    """
    where = "path_lengths"
    w = checks.floating(latent, "latent", where)
    y = checks.floating(y, "y", where)

    def projection(samples):
        if not y.shape.is_compatible_with(samples.shape):
            raise ValueError(f"{where}: y must have the samples' shape "
                             f"{samples.shape.as_list()}, got {y.shape.as_list()}")
        return y
    return _lengths(generator, w, projection, where)


@gin.configurable
def path_length_penalty(decay: float = 0.01, batch_shrink: int = 2) -> GeneratorPenalty:
    """StyleGAN2's path-length regularizer, ``E[(||J_w^T y|| - a)^2]``, as a generator penalty.

    ``y ~ N(0, I) / sqrt(pixels)`` (the samples' shape; pixels H * W of channels-last
    images, the width of vectors) and ``a`` the running mean of the lengths: each call
    moves it by ``a <- a + decay (mean(lengths) - a)`` and the penalty uses the moved ``a``,
    whose dependence on this batch's lengths is differentiated (as both of NVIDIA's
    implementations). The state is ``{"mean": a}``, 0 at first.

    Where it differs from StyleGAN2's code:

    - the batch shrink takes every `batch_shrink`-th example (``latent[::batch_shrink]``),
      not the first ``batch // batch_shrink``: under a tf.distribute strategy each replica
      then takes the rows one device would (when its shard's size is a multiple of
      `batch_shrink`);
    - the lengths' mean that moves ``a`` is the whole batch's (averaged over the replicas in
      sync), so every replica keeps the same state and the step equals one device's; NVIDIA's
      DDP code keeps a mean per GPU;
    - the penalty is the mean over the batch, unweighted: StyleGAN2's `pl_weight` (2) is the
      trainer's weight.

    Args:
      decay: the running mean's rate, in (0, 1) (StyleGAN2: 0.01).
      batch_shrink: regularize every `batch_shrink`-th example, an integer >= 1 (StyleGAN2:
        2).

    Returns:
      `GeneratorPenalty(init, apply)`: ``apply(generator, latent, state, *, noise=None) ->
      (penalty, {"mean": a})``; `noise["path_length"]`, when given, is the unscaled
      N(0, I) of the full generated batch's shape.

    Raises:
      ArgumentError: `decay` is not in (0, 1) or `batch_shrink` not an integer >= 1, naming
        the binding.
    """
    where = "path_length_penalty"
    decay = checks.number(decay, "decay", where, 0.0, 1.0, low_open=True, high_open=True)
    shrink = checks.integer(batch_shrink, "batch_shrink", where, least=1)

    def init(dtype: DType = tf.float32) -> State:
        return {"mean": tf.zeros([], dtype)}

    def apply(generator: Generator, latent: TensorLike, state: State, *,
              noise: Optional[Dict[str, TensorLike]] = None) -> Tuple[tf.Tensor, State]:
        noise = _noise(noise, where)
        if not isinstance(state, dict) or set(state) != {"mean"}:
            raise ValueError(f"{where}: state must be the dict {{'mean': a}} from init or the "
                             f"last call, got {state!r}")
        w = checks.floating(latent, "latent", where)[::shrink]

        def projection(samples):  # y taken (or drawn) at the samples' shape, scaled
            y = _given(noise, "path_length", samples, where, rows=lambda x: x[::shrink])
            return y / tf.sqrt(tf.cast(_pixels(samples), samples.dtype))

        lengths = _lengths(generator, w, projection, where)
        batch_mean = train.replica_mean(tf.reduce_mean(lengths))
        a = tf.cast(state["mean"], lengths.dtype)
        a = a + tf.constant(decay, lengths.dtype) * (batch_mean - a)
        penalty = tf.reduce_mean(tf.square(lengths - a))
        return penalty, {"mean": tf.cast(tf.stop_gradient(a), state["mean"].dtype)}

    return GeneratorPenalty(init, apply)




@gin.configurable
def latent_consistency_penalty(scale: float = 0.03) -> GeneratorPenalty:
    """zCR's generator term (Zhao et al. 2021): ``-E ||G(z) - G(z + scale * delta)||^2``.

    ``delta ~ N(0, I)`` of the latent's shape. The value is negative: minimizing it makes
    the generator's samples differ for nearby codes (ICR's ``-lambda_gen ||G(z) -
    G(T(z))||^2``, the paper's lambda_gen 0.5 the trainer's weight), against mode collapse.
    The squared norm is per example over all sample axes, then the mean over the batch
    (`torch.nn.MSELoss`, used by some reimplementations, also divides by the sample's size).
    No state: `init` gives ``{}``.

    Args:
      scale: the latent perturbation's standard deviation, > 0 (the paper's sigma_noise
        0.03).

    Returns:
      `GeneratorPenalty(init, apply)`: ``apply(generator, latent, state, *, noise=None) ->
      (value, state)``; `noise["latent_perturbation"]`, when given, is the unscaled delta.

    Raises:
      ArgumentError: `scale` is not a positive number, naming the binding.
    """
    where = "latent_consistency_penalty"
    scale = checks.positive(scale, "scale", where)

    def init(dtype: DType = tf.float32) -> State:
        del dtype  # no state
        return {}

    def apply(generator: Generator, latent: TensorLike, state: State, *,
              noise: Optional[Dict[str, TensorLike]] = None) -> Tuple[tf.Tensor, State]:
        noise = _noise(noise, where)
        z = checks.floating(latent, "latent", where)
        delta = _given(noise, "latent_perturbation", z, where)
        samples = tf.convert_to_tensor(generator(z))
        moved = tf.convert_to_tensor(generator(z + tf.constant(scale, z.dtype) * delta))
        if samples.dtype in (tf.float16, tf.bfloat16):  # mixed precision: reduce in float32
            samples, moved = tf.cast(samples, tf.float32), tf.cast(moved, tf.float32)
        axes = list(range(1, samples.shape.rank))
        return -tf.reduce_mean(tf.reduce_sum(tf.square(samples - moved), axis=axes)), state

    return GeneratorPenalty(init, apply)
