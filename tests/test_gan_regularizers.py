"""GAN losses, consistency and generator penalties, lazy terms and spectral normalization.

Oracles: numpy formulas of the losses (float64, 1e-12); float64 central differences of each
piece's weight gradient; the path-length penalty's closed form on a linear generator (and
its expectation ||A||_F^2 / pixels); bCR by hand; numpy's largest singular value and
numpy's power iteration, step by step; the single-device step for MirroredStrategy over two
logical CPUs (tests/conftest.py); Keras's own layer for the behaviour the spectral module's
docstring ascribes to it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from conftest import central_differences
from hogrod import checks, distribute, gan

F64 = tf.float64


def softplus(x):
    return np.logaddexp(0.0, x)


def mlp64(sizes, seed, activation="tanh", spectral=False):
    """A float64 Dense net; `spectral`: every layer wrapped in SpectralNormalization."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((sizes[0],), dtype="float64")]
    for i, width in enumerate(sizes[1:]):
        dense = keras.layers.Dense(width, activation=activation if i < len(sizes) - 2 else None,
                                   dtype="float64")
        layers.append(gan.SpectralNormalization(dense, dtype="float64") if spectral else dense)
    return keras.Sequential(layers)


def normal(shape, seed):
    return tf.random.stateless_normal(shape, (seed, 7), dtype=F64)


# ---- losses ---------------------------------------------------------------------------

def test_losses_match_their_formulas():
    real, fake = normal([6, 1], 0), normal([6], 1)
    r, f = real.numpy()[:, 0], fake.numpy()
    expected = {
        gan.wasserstein_loss: (f.mean() - r.mean(), -f.mean()),
        gan.saturating_loss: (softplus(-r).mean() + softplus(f).mean(), -softplus(f).mean()),
        gan.nonsaturating_loss: (softplus(-r).mean() + softplus(f).mean(), softplus(-f).mean()),
        # each real example against its generated partner: the critic wants r_i > f_i
        gan.relativistic_loss: (np.mean(np.log1p(np.exp(f - r))),
                                np.mean(np.log1p(np.exp(r - f))))}
    for loss, (critic, generator) in expected.items():
        out = loss(real, fake)
        assert isinstance(out, gan.GanLosses) and out.critic.dtype == F64
        np.testing.assert_allclose([float(out.critic), float(out.generator)],
                                   [critic, generator], rtol=1e-12, err_msg=loss.__name__)
    # the relativistic critic prefers real above generated: scores that rank them so lose less
    assert float(gan.relativistic_loss(real + 5.0, fake).critic) < float(
        gan.relativistic_loss(real - 5.0, fake).critic)


def test_bad_scores_are_named():
    with pytest.raises(ValueError, match="relativistic_loss: .*same batch size"):
        gan.relativistic_loss(tf.zeros([4]), tf.zeros([3]))
    with pytest.raises(ValueError, match="wasserstein_loss: real_scores must hold one score"):
        gan.wasserstein_loss(tf.zeros([4, 2]), tf.zeros([4]))
    with pytest.raises(TypeError, match="differ in dtype"):
        gan.saturating_loss(tf.zeros([4]), tf.zeros([4], F64))


# ---- lazy regularization --------------------------------------------------------------

def test_lazy_term_is_scaled_by_its_interval_and_skips_the_computation():
    calls = tf.Variable(0, dtype=tf.int64)

    def compute():
        calls.assign_add(1)
        return tf.constant(1.5, F64)

    def stateful():
        calls.assign_add(1)
        return tf.constant(2.0, F64), {"mean": tf.constant(9.0, F64)}

    @tf.function
    def terms(step):
        plain = gan.lazy_term(compute, step, 3, F64)
        staggered, state = gan.lazy_term(stateful, step, 3, F64, offset=1,
                                         state={"mean": tf.constant(4.0, F64)})
        return plain, staggered, state["mean"]

    got = [[float(x) for x in terms(tf.constant(i, tf.int64))] for i in range(6)]
    assert terms.experimental_get_tracing_count() == 1
    np.testing.assert_array_equal(got, [[4.5, 0, 4], [0, 6, 9], [0, 0, 4],
                                        [4.5, 0, 4], [0, 6, 9], [0, 0, 4]])
    assert int(calls.numpy()) == 4  # computed only on the steps it is due
    assert float(gan.lazy_term(compute, 5, 1, F64)) == 1.5  # every step: no cond
    with pytest.raises(checks.ArgumentError, match="lazy_term: lazy_every must be an integer >= 1"):
        gan.lazy_term(compute, 0, 0, F64)
    with pytest.raises(checks.ArgumentError, match="offset"):
        gan.lazy_term(compute, 0, 4, F64, offset=4)


