"""AdaHessian and Sophia (`hogrod.second_order`) and their Hessian-diagonal estimators.

Oracles, float64: on a diagonal quadratic 1/2 sum d_i w_i^2 + c.w one Rademacher probe gives
the Hessian diagonal exactly, so the first steps equal the papers' update formulas written
in numpy (AdaHessian: Yao et al. 2021 / the authors' code; Sophia: Liu et al. 2023,
Algorithm 3); the spatial average over a Conv2D kernel against numpy; each Hutchinson
sample against z * (H z) with the dense Hessian (`hogrod.hessian`) and their mean against
its diagonal; the Gauss-Newton-Bartlett estimate's mean against
`curvature.gauss_newton_diagonal`; two logical CPUs under MirroredStrategy against one
device; a resumed run (`train.Checkpointer`) against an uninterrupted one.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import checks, curvature, distribute, train, tree
from hogrod.curvature.data import batch_loss
from hogrod.second_order import adahessian, sophia
from hogrod.second_order.diagonal import (GaussNewtonBartlettEstimator, HutchinsonEstimator,
                                          probe_key, spatial_average)

D = np.array([1.0, 2.5, -0.5, 4.0])  # a negative curvature too: |D| in AdaHessian
C = np.array([0.5, -1.0, 0.3, 0.0])
W0 = np.array([1.0, -1.0, 2.0, 0.5])
DUMMY = tf.zeros([1], tf.float64)


def quadratic_steps(opt, d, c, w0, steps, jit_compile=False):
    """`steps` compiled steps of `opt` on 1/2 sum d w^2 + c.w; the weights and logs after
    each."""
    w = tf.Variable(w0)
    step = train.make_train_step(
        lambda _: 0.5 * tf.reduce_sum(d * w * w) + tf.reduce_sum(c * w), opt, [w],
        jit_compile=jit_compile)
    out = []
    for _ in range(steps):
        logs = step(DUMMY)
        out.append((w.numpy().copy(), {k: float(v) for k, v in logs.items()}))
    assert step.experimental_get_tracing_count() == 1  # the refresh is a cond: no retracing
    return out


def adahessian_numpy(d, c, w, steps, lr, b1, b2, k, eps, wd, diag=None):
    """The authors' update; `diag` the spatially averaged |d| (default |d|)."""
    diag = np.abs(d) if diag is None else diag
    m, v, out = 0.0, 0.0, []
    for t in range(1, steps + 1):
        g = d * w + c
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * diag ** 2
        denom = (v / (1 - b2 ** t)) ** (k / 2) + eps
        w = w - lr * (m / (1 - b1 ** t) / denom + wd * w)
        out.append(w)
    return out


@pytest.mark.parametrize("k,wd", [(1.0, 0.0), (0.5, 0.1)])
def test_adahessian_takes_the_papers_first_steps_on_a_diagonal_quadratic(k, wd):
    kw = dict(lr=0.15, b1=0.9, b2=0.999, k=k, eps=1e-4, wd=wd)
    want = adahessian_numpy(D, C, W0, 2, **kw)
    got = quadratic_steps(adahessian(0.15, hessian_power=k, weight_decay=wd, seed=3),
                          D, C, W0, 2)
    for (w, logs), w_np in zip(got, want):
        np.testing.assert_allclose(w, w_np, rtol=1e-13, atol=1e-15)
        assert logs["hessian_diagonal_mean"] == pytest.approx(np.abs(D).mean(), rel=1e-14)


def test_adahessian_averages_a_conv_kernel_over_its_spatial_axes():
    rng = np.random.default_rng(0)
    d = rng.uniform(-2, 3, size=(3, 3, 2, 4))  # Keras's (kh, kw, in, out)
    c, w0 = rng.normal(size=d.shape), rng.normal(size=d.shape)
    averaged = np.broadcast_to(np.abs(d).mean(axis=(0, 1), keepdims=True), d.shape)
    np.testing.assert_allclose(spatial_average([tf.constant(d)])[0].numpy(), averaged,
                               rtol=1e-15)
    assert not np.allclose(averaged, np.broadcast_to(  # the other axes differ here
        np.abs(d).mean(axis=(2, 3), keepdims=True), d.shape))
    want = adahessian_numpy(d, c, w0, 2, 0.1, 0.9, 0.999, 1.0, 1e-4, 0.0, diag=averaged)
    got = quadratic_steps(adahessian(0.1), d, c, w0, 2)
    for (w, _), w_np in zip(got, want):
        np.testing.assert_allclose(w, w_np, rtol=1e-13, atol=1e-15)
    # a rank-2 kernel and a bias are not averaged
    np.testing.assert_allclose(spatial_average([tf.constant(d[0, 0])])[0].numpy(),
                               np.abs(d[0, 0]), rtol=1e-15)


