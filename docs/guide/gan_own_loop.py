"""Gradient penalties in your own GAN training loop, written by hand with GradientTape.

    python docs/guide/gan_own_loop.py            # 3,000 generator steps
    python docs/guide/gan_own_loop.py --quick    # 60 generator steps (HOGROD_GUIDE_QUICK=1)

The penalties are plain functions of (critic, samples) returning a scalar; call one inside
the tape of your critic update and the outer tape differentiates through its inner input
gradient (double backprop). First a closed-form check on a linear critic, then a WGAN-GP
loop that moves a generator onto a 2-D Gaussian, with R1 as the alternative penalty. Then
the Dirac-GAN's exact check of R1, and the newer regularizers on your own networks: the
relativistic loss with R1 + R2 and bCR on a spectrally normalized critic, and a lazy
path-length penalty (its running mean kept by you) on the generator.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
from hogrod import gan  # noqa: E402

TARGET_MEAN = np.array([1.5, -1.0], np.float32)


def mlp(in_dim, out_dim, width=64, name=None):
    return keras.Sequential([keras.Input((in_dim,)),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(out_dim)], name=name)


def check_linear_critic():
    """D(x) = w.x has input gradient w everywhere: GP = (|w| - 1)^2, R1 = |w|^2, and the
    gradient of GP with respect to w is 2 (|w| - 1) w / |w|."""
    w = tf.Variable([[3.0], [4.0]], dtype=tf.float64)              # |w| = 5
    critic = lambda x: tf.matmul(x, w)                              # noqa: E731  [batch, 1]
    real = tf.constant(np.random.default_rng(0).normal(size=(8, 2)))
    fake = tf.constant(np.random.default_rng(1).normal(size=(8, 2)))
    gp, grad = hogrod.value_and_grad(lambda: gan.gradient_penalty(critic, real, fake), w)
    assert np.isclose(float(gp), 16.0) and np.allclose(grad, 2 * 4.0 * w / 5.0)
    assert np.isclose(float(gan.r1_penalty(critic, real)), 25.0)
    assert np.allclose(gan.input_gradient_norm(critic, real), 5.0)  # [batch]


def check_dirac_gan():
    """The Dirac-GAN's exact check: with R1 (gamma / 2) E|grad D|^2, gamma = 0.3, the
    Jacobian at the equilibrium has eigenvalues -gamma/2 +- i sqrt(1/4 - gamma^2/4), and
    1,000 alternating steps of 0.1 from (1, 1) end about 1e-6 from it."""
    game = gan.dirac_gan(gan.saturating_loss, [gan.r1_penalty], [0.15])
    root = 1j * np.sqrt(0.25 - 0.15 ** 2)
    assert np.allclose(gan.dirac_eigenvalues(game), [-0.15 - root, -0.15 + root], atol=1e-10)
    assert np.linalg.norm(gan.dirac_trajectory(game, mode="alternating")[-1]) < 3e-6


def regularized_loop(steps, batch=128, latent=2, gamma=1.0, lazy_every=4):
    """RpGAN + R1 + R2 (R3GAN's recipe) with bCR on your own spectrally normalized critic,
    and StyleGAN2's path-length penalty on your own generator, lazily (every `lazy_every`
    generator steps, multiplied by it), its running mean kept by you."""
    keras.utils.set_random_seed(1)
    critic = keras.Sequential([keras.Input((2,)), gan.SpectralNormalization(
        keras.layers.Dense(64, activation="relu")), gan.SpectralNormalization(
        keras.layers.Dense(1))], name="sn_critic")
    generator = mlp(latent, 2, name="pl_generator")
    c_opt = keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=0.9)
    g_opt = keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=0.9)
    path_length = gan.path_length_penalty(decay=0.01, batch_shrink=2)
    pl_mean = tf.Variable(path_length.init(tf.float32)["mean"])   # the penalty's state

    def jitter(x):  # your augmentation T for bCR: a batch of the same shape
        return x + 0.05 * tf.random.normal(tf.shape(x))

    @tf.function
    def critic_step(real):
        fake = generator(tf.random.normal([batch, latent]))
        with tf.GradientTape() as tape:
            adversarial = gan.relativistic_loss(critic(real, training=True),
                                                critic(fake, training=True)).critic
            r1_r2 = gan.r1_penalty(critic, real) + gan.r2_penalty(critic, real, fake)
            bcr = gan.consistency_penalty(critic, real, fake, augment=jitter)
            loss = adversarial + gamma / 2 * r1_r2 + 1.0 * bcr
        grads = tape.gradient(loss, critic.trainable_variables)
        gan.advance_power_iteration(critic)  # once per step: the critic ran 6 times above
        c_opt.apply_gradients(zip(grads, critic.trainable_variables))
        return adversarial

    @tf.function
    def generator_step(real):
        z = tf.random.normal([batch, latent])
        with tf.GradientTape() as tape:
            adversarial = gan.relativistic_loss(critic(real),
                                                critic(generator(z, training=True))).generator
            before = {"mean": pl_mean.read_value()}
            pl, state = gan.lazy_term(lambda: path_length.apply(generator, z, before),
                                      g_opt.iterations, lazy_every, tf.float32, state=before)
            loss = adversarial + 2.0 * pl
        grads = tape.gradient(loss, generator.trainable_variables)
        g_opt.apply_gradients(zip(grads, generator.trainable_variables))
        pl_mean.assign(state["mean"])
        return pl

    for _ in range(steps):
        real = TARGET_MEAN + 0.3 * tf.random.normal([batch, 2])
        critic_step(real)
        generator_step(real)
    # the oracle: each sigma is at most the kernel's largest singular value (||W^T v|| for a
    # unit v), and a few more power-iteration steps bring it within 1%
    for _ in range(50):
        gan.advance_power_iteration(critic)
    for layer in gan.spectral_layers(critic):
        top = np.linalg.svd(layer.layer.kernel.numpy(), compute_uv=False)[0]
        sigma = float(layer.sigma())
        assert 0.99 * top <= sigma <= top * (1 + 1e-6), (sigma, top)
    assert float(pl_mean.numpy()) > 0.0, "the path-length mean moved on the lazy steps"
    samples = generator(tf.random.normal([2000, latent])).numpy()
    return float(np.linalg.norm(samples.mean(0) - TARGET_MEAN))


def main(quick=False):
    check_linear_critic()
    keras.utils.set_random_seed(0)
    steps, n_critic, batch, latent = (60, 5, 128, 2) if quick else (3000, 5, 256, 2)
    generator, critic = mlp(latent, 2, name="generator"), mlp(2, 1, name="critic")
    g_opt = keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=0.9)
    c_opt = keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=0.9)
    penalty_weight = 1.0

    def real_batch():
        return TARGET_MEAN + 0.3 * tf.random.normal([batch, 2])

    @tf.function
    def critic_step(real, penalty="gp"):
        z = tf.random.normal([batch, latent])
        with tf.GradientTape() as tape:
            fake = generator(z, training=True)
            wasserstein = tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(real))
            if penalty == "gp":   # the inner tape lives inside gradient_penalty
                reg = gan.gradient_penalty(critic, real, fake)
            else:                 # R1: on real data only
                reg = gan.r1_penalty(critic, real)
            loss = wasserstein + penalty_weight * reg
        grads = tape.gradient(loss, critic.trainable_variables)
        c_opt.apply_gradients(zip(grads, critic.trainable_variables))
        return wasserstein, reg

    @tf.function
    def generator_step():
        z = tf.random.normal([batch, latent])
        with tf.GradientTape() as tape:
            loss = -tf.reduce_mean(critic(generator(z, training=True)))
        grads = tape.gradient(loss, generator.trainable_variables)
        g_opt.apply_gradients(zip(grads, generator.trainable_variables))
        return loss

    def distance():
        samples = generator(tf.random.normal([2000, latent])).numpy()
        return float(np.linalg.norm(samples.mean(0) - TARGET_MEAN))

    start = distance()
    for _ in range(steps):
        for _ in range(n_critic):
            wasserstein, gp = critic_step(real_batch())
        generator_step()
    end = distance()
    _, r1 = critic_step(real_batch(), penalty="r1")    # the same loop with R1 instead

    # the trained critic is roughly 1-Lipschitz between real and fake samples (GP's aim)
    x_hat = 0.5 * (real_batch() + generator(tf.random.normal([batch, latent])))
    norms = gan.input_gradient_norm(critic, x_hat).numpy()
    print(f"gan_own_loop: generated mean off the target by {start:.3f} -> {end:.3f}; last "
          f"-W {float(wasserstein):.4f}, GP {float(gp):.4f}, R1 {float(r1):.4f}; median "
          f"|grad D| at interpolates {np.median(norms):.3f}")
    assert np.all(np.isfinite([float(wasserstein), float(gp), float(r1)]))
    assert end < 0.5 * start, "the generator moved towards the target"
    check_dirac_gan()
    regularized = regularized_loop(20 if quick else 1000)
    print(f"gan_own_loop: RpGAN + R1 + R2 + bCR on a spectrally normalized critic, lazy path "
          f"length on the generator: generated mean off the target by {regularized:.3f}")
    return {"start": start, "end": end, "regularized": regularized}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