# ---- consistency regularization -------------------------------------------------------

def test_consistency_penalty_is_its_hand_computation():
    """D(x) = sum(x^2) and T(x) = 2x: D(x) - D(T(x)) = -3 sum(x^2), so bCR is
    9 mean((sum x^2)^2) on the real batch plus fake_weight times it on the generated one."""
    def critic(x):
        return tf.reduce_sum(tf.square(x), axis=[1, 2])

    real, fake = normal([5, 3, 2], 1), normal([5, 3, 2], 2)
    hand = [9 * np.mean(np.sum(b.numpy() ** 2, axis=(1, 2)) ** 2) for b in (real, fake)]
    double = lambda x: 2.0 * x  # noqa: E731
    got = gan.consistency_penalty(critic, real, fake, augment=double, fake_weight=0.25)
    np.testing.assert_allclose(float(got), hand[0] + 0.25 * hand[1], rtol=1e-12)
    np.testing.assert_allclose(float(gan.consistency_penalty(
        critic, real, None, augment=double, fake_weight=0.0)), hand[0], rtol=1e-12)


def test_consistency_penalty_input_is_checked():
    critic = mlp64([2, 3, 1], 0)
    real = normal([4, 2], 0)
    with pytest.raises(checks.ArgumentError,
                       match=r"consistency_penalty.augment: .*shape \[4, 2\]"):
        gan.consistency_penalty(critic, real, real, augment=lambda x: x[:, :1])
    with pytest.raises(checks.ArgumentError, match="augment is required"):
        gan.consistency_penalty(critic, real, real)
    with pytest.raises(checks.ArgumentError, match="dtype"):
        gan.consistency_penalty(critic, real, real, augment=lambda x: tf.cast(x, tf.float32))
    with pytest.raises(checks.ArgumentError, match="no fake batch"):
        gan.consistency_penalty(critic, real, augment=lambda x: x)
    traced = tf.function(lambda x: gan.consistency_penalty(critic, x, x, augment=lambda y: y[1:]),
                         input_signature=[tf.TensorSpec([None, 2], F64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="augmentation must keep"):
        traced(real)


# ---- generator penalties --------------------------------------------------------------

def linear_generator(a, shape):
    """G(w) = w A reshaped to [batch, *shape]: J_w^T y = A y (y flattened)."""
    a = tf.constant(a, F64)
    return lambda w: tf.reshape(tf.matmul(w, a), [-1, *shape])


def test_path_length_penalty_on_a_linear_generator_is_its_closed_form():
    """||J_w^T y_i|| = ||A y_i|| / sqrt(H W) for y_i ~ N(0, I) / sqrt(H W); every
    `batch_shrink`-th example; the mean moved once per call by `decay`, and the penalty
    taken at the moved mean. Two chained calls."""
    rng = np.random.default_rng(0)
    shape, latent, batch = (3, 2, 2), 4, 8
    a = rng.normal(size=(latent, 12))
    generator = linear_generator(a, shape)
    penalty = gan.path_length_penalty(decay=0.1, batch_shrink=2)
    state = penalty.init(F64)
    mean = 0.0
    for call in range(2):
        w, y = normal([batch, latent], call), normal([batch, *shape], 10 + call)
        value, state = penalty.apply(generator, w, state, noise={"path_length": y})
        lengths = np.linalg.norm(y.numpy()[::2].reshape(4, -1) @ a.T, axis=1) / np.sqrt(6)
        mean = mean + 0.1 * (lengths.mean() - mean)
        np.testing.assert_allclose(float(value), np.mean((lengths - mean) ** 2), rtol=1e-12)
        np.testing.assert_allclose(float(state["mean"]), mean, rtol=1e-12)
        np.testing.assert_allclose(gan.path_lengths(generator, w[::2], y[::2] / np.sqrt(6)),
                                   lengths, rtol=1e-12)
    # y drawn inside: with decay near 1 the mean is this batch's, so value + mean^2 is the
    # mean squared length, whose expectation is ||A||_F^2 / (H W)
    tf.random.set_seed(0)
    drawn = gan.path_length_penalty(decay=1 - 1e-9, batch_shrink=1)
    value, state = drawn.apply(generator, normal([4000, latent], 3), drawn.init(F64))
    np.testing.assert_allclose(float(value) + float(state["mean"]) ** 2, np.sum(a ** 2) / 6,
                               rtol=0.05)


def test_path_lengths_of_stylegan_layers_average_over_the_layers():
    """w [batch, layers, w_dim]: ||J^T y||^2 summed over w_dim and averaged over the layers."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 4, 5))  # a matrix per layer

    def generator(w):
        return tf.einsum("bld,ldk->bk", w, tf.constant(a, F64))
    w, y = normal([6, 3, 4], 0), normal([6, 5], 1)
    expected = np.sqrt(np.mean(np.sum(np.einsum("ldk,bk->bld", a, y.numpy()) ** 2, -1), -1))
    np.testing.assert_allclose(gan.path_lengths(generator, w, y), expected, rtol=1e-12)


def test_latent_consistency_penalty_is_its_definition():
    generator = mlp64([3, 4, 2], 2)
    z, delta = normal([5, 3], 0), normal([5, 3], 1)
    zcr = gan.latent_consistency_penalty(scale=0.1)
    value, state = zcr.apply(generator, z, zcr.init(F64), noise={"latent_perturbation": delta})
    moved = generator(z + 0.1 * delta).numpy()
    np.testing.assert_allclose(float(value), -np.mean(np.sum((generator(z).numpy() - moved) ** 2,
                                                             axis=1)), rtol=1e-12)
    assert state == {}


def test_generator_penalty_input_is_checked():
    for make, binding, match in [(lambda: gan.path_length_penalty(decay=1.5), "decay", r"\(0"),
                                 (lambda: gan.path_length_penalty(decay=0.0), "decay", r"\(0"),
                                 (lambda: gan.path_length_penalty(batch_shrink=0),
                                  "batch_shrink", ">= 1"),
                                 (lambda: gan.latent_consistency_penalty(scale=0.0), "scale",
                                  "")]:
        with pytest.raises(checks.ArgumentError, match=f"penalty: {binding} must be.*{match}"):
            make()
    penalty, generator = gan.path_length_penalty(), linear_generator(np.eye(2), (2,))
    with pytest.raises(ValueError, match="unknown noise key"):
        penalty.apply(generator, tf.zeros([4, 2], F64), penalty.init(F64), noise={"pl": 1.0})
    with pytest.raises(ValueError, match="state must be the dict"):
        penalty.apply(generator, tf.zeros([4, 2], F64), 0.0)
    with pytest.raises(ValueError, match=r"noise\['path_length'\] must have the shape"):
        penalty.apply(generator, tf.zeros([4, 2], F64), penalty.init(F64),
                      noise={"path_length": tf.zeros([4, 3], F64)})


# ---- weight gradients against float64 central differences -------------------------------

def _setup(piece):
    """(scalar function of the weights, the weights) for one piece, everything float64."""
    real, fake = normal([5, 2], 0), normal([5, 2], 1)
    if piece in ("consistency", "relativistic", "spectral_r1_r2"):
        critic = mlp64([2, 4, 1], 0, spectral=piece == "spectral_r1_r2")
        if piece == "consistency":
            def fn():
                return gan.consistency_penalty(critic, real, fake, augment=lambda x: 0.8 * x + 0.1)
        elif piece == "relativistic":
            def fn():
                return gan.relativistic_loss(critic(real), critic(fake)).critic
        else:
            for layer in gan.spectral_layers(critic):  # u at the top singular vector
                w = layer.layer.kernel.numpy().reshape(-1, layer.layer.kernel.shape[-1])
                layer.vector_u.assign(np.linalg.svd(w)[2][0])

            def fn():
                return gan.r1_penalty(critic, real) + 0.5 * gan.r2_penalty(critic, real, fake)
        return fn, critic.trainable_variables
    generator = mlp64([3, 5, 2], 1)
    z, y = normal([6, 3], 2), normal([6, 2], 3)
    if piece == "path_length":
        penalty = gan.path_length_penalty(decay=0.2, batch_shrink=2)
        state = {"mean": tf.constant(0.3, F64)}

        def fn():
            return penalty.apply(generator, z, state, noise={"path_length": y})[0]
    else:
        penalty = gan.latent_consistency_penalty(scale=0.5)

        def fn():
            return penalty.apply(generator, z, {}, noise={"latent_perturbation": z[::-1]})[0]
    return fn, generator.trainable_variables


@pytest.mark.parametrize("piece", ["consistency", "relativistic", "spectral_r1_r2",
                                   "path_length", "latent_consistency"])
def test_weight_gradients_match_central_differences(piece):
    fn, variables = _setup(piece)
    value, grads = hogrod.value_and_grad(fn, variables)
    assert value.dtype == F64
    for g, fd in zip(grads, central_differences(fn, variables)):
        np.testing.assert_allclose(g.numpy(), fd, rtol=1e-6, atol=1e-8, err_msg=piece)


# ---- spectral normalization -------------------------------------------------------------

def test_sigma_is_the_largest_singular_value_and_the_output_uses_the_normalized_kernel():
    keras.utils.set_random_seed(3)
    conv = gan.SpectralNormalization(keras.layers.Conv2D(3, 2, dtype="float64"), dtype="float64")
    dense = gan.SpectralNormalization(keras.layers.Dense(4, dtype="float64"), dtype="float64")
    x = normal([2, 5, 5, 2], 0)
    conv(x), dense(x[:, 0, 0])
    for layer in (conv, dense):
        for _ in range(200):
            gan.advance_power_iteration(layer)
        w = layer.layer.kernel.numpy()
        top = np.linalg.svd(w.reshape(-1, w.shape[-1]), compute_uv=False)[0]
        np.testing.assert_allclose(float(layer.sigma()), top, rtol=1e-12)
    np.testing.assert_allclose(dense(x[:, 0, 0]), x[:, 0, 0].numpy() @ (
        dense.layer.kernel.numpy() / float(dense.sigma())) + dense.layer.bias.numpy(), rtol=1e-12)


def numpy_step(kernel, u):
    w = kernel.reshape(-1, kernel.shape[-1])
    v = w @ u / np.linalg.norm(w @ u)
    return w.T @ v / np.linalg.norm(w.T @ v)


def test_power_iteration_advances_once_per_step_however_often_the_critic_runs():
    """Each step runs the critic on real and fake batches, in R1 and GP (their inner tapes)
    and through functional_call, then advances once and updates the weights: u is one numpy
    power-iteration step per training step, at the weights it was advanced at."""
    critic = mlp64([2, 6, 4, 1], 4, spectral=True)
    layers = gan.spectral_layers(critic)
    assert len(layers) == 3 and len(critic.non_trainable_variables) == 3
    real, fake = normal([8, 2], 0), normal([8, 2], 1)
    opt = keras.optimizers.SGD(0.1)

    @tf.function
    def step():
        before = [tf.identity(layer.vector_u.value) for layer in layers]
        with tf.GradientTape() as tape:
            loss = gan.nonsaturating_loss(critic(real, training=True),
                                          critic(fake, training=True)).critic
            loss += gan.r1_penalty(critic, real) + gan.gradient_penalty(critic, real, fake)
            loss += tf.reduce_mean(hogrod.functional_call(
                critic, hogrod.trainable_values(critic), real, training=True))
        unchanged = [tf.reduce_all(tf.equal(b, layer.vector_u.value)) for b, layer in
                     zip(before, layers)]
        with tf.control_dependencies(unchanged):
            gan.advance_power_iteration(critic)
        opt.apply(tape.gradient(loss, critic.trainable_variables), critic.trainable_variables)
        return tf.reduce_all(unchanged)

    us = [layer.vector_u.numpy() for layer in layers]
    for _ in range(3):
        kernels = [layer.layer.kernel.numpy() for layer in layers]
        assert bool(step())  # the forward passes left u as it was
        us = [numpy_step(k, u) for k, u in zip(kernels, us)]
        for layer, u in zip(layers, us):
            np.testing.assert_allclose(layer.vector_u.numpy(), u, rtol=1e-12, atol=1e-14)
    assert step.experimental_get_tracing_count() == 1


def test_functional_call_of_a_normalized_critic_equals_its_call_and_gradient():
    critic = mlp64([2, 5, 1], 5, spectral=True)
    x = normal([4, 2], 2)
    params = hogrod.trainable_values(critic)
    state = hogrod.model_state(critic)
    out, new_state = hogrod.functional_call(critic, params, x, state=state)
    np.testing.assert_allclose(out, critic(x), rtol=1e-12)
    for a, b in zip(new_state, state):  # the forward pass does not advance u
        np.testing.assert_array_equal(a, b)
    # sigma is the substituted kernel's: scaled kernels (biases kept) give the same output
    scaled = [3.0 * p if len(p.shape) == 2 else p for p in params]
    np.testing.assert_allclose(hogrod.functional_call(critic, scaled, x), critic(x), rtol=1e-12)
    _, by_params = hogrod.value_and_grad(
        lambda: gan.r1_penalty(lambda y: hogrod.functional_call(critic, params, y), x), params)
    _, by_variables = hogrod.value_and_grad(lambda: gan.r1_penalty(critic, x),
                                            critic.trainable_variables)
    for a, b in zip(by_params, by_variables):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_keras_spectral_normalization_does_what_the_module_docstring_says():
    """Why hogrod has its own layer: Keras's advances u and writes W / sigma into the kernel on
    every training call (the gradient then misses sigma's dependence on W), normalizes
    nothing with training=False, and under functional_call advances u in the returned
    state."""
    keras.utils.set_random_seed(6)
    layer = keras.layers.SpectralNormalization(keras.layers.Dense(3))
    model = keras.Sequential([keras.Input((4,)), layer])
    x = tf.random.stateless_normal([5, 4], (0, 1))
    kernel = layer.layer.kernel.numpy()
    np.testing.assert_allclose(model(x, training=False), x.numpy() @ kernel, rtol=1e-5, atol=1e-6)
    u0 = layer.vector_u.numpy().copy()
    model(x, training=True)
    u1, k1 = layer.vector_u.numpy().copy(), layer.layer.kernel.numpy().copy()
    model(x, training=True)
    assert not np.allclose(u0, u1) and not np.allclose(u1, layer.vector_u.numpy())  # per call
    assert not np.allclose(kernel, k1)  # the trainable kernel now holds W / sigma
    with tf.GradientTape() as tape:  # and its gradient is the plain Dense one: sigma cut off
        total = tf.reduce_sum(model(x, training=True))
    np.testing.assert_allclose(tape.gradient(total, layer.layer.kernel),
                               x.numpy().T @ np.ones((5, 3)), rtol=1e-5)
    _, state = hogrod.functional_call(model, hogrod.trainable_values(model), x, training=True,
                                      state=hogrod.model_state(model))
    assert not np.allclose(state[0], layer.vector_u.numpy())
    # ours: the same calls change nothing
    ours = mlp64([4, 3], 6, spectral=True)
    before = [v.numpy().copy() for v in ours.variables]
    for training in (True, True, False):
        ours(tf.cast(x, F64), training=training)
    for v, b in zip(ours.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_spectral_normalization_refuses_what_it_cannot_normalize():
    with pytest.raises(ValueError, match="neither a kernel nor embeddings"):
        gan.SpectralNormalization(keras.layers.Activation("relu"))(tf.zeros([2, 3]))
    with pytest.raises(ValueError, match="non-trainable variables"):
        gan.SpectralNormalization(keras.layers.BatchNormalization())(tf.zeros([2, 3]))
    with pytest.raises(TypeError, match="wraps a Keras layer"):
        gan.SpectralNormalization(lambda x: x)
    assert gan.advance_power_iteration(mlp64([2, 1], 0)) == 0


# ---- two replicas equal one device ------------------------------------------------------

def _replica_step(strategy):
    """One critic and one generator gradient of the new pieces, and the power iteration,
    under `strategy`: the relativistic loss with R1 + R2 and bCR on a spectrally normalized
    critic; the path-length and zCR penalties of a generator (their noise in the batch)."""
    with strategy.scope():
        critic = mlp64([2, 4, 1], 7, spectral=True)
        generator = mlp64([3, 4, 2], 8)
    path_length, zcr = gan.path_length_penalty(decay=0.3), gan.latent_consistency_penalty()
    batch = {"real": normal([8, 2], 0), "z": normal([8, 3], 1), "y": normal([8, 2], 2),
             "delta": normal([8, 3], 3)}
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).unbatch().batch(8))

    def replica(b):
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape(persistent=True) as tape:
            fake = generator(b["z"])
            d = gan.relativistic_loss(critic(b["real"]), critic(fake)).critic
            d += gan.r1_penalty(critic, b["real"]) + gan.r2_penalty(critic, b["real"], fake)
            d += gan.consistency_penalty(critic, b["real"], fake, augment=lambda x: x[:, ::-1])
            start = {"mean": tf.constant(0.5, F64)}

            def pl_term():
                return path_length.apply(generator, b["z"], start, noise={"path_length": b["y"]})
            pl, state = gan.lazy_term(pl_term, 4, 2, F64, state=start)  # due: 2 x the penalty
            skipped, kept = gan.lazy_term(pl_term, 5, 2, F64, state=start)
            g = pl + zcr.apply(generator, b["z"], {}, noise={"latent_perturbation": b["delta"]})[0]
        grads = tape.gradient(d, critic.trainable_variables) + tape.gradient(
            g, generator.trainable_variables)
        gan.advance_power_iteration(critic)
        return (ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [d, g, skipped] + grads),
                tf.stack([state["mean"], kept["mean"]]))

    def run(b):
        return strategy.run(replica, args=(b,))

    out, mean = run(next(iter(data)))
    local = strategy.experimental_local_results
    np.testing.assert_array_equal(local(mean)[0], local(mean)[-1])  # one state on every replica
    values = [local(x)[0].numpy().ravel() for x in out] + [local(mean)[0].numpy().ravel()]
    us = [layer.vector_u.numpy() for layer in gan.spectral_layers(critic)]
    return np.concatenate(values + us)


def _compiled_lazy_path_length(strategy):
    """The lazy path-length penalty and its gradient in a compiled step under `strategy`: its
    mean all-reduced, which MirroredStrategy cannot do inside the lazy term's cond."""
    with strategy.scope():
        generator = mlp64([3, 4, 2], 8)
    penalty = gan.path_length_penalty(decay=0.3)
    batch = {"z": normal([8, 3], 1), "y": normal([8, 2], 2)}
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).unbatch().batch(8))

    def replica(b):
        start = {"mean": tf.constant(0.5, F64)}
        with tf.GradientTape() as tape:
            value, state = gan.lazy_term(lambda: penalty.apply(
                generator, b["z"], start, noise={"path_length": b["y"]}), 4, 2, F64, state=start)
        grads = [tf.zeros(v.shape, F64) if g is None else g  # the output bias: no path
                 for v, g in zip(generator.trainable_variables,
                                 tape.gradient(value, generator.trainable_variables))]
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [value] + grads), state["mean"]

    out, mean = tf.function(lambda b: strategy.run(replica, args=(b,)))(next(iter(data)))
    local = strategy.experimental_local_results
    return np.concatenate([local(x)[0].numpy().ravel() for x in out]
                          + [local(mean)[-1].numpy().ravel()])


def test_the_new_pieces_under_two_replicas_equal_one_device():
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    single = tf.distribute.get_strategy()
    for step in (_replica_step, _compiled_lazy_path_length):
        np.testing.assert_allclose(step(strategy), step(single), rtol=1e-10, atol=1e-12)
