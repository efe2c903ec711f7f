"""Meta-learning against oracles: closed-form meta-gradients of a linear model, float64
finite differences for an MLP, Reptile / Meta-SGD against their definitions, iMAML against
the exact implicit gradient of a quadratic inner problem, episode invariants, BatchNorm
purity, a short sinusoid run, strategy equivalence, bad input."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import distribute, meta, train
from conftest import SHARED_DATA


def mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def linear_model(dim=1, dtype="float64"):
    return keras.Sequential([keras.Input((dim,), dtype=dtype),
                             keras.layers.Dense(1, use_bias=False, dtype=dtype)])


def meta_grad(model, loss, task, inner_lr, steps, first_order):
    xs, ys, xq, yq = task
    with tf.GradientTape() as tape:
        fast = meta.adapt(model, loss, (xs, ys), inner_lr, steps, first_order)
        value = loss(yq, hogrod.functional_call(model, fast, xq))
    return tape.gradient(value, model.trainable_variables)


def test_maml_meta_gradient_of_a_linear_model_matches_the_closed_form():
    rng = np.random.default_rng(0)
    xs, xq = rng.normal(size=(8, 1)), rng.normal(size=(6, 1))
    ys, yq = 3 * xs + 0.1, 3 * xq - 0.2
    model = linear_model()
    w = float(model.trainable_variables[0].numpy()[0, 0])
    a = 0.1
    dls = 2 * np.mean(xs * (w * xs - ys))
    w1 = w - a * dls
    dlq = 2 * np.mean(xq * (w1 * xq - yq))
    second = dlq * (1 - a * 2 * np.mean(xs ** 2))
    task = tuple(tf.constant(t) for t in (xs, ys, xq, yq))
    got2 = meta_grad(model, mse, task, a, 1, False)[0].numpy().item()
    got1 = meta_grad(model, mse, task, a, 1, True)[0].numpy().item()
    np.testing.assert_allclose(got2, second, rtol=1e-7)
    np.testing.assert_allclose(got1, dlq, rtol=1e-7)
    assert abs(got2 - got1) > 1e-3  # the second-order term is really there


def test_maml_meta_gradient_of_an_mlp_matches_finite_differences():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,), dtype="float64"),
                              keras.layers.Dense(5, activation="tanh", dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    rng = np.random.default_rng(1)
    task = tuple(tf.constant(t) for t in (rng.normal(size=(5, 1)), rng.normal(size=(5, 1)),
                                          rng.normal(size=(5, 1)), rng.normal(size=(5, 1))))
    grads = meta_grad(model, mse, task, 0.3, 2, False)
    params = hogrod.trainable_values(model)

    def meta_loss(ps):
        fast = meta.adapt(model, mse, task[:2], 0.3, 2, params=ps)
        return float(mse(task[3], hogrod.functional_call(model, fast, task[2])))

    eps = 1e-6
    for k, p in enumerate(params):
        base = p.numpy()
        for idx in list(np.ndindex(base.shape))[:4]:
            plus, minus = base.copy(), base.copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd = (meta_loss(params[:k] + [tf.constant(plus)] + params[k + 1:])
                  - meta_loss(params[:k] + [tf.constant(minus)] + params[k + 1:])) / (2 * eps)
            np.testing.assert_allclose(grads[k].numpy()[idx], fd, rtol=1e-5, atol=1e-9)


def sinusoid_batch(seed, tasks=4, k=5, dtype=tf.float32):
    xs, ys, xq, yq, _, _ = meta.sample_sinusoids(tf.constant([seed, 0], tf.int64), tasks, k, k,
                                                 dtype)
    return xs, ys, xq, yq


def small_mlp(dtype="float32", dropout=None):
    keras.utils.set_random_seed(0)
    hidden = [keras.layers.Dense(8, activation="tanh", dtype=dtype)]
    if dropout:
        hidden.append(keras.layers.Dropout(dropout, dtype=dtype))
    return keras.Sequential([keras.Input((1,), dtype=dtype)] + hidden +
                            [keras.layers.Dense(1, dtype=dtype)])


def test_vectorized_meta_batch_equals_the_per_task_loop():
    model = small_mlp()
    tasks = sinusoid_batch(0)
    algo = meta.maml(model, mse, inner_lr=0.05, inner_steps=2)
    with tf.GradientTape() as tape:
        loss = algo.meta_loss(tasks)["loss"]
    got = tape.gradient(loss, model.trainable_variables)
    per_task = [meta_grad(model, mse, tuple(t[i] for t in tasks), 0.05, 2, False)
                for i in range(4)]
    for j, g in enumerate(got):
        np.testing.assert_allclose(g, np.mean([pt[j] for pt in per_task], axis=0), rtol=1e-4,
                                   atol=1e-6)
    seq = meta.maml(model, mse, inner_lr=0.05, inner_steps=2, task_map="recomputed")
    with tf.GradientTape() as tape:
        loss2 = seq.meta_loss(tasks)["loss"]
    for a, b in zip(tape.gradient(loss2, model.trainable_variables), got):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_reptile_step_follows_its_definition():
    model = small_mlp()
    tasks = sinusoid_batch(1)
    theta = [v.numpy() for v in model.trainable_variables]
    fast = [meta.adapt(model, mse, (tf.concat([t[0][i], t[2][i]], 0),
                                    tf.concat([t[1][i], t[3][i]], 0)), 0.02, 3, True)
            for i, t in [(i, tasks) for i in range(4)]]
    phi_bar = [np.mean([f[j].numpy() for f in fast], axis=0) for j in range(len(theta))]
    algo = meta.reptile(model, mse, inner_lr=0.02, inner_steps=3)
    eps = 0.5
    train.make_train_step(algo.meta_loss, keras.optimizers.SGD(eps),
                          model.trainable_variables)(tasks)
    for v, t, p in zip(model.trainable_variables, theta, phi_bar):
        np.testing.assert_allclose(v.numpy(), t + eps * (p - t), rtol=1e-5, atol=1e-6)


def test_meta_sgd_uses_and_learns_per_parameter_rates():
    model = small_mlp("float64")
    tasks = sinusoid_batch(2, dtype=tf.float64)
    algo = meta.meta_sgd(model, mse, inner_lr=0.1)
    for r in algo.variables:  # make the rates differ per entry
        r.assign(tf.random.stateless_uniform(r.shape, (1, 2), 0.05, 0.2, dtype=tf.float64))
    xs, ys = tasks[0][0], tasks[1][0]
    fast = algo.adapt((xs, ys), 1)
    g = hogrod.grad(lambda: mse(ys, model(xs)), model.trainable_variables)
    for f, v, r, gi in zip(fast, model.trainable_variables, algo.variables, g):
        np.testing.assert_allclose(f, v.numpy() - r.numpy() * gi.numpy(), rtol=1e-12)
    with tf.GradientTape() as tape:
        loss = algo.meta_loss(tasks)["loss"]
    g_rate = tape.gradient(loss, algo.variables[0]).numpy()
    eps, idx = 1e-6, (0, 3)
    r0 = algo.variables[0].numpy()
    vals = []
    for s in (eps, -eps):
        r = r0.copy()
        r[idx] += s
        algo.variables[0].assign(r)
        vals.append(float(algo.meta_loss(tasks)["loss"]))
    np.testing.assert_allclose(g_rate[idx], (vals[0] - vals[1]) / (2 * eps), rtol=1e-5)


def imaml_quadratic(scale, lam=2.0, seed=3):
    """A linear-regression task (support inputs scaled per coordinate by `scale`), its
    exact iMAML meta-gradient (closed form), and the task as a meta-batch of one."""
    rng = np.random.default_rng(seed)
    d = len(scale)
    model = linear_model(d)
    xs, xq = rng.normal(size=(12, d)) * scale, rng.normal(size=(9, d))
    ys, yq = xs @ [[1.0], [-2.0], [0.5]], xq @ [[0.3], [1.0], [-1.0]]
    theta = model.trainable_variables[0].numpy()
    A = 2 * xs.T @ xs / 12  # Hessian of the support MSE
    phi = np.linalg.solve(A + lam * np.eye(d), 2 * xs.T @ ys / 12 + lam * theta)
    grad_q = 2 * xq.T @ (xq @ phi - yq) / 9
    exact = np.linalg.solve(np.eye(d) + A / lam, grad_q)
    return model, exact, tuple(tf.constant(t[None]) for t in (xs, ys, xq, yq)), A


def imaml_meta_grad(algo, model, tasks):
    with tf.GradientTape() as tape:
        loss = algo.meta_loss(tasks)["loss"]
    return tape.gradient(loss, model.trainable_variables)[0].numpy()


@pytest.mark.parametrize("mode", ["vectorized", "sequential", "recomputed"])
def test_imaml_implicit_gradient_equals_the_exact_one_on_a_quadratic_inner_problem(mode):
    # curvatures 3.3 to 6.1 at rate 0.1: 45 steps leave about 1e-8 of the inner error
    model, exact, tasks, _ = imaml_quadratic([1.0, 1.0, 1.0])
    algo = meta.imaml(model, mse, inner_lr=0.1, inner_steps=45, lam=2.0, maxiter=3,
                      task_map=mode)
    np.testing.assert_allclose(imaml_meta_grad(algo, model, tasks), exact, rtol=1e-6, atol=1e-9)


def test_imaml_bad_maxiter_and_lam_are_named():
    for kwargs, match in [({"maxiter": 0}, "imaml: maxiter"),
                          ({"maxiter": 2.5}, "imaml: maxiter"), ({"lam": 0.0}, "imaml: lam"),
                          ({"lam": float("inf")}, "imaml: lam")]:
        with pytest.raises(ValueError, match=match):
            meta.imaml(small_mlp(), mse, **kwargs)


def test_tasks_without_their_task_axis_are_named_before_the_model_sees_them():
    model = small_mlp()  # takes [batch, 1]
    one = (tf.ones([5, 1]), tf.ones([5, 1]), tf.ones([5, 1]), tf.ones([5, 1]))
    for build in (meta.reptile, meta.imaml, meta.maml_plus_plus, meta.maml):
        algo = build(model, mse)
        with pytest.raises(ValueError, match=r"x_support has shape \[5, 1\], but the model "
                                             r"takes batches of rank 2.*x\[None\]"):
            algo.meta_loss(one)
    assert np.isfinite(float(algo.meta_loss(tuple(t[None] for t in one), 0)["loss"]))
    with pytest.raises(ValueError, match="tasks must be .x_support"):
        meta.maml(model, mse).meta_loss(one[:3])


def test_an_inner_rate_given_as_a_number_must_be_positive():
    """A negative rate ascends the support loss and zero adapts nothing: both ran before,
    to a plausible (or NaN) loss; a learned tensor rate (Meta-SGD's) may take any sign."""
    for build in (meta.maml, meta.fomaml, meta.anil, meta.meta_sgd, meta.reptile,
                  meta.maml_plus_plus, meta.imaml):
        for rate in (-0.01, 0.0, float("nan")):
            with pytest.raises(hogrod.checks.ArgumentError, match=r"inner_lr must be a "
                                                                  r"positive finite number"):
                build(small_mlp(), mse, inner_lr=rate)
    model = small_mlp()
    support = (tf.ones([3, 1]), tf.ones([3, 1]))
    n = len(model.trainable_variables)
    with pytest.raises(hogrod.checks.ArgumentError, match=r"^hogrod.meta.adapt: inner_lr\[1\] "):
        meta.adapt(model, mse, support, [0.1, 0.0] + [0.1] * (n - 2))
    with pytest.raises(hogrod.checks.ArgumentError, match=r"^hogrod.meta.adapt: inner_lr "):
        meta.adapt(model, mse, support, lambda step: -0.1)
    # None freezes, a tensor is taken as it is (here a negative one: one ascent step)
    theta = [v.numpy() for v in model.trainable_variables]
    fast = meta.adapt(model, mse, support, [None, tf.constant(-0.1)] + [None] * (n - 2))
    np.testing.assert_array_equal(fast[0], theta[0])
    assert np.any(fast[1].numpy() != theta[1])


def test_imaml_curvature_probes_keep_the_inner_solve_stable_on_a_sharp_task():
    model, exact, tasks, A = imaml_quadratic([5.0, 10.0, 14.0])
    assert 0.1 * (np.linalg.eigvalsh(A).max() + 2.0) > 2  # rate 0.1 is past the stability limit
    unsafe = meta.imaml(model, mse, inner_lr=0.1, inner_steps=45, lam=2.0, maxiter=3)
    got = imaml_meta_grad(unsafe, model, tasks)
    assert not np.all(np.isfinite(got)) or not np.allclose(got, exact, rtol=1e-2)
    safe = meta.imaml(model, mse, inner_lr=0.1, inner_steps=45, lam=2.0, maxiter=3,
                      curvature_probes=20)
    np.testing.assert_allclose(imaml_meta_grad(safe, model, tasks), exact, rtol=1e-6, atol=1e-9)
    # where inner_lr is already stable, the probes leave the rate (and the result) alone
    model, exact, tasks, _ = imaml_quadratic([1.0, 1.0, 1.0])
    safe = meta.imaml(model, mse, inner_lr=0.1, inner_steps=45, lam=2.0, maxiter=3,
                      curvature_probes=20)
    np.testing.assert_allclose(imaml_meta_grad(safe, model, tasks), exact, rtol=1e-6, atol=1e-9)


def test_imaml_accelerated_steps_reach_the_proximal_solution_where_plain_steps_do_not():
    # curvatures from about 2 (lam alone: a flat direction) to about 53: at the safe rate
    # 1/L plain steps contract the flat error by 1 - 2/53 per step, accelerated ones by
    # about 1 - sqrt(2/53); 60 steps leave about 1e-2 and 1e-6 of it
    model, exact, tasks, A = imaml_quadratic([0.05, 1.0, 6.0])
    xs, ys = tasks[0][0], tasks[1][0]
    theta = model.trainable_variables[0].numpy()
    phi = np.linalg.solve(A + 2.0 * np.eye(3), 2 * xs.numpy().T @ ys.numpy() / 12 + 2.0 * theta)
    kwargs = dict(inner_lr=0.1, inner_steps=60, lam=2.0, maxiter=3, curvature_probes=20)
    plain = meta.imaml(model, mse, **kwargs)
    assert not np.allclose(plain.adapt((xs, ys), 60)[0], phi, rtol=1e-3)
    fast = meta.imaml(model, mse, accelerated=True, **kwargs)
    np.testing.assert_allclose(fast.adapt((xs, ys), 60)[0], phi, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(imaml_meta_grad(fast, model, tasks), exact, rtol=1e-5, atol=1e-9)
    with pytest.raises(ValueError, match="imaml: accelerated"):
        meta.imaml(model, mse, accelerated=1)


@pytest.mark.slow
def test_every_algorithm_trains_one_compiled_step():
    # with Dropout: every step draws new masks (the seed state advances), in one trace
    for name, factory in meta.ALGORITHMS.items():
        model = small_mlp(dropout=0.2)
        opt = keras.optimizers.Adam(1e-3)
        kwargs = {"imaml": {"maxiter": 2}}.get(name, {})
        algo = factory(model, mse, inner_steps=2, **kwargs)  # small: tracing is the cost
        # a plain tf.function: "auto" takes it too (Dropout's random ops keep XLA out), after
        # tracing the step once more for XLA, which doubled this test's time
        step = train.make_train_step(lambda tasks: algo.meta_loss(tasks, opt.iterations), opt,
                                     model.trainable_variables + algo.variables,
                                     jit_compile=False)
        before = [v.numpy() for v in model.trainable_variables]
        seed_state = model.non_trainable_variables[0]
        start = seed_state.numpy()
        logs = [step(sinusoid_batch(s)) for s in (4, 5)]
        assert float(logs[0]["applied"]) == 1.0, name
        assert any(not np.allclose(b, v.numpy())
                   for b, v in zip(before, model.trainable_variables)), name
        assert step.experimental_get_tracing_count() == 1, name
        np.testing.assert_array_equal(seed_state.numpy(), start + [0, 2], err_msg=name)
        # the objective is "loss" (logged as such), everything else a monitor/ term
        assert not set(logs[0]) - {"loss", "grad_norm", "lr", "applied"} - {
            k for k in logs[0] if k.startswith("monitor/")}, (name, sorted(logs[0]))


def test_batchnorm_model_adapts_without_mutating_the_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.BatchNormalization(), keras.layers.ReLU(),
                              keras.layers.Dense(3)])
    before = [v.numpy().copy() for v in model.variables]
    x = tf.random.stateless_normal((6, 4), (0, 1))
    y = tf.constant([0, 1, 2, 0, 1, 2])
    ce = lambda y, logits: tf.reduce_mean(  # noqa: E731
        tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    algo = meta.maml(model, ce, inner_lr=0.5, inner_steps=3)
    with tf.GradientTape() as tape:
        loss = algo.meta_loss((x[None], y[None], x[None], y[None]))["loss"]
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None for g in grads)
    for b, v in zip(before, model.variables):
        np.testing.assert_array_equal(b, v.numpy())
    adapted = meta.evaluate(algo, model, ce, (x[None], y[None], x[None], y[None]), (0, 3))
    assert adapted["loss_after_3"] < adapted["loss_after_0"]