def sophia_numpy(d, c, w, steps, lr, b1, b2, rho, every, eps, wd):
    """The paper's Algorithm 3 with the Hutchinson estimate z * (H z) = d (exact here);
    the weights, the clipped fraction and whether h was refreshed, after each step."""
    m, h, out = 0.0, 0.0, []
    for t in range(1, steps + 1):
        g = d * w + c
        m = b1 * m + (1 - b1) * g
        refresh = (t - 1) % every == 0
        if refresh:
            h = b2 * h + (1 - b2) * d
        ratio = m / np.maximum(rho * h, eps)
        w = w - lr * wd * w - lr * np.clip(ratio, -1, 1)
        out.append((w, np.mean(np.abs(ratio) > 1), float(refresh)))
    return out


@pytest.mark.parametrize("rho,clipping", [(0.04, "active"), (60.0, "inactive")])
def test_sophia_takes_the_papers_steps_clipped_and_not(rho, clipping):
    d = np.abs(D) if clipping == "inactive" else D  # a negative h is floored at eps: clipped
    kw = dict(lr=0.05, b1=0.965, b2=0.99, rho=rho, every=2, eps=1e-12, wd=0.1)
    want = sophia_numpy(d, C, W0, 3, **kw)
    fractions = [f for _, f, _ in want]
    if clipping == "active":
        assert fractions == [1.0, 1.0, 1.0]
    else:
        assert fractions == [0.0, 0.0, 0.0]
    # the active case in one XLA computation (the refresh's cond and the probes inside it)
    got = quadratic_steps(sophia(0.05, rho=rho, hessian_every=2, weight_decay=0.1, seed=1),
                          d, C, W0, 3, jit_compile=clipping == "active")
    for (w, logs), (w_np, fraction, refreshed) in zip(got, want):
        np.testing.assert_allclose(w, w_np, rtol=1e-13, atol=1e-15)
        assert logs["clipped_fraction"] == fraction
        assert logs["hessian_refreshed"] == refreshed
        assert logs["hessian_diagonal_mean"] == pytest.approx(d.mean(), rel=1e-14)
    assert [r for _, _, r in want] == [1.0, 0.0, 1.0]


def test_the_hutchinson_estimate_is_z_times_hz_and_its_mean_the_diagonal():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(5, 5))
    a = a + a.T  # a non-diagonal Hessian, plus a cubic term making it depend on w
    w = [tf.Variable(rng.normal(size=(2, 2))), tf.Variable(rng.normal(size=(1,)))]

    def objective(_):
        flat = tf.concat([tf.reshape(v, [-1]) for v in w], 0)
        return 0.5 * tf.tensordot(flat, tf.linalg.matvec(a, flat), 1) \
            + tf.reduce_sum(flat ** 3) / 6

    h = hogrod.hessian(lambda: objective(None), w).numpy()
    estimator = HutchinsonEstimator(1)

    def flat(key):
        return tf.concat([tf.reshape(t, [-1]) for t in estimator.estimate(
            objective, DUMMY, w, key)], 0)

    for i in range(3):  # each sample is z * (H z) with its probe
        key = probe_key(7, i)
        z = np.concatenate([t.numpy().ravel() for t in tree.rademacher_like(
            [v.read_value() for v in w], tf.random.experimental.stateless_fold_in(key, 0))])
        np.testing.assert_allclose(flat(key).numpy(), z * (h @ z), rtol=1e-13, atol=1e-13)
    draws = 2000

    @tf.function
    def moments():
        def body(i, s1, s2):
            e = flat(probe_key(7, i))
            return i + 1, s1 + e, s2 + e * e
        zero = tf.zeros([5], tf.float64)
        _, s1, s2 = tf.while_loop(lambda i, *_: i < draws, body,
                                  (tf.constant(0, tf.int64), zero, zero))
        return s1 / draws, s2 / draws

    mean, square = (t.numpy() for t in moments())
    error = np.sqrt((square - mean ** 2) / (draws - 1))
    assert np.all(np.abs(mean - np.diag(h)) < 4 * error)
    # several probes in one estimate: the mean of the single-probe samples drawn from each
    three = HutchinsonEstimator(3).estimate(objective, DUMMY, w, probe_key(7, 0))
    singles = []
    for p in range(3):
        z = tree.rademacher_like([v.read_value() for v in w],
                                 tf.random.experimental.stateless_fold_in(probe_key(7, 0), p))
        zf = np.concatenate([t.numpy().ravel() for t in z])
        singles.append(zf * (h @ zf))
    np.testing.assert_allclose(np.concatenate([t.numpy().ravel() for t in three]),
                               np.mean(singles, 0), rtol=1e-13, atol=1e-13)


