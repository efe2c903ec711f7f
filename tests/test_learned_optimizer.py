"""hogrod.learned's learned optimizers and task family.

Oracles: a numpy reimplementation of the MLP optimizer's documented update (features,
normalization, MLP, step) over a few steps; the same update eagerly and under
`tf.function` (one trace for new theta values); float64 central differences for the
gradients in theta (the MLP optimizer's and both schedules'); the documented bound on the
first steps; hand-written loops for `meta.adapt`, `hypergrad.unrolled` and
`train.make_train_step` with the learned optimizer (and a hand-built theta that descends,
so a tiny problem trains); numpy's `interp` and the persistent_es and optax schedule
formulas for the rates; `optim.learnable(sgd)` for a one-knot schedule; sklearn's digits
labels for the task family's class subsets; a Python loop over particles for the
vectorized map; errors naming each bad argument.
"""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from hogrod import checks, hypergrad, meta, optim, train
from hogrod.learned import (LearnedOptimizer, MLPOptimizerState, digits_mlp, feature_count,
                            learned_schedule, mlp_optimizer, optimizer_problem, task_seed,
                            training_curves)
from conftest import central_differences

F64 = tf.float64
SMALL = dict(hidden_size=3, hidden_layers=1, decays=(0.5, 0.9), second_moment_decay=0.8,
             step_mult=0.01, exp_mult=0.3, timescales=(1.0, 10.0), dtype="float64")


def small_mlp(**overrides):
    return mlp_optimizer(**{**SMALL, **overrides})


def random_theta(lopt, seed=0, scale=0.5):
    """A generic theta: random kernels and biases (no unit sits on a ReLU kink)."""
    rng = np.random.default_rng(seed)
    return tf.nest.map_structure(
        lambda s: tf.constant(scale * rng.normal(size=s.shape.as_list()), s.dtype), lopt.spec)