def test_evaluation_counts_diverged_tasks_and_reports_the_median():
    # MSE curvature 2 mean(x^2): 2 and 8 converge at rate 0.01, 1,800 diverges (|1 - 18| > 1)
    model = linear_model(1, dtype="float32")
    model.trainable_variables[0].assign([[0.0]])
    x = tf.constant([[[1.0]] * 4, [[2.0]] * 4, [[30.0]] * 4])
    y = 3.0 * x
    algo = meta.maml(model, mse, inner_lr=0.01)
    ev = meta.evaluate(algo, model, mse, (x, y, x, y), steps=(0, 40))
    assert ev["loss_after_0_nonfinite"] == 0 and np.isfinite(ev["loss_after_0"])
    assert ev["loss_after_40_nonfinite"] == 1 and not np.isfinite(ev["loss_after_40"])
    # losses 9 (0.98^2)^40 (task 1, the median), 36 (0.92^2)^40 (task 2), inf (task 3)
    expect = 9.0 * (1 - 0.01 * 2.0) ** 80
    np.testing.assert_allclose(ev["loss_after_40_median"], expect, rtol=1e-3)


@pytest.mark.slow
def test_short_sinusoid_run_adapts_well_below_the_unadapted_loss(tmp_path):
    from experiments import maml as exp
    from hogrod import harness
    # 800 steps at outer_lr 3e-3 leave loss_after_10 at about 0.11 of loss_after_0
    overrides = ["maml_experiment.meta_iterations = 800", "maml_experiment.eval_every = 800",
                 "maml_experiment.outer_lr = 3e-3", "sinusoid_data.eval_tasks = 100"]
    args = (exp.maml_experiment, ["configs/maml/sinusoid_maml.gin"], overrides)
    _, metrics = harness.run(*args, str(tmp_path))
    assert metrics["loss_after_10"] < 0.2 * metrics["loss_after_0"]
    assert metrics["loss_after_1"] < metrics["loss_after_0"]
    for name in ("adaptation.png", "metrics.json", "operative_config.gin", "loss.png"):
        assert (tmp_path / name).exists()
    assert os.listdir(tmp_path / "eval")  # held-out losses in TensorBoard too
    assert metrics["train_steps"] == 800 and metrics["train_steps_per_s"] > 0
    # the finished run, run again: nothing retrained, the final model re-evaluated (the
    # same numbers: the held-out tasks are fixed) and listed once, nothing lost
    _, again = harness.run(*args, str(tmp_path))
    assert again["loss_after_10"] == metrics["loss_after_10"]
    history = json.loads((tmp_path / "eval_history.json").read_text())
    assert [h["step"] for h in history] == [0, 800]  # from the untrained model on
    assert history[0]["loss_after_0"] > metrics["loss_after_0"]
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["final_train_loss"] == metrics["final_train_loss"]
    assert saved["train_steps_per_s"] == metrics["train_steps_per_s"]  # kept: trained nothing
    # re-evaluated, not reused: other evaluation settings give their own numbers
    _, other = harness.run(args[0], args[1], args[2] + ["maml_experiment.eval_steps = (0, 2)"],
                           str(tmp_path), allow_config_change=True)
    assert "loss_after_2" in other and "loss_after_10" not in other
    assert other["loss_after_0"] == metrics["loss_after_0"]
    assert [h["step"] for h in json.loads((tmp_path / "eval_history.json").read_text())] == [
        0, 800]


