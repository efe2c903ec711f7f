"""Gradient penalties against closed forms and finite differences; metrics on true and
collapsed samplers; the trainer's compiled steps; bad input."""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import gan
from conftest import bench_config


class LinearCritic(keras.Model):
    """D(x) = <w, x> + b: grad_x D = w everywhere, for any input rank."""

    def __init__(self, w):
        super().__init__()
        self.w = tf.constant(w, tf.float32)

    def call(self, x, training=False):
        axes = list(range(1, len(x.shape)))
        return tf.reduce_sum(x * self.w, axis=axes) + 0.3


def test_penalties_of_a_linear_critic_match_the_closed_form_for_vectors_and_images():
    for shape in [(3,), (4, 4, 2)]:
        w = np.random.default_rng(0).normal(size=shape).astype(np.float32)
        critic = LinearCritic(w)
        real = tf.random.stateless_normal((6,) + shape, (0, 1))
        fake = tf.random.stateless_normal((6,) + shape, (0, 2))
        norm = np.linalg.norm(w)
        np.testing.assert_allclose(gan.gradient_penalty(critic, real, fake), (norm - 1) ** 2,
                                   rtol=1e-5)
        np.testing.assert_allclose(gan.gradient_penalty(critic, real, fake, target=norm + 1,
                                                        one_sided=True), 0.0, atol=1e-10)
        np.testing.assert_allclose(gan.r1_penalty(critic, real), norm ** 2, rtol=1e-5)
        np.testing.assert_allclose(gan.r2_penalty(critic, real, fake), norm ** 2, rtol=1e-5)
        np.testing.assert_allclose(gan.dragan_penalty(critic, real), (norm - 1) ** 2, rtol=1e-5)


def small_critic(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def half_squared_norm(x):
    """D(x) = ||x||^2 / 2 (any callable is a critic): grad_x D = x, so the penalty at x_hat
    is (||x_hat|| - 1)^2."""
    return 0.5 * tf.reduce_sum(tf.square(x), axis=list(range(1, len(x.shape))))


def test_gradient_penalty_is_taken_at_the_interpolates():
    real = tf.random.stateless_normal((6, 3), (0, 3), dtype=tf.float64)
    fake = tf.random.stateless_normal((6, 3), (0, 4), dtype=tf.float64)
    e = tf.constant([0.0, 0.1, 0.5, 0.7, 0.9, 1.0], tf.float64)
    x_hat = e[:, None] * real + (1 - e[:, None]) * fake
    expect = np.mean((np.linalg.norm(x_hat, axis=1) - 1.0) ** 2)
    np.testing.assert_allclose(gan.gradient_penalty(half_squared_norm, real, fake,
                                                    noise={"interpolation": e}), expect, rtol=1e-12)
    one_sided = np.mean(np.maximum(np.linalg.norm(x_hat, axis=1) - 1.0, 0.0) ** 2)
    np.testing.assert_allclose(gan.gradient_penalty(half_squared_norm, real, fake, one_sided=True,
                                                    noise={"interpolation": e}), one_sided,
                               rtol=1e-12)


def float64_critic(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((2,), dtype="float64"),
                             keras.layers.Dense(8, activation="tanh", dtype="float64"),
                             keras.layers.Dense(1, dtype="float64")])