def params_and_grads(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    params = [tf.constant(rng.normal(size=(3, 2))), tf.constant(rng.normal(size=(2,))),
              tf.constant(rng.normal(), F64)]
    grads = [[tf.constant(scale * rng.normal(size=p.shape)) for p in params]
             for _ in range(3)]
    return params, grads


# ---- the MLP optimizer against numpy ------------------------------------------------------

def numpy_update(theta, config, params, grads, momenta, second, count):
    """The module docstring's update, in numpy float64."""
    d = np.asarray(config["decays"])
    b, k = config["second_moment_decay"], len(d)
    out_p, out_m, out_v = [], [], []
    for p, g, m, v in zip(params, grads, momenta, second):
        p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
        gf, pf = g.reshape(-1), p.reshape(-1)
        m = d * m.reshape(-1, k) + (1 - d) * gf[:, None]
        v = b * v.reshape(-1) + (1 - b) * gf ** 2
        f = np.column_stack([gf, pf, m, v, m / np.sqrt(v[:, None] + 1e-6)])
        f = f / np.sqrt(1e-5 + np.mean(f ** 2, axis=0))
        emb = np.tanh(count / np.asarray(config["timescales"]) - 1)
        h = np.column_stack([f, np.tile(emb, (len(gf), 1))])
        for i, layer in enumerate(theta):
            h = h @ np.asarray(layer["kernel"]) + np.asarray(layer["bias"])
            if i < len(theta) - 1:
                h = np.maximum(h, 0)
        step = config["step_mult"] * h[:, 0]
        if config["adam_learning_rate"]:  # Adam's step, as keras.optimizers.Adam's docs
            t = count + 1
            m1 = m[:, list(config["decays"]).index(0.9)]
            step = step + (config["adam_learning_rate"] * np.sqrt(1 - b ** t) / (1 - 0.9 ** t)
                           * m1 / (np.sqrt(v) + 1e-7))
        step = step * np.exp(config["exp_mult"] * h[:, 1])
        out_p.append(p - step.reshape(p.shape))
        out_m.append(m.reshape(p.shape + (k,)))
        out_v.append(v.reshape(p.shape))
    return out_p, out_m, out_v


@pytest.mark.parametrize("adam_learning_rate", [0.0, 0.05])
def test_the_update_is_the_documented_formula_in_float64(adam_learning_rate):
    lopt = small_mlp(adam_learning_rate=adam_learning_rate)
    theta = random_theta(lopt)
    opt = lopt.optimizer(theta)
    params, grads = params_and_grads()
    state = opt.init(params)
    want_p = [p.numpy() for p in params]
    want_m = [np.asarray(m) for m in state.momenta]
    want_v = [np.asarray(v) for v in state.second_moment]
    for t, g in enumerate(grads):
        params, state = opt.update(g, state, params)
        want_p, want_m, want_v = numpy_update(theta, lopt.config, want_p, g, want_m, want_v, t)
        for got, want in zip(params + state.momenta + state.second_moment,
                             want_p + want_m + want_v):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
    assert int(state.count) == 3 and params[2].shape == ()


def test_with_its_heads_at_zero_the_adam_started_optimizer_is_optim_adam():
    """The optimizer `adam_learning_rate` starts from: with the direction and magnitude
    columns of the last kernel and bias at 0, its steps are `hogrod.optim.adam`'s."""
    lopt = small_mlp(adam_learning_rate=0.03)
    theta = random_theta(lopt)
    theta[-1] = {"kernel": tf.zeros_like(theta[-1]["kernel"]),
                 "bias": tf.zeros_like(theta[-1]["bias"])}
    learned, adam = lopt.optimizer(theta), optim.adam(0.03, b2=0.8)
    params, grads = params_and_grads(2)
    ours, theirs = (params, learned.init(params)), (params, adam.init(params))
    for g in grads + grads:
        ours, theirs = learned.update(g, ours[1], ours[0]), adam.update(g, theirs[1], theirs[0])
        for a, b in zip(ours[0], theirs[0]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-15)
    assert not np.allclose(ours[0][0].numpy(), params[0].numpy())


def test_the_update_under_tf_function_equals_eager_and_traces_once():
    """Variables in theta are read at each update: after new values are assigned, the
    compiled update (one trace) and the eager one equal an optimizer built on the values."""
    lopt = small_mlp()
    variables = tf.nest.map_structure(tf.Variable, random_theta(lopt))
    opt = lopt.optimizer(variables)
    params, grads = params_and_grads(1)
    compiled = tf.function(opt.update)
    state = opt.init(params)
    for new in (random_theta(lopt, 1), random_theta(lopt, 2)):
        tf.nest.map_structure(lambda v, x: v.assign(x), variables, new)
        want = lopt.optimizer(new).update(grads[0], state, params)
        for got in (opt.update(grads[0], state, params), compiled(grads[0], state, params)):
            for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-14, atol=1e-16)
    assert compiled.experimental_get_tracing_count() == 1


def test_the_update_is_differentiable_in_theta():
    lopt = small_mlp()
    variables = tf.nest.map_structure(tf.Variable, random_theta(lopt, 3))
    opt = lopt.optimizer(variables)
    params, grads = params_and_grads(2)
    weights = [tf.constant(np.random.default_rng(5).normal(size=p.shape)) for p in params]

    @tf.function
    def value():
        p, s = params, opt.init(params)
        for g in grads:
            p, s = opt.update(g, s, p)
        return tf.add_n([tf.reduce_sum(w * x) for w, x in zip(weights, p)])

    flat = tf.nest.flatten(variables)
    with tf.GradientTape() as tape:
        v = value()
    got = tape.gradient(v, flat)
    want = central_differences(value, flat)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-6, atol=1e-9)


def step_bound(theta, lopt):
    """The module docstring's bound on the first steps' root mean square, over step_mult."""
    bound = math.sqrt(feature_count(len(lopt.config["decays"])) + len(lopt.config["timescales"]))
    for layer in theta[:-1]:
        bound *= np.linalg.norm(np.asarray(layer["kernel"]), 2)
    return bound * np.linalg.norm(np.asarray(theta[-1]["kernel"])[:, 0])