def test_a_schedule_bound_to_the_meta_learning_rate_sets_each_steps_rate(tmp_path):
    from experiments import maml as exp
    from hogrod import harness
    short = ["maml_experiment.meta_iterations = 2", "maml_experiment.eval_every = 2",
             "sinusoid_data.eval_tasks = 2", "maml_experiment.eval_steps = (0, 1)",
             "maml_experiment.outer_lr = @PiecewiseConstantDecay()",
             "PiecewiseConstantDecay.boundaries = [0]",
             "PiecewiseConstantDecay.values = [1e-3, 2.5e-4]"]
    args = (exp.maml_experiment, ["configs/maml/sinusoid_maml.gin"], short)
    _, metrics = harness.run(*args, str(tmp_path / "schedule"))
    # Adam's rate at the second step (iterations 1, past the boundary)
    assert metrics["final_train_lr"] == pytest.approx(2.5e-4, rel=1e-6)
    with pytest.raises(ValueError, match="outer_lr is a schedule.*outer_lr_decay_every = 5"):
        harness.run(args[0], args[1], short + ["maml_experiment.outer_lr_decay_every = 5"],
                    str(tmp_path / "both"))


def synthetic_classes(num_classes=7, per_class=(5, 6, 7, 5, 9, 5, 6)):
    images = []
    for c in range(num_classes):
        for j in range(per_class[c]):
            images.append(np.full((4, 4, 1), c * 20 + j, np.uint8))  # encodes class and index
    offsets = np.concatenate([[0], np.cumsum(per_class[:num_classes])])
    return meta.ImageClasses(np.stack(images), offsets, rotations=1)


