"""The GAN trainer `make_gan_step`: each recipe's call against a hand-written step in
float64 (the losses, penalties, spectral normalization and path length written out with
their own tapes, SGD by hand); the lazy factor and interval; n_critic; the noise keys;
XLA ("auto") against plain; two replicas against one device; bad input; the binary."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, distribute, gan

F64 = tf.float64
LR = 2.0 ** -5  # SGD's rate, held exactly by Keras's float32 copy


def shifted(x):
    """bCR's augmentation in these tests: deterministic, so the hand step can repeat it."""
    return 0.9 * x + 0.1


def bcr(critic, real, fake, *, noise=None):
    return gan.consistency_penalty(critic, real, fake, augment=shifted, noise=noise)


def models(spectral, dtype="float64", seed=0):
    keras.utils.set_random_seed(seed)
    wrap = (lambda layer: gan.SpectralNormalization(layer, dtype=dtype)) if spectral else \
        (lambda layer: layer)
    critic = keras.Sequential([keras.Input((2,), dtype=dtype),
                               wrap(keras.layers.Dense(4, activation="tanh", dtype=dtype)),
                               wrap(keras.layers.Dense(1, dtype=dtype))])
    generator = keras.Sequential([keras.Input((2,), dtype=dtype),
                                  keras.layers.Dense(2, dtype=dtype)])
    return generator, critic


def batches(n, dtype=F64, size=8):
    real = tf.data.Dataset.range(n).map(
        lambda i: tf.random.stateless_normal([size, 2], [i, 7], dtype=dtype) + 1.0)
    return [b for b in gan.with_noise(real, latent_dim=2, seed=3)]


# ---- the hand-written step ----------------------------------------------------------------

def unit(x):
    return x / tf.norm(x)


def normalized(w, u):
    v = tf.stop_gradient(unit(tf.linalg.matvec(w, u)))
    return w / tf.norm(tf.linalg.matvec(w, v, transpose_a=True))


def critic_fn(p, us, x):
    w1, b1, w2, b2 = p
    if us is not None:
        w1, w2 = normalized(w1, us[0]), normalized(w2, us[1])
    return tf.reshape(tf.tanh(x @ w1 + b1) @ w2 + b2, [-1])


def gen_fn(q, z):
    return z @ q[0] + q[1]