@pytest.mark.parametrize("scale", [1e-8, 1.0, 1e8])
def test_the_first_steps_are_small_as_documented_whatever_the_gradient_scale(scale):
    lopt = mlp_optimizer(dtype="float64")  # learned_optimization's sizes and multipliers
    theta = lopt.init(7)
    assert all(np.all(np.asarray(layer["bias"]) == 0) for layer in theta)
    assert np.all(np.asarray(theta[-1]["kernel"])[:, 1] == 0)
    opt = lopt.optimizer(theta)
    params, grads = params_and_grads(3, scale)
    params = [tf.constant(np.random.default_rng(4).normal(size=(40, 30)))] + params
    grads = [[tf.constant(scale * np.random.default_rng(t).normal(size=(40, 30)))] + g
             for t, g in enumerate(grads)]
    bound = lopt.config["step_mult"] * step_bound(theta, lopt)
    state = opt.init(params)
    for g in grads:
        new, state = opt.update(g, state, params)
        for p, q in zip(params, new):
            rms = float(np.sqrt(np.mean((p.numpy() - q.numpy()) ** 2)))
            assert 0 < rms <= bound
        params = new
    assert bound < 0.1  # small: the parameters move by a few hundredths at most


# ---- the optimizer shape: adapt, hypergrad, make_train_step --------------------------------

def descending_theta(lopt):
    """theta of a 1-hidden-layer, 2-unit optimizer whose direction is the normalized
    gradient (feature 0): relu(x) - relu(-x) = x, a normalized gradient descent."""
    n_in = lopt.spec[0]["kernel"].shape[0]
    w0 = np.zeros((n_in, 2))
    w0[0, 0], w0[0, 1] = 1.0, -1.0
    w1 = np.array([[1.0, 0.0], [-1.0, 0.0]])
    return [{"bias": tf.zeros([2], F64), "kernel": tf.constant(w0)},
            {"bias": tf.zeros([2], F64), "kernel": tf.constant(w1)}]


def regression_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3))
    return tf.constant(x), tf.constant(x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3)


def hand_loop(opt, params, loss, steps):
    state = opt.init(params)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            tape.watch(params)
            value = loss(params)
        params, state = opt.update(tape.gradient(value, params), state, params)
    return params


def test_meta_adapt_takes_the_learned_optimizers_steps():
    """Against the numpy formula on numpy gradients of the model's mean squared error."""
    lopt = small_mlp(hidden_size=2)
    theta = random_theta(lopt, 4)
    x, y = regression_data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])

    def mse(y_true, y_pred):
        return tf.reduce_mean(tf.square(y_true - y_pred))

    got = meta.adapt(model, mse, (x, y), None, inner_steps=3, optimizer=lopt.optimizer(theta))
    p = [v.numpy() for v in model.trainable_variables]
    m = [np.zeros(q.shape + (2,)) for q in p]
    v = [np.zeros(q.shape) for q in p]
    xn, yn = x.numpy(), y.numpy()
    for t in range(3):
        residual = xn @ p[0] + p[1] - yn
        g = [2 * xn.T @ residual / len(xn), 2 * residual.sum(0) / len(xn)]
        p, m, v = numpy_update(theta, lopt.config, p, g, m, v, t)
    for a, b in zip(got, p):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-15)


def test_hypergrad_unrolled_differentiates_through_the_learned_optimizer():
    lopt = small_mlp(hidden_size=2)
    theta = tf.nest.map_structure(tf.Variable, random_theta(lopt, 5))
    opt = lopt.optimizer(theta)
    x, y = regression_data()

    def inner(w, h):
        return tf.reduce_mean(tf.square(x @ w[0] + w[1] - y))

    def outer(w, h):
        return tf.reduce_mean(tf.square(x[:8] @ w[0] + w[1] - y[:8] + 0.1))

    start = [tf.zeros([3, 1], F64), tf.zeros([1], F64)]
    got = hypergrad.hypergradient(inner, outer, start, theta, hypergrad.unrolled(opt, 4))
    with tf.GradientTape() as tape:
        value = outer(hand_loop(opt, start, lambda w: inner(w, None), 4), None)
    want = tape.gradient(value, theta)
    np.testing.assert_allclose(got.value.numpy(), value.numpy(), rtol=1e-13)
    for a, b in zip(tf.nest.flatten(got.grads), tf.nest.flatten(want)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-14)