def test_episode_invariants():
    classes = synthetic_classes()
    xs, ys, xq, yq = next(iter(meta.episodes(classes, n_way=3, k_shot=2, k_query=3,
                                             meta_batch_size=5, seed=0)))
    assert xs.shape == (5, 6, 4, 4, 1) and xq.shape == (5, 9, 4, 4, 1)
    for t in range(5):
        s_codes = np.round(xs[t, :, 0, 0, 0].numpy() * 255).astype(int)
        q_codes = np.round(xq[t, :, 0, 0, 0].numpy() * 255).astype(int)
        assert set(ys[t].numpy()) == set(yq[t].numpy()) == {0, 1, 2}
        assert np.bincount(ys[t].numpy()).tolist() == [2, 2, 2]
        assert not set(s_codes) & set(q_codes)  # support and query disjoint
        s_class, q_class = s_codes // 20, q_codes // 20
        assert len(set(s_class)) == 3  # N distinct classes
        for label in range(3):  # one class per label, the same in support and query
            assert len(set(s_class[ys[t].numpy() == label]) | set(q_class[yq[t].numpy() == label])) == 1


def test_episode_bad_input_is_clear(tmp_path):
    classes = synthetic_classes()
    with pytest.raises(ValueError, match="more than the 5 examples of the smallest class"):
        meta.episodes(classes, n_way=2, k_shot=3, k_query=3)
    with pytest.raises(ValueError, match="n_way=9 is more than the 7 classes"):
        meta.episodes(classes, n_way=9, k_shot=1, k_query=1)
    with pytest.raises(FileNotFoundError, match="images_background.zip"):
        meta.load_omniglot("/nonexistent/dir", cache_dir="/nonexistent/cache")
    np.savez(tmp_path / "omniglot_28.npz", chars=np.zeros((2, 3, 28, 28), np.uint8))
    with pytest.raises(FileNotFoundError, match="lacks"):  # a cache does not hide a wrong dir
        meta.load_omniglot("/nonexistent/dir", cache_dir=str(tmp_path))
    for name in ("n_way", "k_shot", "k_query"):
        with pytest.raises(ValueError, match=f"{name} must be at least 1, got 0"):
            meta.episodes(classes, **dict(dict(n_way=2, k_shot=1, k_query=1), **{name: 0}))


