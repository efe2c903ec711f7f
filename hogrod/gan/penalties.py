"""Gradient penalties: the gradient of a gradient norm, as plain functions.

Each returns the unweighted expectation over the batch (trainers apply weights). The input
gradient is taken with an inner tape, so an outer tape (the critic's update) differentiates
through it: double backprop. The norm is over all non-batch axes (vectors or images) and
is exact and safe at a zero gradient: value 0, finite gradients. Half-precision gradients
are reduced in float32, so the penalties work under mixed precision (float64 stays
float64); they use no Python state, so they run inside `tf.function` and `tf.distribute`
replica functions.
"""

import tensorflow as tf

__all__ = ["input_gradient_norm", "gradient_penalty", "r1_penalty", "r2_penalty",
           "dragan_penalty"]


def _safe_norm(squared):
    """sqrt with value 0 and gradient 0 (not NaN) where the argument is 0."""
    positive = squared > 0
    return tf.where(positive, tf.sqrt(tf.where(positive, squared, 1.0)), 0.0)


def _one_score_per_example(shape, n):
    """Whether a critic output of `shape` can be one score for each of n examples: [n] or
    [n, 1] ([] for a single example; unknown sizes are given the benefit of the doubt)."""
    if shape.rank is None:
        return True
    if shape.rank == 0:
        return n == 1
    if shape.rank > 2 or (shape.rank == 2 and shape[-1] != 1):
        return False
    return shape[0] is None or n is None or shape[0] == n


def _squared_input_gradient(critic, x):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = critic(x)
        if not _one_score_per_example(out.shape, x.shape[0]):
            raise ValueError(f"the critic must return one scalar per example (shape "
                             f"[{x.shape[0]}] or [{x.shape[0]}, 1]), got shape {out.shape}")
        total = tf.reduce_sum(out)  # example i's score depends only on x_i
    grad = tape.gradient(total, x)
    if grad.dtype in (tf.float16, tf.bfloat16):  # mixed precision: reduce in float32
        grad = tf.cast(grad, tf.float32)
    axes = list(range(1, x.shape.rank))
    return tf.reduce_sum(tf.square(grad), axis=axes)


def input_gradient_norm(critic, x):
    """||d critic(x)_i / d x_i|| per example, shape [batch]."""
    return _safe_norm(_squared_input_gradient(critic, x))


def _check_pair(real, fake):
    if not real.shape.is_compatible_with(fake.shape):
        raise ValueError(f"real and fake must have the same shape, got {real.shape} and "
                         f"{fake.shape}")
    if not (real.shape.is_fully_defined() and fake.shape.is_fully_defined()):
        # unknown sizes (a tf.function traced with None): checked when the step runs
        tf.debugging.assert_equal(tf.shape(real), tf.shape(fake),
                                  message="real and fake must have the same shape")


def _per_example_shape(x):  # [batch, 1, ..., 1]: one value per example, broadcastable to x
    return tf.concat([tf.shape(x)[:1], tf.ones([x.shape.rank - 1], tf.int32)], 0)


def _per_example_uniform(x, seed=None):
    return tf.random.uniform(_per_example_shape(x), dtype=x.dtype, seed=seed)


def gradient_penalty(critic, real, fake, target=1.0, one_sided=False, interpolation=None):
    """WGAN-GP (Gulrajani et al. 2017): E[(||grad D(x_hat)|| - target)^2] at random
    interpolates x_hat = e real + (1 - e) fake, e ~ U[0, 1] per example. one_sided:
    E[max(0, ||grad|| - target)^2], the Lipschitz penalty (WGAN-LP, Petzka et al. 2018).

    interpolation: the weights e, shape [batch] (None: drawn here). Passing them with the
    data makes a step reproducible across replica counts under a tf.distribute strategy."""
    real, fake = tf.convert_to_tensor(real), tf.convert_to_tensor(fake)
    _check_pair(real, fake)
    if interpolation is None:
        e = _per_example_uniform(real)
    else:
        interpolation = tf.convert_to_tensor(interpolation)
        if interpolation.shape.rank != 1 or not interpolation.shape.is_compatible_with(
                real.shape[:1]):
            raise ValueError(f"interpolation must hold one weight per example, shape "
                             f"[{real.shape[0]}], got {interpolation.shape}")
        e = tf.reshape(tf.cast(interpolation, real.dtype), _per_example_shape(real))
    x_hat = e * real + (1.0 - e) * tf.cast(fake, real.dtype)
    gap = input_gradient_norm(critic, x_hat) - target
    if one_sided:
        gap = tf.nn.relu(gap)
    return tf.reduce_mean(tf.square(gap))


def r1_penalty(critic, real):
    """R1 (Mescheder et al. 2018): E[||grad D(x)||^2] on real data."""
    return tf.reduce_mean(_squared_input_gradient(critic, real))


def r2_penalty(critic, fake):
    """R2: E[||grad D(x)||^2] on generated data."""
    return tf.reduce_mean(_squared_input_gradient(critic, fake))


def dragan_penalty(critic, real, target=1.0, scale=0.5):
    """DRAGAN (Kodali et al. 2017): E[(||grad D(x_hat)|| - target)^2] at points between real
    data and a perturbation of it, x + scale * std(x) * U[0, 1] noise."""
    real = tf.convert_to_tensor(real)
    noise = tf.random.uniform(tf.shape(real), dtype=real.dtype)
    perturbed = real + scale * tf.math.reduce_std(real) * noise
    alpha = _per_example_uniform(real)
    x_hat = real + alpha * (perturbed - real)
    return tf.reduce_mean(tf.square(input_gradient_norm(critic, x_hat) - target))