def test_make_train_step_trains_a_tiny_problem_with_the_learned_optimizer():
    lopt = small_mlp(hidden_size=2, step_mult=0.02)
    opt = lopt.optimizer(descending_theta(lopt))
    x, y = regression_data()
    w = [tf.Variable(tf.zeros([3, 1], F64)), tf.Variable(tf.zeros([1], F64))]

    def loss(p):
        return tf.reduce_mean(tf.square(x @ p[0] + p[1] - y))

    step = train.make_train_step(lambda batch: loss(w), opt, w)
    want = hand_loop(opt, [tf.convert_to_tensor(v) for v in w], loss, 1)
    first = step((x, y))
    assert "lr" not in first  # no single learning rate to log
    for v, p in zip(w, want):
        np.testing.assert_allclose(v.numpy(), p.numpy(), rtol=1e-13, atol=1e-15)
    for _ in range(200):
        logs = step((x, y))
    assert float(logs["loss"]) < 1e-2 * float(first["loss"])


# ---- checkpoints ---------------------------------------------------------------------------

def test_save_and_load_round_trip_exactly_and_refuse_another_configuration(tmp_path):
    lopt = small_mlp()
    theta = random_theta(lopt, 6)
    path = str(tmp_path / "lopt.npz")
    lopt.save(tf.nest.map_structure(tf.Variable, theta), path)
    loaded = lopt.load(path)
    for a, b in zip(tf.nest.flatten(loaded), tf.nest.flatten(theta)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match=r"hidden_size=3.*hidden_size=4.*mlp_optimizer\.hidden_size"):
        small_mlp(hidden_size=4).load(path)
    with pytest.raises(ValueError, match=r"decays=\[0\.5, 0\.9\].*decays=\[0\.5, 0\.8\]"):
        small_mlp(decays=(0.5, 0.8)).load(path)
    with pytest.raises(ValueError, match="the theta of a mlp_optimizer, not of a learned_schedule"):
        learned_schedule(dtype="float64").load(path)
    np.savez(str(tmp_path / "other.npz"), a=np.zeros(2))
    with pytest.raises(ValueError, match="not a learned optimizer's checkpoint"):
        lopt.load(str(tmp_path / "other.npz"))
    assert json.loads(str(np.load(path)["config"]))["hidden_size"] == 3


# ---- the learned schedule ------------------------------------------------------------------

def test_the_schedules_rates_are_their_formulas():
    horizon, steps = 10, np.arange(14)
    piecewise = learned_schedule(kind="piecewise", horizon=horizon, knots=4, dtype="float64")
    logs = np.array([-1.0, -3.0, -0.5, -2.0])
    theta = {"log_rates": tf.constant(logs)}
    knots = np.arange(4) * horizon / 3
    want = np.interp(np.minimum(steps, horizon), knots, np.exp(logs))
    got = [float(piecewise.rate(theta, t)) for t in steps]
    np.testing.assert_allclose(got, want, rtol=1e-14)
    # two knots: persistent_es's linear schedule
    linear = learned_schedule(kind="piecewise", horizon=horizon, dtype="float64")
    a, b = -4.0, -1.0
    for t in range(horizon + 1):
        np.testing.assert_allclose(
            float(linear.rate({"log_rates": tf.constant([a, b], F64)}, t)),
            math.exp(a) * (horizon - t) / horizon + math.exp(b) * t / horizon, rtol=1e-14)
    # polynomial: optax's polynomial decay
    poly = learned_schedule(kind="polynomial", horizon=horizon, dtype="float64")
    theta = {"log_power": tf.constant(math.log(2.5), F64),
             "log_rates": tf.constant([-1.0, -4.0], F64)}
    s = np.minimum(steps, horizon)
    want = (math.exp(-1) - math.exp(-4)) * (1 - s / horizon) ** 2.5 + math.exp(-4)
    np.testing.assert_allclose([float(poly.rate(theta, t)) for t in steps], want, rtol=1e-13)