def test_omniglot_from_the_original_zips_when_present(tmp_path):
    data_dir = os.path.join(SHARED_DATA, "omniglot")
    if not os.path.exists(os.path.join(data_dir, "images_background.zip")):
        # No offline copy: the same loader on a two-character fake of the zip layout.
        import zipfile
        from PIL import Image
        import io
        data_dir = str(tmp_path)
        for z in meta.episodes.__globals__["OMNIGLOT_ZIPS"]:
            with zipfile.ZipFile(os.path.join(data_dir, z), "w") as f:
                for c in range(2):
                    for i in range(20):
                        buf = io.BytesIO()
                        Image.fromarray(np.full((105, 105), 255 * (i % 2), np.uint8)).save(buf, "PNG")
                        f.writestr(f"{z[:-4]}/A/character{c:02d}/{i}.png", buf.getvalue())
        train_chars = 2
    else:
        train_chars = 1200
    tr = meta.load_omniglot(data_dir, "train", 28, train_characters=train_chars,
                            cache_dir=str(tmp_path / "cache"))
    te = meta.load_omniglot(data_dir, "test", 28, train_characters=train_chars,
                            cache_dir=str(tmp_path / "cache"))
    assert tr.images.shape[1:] == (28, 28, 1) and tr.rotations == 4
    assert len(tr.offsets) - 1 == train_chars
    if train_chars == 1200:
        assert len(te.offsets) - 1 == 423 and tr.images.shape[0] == 24000
    xs, ys, xq, yq = next(iter(meta.episodes(tr, 5, 1, 15, 2, seed=0)))
    assert xs.shape == (2, 5, 28, 28, 1) and xq.shape == (2, 75, 28, 28, 1)


