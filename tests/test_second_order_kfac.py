"""The K-FAC step optimizer (`hogrod.second_order.kfac`), float64.

Oracles: on linear least squares the type-2 factors are exact, so one step with rate 1 and
damping 1e-16 lands on numpy.linalg.lstsq's solution, and the quadratic model is exact
(rho = 1); the preconditioned gradient of a 2-layer MLP against a dense numpy solve with
(A + pi sqrt(d) I) (x) (G + sqrt(d)/pi I), its factors against their closed forms (A of
the first layer from the inputs, G of the linear output layer (2/K) I); the running
average against kfac-jax's weighted-average formula; the damping against the
Levenberg-Marquardt formula on the reduction ratios the steps logged; the exact diagonal
of a LayerNormalization's curvature against a dense Gauss-Newton diagonal; MirroredStrategy
on two logical CPUs against one device; a resumed run against an uninterrupted one.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, curvature, distribute, second_order, train
from hogrod.curvature.data import batch_loss
from hogrod.second_order import common

MSE = keras.losses.MeanSquaredError(dtype="float64")


def objective_of(model):
    return lambda batch: batch_loss(MSE, batch[1], model(batch[0], training=True))


def regression(n=32, d=3, k=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = np.tanh(x @ rng.normal(size=(d, k))) + 0.5 + 0.1 * rng.normal(size=(n, k))
    return tf.constant(x), tf.constant(y)


def mlp(strategy=None, hidden=4, norm=False, seed=0, d=3):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        layers = [keras.Input((d,), dtype="float64"),
                  keras.layers.Dense(hidden, activation="tanh", dtype="float64", name="hidden")]
        if norm:
            layers.append(keras.layers.LayerNormalization(dtype="float64", name="norm"))
        layers.append(keras.layers.Dense(2, dtype="float64", name="out"))
        return keras.Sequential(layers)


def stepper(model, strategy=None, **kw):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        opt = second_order.kfac(model, MSE, **kw)
    step = train.make_train_step(objective_of(model), opt, model.trainable_variables,
                                 strategy=strategy)
    return opt, step


def floats(logs):
    return {k: float(v) for k, v in logs.items()}


def test_one_step_on_linear_least_squares_lands_on_lstsq_and_its_model_is_exact():
    x, y = regression()
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(2, dtype="float64")])
    _, step = stepper(model, learning_rate=1.0, damping=1e-16, min_damping=0.0,
                      damping_adaptation_interval=1)
    logs = floats(step((x, y)))
    xs = np.hstack([x.numpy(), np.ones((x.shape[0], 1))])
    sol = np.linalg.lstsq(xs, y.numpy(), rcond=None)[0]
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), sol[:3], atol=1e-6)
    np.testing.assert_allclose(model.trainable_variables[1].numpy(), sol[3], atol=1e-6)
    # a quadratic objective: the Gauss-Newton model is exact, rho = 1, the damping shrinks
    assert logs["rho"] == pytest.approx(1.0, abs=1e-8)
    assert logs["damping"] == 1e-16 and logs["lr"] == 1.0 and logs["momentum"] == 0.0


def flat(model):
    return np.concatenate([v.numpy().reshape(-1) for v in model.trainable_variables])


def test_adaptive_rate_and_momentum_minimize_the_damped_quadratic_model():
    """kfac-jax's adaptive mode: the update delta = alpha p + beta v minimizes the damped
    exact model g^T d + 1/2 d^T (C + lambda I) d over the span of the preconditioned
    gradient p and the previous update v, so the model's gradient r = g + (C + lambda I)
    delta is orthogonal to v and to delta (the span): checked with the dense Gauss-Newton
    matrix, no K-FAC factor needed. On least squares the span holds Newton's step: rate 1."""
    x, y = regression()
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(2, dtype="float64")])
    _, step = stepper(model, damping=1e-16, min_damping=0.0, adaptive=True)
    logs = floats(step((x, y)))
    xs = np.hstack([x.numpy(), np.ones((x.shape[0], 1))])
    sol = np.linalg.lstsq(xs, y.numpy(), rcond=None)[0]
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), sol[:3], atol=1e-6)
    assert logs["lr"] == pytest.approx(1.0, abs=1e-6)

    model = mlp()
    _, step = stepper(model, damping=0.1, adaptive=True, inverse_every=1, adapt_damping=False)
    start = flat(model)
    for seed in (1, 2, 3):
        batch = regression(seed=seed)
        before = flat(model)
        with tf.GradientTape() as tape:
            value = objective_of(model)(batch)
        g = np.concatenate([t.numpy().reshape(-1) for t in
                            tape.gradient(value, model.trainable_variables)])
        gn = curvature.GaussNewtonOperator(model, MSE, batch).to_dense().numpy()
        logs = floats(step(batch))
        delta = flat(model) - before
        r = g + (gn + logs["damping"] * np.eye(len(g))) @ delta
        scale = np.linalg.norm(g) * np.linalg.norm(delta)
        assert abs(r @ delta) <= 1e-9 * scale
        if seed > 1:
            previous = before - start
            assert abs(r @ previous) <= 1e-9 * np.linalg.norm(g) * np.linalg.norm(previous)
            assert logs["momentum"] != 0.0
        start = before