@pytest.mark.parametrize("kind,base", [("piecewise", "sgd"), ("polynomial", "adam")])
def test_the_schedules_steps_and_their_gradient_in_theta(kind, base):
    sched = learned_schedule(kind=kind, horizon=4, knots=3, base=base, momentum=0.5,
                             initial_rate=0.1, final_rate=0.02, power=1.5, dtype="float64")
    theta = tf.nest.map_structure(tf.Variable, sched.init(0))
    opt = sched.optimizer(theta)
    x, y = regression_data()

    def loss(p):
        return tf.reduce_mean(tf.square(x @ p[0] - y))

    start = [tf.constant(np.full((3, 1), 0.1))]
    # the steps are the base optimizer's at the rate of each step
    p, s = start, opt.init(start)
    for t in range(6):
        rate = float(sched.rate(theta, t))
        fixed = (optim.sgd(rate, momentum=0.5) if base == "sgd" else optim.adam(rate))
        with tf.GradientTape() as tape:
            tape.watch(p)
            value = loss(p)
        g = tape.gradient(value, p)
        want, _ = fixed.update(g, s, p)
        p, s = opt.update(g, s, p)
        np.testing.assert_allclose(p[0].numpy(), want[0].numpy(), rtol=1e-13)

    @tf.function
    def final():
        return loss(hand_loop(opt, start, loss, 6))

    flat = tf.nest.flatten(theta)
    with tf.GradientTape() as tape:
        v = final()
    got = tape.gradient(v, flat)
    for g, w in zip(got, central_differences(final, flat)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-6, atol=1e-10)