def test_mirrored_meta_gradient_equals_single_device():
    tasks = sinusoid_batch(5, tasks=4)

    def run(strategy):
        with strategy.scope():
            model = small_mlp()
            opt = keras.optimizers.SGD(0.1)
            algo = meta.maml(model, mse, inner_lr=0.05, inner_steps=2)
        step = train.make_train_step(algo.meta_loss, opt, model.trainable_variables,
                                     strategy=strategy)
        data = tf.data.Dataset.from_tensors(tasks).unbatch().batch(4)
        step(next(iter(distribute.distribute_dataset(strategy, data))))
        return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])

    single = run(tf.distribute.get_strategy())
    mirrored = run(distribute.make_strategy("mirrored"))
    np.testing.assert_allclose(mirrored, single, atol=1e-5)


class _Mapped(Exception):
    """Raised by the spy below: the trace stops at the first task mapping."""


def mapping_of(monkeypatch, call):
    """The task mapping `call()` uses: map_tasks is replaced by a spy that records its mode
    and stops the trace there (nothing else is traced)."""
    import sys
    seen = []

    def spy(fn, tasks, seeds=None, params=(), mode="vectorized"):
        seen.append(mode)
        raise _Mapped
    monkeypatch.setattr(sys.modules["hogrod.taskmap"], "map_tasks", spy)
    with pytest.raises(_Mapped):
        call()
    return seen[-1]