def squared_grad(d, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        s = tf.reduce_sum(d(x))
    return tf.reduce_sum(tf.square(tape.gradient(s, x)), axis=1)


mean, softplus = tf.reduce_mean, tf.nn.softplus
LOSSES = {  # (critic, generator) of (real scores, fake scores)
    "wasserstein": (lambda r, f: mean(f) - mean(r), lambda r, f: -mean(f)),
    "nonsaturating": (lambda r, f: mean(softplus(-r)) + mean(softplus(f)),
                      lambda r, f: mean(softplus(-f))),
    "relativistic": (lambda r, f: mean(softplus(f - r)), lambda r, f: mean(softplus(r - f)))}


def gp(d, real, fake, b):
    e = b["interpolation"][:, None]
    return mean(tf.square(tf.sqrt(squared_grad(d, e * real + (1 - e) * fake)) - 1.0))


CRITIC_PENALTIES = {
    "gp": (gan.gradient_penalty, gp),
    "r1": (gan.r1_penalty, lambda d, real, fake, b: mean(squared_grad(d, real))),
    "r2": (gan.r2_penalty, lambda d, real, fake, b: mean(squared_grad(d, fake))),
    "bcr": (bcr, lambda d, real, fake, b: mean(tf.square(d(real) - d(shifted(real))))
            + mean(tf.square(d(fake) - d(shifted(fake))))),
}


def path_length(q, z, state, b):  # decay 0.01, every 2nd row, pixels = 2
    w, y = z[::2], b["path_length"][::2] / np.sqrt(2.0)
    with tf.GradientTape() as tape:
        tape.watch(w)
        s = tf.reduce_sum(gen_fn(q, w) * y)
    lengths = tf.norm(tape.gradient(s, w), axis=1)
    a = state + 0.01 * (mean(lengths) - state)
    return mean(tf.square(lengths - a)), tf.stop_gradient(a)


def zcr(q, z, state, b):  # scale 0.03
    moved = gen_fn(q, z + 0.03 * b["latent_perturbation"])
    return -mean(tf.reduce_sum(tf.square(gen_fn(q, z) - moved), axis=1)), state


GENERATOR_PENALTIES = {"path_length": (gan.path_length_penalty, path_length),
                       "zcr": (gan.latent_consistency_penalty, zcr)}


def hand_call(recipe, w, calls):
    """`calls` calls of the recipe's step from the weights `w` (p, q, us, a, iterations)."""
    p, q, us, a, ic, ig = w
    loss_c, loss_g = LOSSES[recipe["loss"]]
    for group in calls:
        for b in group:
            if us is not None:
                us = [unit(tf.linalg.matvec(m, unit(tf.linalg.matvec(m, u)), transpose_a=True))
                      for m, u in zip((p[0], p[2]), us)]
            with tf.GradientTape() as tape:
                tape.watch(p)
                d = lambda x: critic_fn(p, us, x)  # noqa: E731
                fake = gen_fn(q, b["z"])
                total = loss_c(d(b["real"]), d(fake))
                for name, weight, every in recipe["critic"]:
                    if ic % every == 0:
                        total += weight * every * CRITIC_PENALTIES[name][1](d, b["real"], fake, b)
            p = [v - LR * g for v, g in zip(p, tape.gradient(total, p))]
            ic += 1
        b = group[-1]
        with tf.GradientTape() as tape:
            tape.watch(q)
            d = lambda x: critic_fn(p, us, x)  # noqa: E731
            total = loss_g(d(b["real"]), d(gen_fn(q, b["z"])))
            new_a = a
            for name, weight, every in recipe["generator"]:
                if ig % every == 0:
                    value, state = GENERATOR_PENALTIES[name][1](q, b["z"], a, b)
                    total += weight * every * value
                    new_a = state if name == "path_length" else new_a
        q = [v - LR * g for v, g in zip(q, tape.gradient(total, q))]
        a, ig = new_a, ig + 1
    return p, q, us, a, ic, ig


RECIPES = {
    "wgan_gp_cr": {"loss": "wasserstein", "critic": [("gp", 0.5, 1), ("bcr", 2.0, 1)],
                   "generator": [("zcr", 0.7, 1)], "n_critic": 2, "spectral": False},
    # lazy R1 and path length: due on the updates 0, 2, 4, ... of their player
    "ns_r1_sn_lazy": {"loss": "nonsaturating", "critic": [("r1", 0.3, 2)],
                      "generator": [("path_length", 0.5, 2)], "n_critic": 3, "spectral": True},
    "rpgan_r1_r2_cr_sn": {"loss": "relativistic",
                          "critic": [("r1", 0.3, 1), ("r2", 0.2, 1), ("bcr", 1.5, 1)],
                          "generator": [("path_length", 0.5, 1), ("zcr", 0.4, 1)],
                          "n_critic": 2, "spectral": True},
}


def build(recipe, generator, critic, jit_compile=False, strategy=None, loss=None):
    losses = {"wasserstein": gan.wasserstein_loss, "nonsaturating": gan.nonsaturating_loss,
              "relativistic": gan.relativistic_loss}
    sgd = keras.optimizers.SGD
    with (strategy or tf.distribute.get_strategy()).scope():
        opts = sgd(LR), sgd(LR)
    return gan.make_gan_step(
        generator, critic, *opts, 2, loss=loss or losses[recipe["loss"]],
        critic_penalties=[(CRITIC_PENALTIES[n][0], w, e) for n, w, e in recipe["critic"]],
        generator_penalties=[(GENERATOR_PENALTIES[n][0](), w, e)
                             for n, w, e in recipe["generator"]],
        n_critic=recipe["n_critic"], strategy=strategy, jit_compile=jit_compile)


def weights(generator, critic, step):
    us = [layer.vector_u for layer in gan.spectral_layers(critic)]
    state = [v for values in step.generator_state.penalties.values() for v in values.values()]
    return [v.numpy() for v in critic.trainable_variables + generator.trainable_variables
            + us + state]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_takes_the_hand_written_step_in_float64(name):
    """Two calls (n_critic critic updates, then the generator's) agree with the step
    written out by hand to 1e-12: the loss's critic and generator terms (the generator's
    with D(real)), each penalty at its weight and its points, the lazy factor on the due
    updates only, the power iteration once per critic update, the path-length mean kept
    on the skipped steps, the batch's noise keys."""
    recipe = RECIPES[name]
    generator, critic = models(recipe["spectral"])
    step = build(recipe, generator, critic)
    n = recipe["n_critic"]
    data = batches(2 * n)
    calls = [tuple(data[k * n:(k + 1) * n]) for k in range(2)]
    us = [tf.convert_to_tensor(layer.vector_u) for layer in gan.spectral_layers(critic)] \
        if recipe["spectral"] else None
    start = ([tf.convert_to_tensor(v) for v in critic.trainable_variables],
             [tf.convert_to_tensor(v) for v in generator.trainable_variables], us,
             tf.constant(0.0, F64), 0, 0)
    hand = start
    for batch_group in calls:
        logs = step(batch_group)
        hand = hand_call(recipe, hand, [batch_group])
        p, q, us, a, _, _ = hand
        expected = [t.numpy() for t in p + q + (us or [])]
        if any(n == "path_length" for n, _, _ in recipe["generator"]):
            expected.append(a.numpy())
        got = weights(generator, critic, step)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-13)
    assert float(logs["critic/applied"]) == 1.0 and logs["critic/loss"].dtype == F64
    assert {f"critic/{n}" for n in ("adversarial",)} <= set(logs)