@pytest.mark.parametrize("penalty", ["gp", "r1"])
def test_penalty_parameter_gradients_match_float64_finite_differences(penalty):
    critic = float64_critic()
    real = tf.random.stateless_normal((5, 2), (1, 1), dtype=tf.float64)
    fake = tf.random.stateless_normal((5, 2), (1, 2), dtype=tf.float64)
    e = tf.random.stateless_uniform([5], (1, 3), dtype=tf.float64)
    fn = {"gp": lambda: gan.gradient_penalty(critic, real, fake, noise={"interpolation": e}),
          "r1": lambda: gan.r1_penalty(critic, real)}[penalty]
    with tf.GradientTape() as tape:
        p = fn()
    assert p.dtype == tf.float64
    grads = tape.gradient(p, critic.trainable_variables)
    eps = 1e-6
    for var, g in zip(critic.trainable_variables, grads):
        base = var.numpy()
        for idx in list(np.ndindex(base.shape))[:6]:
            vals = []
            for s in (eps, -eps):
                k = base.copy()
                k[idx] += s
                var.assign(k)
                vals.append(float(fn()))
            var.assign(base)
            # None: the penalty does not depend on it (the output bias): FD must agree
            np.testing.assert_allclose(0.0 if g is None else g.numpy()[idx],
                                       (vals[0] - vals[1]) / (2 * eps), rtol=1e-6, atol=1e-9)


def test_zero_gradient_is_safe():
    zero = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    real = tf.random.stateless_normal((4, 2), (2, 1))
    import hogrod
    gp = gan.gradient_penalty(zero, real, real + 1.0)
    r1 = gan.r1_penalty(zero, real)
    _, grads = hogrod.value_and_grad(lambda: gan.gradient_penalty(zero, real, real + 1.0)
                                     + gan.r1_penalty(zero, real), zero.trainable_variables)
    assert float(gp) == 1.0 and float(r1) == 0.0
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    np.testing.assert_array_equal(gan.input_gradient_norm(zero, real), 0.0)


def test_mixed_precision_penalty_matches_float32():
    critic = small_critic()
    real = tf.random.stateless_normal((16, 2), (3, 1))
    ref = float(gan.r1_penalty(critic, real))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        half = small_critic()
        for a, b in zip(half.trainable_variables, critic.trainable_variables):
            a.assign(b)
        assert half.layers[0].compute_dtype == "float16"
        got = gan.r1_penalty(half, real)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert got.dtype == tf.float32
    np.testing.assert_allclose(float(got), ref, rtol=1e-2)


def test_bad_input_is_named():
    critic = small_critic()
    with pytest.raises(ValueError, match="same shape"):
        gan.gradient_penalty(critic, tf.zeros((4, 2)), tf.zeros((3, 2)))
    two_outputs = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="one scalar per example"):
        gan.r1_penalty(two_outputs, tf.zeros((4, 2)))
    with pytest.raises(ValueError, match="unknown toy data set"):
        gan.toy_batches("nine_gaussians")
    # a norm's target below 0 would only grow the penalty: a typo, not a setting
    for penalty in (gan.gradient_penalty, gan.lp_penalty):
        with pytest.raises(hogrod.checks.ArgumentError, match="gradient_penalty: target must "
                                                              "be a finite number >= 0"):
            penalty(critic, tf.zeros((4, 2)), tf.ones((4, 2)), target=-1.0)
    # a stateless seed: an int is the pair [seed, 0]; anything else is named
    np.testing.assert_array_equal(gan.sample_toy("eight_gaussians", 5, 3),
                                  gan.sample_toy("eight_gaussians", 5, [3, 0]))
    with pytest.raises(hogrod.checks.ArgumentError, match="sample_toy: seed must be"):
        gan.sample_toy("eight_gaussians", 5, 2.5)
    # one score for the whole batch (a mean inside the critic) is not a per-example score
    batch_mean = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1),
                                   keras.layers.Lambda(lambda s: tf.reduce_mean(s))])
    with pytest.raises(ValueError, match="one scalar per example"):
        gan.r1_penalty(batch_mean, tf.zeros((4, 2)))
    # but a single example's score may be a scalar (a squeezed [1, 1] output)
    squeezed = lambda x: tf.squeeze(critic(x))  # noqa: E731
    np.testing.assert_allclose(gan.r1_penalty(squeezed, tf.ones((1, 2))),
                               gan.r1_penalty(critic, tf.ones((1, 2))), rtol=1e-6)
    # sizes unknown when traced: the mismatch is named when the step runs
    traced = tf.function(lambda r, f: gan.gradient_penalty(critic, r, f),
                         input_signature=[tf.TensorSpec([None, 2])] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="real and fake must have the same"):
        traced(tf.zeros((4, 2)), tf.zeros((3, 2)))