def test_task_map_argument_maps_every_algorithm_and_the_evaluation(monkeypatch):
    tasks = sinusoid_batch(0, tasks=2, k=3)
    model = small_mlp()
    for mode, evaluated in [("sequential", "sequential"), ("recomputed", "sequential"),
                            ("vectorized", "vectorized")]:
        for name, factory in meta.ALGORITHMS.items():
            algo = factory(model, mse, task_map=mode)
            assert mapping_of(monkeypatch, lambda: algo.meta_loss(tasks, 0)) == mode, name
        assert mapping_of(monkeypatch, lambda: meta.evaluate(
            algo, model, mse, tasks, steps=(1,), task_map=mode)) == evaluated
    for name, factory in meta.ALGORITHMS.items():  # the default
        algo = factory(model, mse)
        assert mapping_of(monkeypatch, lambda: algo.meta_loss(tasks, 0)) == "vectorized", name
    with pytest.raises(ValueError, match="reptile: task_map must be one of"):
        meta.reptile(model, mse, task_map="parallel")
    with pytest.raises(ValueError, match="evaluate: task_map must be one of"):
        meta.evaluate(algo, model, mse, tasks, task_map=False)


def test_bad_meta_loss_arguments_are_named():
    algo = meta.maml(small_mlp(), mse)
    with pytest.raises(ValueError, match="x_support, y_support, x_query, y_query"):
        algo.meta_loss(sinusoid_batch(0)[:2])
    with pytest.raises(TypeError, match="step must be an integer scalar"):
        algo.meta_loss(sinusoid_batch(0), 0.5)
    with pytest.raises(TypeError, match="meta_gradient: algorithm must be"):
        meta.meta_gradient(algo.meta_loss, small_mlp(), sinusoid_batch(0))