def test_a_one_knot_schedule_is_optim_learnable_sgd():
    sched = learned_schedule(knots=1, initial_rate=0.05, dtype="float64")
    theta = sched.init(0)
    learned, (variable,) = optim.learnable(optim.sgd(0.05), F64, names=["learning_rate"])
    np.testing.assert_array_equal(variable.numpy(), theta["log_rates"].numpy()[0])
    x, y = regression_data()

    def loss(p):
        return tf.reduce_mean(tf.square(x @ p[0] - y))

    start = [tf.zeros([3, 1], F64)]
    for a, b in zip(hand_loop(sched.optimizer(theta), start, loss, 3),
                    hand_loop(learned, start, loss, 3)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---- the digits task family ----------------------------------------------------------------

def test_a_task_is_a_function_of_its_seed_and_its_labels_are_its_digits():
    """The task (class subset) and weights from init's seed alone (eagerly, compiled, the
    same); every example of label i, in batches and in the whole data, is digit task[i]
    by sklearn's own targets."""
    family = digits_mlp(classes=4, batch_size=64, dtype="float64")
    digits = load_digits()
    digits_of = {}
    for row, c in zip(digits.data / 16.0, digits.target):
        digits_of.setdefault(row.tobytes(), set()).add(int(c))
    index = {row: next(iter(d)) for row, d in digits_of.items() if len(d) == 1}
    seeds = [task_seed(s, "train") for s in (0, 1, 12345)]
    compiled_init = tf.function(family.init)
    tasks = []
    for seed in seeds:
        params, task = family.init(seed)
        for a, b in zip(tf.nest.flatten((params, task)), tf.nest.flatten(compiled_init(seed))):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        task = task.numpy()
        assert len(set(task)) == 4 and set(task) <= set(range(10))
        tasks.append(tuple(task))
        batches = [family.batch(seed, t) for t in (0, 1, 7)] + [family.data(task)]
        seen = 0
        for batch in batches:
            x, y = family.examples(task, batch)
            for row, label in zip(x.numpy(), y.numpy()):
                if row.tobytes() in index:  # an image two digits share tells nothing
                    assert index[row.tobytes()] == task[label]
                    seen += 1
        assert seen > 0.9 * (3 * 64 + 4 * 174)
        assert sorted(np.unique(family.data(task)[0].numpy())) == [0, 1, 2, 3]
    assert len(set(tasks)) == 3  # three seeds, three different subsets (or orders)
    a, b = family.batch(seeds[0], 0)[1], family.batch(seeds[0], 1)[1]
    assert not np.array_equal(a.numpy(), b.numpy())


def test_held_out_task_seeds_are_never_training_task_seeds():
    rng = np.random.default_rng(0)
    raw = [0, 1, 2 ** 62, 2 ** 63 - 1] + [int(s) for s in rng.integers(0, 2 ** 63, 20)]
    pairs = [tf.constant([a, b], tf.int64) for a in raw[:6] for b in raw]
    train_seeds = {tuple(task_seed(p, "train").numpy()) for p in pairs}
    heldout = {tuple(task_seed(p, "heldout").numpy()) for p in pairs}
    assert not train_seeds & heldout
    assert len(train_seeds) == len(heldout) == len({tuple(p.numpy()) for p in pairs})
    family = digits_mlp(dtype="float64")
    lopt = small_mlp()
    one = optimizer_problem(lopt, family, "train").init(3)
    other = optimizer_problem(lopt, family, "heldout").init(3)
    assert not np.array_equal(one.params[0].numpy(), other.params[0].numpy())


def test_the_problem_steps_the_learned_optimizer_vectorized_over_particles():
    """Each particle its own theta, task and data seed (the unroll's data seed is not
    init's), under tf.vectorized_map, against a Python loop of the optimizer's updates."""
    family = digits_mlp(classes=3, hidden_sizes=(5,), batch_size=8, dtype="float64")
    lopt = small_mlp()
    problem = optimizer_problem(lopt, family)
    seeds = tf.constant([[0, 0], [5, 1]], tf.int64)
    data_seeds = tf.constant([[3, 9], [4, 2]], tf.int64)
    thetas = [random_theta(lopt, 8), random_theta(lopt, 9)]
    stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *thetas)

    def particle(args):
        state, data_seed, theta = args
        for t in range(2):
            state = problem.step(state, theta, problem.batch(data_seed, t))
        return problem.objective(state, problem.batch(data_seed, 2)), state.params

    # started one by one, as an unroll's resets do; stepped vectorized
    states = tf.nest.map_structure(lambda *s: tf.stack(s), *[problem.init(s) for s in seeds])
    got = tf.vectorized_map(particle, (states, data_seeds, stacked))
    for i in range(2):
        params, task = family.init(task_seed(seeds[i], "train"))
        state = problem.init(seeds[i])
        np.testing.assert_array_equal(state.task.numpy(), task.numpy())
        opt_state = state.opt_state
        opt = lopt.optimizer(thetas[i])
        data_key = task_seed(data_seeds[i], "train")
        for t in range(2):
            with tf.GradientTape() as tape:
                tape.watch(params)
                value = family.loss(params, task, family.batch(data_key, t))
            params, opt_state = opt.update(tape.gradient(value, params), opt_state, params)
        want = family.loss(params, task, family.batch(data_key, 2))
        np.testing.assert_allclose(got[0][i].numpy(), want.numpy(), rtol=1e-12)
        for a, b in zip(got[1], params):
            np.testing.assert_allclose(a[i].numpy(), b.numpy(), rtol=1e-12, atol=1e-15)


def test_training_curves_train_held_out_tasks_with_any_optimizer():
    family = digits_mlp(classes=3, hidden_sizes=(16,), batch_size=16, dtype="float64")
    curves = training_curves(optim.adam(1e-2), family, [0, 1], 15)
    assert curves.shape == (2, 16)
    assert np.all(curves.numpy()[:, -1] < 0.75 * curves.numpy()[:, 0])  # Adam trains them
    key = task_seed(1, "heldout")
    params, task = family.init(key)
    everything = family.data(task)
    np.testing.assert_allclose(curves[1, 0].numpy(),
                               family.loss(params, task, everything).numpy(), rtol=1e-13)
    adam = optim.adam(1e-2)
    with tf.GradientTape() as tape:
        tape.watch(params)
        value = family.loss(params, task, family.batch(key, 0))
    params, _ = adam.update(tape.gradient(value, params), adam.init(params), params)
    np.testing.assert_allclose(curves[1, 1].numpy(),
                               family.loss(params, task, everything).numpy(), rtol=1e-12)
    sequential = training_curves(optim.adam(1e-2), family, [0, 1], 15, mode="sequential")
    np.testing.assert_allclose(sequential.numpy(), curves.numpy(), rtol=1e-11)