def test_auto_compiles_equals_plain_in_float64_and_traces_once(monkeypatch):
    """The power iteration's Python call runs once per trace of the whole call (twice:
    n_critic): counted, it shows one trace over three calls."""
    recipe = {"loss": "relativistic", "critic": [("r1", 0.3, 2)], "generator": [],
              "n_critic": 2, "spectral": True}
    traces = []
    advance = gan.advance_power_iteration
    monkeypatch.setattr(gan.spectral, "advance_power_iteration",
                        lambda model: traces.append(1) or advance(model))
    data = batches(6)
    calls = [tuple(data[2 * i:2 * i + 2]) for i in range(3)]
    result = {}
    for jit in ("auto", False):
        generator, critic = models(True)
        step = build(recipe, generator, critic, jit_compile=jit)
        for group in calls:
            step(group)
        assert len(traces) == 2  # one trace, two critic updates in it
        traces.clear()
        result[jit] = weights(generator, critic, step)
    for a, b in zip(result["auto"], result[False]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def host_zero(critic, real, fake, *, noise=None):
    """A penalty XLA cannot compile (a host function): zero."""
    return tf.reshape(tf.numpy_function(lambda: np.float32(0.0), [], tf.float32), [])


def test_auto_falls_back_to_plain_once_where_xla_refuses(caplog):
    recipe = dict(RECIPES["wgan_gp_cr"], critic=[("gp", 0.5, 1)], generator=[], n_critic=1)
    data = batches(2, tf.float32)
    result = {}
    for jit in ("auto", False):
        generator, critic = models(False, "float32")
        sgd = keras.optimizers.SGD
        step = gan.make_gan_step(generator, critic, sgd(LR), sgd(LR), 2,
                                 critic_penalties=[(gan.gradient_penalty, 0.5, 1),
                                                   (host_zero, 1.0, 1)],
                                 n_critic=recipe["n_critic"], jit_compile=jit)
        with caplog.at_level("WARNING"):
            for b in data:
                step((b,))
        result[jit] = weights(generator, critic, step)
    warned = [r for r in caplog.records if "runs a plain tf.function, not XLA" in r.getMessage()]
    assert len(warned) == 1 and "make_gan_step.jit_compile = False" in warned[0].getMessage()
    for a, b in zip(result["auto"], result[False]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(Exception, match="XLA|compile"):
        generator, critic = models(False, "float32")
        gan.make_gan_step(generator, critic, keras.optimizers.SGD(LR), keras.optimizers.SGD(LR),
                          2, critic_penalties=[(host_zero, 1.0, 1)], n_critic=1,
                          jit_compile=True)((data[0],))


def test_two_replicas_equal_one_device():
    """The batches, their latent codes and every penalty's noise sharded by the strategy;
    the path-length mean all-reduced; the power iteration once per update."""
    recipe = dict(RECIPES["rpgan_r1_r2_cr_sn"], critic=[("r2", 0.2, 2)],
                  generator=[("path_length", 0.5, 2)])
    data = gan.with_noise(tf.data.Dataset.range(4).map(
        lambda i: tf.random.stateless_normal([8, 2], [i, 7], dtype=F64) + 1.0), 2, seed=3)
    out = []
    for strategy in (distribute.make_strategy("mirrored"), tf.distribute.get_strategy()):
        assert strategy.num_replicas_in_sync in (1, 2)
        with strategy.scope():
            generator, critic = models(True)
        step = build(recipe, generator, critic, strategy=strategy)
        it = iter(distribute.distribute_dataset(strategy, data))
        for _ in range(2):
            step(next(gan.grouped(it, 2)))
        out.append(weights(generator, critic, step))
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_bad_input_names_the_binding():
    generator, critic = models(False, "float32")
    sgd = keras.optimizers.SGD
    cases = [
        (dict(critic_penalties=[(gan.r1_penalty, 0.1, 0)]),
         r"make_gan_step.critic_penalties\[0\]: lazy_every must be"),
        (dict(critic_penalties=[(gan.r1_penalty, -0.1, 1)]),
         r"make_gan_step.critic_penalties\[0\]: weight must be a finite number >= 0"),
        (dict(loss="hinge"), "make_gan_step.loss must be a GAN loss function"),
        (dict(loss=lambda scores: scores), r"must take \(real_scores, fake_scores\)"),
        (dict(critic_penalties=[(gan.r1_penalty, 0.1)]), r"critic_penalties\[0\] must be a "
                                                          r"\(penalty, weight, lazy_every\)"),
        (dict(generator_penalties=[(gan.path_length_penalty, 1.0, 1)]),
         r"generator_penalties\[0\]: the penalty must be a GeneratorPenalty.*"
         r"@path_length_penalty\(\)"),
        (dict(generator_penalties=[(gan.path_length_penalty(), 1.0, 0)]),
         r"generator_penalties\[0\]: lazy_every must be"),
        (dict(critic_penalties=[(lambda critic, real: 0.0, 1.0, 1)]),
         r"must take \(critic, real, fake, \*, noise\)"),
        (dict(jit_compile="yes"), "make_gan_step.jit_compile must be True, False or 'auto'"),
        (dict(n_critic=0), "n_critic"),
    ]
    for kwargs, message in cases:
        with pytest.raises((checks.ArgumentError, TypeError), match=message):
            gan.make_gan_step(generator, critic, sgd(), sgd(), 2, **kwargs)
    step = gan.make_gan_step(generator, critic, sgd(), sgd(), 2, n_critic=1,
                             jit_compile=False)
    with pytest.raises(ValueError, match=r"unknown batch key\(s\) \['noise'\]"):
        step.critic_step({"real": tf.zeros([4, 2]), "noise": tf.zeros([4])})


def test_an_unknown_loss_in_gin_is_refused_naming_it(tmp_path):
    from experiments import gan as binary
    from hogrod import harness
    code = harness.run_cli(binary.gan_experiment,
                           ["configs/gan/twentyfive_gaussians/ns_r1.gin"],
                           ["make_gan_step.loss = @hinge_loss"], str(tmp_path / "run"))
    assert code == 2 and not (tmp_path / "run").exists()


def test_the_binary_runs_a_recipe_and_resumes_exactly(tmp_path):
    """4 generator steps at once equal 2, then 2 more in the same directory (the model,
    optimizers, data iterator with its noise, and the path-length state restored)."""
    from experiments import gan as binary
    from hogrod import harness
    config = ["configs/gan/twentyfive_gaussians/rpgan_r1_r2_sn.gin"]
    tiny = ["gan_experiment.width = 8", "gan_experiment.batch_size = 16",
            "gan_experiment.eval_samples = 200", "gan_experiment.eval_every = 2",
            "gan_experiment.checkpoint_every = 2",
            "make_gan_step.generator_penalties = [(@path_length_penalty(), 0.5, 1)]",
            "make_gan_step.jit_compile = False"]  # XLA's compile: the auto test's
    _, once = harness.run(binary.gan_experiment, config,
                          tiny + ["gan_experiment.generator_steps = 4"], str(tmp_path / "a"))
    _, half = harness.run(binary.gan_experiment, config,
                          tiny + ["gan_experiment.generator_steps = 2"], str(tmp_path / "b"))
    assert half["generator_steps"] == 2
    refused = harness.run_cli(binary.gan_experiment, config,
                              tiny + ["gan_experiment.generator_steps = 4"], str(tmp_path / "b"))
    assert refused == 2  # a changed config, without --allow_config_change
    _, twice = harness.run(binary.gan_experiment, config,
                           tiny + ["gan_experiment.generator_steps = 4"], str(tmp_path / "b"),
                           allow_config_change=True)
    assert once["generator_steps"] == twice["generator_steps"] == 4
    for key in ("final_train_loss", "final_train_generator/loss", "modes_covered",
                "high_quality_percent", "reverse_kl"):
        assert once[key] == twice[key], key
    assert [h["step"] for h in twice["history"]] == [0, 2, 4]
    assert (tmp_path / "b" / "samples_000004.png").exists()