def classifier(loss_name):
    keras.utils.set_random_seed(2)
    outputs = 3
    model = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(outputs, dtype="float64")])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 2))
    losses = {
        "sparse_ce": (keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 dtype="float64"),
                      rng.integers(0, outputs, size=4)),
        "bce": (keras.losses.BinaryCrossentropy(from_logits=True, dtype="float64"),
                rng.integers(0, 2, size=(4, 3)).astype(np.float64)),
        "mse": (keras.losses.MeanSquaredError(dtype="float64"), rng.normal(size=(4, 3))),
    }
    loss, y = losses[loss_name]
    return model, loss, x, y


def bartlett_moments(estimator, batch, variables, draws, strategy=None, jit_compile=False):
    """The mean of `draws` estimates (keys (5, i)) and its standard error, one compiled loop
    (with `jit_compile`, one XLA computation); under `strategy` each estimate from the
    replicas' shards of `batch`."""
    n = sum(int(tf.size(v)) for v in variables)

    def one(b, key):
        return tf.concat([tf.reshape(t, [-1]) for t in estimator.estimate(
            None, b, variables, key)], 0)

    if strategy is None:
        sample = one
    else:
        def sample(b, key):
            out = strategy.run(one, args=(b, key))
            return strategy.experimental_local_results(out)[0]
        batch = next(iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensors(batch))))

    @tf.function(jit_compile=jit_compile)
    def moments(b):
        def body(i, s1, s2):
            e = sample(b, probe_key(5, i))
            return i + 1, s1 + e, s2 + e * e
        zero = tf.zeros([n], tf.float64)
        _, s1, s2 = tf.while_loop(lambda i, *_: i < draws, body,
                                  (tf.constant(0, tf.int64), zero, zero))
        return s1 / draws, s2 / draws

    mean, square = (t.numpy() for t in moments(batch))
    return mean, np.sqrt(np.maximum(square - mean ** 2, 0) / (draws - 1))


@pytest.mark.parametrize("loss_name,replicas", [("sparse_ce", 1), ("bce", 1), ("mse", 1),
                                                ("sparse_ce", 2)])
def test_the_gauss_newton_bartlett_mean_is_the_gauss_newton_diagonal(loss_name, replicas):
    strategy = distribute.make_strategy("mirrored") if replicas == 2 else None
    with (strategy or tf.distribute.get_strategy()).scope():
        model, loss, x, y = classifier(loss_name)
    est = GaussNewtonBartlettEstimator(model, loss)
    mean, error = bartlett_moments(est, (x, y), model.trainable_variables, 4000 // replicas,
                                   strategy, jit_compile=loss_name == "sparse_ce" and not strategy)
    exact = curvature.gauss_newton_diagonal(model, loss, (x, y))
    assert np.all(np.abs(mean - exact) < 4.5 * error + 1e-14)
    np.testing.assert_allclose(mean, exact, rtol=0.2)


def regression(n=8):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(n, 3))
    return x, np.tanh(x @ rng.normal(size=(3, 2)))


def mlp(strategy=None):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((3,), dtype="float64"),
                                 keras.layers.Dense(4, activation="tanh", dtype="float64"),
                                 keras.layers.Dense(2, dtype="float64")])


MSE = keras.losses.MeanSquaredError(dtype="float64")
FACTORIES = {
    "adahessian": lambda model: adahessian(0.05, seed=2),
    "sophia": lambda model: sophia(0.05, hessian_every=2, seed=2),
    "sophia_gnb": lambda model: sophia(0.05, hessian_every=2, seed=2,
                                       estimator="gauss_newton_bartlett", model=model,
                                       loss=MSE),
}


def run(name, strategy, steps, model=None, restore=None, save=None):
    """`steps` steps of the named optimizer on the MLP; its weights and logs."""
    strategy = strategy or tf.distribute.get_strategy()
    model = model or mlp(strategy)
    with strategy.scope():
        opt = FACTORIES[name](model)
    step = train.make_train_step(lambda b: batch_loss(MSE, b[1], model(b[0], training=True)),
                                 opt, model.trainable_variables, strategy=strategy)
    if restore:
        assert train.Checkpointer(restore, model=model, optimizer=opt).restore() > 0
    data = distribute.distribute_dataset(
        strategy, tf.data.Dataset.from_tensor_slices(regression()).batch(8).repeat())
    it = iter(data)
    logs = [{k: float(v) for k, v in step(next(it)).items()} for _ in range(steps)]
    if save:
        ckpt = train.Checkpointer(save, model=model, optimizer=opt)
        ckpt.step.assign(steps)
        ckpt.save()
    return [v.numpy() for v in model.trainable_variables], logs