def test_data_functions_name_their_parts_and_the_meta_batch_size():
    from experiments import maml as exp
    data = exp.sinusoid_data(0, meta_batch_size=3, k_shot=4, eval_tasks=2)
    assert isinstance(data, exp.MetaData) and data.meta_batch_size == 3
    assert data.train.element_spec[0].shape == (3, 4, 1)  # known without pulling a batch
    assert data.eval_tasks[0].shape == (2, 4, 1) and not data.classification
    assert data.loss is exp.mse


def test_adapt_on_an_objective_is_adapt_on_the_loss_it_computes():
    """`adapt(objective=...)` with the objective a Keras loss of the model's outputs takes
    the loss's steps exactly (the second derivatives through them too); an objective that
    ignores a param it steps is an error naming that param."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    rng = np.random.default_rng(0)
    x, y = tf.constant(rng.normal(size=(5, 2))), tf.constant(rng.normal(size=(5, 1)))
    theta = meta.initial_params(model)

    def objective(params, support):
        return mse(support[1], hogrod.functional_call(model, params, support[0]))

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(theta)
        by_loss = meta.adapt(model, mse, (x, y), 0.1, 2, params=theta)
        by_objective = meta.adapt(model, None, (x, y), 0.1, 2, params=theta,
                                  objective=objective)
        outer = [tf.reduce_sum(f ** 3) for f in (by_loss[0], by_objective[0])]
    for a, b in zip(by_loss, by_objective):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(*[tape.gradient(o, theta) for o in outer]):
        np.testing.assert_array_equal(a, b)
    for rate, optimizer in ((0.1, None), (None, hogrod.optim.sgd(0.1))):  # both inner loops
        with pytest.raises(hogrod.checks.ArgumentError,
                           match=r"do not depend on parameter '\S*bias' \(params\[1\]\)"):
            meta.adapt(model, None, (x, y), rate, params=theta, optimizer=optimizer,
                       objective=lambda p, s: tf.reduce_sum(p[0]) * 1.0)
    with pytest.raises(hogrod.checks.ArgumentError, match="seeds are for the model's"):
        meta.adapt(model, None, (x, y), 0.1, params=theta, objective=objective,
                   seeds=tf.zeros([1, 1, 2], tf.int64))