@pytest.mark.parametrize("name,expected_modes", [("eight_gaussians", 8),
                                                 ("twentyfive_gaussians", 25)])
def test_metrics_on_the_true_mixture_and_a_collapsed_sampler(name, expected_modes):
    true = gan.sample_toy(name, 20000, tf.constant([0, 5], tf.int64)).numpy()
    m = gan.mode_metrics(true, name)
    assert m["modes_covered"] == m["num_modes"] == expected_modes
    np.testing.assert_allclose(m["high_quality_percent"], 100 * (1 - np.exp(-4.5)), atol=0.3)
    assert m["reverse_kl"] < 0.01
    centers, std = gan.modes(name)
    collapsed = centers[0] + std * np.random.default_rng(0).normal(size=(2500, 2))
    c = gan.mode_metrics(collapsed, name)
    assert c["modes_covered"] == 1
    np.testing.assert_allclose(c["reverse_kl"], np.log(expected_modes), rtol=1e-6)


def test_toy_modes_have_no_duplicates():
    for name in ("eight_gaussians", "twentyfive_gaussians"):
        centers, _ = gan.modes(name)
        d = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        assert d[~np.eye(len(centers), dtype=bool)].min() > 0.5


def test_critic_step_is_one_compiled_function_with_the_weighted_penalty():
    keras.utils.set_random_seed(0)
    gen = keras.Sequential([keras.Input((2,)), keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(2)])
    critic = small_critic()
    step = gan.make_gan_step(gen, critic, keras.optimizers.Adam(1e-3),
                             keras.optimizers.Adam(1e-3), 2,
                             critic_penalties=[(gan.gradient_penalty, 10.0, 2)], n_critic=3)
    it = gan.grouped(iter(gan.toy_batches("eight_gaussians", 32, 0)), 3)
    for _ in range(3):
        logs = step(next(it))
    assert step.critic_step.experimental_get_tracing_count() == 1
    assert step.generator_step.experimental_get_tracing_count() == 1
    np.testing.assert_allclose(float(logs["critic/loss"]), float(logs["critic/adversarial"])
                               + 10.0 * float(logs["critic/gradient_penalty"]), rtol=1e-5)
    with pytest.raises(ValueError, match="n_critic"):
        step(next(it)[:2])
    with pytest.raises(ValueError, match=r"make_gan_step.critic_penalties\[0\]: the penalty"):
        gan.make_gan_step(gen, critic, None, None, 2, critic_penalties=[("wgan", 1.0, 1)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_critic_update_and_lazy_regularization_follow_their_definition(dtype):
    """A linear critic D = <w, x> + b under SGD: the Wasserstein term's gradient is
    mean(fake) - mean(real), the GP's is 2 (||w|| - 1) w / ||w||, scaled by lazy_every on
    the steps where it is due (the first of every lazy_every) and absent on the others.
    float64 models and data stay float64 through the penalty, the lazy cond and the weights:
    the update agrees to 1e-12."""
    keras.utils.set_random_seed(1)
    gen = keras.Sequential([keras.Input((2,), dtype=dtype), keras.layers.Dense(2, dtype=dtype)])
    critic = keras.Sequential([keras.Input((2,), dtype=dtype), keras.layers.Dense(1, dtype=dtype)])
    lr, lam, lazy = 2.0 ** -4, 10.0, 2  # a rate Keras's float32 copy holds exactly
    rtol, atol = (1e-5, 1e-7) if dtype == "float32" else (1e-12, 1e-14)
    step = gan.make_gan_step(gen, critic, keras.optimizers.SGD(lr), keras.optimizers.SGD(lr),
                             2, critic_penalties=[(gan.gradient_penalty, lam, lazy)], n_critic=1)
    for i in range(3):
        batch = {"real": tf.random.stateless_normal([8, 2], (i, 0), dtype=dtype),
                 "z": tf.random.stateless_normal([8, 2], (i, 1), dtype=dtype),
                 "interpolation": tf.random.stateless_uniform([8], (i, 2), dtype=dtype)}
        w, b = (v.numpy().copy() for v in critic.trainable_variables)
        delta = gen(batch["z"]).numpy().mean(0) - batch["real"].numpy().mean(0)
        n = np.linalg.norm(w)
        gp_grad = lazy * lam * 2 * (n - 1) * w[:, 0] / n if i % lazy == 0 else 0.0
        logs = step.critic_step(batch)
        np.testing.assert_allclose(critic.trainable_variables[0].numpy()[:, 0],
                                   w[:, 0] - lr * (delta + gp_grad), rtol=rtol, atol=atol)
        np.testing.assert_allclose(critic.trainable_variables[1].numpy(), b, atol=atol)
        np.testing.assert_allclose(float(logs["gradient_penalty"]),
                                   lazy * (n - 1) ** 2 if i % lazy == 0 else 0.0, rtol=rtol)
        assert logs["loss"].dtype == dtype and logs["adversarial"].dtype == dtype


def test_short_training_run_covers_more_modes_than_at_initialization(tmp_path):
    from experiments import gan as binary
    from hogrod import harness
    # 200 steps of a 32-wide net at rate 1e-3 cover 3-6 of the 8 modes from 0 (seeds 0-2)
    # and take the reverse KL from 1.3-1.7 to under 0.1
    # (a plain tf.function: XLA's compile cost more than the 200 steps it would speed up)
    small = ["gan_experiment.generator_steps = 200", "gan_experiment.eval_every = 200",
             "gan_experiment.width = 32", "gan_experiment.learning_rate = 1e-3",
             "make_gan_step.jit_compile = False"]
    _, m = harness.run(binary.gan_experiment, ["configs/gan/eight_gaussians.gin"],
                       small, str(tmp_path))
    initial = m["history"][0]
    assert initial["step"] == 0
    assert m["modes_covered"] > initial["modes_covered"]
    assert m["reverse_kl"] < initial["reverse_kl"]
    assert (tmp_path / "samples_000200.png").exists()
    assert m["train_steps_per_s"] > 0 and m["wall_seconds"] > 0
    # the finished run, run again: trains nothing, re-evaluates the final step, lists it once
    _, again = harness.run(binary.gan_experiment, ["configs/gan/eight_gaussians.gin"],
                           small, str(tmp_path))
    assert [h["step"] for h in again["history"]] == [0, 200]
    assert again["reverse_kl"] == m["reverse_kl"]


def test_bench_binary_runs(tmp_path):
    from experiments.bench import wgan_gp as bench_wgan_gp
    from hogrod import harness
    _, m = harness.run(bench_wgan_gp.bench_wgan_gp, [bench_config("wgan_gp")],
                       ["bench_wgan_gp.width = 8", "bench_wgan_gp.batch = 8",
                        "bench_wgan_gp.rounds = 1", "bench_wgan_gp.steps_per_round = 2",
                        "bench_wgan_gp.warmup = 1"], str(tmp_path))
    assert m["ratio_over_eager"] > 0
    # each ratio is the candidate's time over the floor's (the products alone), from the
    # rates of the same rounds; which is faster at width 8 is noise, not a property
    for name in ("hogrod_compiled", "tf_eager"):
        assert m[f"floor_ratio_over_{name}"] == pytest.approx(
            1e3 / (m["matmul_floor_ms"] * m[f"critic_steps_per_s_{name}"]), rel=1e-12)


class QuadraticCritic(keras.Model):
    """D(x) = ||x W||^2 / 2: grad_x D = W W^T x depends on the point, so a penalty taken at
    the wrong points (real for fake) has another value."""

    def __init__(self):
        super().__init__()
        self.w = self.add_weight(shape=(2, 2), initializer="random_normal", name="w")

    def call(self, x, training=False):
        return 0.5 * tf.reduce_sum(tf.square(tf.matmul(x, self.w)), axis=1)


@gin.configurable(denylist=["critic", "real", "fake", "noise"])
def r1_plus_r2(critic, real, fake, *, noise=None, ratio=1.0):
    """The example of a new penalty in hogrod/gan/penalties.py's docstring."""
    return (tf.reduce_mean(gan.squared_input_gradient(critic, real))
            + ratio * tf.reduce_mean(gan.squared_input_gradient(critic, fake)))


@pytest.fixture
def gin_bindings():
    yield gin.parse_config
    gin.clear_config()


PENALTY_BINDINGS = {
    "gp": ["make_gan_step.critic_penalties = [(@gradient_penalty, 1.0, 1)]"],
    "lp": ["make_gan_step.critic_penalties = [(@lp_penalty, 1.0, 1)]"],
    "r1": ["make_gan_step.critic_penalties = [(@r1_penalty, 1.0, 1)]"],
    "r2": ["make_gan_step.critic_penalties = [(@r2_penalty, 1.0, 1)]"],
    "dragan": ["make_gan_step.critic_penalties = [(@dragan_penalty, 1.0, 1)]",
               "dragan_penalty.scale = 0.7", "dragan_penalty.target = 0.0"],
    "gp_target_0": ["make_gan_step.critic_penalties = [(@gradient_penalty, 1.0, 1)]",
                    "gradient_penalty.target = 0.0"],
    "lp_target_small": ["make_gan_step.critic_penalties = [(@gradient_penalty, 1.0, 1)]",
                        "gradient_penalty.one_sided = True", "gradient_penalty.target = 0.005"],
    "r1_plus_r2": ["make_gan_step.critic_penalties = [(@r1_plus_r2, 1.0, 1)]",
                   "r1_plus_r2.ratio = 0.5"],
}


@pytest.mark.parametrize("penalty", sorted(PENALTY_BINDINGS))
def test_the_trainer_takes_each_penalty_at_its_points(penalty, gin_bindings):
    """Oracle: the closed form ||W W^T x|| at real data (R1), generated data (R2), the
    interpolates (GP, LP) or DRAGAN's perturbed points, in numpy, before the critic's
    update. The penalty and its hyperparameters come from gin bindings, by reference."""
    gin_bindings(PENALTY_BINDINGS[penalty])
    keras.utils.set_random_seed(3)
    gen = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    critic = QuadraticCritic()
    critic(tf.zeros((1, 2)))
    step = gan.make_gan_step(gen, critic, keras.optimizers.SGD(0.01),
                             keras.optimizers.SGD(0.01), 2, n_critic=1)
    batch = {"real": tf.random.stateless_normal([8, 2], (5, 0)) + 3.0,
             "z": tf.random.stateless_normal([8, 2], (5, 1)),
             "interpolation": tf.random.stateless_uniform([8], (5, 2)),
             "perturbation": 2.0 * tf.random.stateless_normal([8, 2], (5, 3))}
    W = critic.w.numpy()
    real, fake, e = batch["real"].numpy(), gen(batch["z"]).numpy(), batch["interpolation"].numpy()
    norm = lambda x: np.linalg.norm(x @ W @ W.T, axis=1)  # noqa: E731
    x_hat = e[:, None] * real + (1 - e[:, None]) * fake
    x_dragan = real + e[:, None] * 0.7 * batch["perturbation"].numpy()
    expected = {"r1": np.mean(norm(real) ** 2), "r2": np.mean(norm(fake) ** 2),
                "gp": np.mean((norm(x_hat) - 1) ** 2),
                "lp": np.mean(np.maximum(norm(x_hat) - 1, 0) ** 2),
                "dragan": np.mean(norm(x_dragan) ** 2),
                "gp_target_0": np.mean(norm(x_hat) ** 2),
                "lp_target_small": np.mean(np.maximum(norm(x_hat) - 0.005, 0) ** 2),
                "r1_plus_r2": np.mean(norm(real) ** 2) + 0.5 * np.mean(norm(fake) ** 2)}
    assert abs(expected["r1"] - expected["r2"]) > 0.1 * expected["r2"]  # the test can fail
    assert abs(expected["gp_target_0"] - expected["gp"]) > 0.1 * expected["gp"]
    assert abs(expected["dragan"] - expected["r1"]) > 0.05 * expected["r1"]  # perturbed
    assert 0 < expected["lp_target_small"] < 0.95 * np.mean((norm(x_hat) - 0.005) ** 2)
    logs = step.critic_step(batch)
    (name,) = [k for k in logs if k not in ("adversarial", "loss", "grad_norm", "lr", "applied")]
    np.testing.assert_allclose(float(logs[name]), expected[penalty], rtol=1e-5)


def test_dragan_with_given_noise_is_its_closed_form():
    """D(x) = ||x||^2 / 2 in float64: grad D(x_hat) = x_hat = x + alpha scale p."""
    real = tf.random.stateless_normal((6, 3), (7, 0), dtype=tf.float64)
    p = gan.perturbation(real, (7, 1))
    alpha = tf.constant([0.0, 0.1, 0.5, 0.7, 0.9, 1.0], tf.float64)
    x_hat = real.numpy() + alpha.numpy()[:, None] * 0.3 * p.numpy()
    expect = np.mean((np.linalg.norm(x_hat, axis=1) - 2.0) ** 2)
    got = gan.dragan_penalty(half_squared_norm, real, real + 1.0, target=2.0, scale=0.3,
                             noise={"interpolation": alpha, "perturbation": p})
    assert got.dtype == tf.float64
    np.testing.assert_allclose(float(got), expect, rtol=1e-12)
    # the perturbation at unit scale: the batch's std (numpy's, over every element) times U[0, 1]
    u = tf.random.stateless_uniform((6, 3), (7, 1), dtype=tf.float64).numpy()
    np.testing.assert_allclose(p.numpy(), np.std(real.numpy()) * u, rtol=1e-12)


def test_with_noise_draws_every_penalty_number_from_the_whole_batch():
    real = tf.random.stateless_normal((8, 2), (8, 0))
    data = gan.with_noise(tf.data.Dataset.from_tensors(real).repeat(2), latent_dim=3, seed=4)
    for i, batch in enumerate(data):
        assert set(batch) == {"real", "z"} | set(gan.NOISE_KEYS) | set(gan.GENERATOR_NOISE_KEYS)
        np.testing.assert_array_equal(batch["z"], tf.random.stateless_normal([8, 3], [4, i]))
        np.testing.assert_array_equal(batch["interpolation"],
                                      tf.random.stateless_uniform([8], [5, i]))
        u = tf.random.stateless_uniform([8, 2], [6, i]).numpy()
        np.testing.assert_allclose(batch["perturbation"], np.std(real.numpy()) * u, rtol=1e-6)
        np.testing.assert_array_equal(batch["path_length"],
                                      tf.random.stateless_normal([8, 2], [7, i]))
        np.testing.assert_array_equal(batch["latent_perturbation"],
                                      tf.random.stateless_normal([8, 3], [8, i]))


def test_penalty_references_and_noise_are_checked():
    keras.utils.set_random_seed(0)
    gen = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    critic = small_critic()
    sgd = keras.optimizers.SGD
    with pytest.raises(TypeError, match=r"make_gan_step.critic_penalties\[0\]: the penalty must "
                                        "be a critic penalty function, got int"):
        gan.make_gan_step(gen, critic, sgd(), sgd(), 2, critic_penalties=[(42, 1.0, 1)])
    with pytest.raises(TypeError, match=r"must take \(critic, real, fake, \*, noise\)"):
        gan.make_gan_step(gen, critic, sgd(), sgd(), 2, critic_penalties=[
            (lambda critic, real: gan.r1_penalty(critic, real), 1.0, 1)])
    x = tf.zeros([4, 2])
    with pytest.raises(ValueError, match=r"gradient_penalty: unknown noise key\(s\) "
                                         r"\['interpolations'\]"):
        gan.gradient_penalty(critic, x, x, noise={"interpolations": tf.ones([4])})
    with pytest.raises(TypeError, match="r1_penalty: noise must be a dict"):
        gan.r1_penalty(critic, x, x, noise=tf.ones([4]))
    with pytest.raises(ValueError, match=r"dragan_penalty: noise\['perturbation'\] must have "
                                         r"the shape of real"):
        gan.dragan_penalty(critic, x, x, noise={"perturbation": tf.ones([4, 3])})
    with pytest.raises(ValueError, match="real and fake must have the same shape"):
        gan.dragan_penalty(critic, x, tf.zeros([3, 2]))
    step = gan.make_gan_step(gen, critic, sgd(), sgd(), 2, n_critic=1)
    with pytest.raises(ValueError, match="a batch dict needs the key 'real'"):
        step.critic_step({"x": x})


@pytest.mark.parametrize("shape", [(3,), (4, 4, 2)])
def test_each_gp_interpolate_lies_on_the_segment_between_its_real_and_fake_example(shape):
    """One weight e_i per example: x_hat_i - fake_i = e_i (real_i - fake_i), 0 <= e_i <= 1
    (a weight per element would leave the segment)."""
    seen = []

    def critic(x):
        seen.append(x.numpy())
        return half_squared_norm(x)
    real = tf.random.stateless_normal((16,) + shape, (6, 0), dtype=tf.float64)
    fake = tf.random.stateless_normal((16,) + shape, (6, 1), dtype=tf.float64)
    gp = gan.gradient_penalty(critic, real, fake)
    (x_hat,) = seen
    d = (real - fake).numpy().reshape(16, -1)
    r = (x_hat - fake.numpy()).reshape(16, -1)
    e = np.sum(r * d, axis=1) / np.sum(d * d, axis=1)
    np.testing.assert_allclose(r, e[:, None] * d, atol=1e-12)
    assert np.all((e >= 0) & (e <= 1)) and len(np.unique(e)) == 16
    norms = np.linalg.norm(x_hat.reshape(16, -1), axis=1)  # grad of ||x||^2 / 2 is x
    np.testing.assert_allclose(float(gp), np.mean((norms - 1) ** 2), rtol=1e-12)


def test_trainer_and_gp_arguments_are_checked():
    keras.utils.set_random_seed(0)
    gen = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    critic = small_critic()
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    sgd = keras.optimizers.SGD
    with pytest.raises(ValueError, match="the critic has no trainable variables"):
        gan.make_gan_step(gen, unbuilt, sgd(), sgd(), 2)
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
        gan.make_gan_step(gen, critic, sgd(), sgd(), 2,
                          critic_penalties=[(gan.gradient_penalty, -1.0, 1)])
    step = gan.make_gan_step(gen, critic, sgd(), sgd(), 2, n_critic=2)
    with pytest.raises(TypeError, match="tuple of 2 real batches"):
        step(tf.zeros([2, 2]))  # two rows, not two batches
    with pytest.raises(ValueError, match=r"one weight per example, shape \[4\], got \(4, 2\)"):
        gan.gradient_penalty(critic, tf.zeros([4, 2]), tf.ones([4, 2]),
                             noise={"interpolation": tf.fill([4, 2], 0.5)})