def dense_step(a, g, grads, damping):
    """-(A + pi sqrt(d) I) (x) (G + sqrt(d)/pi I) \\ vec(V), V = [kernel grad; bias grad]."""
    v = np.vstack([grads[0], grads[1][None]])
    pi = math.sqrt((np.trace(a) / len(a)) / (np.trace(g) / len(g)))
    root = math.sqrt(damping)
    m = np.kron(a + pi * root * np.eye(len(a)), g + root / pi * np.eye(len(g)))
    return -np.linalg.solve(m, v.reshape(-1)).reshape(v.shape)


def test_preconditioned_gradient_factors_and_running_average_on_an_mlp():
    (x1, y1), (x2, y2) = regression(seed=1), regression(seed=2)
    model = mlp()
    damping, decay = 0.1, 0.5
    opt, step = stepper(model, learning_rate=1.0, damping=damping, decay=decay,
                        inverse_every=1, adapt_damping=False)
    before = [v.numpy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        value = objective_of(model)((x1, y1))
    grads = [g.numpy() for g in tape.gradient(value, model.trainable_variables)]
    step((x1, y1))
    after = [v.numpy() for v in model.trainable_variables]
    factors = [[f.numpy() for f in fs] for fs in opt.factors]
    # the first average is the first batch's factors: closed forms
    xs = np.hstack([x1.numpy(), np.ones((len(x1), 1))])
    np.testing.assert_allclose(factors[0][0], xs.T @ xs / len(xs), rtol=1e-12)
    np.testing.assert_allclose(factors[1][1], np.eye(2), rtol=1e-12)  # (2/K) I, K = 2
    for layer, (a, g) in enumerate(factors):
        want = dense_step(a, g, grads[2 * layer:2 * layer + 2], damping)
        got = np.vstack([after[2 * layer] - before[2 * layer],
                         (after[2 * layer + 1] - before[2 * layer + 1])[None]])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # the second average: kfac-jax's weighted average (decay A_1 + A_2) / (decay + 1)
    step((x2, y2))
    xs2 = np.hstack([x2.numpy(), np.ones((len(x2), 1))])
    np.testing.assert_allclose(opt.factors[0][0].numpy(),
                               (decay * factors[0][0] + xs2.T @ xs2 / len(xs2)) / (decay + 1),
                               rtol=1e-12)


def lm_rule(damping, rho, factor, low, high):
    if not math.isfinite(rho) or rho < common.LOWER:
        damping = damping / factor
    elif rho > common.UPPER:
        damping = damping * factor
    return min(max(damping, low), high)


def test_levenberg_marquardt_on_scripted_ratios_and_in_kfac():
    damping = tf.constant(1.0, tf.float64)
    for rho in [0.9, 0.5, 0.1, float("nan"), float("inf"), -3.0, 0.8, 0.76, 0.24, 0.25, 0.75]:
        want = lm_rule(float(damping), rho, 0.5, 0.3, 3.0)
        damping = common.levenberg_marquardt(damping, tf.constant(rho, tf.float64), 0.5,
                                             0.3, 3.0)
        assert float(damping) == want
    # in K-FAC: the next step's damping is the rule applied to this step's rho, every
    # second step, with damping_decay ** interval
    x, y = regression()
    model = mlp(hidden=6)
    _, step = stepper(model, learning_rate=1.0, damping=1e-2, damping_adaptation_interval=2,
                      damping_decay=0.8, inverse_every=2)
    logs = [floats(step((x, y))) for _ in range(6)]
    for t in range(5):
        want = logs[t]["damping"]
        if t % 2 == 1:
            want = lm_rule(want, logs[t]["rho"], 0.8 ** 2, 1e-8, math.inf)
        assert logs[t + 1]["damping"] == pytest.approx(want, rel=1e-12)
    assert len({log["damping"] for log in logs}) > 1


def layer_norm_diagonal(model, x):
    """The dense Gauss-Newton diagonal of the mean MSE over the LayerNormalization's
    weights: H = 2/(N K) I on the outputs."""
    norm = model.get_layer("norm")
    with tf.GradientTape(persistent=True) as tape:
        z = tf.reshape(model(x, training=True), [-1])
    jac = [tape.jacobian(z, v) for v in norm.trainable_variables]
    return [2 / int(z.shape[0]) * tf.reduce_sum(tf.square(j), 0).numpy() for j in jac]


def run_mirrored(strategy, steps=3):
    x, y = regression(n=16)
    model = mlp(strategy, norm=True)
    opt, step = stepper(model, strategy, learning_rate=1.0, damping=1e-2, adaptive=True,
                        damping_adaptation_interval=2, inverse_every=2,
                        other_layers="diagonal")
    data = distribute.distribute_dataset(
        strategy, tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat())
    it = iter(data)
    first_norm = None
    logs = []
    for i in range(steps):
        if i == 0:
            first_norm = layer_norm_diagonal(model, x)
        logs.append(floats(step(next(it))))
        if i == 0:
            diag = [d.numpy() for d in opt.factors[1]]
    return [v.numpy() for v in model.trainable_variables], logs, diag, first_norm


def test_two_replicas_step_as_one_device_and_the_diagonal_is_exact():
    one, logs_one, diag, dense = run_mirrored(tf.distribute.get_strategy())
    for d, want in zip(diag, dense):  # the first average: the batch's exact diagonal
        np.testing.assert_allclose(d, want, rtol=1e-10)
    two, logs_two, _, _ = run_mirrored(distribute.make_strategy("mirrored"))
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    for a, b in zip(logs_one, logs_two):
        for key in ("loss", "lr", "momentum", "damping", "rho"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
    assert logs_one[1]["momentum"] != 0.0 and logs_one[0]["lr"] != 1.0  # adapted


def test_a_resumed_run_takes_the_steps_of_an_uninterrupted_one(tmp_path):
    x, y = regression()
    kw = dict(learning_rate=0.5, momentum=0.5, fisher="mc", inverse_every=3,
              damping_adaptation_interval=2)

    def fresh():
        model = mlp(seed=3)
        opt, step = stepper(model, **kw)
        return model, opt, step

    model, opt, step = fresh()
    for _ in range(4):
        want = floats(step((x, y)))
    model, opt, step = fresh()
    ckpt = train.Checkpointer(str(tmp_path), model=model, optimizer=opt)
    for _ in range(2):
        step((x, y))
    ckpt.save()
    model, opt, step = fresh()
    ckpt = train.Checkpointer(str(tmp_path), model=model, optimizer=opt)
    ckpt.restore()
    for _ in range(2):
        got = floats(step((x, y)))
    assert got == want


@pytest.mark.parametrize("kw,match", [
    (dict(learning_rate=0.0), "learning_rate"), (dict(damping=-1e-3), "damping"),
    (dict(decay=1.0), "decay"), (dict(decay=0.0), "decay"), (dict(fisher="gn"), "fisher"),
    (dict(inverse_every=0), "inverse_every"), (dict(other_layers="skip"), "other_layers"),
    (dict(damping_decay=1.5), "damping_decay"), (dict(mc_samples=0), "mc_samples"),
    (dict(damping=0.0), "damping \\+ l2_reg must be > 0"),
    (dict(damping=2.0, max_damping=1.0), "damping must be <= max_damping")])
def test_bad_hyperparameters_are_named(kw, match):
    with pytest.raises(checks.ArgumentError, match=match):
        second_order.kfac(mlp(), MSE, **kw)


def test_what_kfac_refuses():
    with pytest.raises(checks.ArgumentError, match="model 'norm_only' has no layer K-FAC"):
        model = keras.Sequential([keras.Input((3,), dtype="float64"),
                                  keras.layers.LayerNormalization(dtype="float64")],
                                 name="norm_only")
        second_order.kfac(model, MSE, other_layers="diagonal")
    with pytest.raises(ValueError, match="layer 'norm' .*other_layers='diagonal'"):
        second_order.kfac(mlp(norm=True), MSE)
    with pytest.raises(ValueError, match="loss Huber"):
        second_order.kfac(mlp(), keras.losses.Huber(dtype="float64"))
    with pytest.raises(TypeError, match="loss must be a Keras loss"):
        second_order.kfac(mlp(), lambda y, z: tf.reduce_mean((y - z) ** 2))
    with pytest.raises(ValueError, match="loss must be a mean"):
        second_order.kfac(mlp(), keras.losses.MeanSquaredError(reduction="sum",
                                                               dtype="float64"))
    model = mlp()
    with pytest.raises(ValueError, match="exactly model.trainable_variables"):
        train.make_train_step(objective_of(model), second_order.kfac(model, MSE),
                              model.trainable_variables[:2])


def test_half_precision_models_keep_float32_factors():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), dtype="bfloat16"),
                              keras.layers.Dense(4, dtype="bfloat16"),
                              keras.layers.BatchNormalization(dtype="bfloat16"),
                              keras.layers.Dense(2, dtype="bfloat16")])
    loss = keras.losses.MeanSquaredError(dtype="bfloat16")
    opt = second_order.kfac(model, loss, learning_rate=0.5, other_layers="diagonal")
    x, y = regression()
    step = train.make_train_step(
        lambda b: batch_loss(loss, b[1], model(b[0])), opt, model.trainable_variables)
    logs = floats(step((tf.cast(x, tf.bfloat16), tf.cast(y, tf.bfloat16))))
    assert all(f.dtype == tf.float32 for fs in opt.factors for f in fs)
    assert all(math.isfinite(v) for v in logs.values())
    assert all(np.all(np.isfinite(d)) and np.any(d > 0) for d in opt.factors[1])  # BatchNorm's