# ---- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,named", [
    (dict(hidden_size=0), "hidden_size"), (dict(hidden_layers=-1), "hidden_layers"),
    (dict(decays=(0.5, 1.0)), r"decays\[1\]"), (dict(decays=()), "decays"),
    (dict(second_moment_decay=0.0), "second_moment_decay"), (dict(step_mult=0), "step_mult"),
    (dict(exp_mult=-1e-3), "exp_mult"), (dict(timescales=(1, -2)), r"timescales\[1\]"),
    (dict(dtype="int32"), "dtype"), (dict(dtype=1), "dtype"),
    (dict(adam_learning_rate=-1e-3), "adam_learning_rate"),
    (dict(adam_learning_rate=1e-3, decays=(0.5, 0.99)), "adam_learning_rate")])
def test_mlp_optimizer_names_a_bad_setting(kwargs, named):
    with pytest.raises(checks.ArgumentError, match=f"mlp_optimizer: {named}"):
        mlp_optimizer(**kwargs)


@pytest.mark.parametrize("kwargs,named", [
    (dict(kind="cosine"), "kind"), (dict(horizon=0), "horizon"), (dict(knots=0), "knots"),
    (dict(initial_rate=-0.1), "initial_rate"), (dict(final_rate=0.0), "final_rate"),
    (dict(power=0), "power"), (dict(base="rmsprop"), "base"), (dict(momentum=1.5), "momentum"),
    (dict(b2=1.0), "b2"), (dict(dtype="string"), "dtype")])
def test_learned_schedule_names_a_bad_setting(kwargs, named):
    with pytest.raises(checks.ArgumentError, match=f"learned_schedule: {named}"):
        learned_schedule(**kwargs)


def test_bad_theta_params_and_tasks_are_named():
    lopt = small_mlp()
    theta = random_theta(lopt)
    with pytest.raises(checks.ArgumentError, match="structure of mlp_optimizer's init"):
        lopt.optimizer(theta[:1])
    with pytest.raises(checks.ArgumentError, match=r"theta\[0\]\['kernel'\] must be float64\[9, 3\]"):
        lopt.optimizer([{**theta[0], "kernel": tf.zeros([9, 3], tf.float32)}, theta[1]])
    with pytest.raises(checks.ArgumentError, match="params leaf 0 is float32 but theta is float64"):
        p = [tf.zeros([2], tf.float32)]
        lopt.optimizer(theta).update(p, lopt.init_state(p), p)
    with pytest.raises(TypeError, match="MLPOptimizerState"):
        p = [tf.zeros([2], F64)]
        lopt.optimizer(theta).update(p, optim.adam(0.1).init(p), p)
    assert isinstance(lopt.init_state([tf.zeros([2], F64)]), MLPOptimizerState)
    with pytest.raises(checks.ArgumentError, match="seed"):
        lopt.init(-1)
    for kwargs, named in [(dict(classes=1), "classes"), (dict(classes=11), "classes"),
                          (dict(hidden_sizes=(0,)), r"hidden_sizes\[0\]"),
                          (dict(batch_size=0), "batch_size")]:
        with pytest.raises(checks.ArgumentError, match=f"digits_mlp: {named}"):
            digits_mlp(**kwargs)
    family = digits_mlp(classes=2, hidden_sizes=(), batch_size=4)
    with pytest.raises(checks.ArgumentError, match="optimizer_problem: split"):
        optimizer_problem(lopt, family, split="test")
    with pytest.raises(checks.ArgumentError, match="optimizer_problem: meta_objective"):
        optimizer_problem(lopt, family, meta_objective="mean")
    with pytest.raises(checks.ArgumentError, match="optimizer_problem: learned"):
        optimizer_problem(optim.adam(0.1), family)
    with pytest.raises(checks.ArgumentError, match="training_curves: seeds"):
        training_curves(optim.adam(0.1), family, [-1], 3)
    with pytest.raises(checks.ArgumentError, match="training_curves: steps"):
        training_curves(optim.adam(0.1), family, [0], -1)
    assert isinstance(lopt, LearnedOptimizer)