@pytest.mark.parametrize("name", ["adahessian", "sophia"])
def test_two_replicas_take_one_devices_steps(name):
    one, logs_one = run(name, None, 3)
    two, logs_two = run(name, distribute.make_strategy("mirrored"), 3)
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(logs_one, logs_two):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["adahessian", "sophia_gnb"])
def test_a_resumed_run_takes_the_uninterrupted_steps(name, tmp_path):
    whole, logs = run(name, None, 5)
    run(name, None, 3, save=str(tmp_path))
    resumed, logs_resumed = run(name, None, 2, restore=str(tmp_path))
    for a, b in zip(whole, resumed):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    for a, b in zip(logs[3:], logs_resumed):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-13, atol=1e-15)
    if name != "adahessian":  # the resumed run refreshed h where the whole one did
        assert [log["hessian_refreshed"] for log in logs] == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_what_the_factories_refuse():
    model, loss, _, _ = classifier("sparse_ce")
    bad = [
        (lambda: adahessian(0.0), "learning_rate"),
        (lambda: adahessian(0.1, b1=1.0), "b1"),
        (lambda: adahessian(0.1, b2=-0.1), "b2"),
        (lambda: adahessian(0.1, hessian_power=0.0), "hessian_power"),
        (lambda: adahessian(0.1, eps=0.0), "eps"),
        (lambda: adahessian(0.1, weight_decay=-1.0), "weight_decay"),
        (lambda: adahessian(0.1, num_probes=0), "num_probes"),
        (lambda: sophia(-1.0), "learning_rate"),
        (lambda: sophia(0.1, b1=1.5), "b1"),
        (lambda: sophia(0.1, b2=1.0), "b2"),
        (lambda: sophia(0.1, rho=0.0), "rho"),
        (lambda: sophia(0.1, hessian_every=0), "hessian_every"),
        (lambda: sophia(0.1, estimator="gnb"), "estimator"),
        (lambda: sophia(0.1, seed=-1), "seed"),
    ]
    for make, arg in bad:
        with pytest.raises(checks.ArgumentError, match=arg):
            make()
    with pytest.raises(ValueError, match="needs model= and loss="):
        sophia(0.1, estimator="gauss_newton_bartlett")
    with pytest.raises(ValueError, match="needs loss="):
        sophia(0.1, estimator="gauss_newton_bartlett", model=model)
    with pytest.raises(ValueError, match="sophia: cannot sample labels .* Huber"):
        sophia(0.1, estimator="gauss_newton_bartlett", model=model, loss=keras.losses.Huber())
    # the Hutchinson estimator takes no model: the binary may pass one, unused
    assert sophia(0.1, model=model, loss=loss).estimator.__class__ is HutchinsonEstimator
    with pytest.raises(ValueError, match="accumulation_steps=2"):
        train.make_train_step(lambda b: MSE(b[1], model(b[0])), adahessian(0.1),
                              model.trainable_variables, accumulation_steps=2)


def batch_norm_statistics_after_a_step(make_optimizer):
    """A Dense-BatchNorm-Dense model's moving statistics after one step of the optimizer
    made from it and its loss."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 2))
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(4, dtype="float64"),
                              keras.layers.BatchNormalization(dtype="float64"),
                              keras.layers.Dense(2, dtype="float64")])
    mse = keras.losses.MeanSquaredError(dtype="float64")
    objective = lambda b: batch_loss(mse, b[1], model(b[0], training=True))  # noqa: E731
    before = [v.numpy() for v in model.non_trainable_variables]
    step = train.make_train_step(objective, make_optimizer(model, mse),
                                 model.trainable_variables, jit_compile=False)  # bitwise
    step((x, y))
    return before, [v.numpy() for v in model.non_trainable_variables]


@pytest.mark.parametrize("kind", ["adahessian", "sophia_gnb"])
def test_an_estimators_extra_pass_leaves_batch_norm_statistics_as_the_steps_own(kind):
    start, want = batch_norm_statistics_after_a_step(
        lambda model, mse: keras.optimizers.SGD(0.1))
    assert not np.allclose(want[0], start[0])  # the step's own pass moved them
    make = {"adahessian": lambda model, mse: adahessian(0.1, seed=1),
            "sophia_gnb": lambda model, mse: sophia(0.1, estimator="gauss_newton_bartlett",
                                                    model=model, loss=mse, seed=1)}[kind]
    for got, expected in zip(batch_norm_statistics_after_a_step(make)[1], want):
        np.testing.assert_array_equal(got, expected)
