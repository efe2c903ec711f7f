"""`hogrod.second_order.hessian_free` in float64: one step on linear least squares lands on
numpy.linalg.lstsq's solution; two truncated, preconditioned, warm-started, damped steps
against a numpy transcription of Martens' algorithm (exact per-example gradients and
Gauss-Newton matrix of a linear model); Levenberg-Marquardt against its formula on the
reduction ratios a non-quadratic problem gives (numpy Hessian); CG backtracking against
scipy's CG iterates and the rule; MirroredStrategy on two logical CPUs against one device;
resume against an uninterrupted run; Newton-CG on Rosenbrock (the benchmark) to f < 1e-10;
the exact Newton step on a weighted dict objective; scipy's Newton-CG step on negative
curvature; no step on a NaN product; BatchNorm statistics as one SGD step's; bad input."""

import keras
import numpy as np
import pytest
import scipy.optimize
import scipy.sparse.linalg
import tensorflow as tf

from hogrod import distribute, harness, train
from hogrod.curvature.data import batch_loss
from hogrod.second_order import common, hessian_free
from conftest import bench_config

MSE = keras.losses.MeanSquaredError(dtype="float64")
N, D, OUT = 12, 3, 2


def regression(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D))
    y = x @ rng.normal(size=(D, OUT)) + 0.5 + 0.3 * rng.normal(size=(N, OUT))
    return x, y


def linear(strategy=None, hidden=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        keras.utils.set_random_seed(1)
        layers = [keras.Input((D,), dtype="float64")]
        if hidden:
            layers.append(keras.layers.Dense(hidden, activation="tanh", dtype="float64"))
        return keras.Sequential(layers + [keras.layers.Dense(OUT, dtype="float64")])


def objective_of(model):
    return lambda batch: batch_loss(MSE, batch[1], model(batch[0]))


def flat(model):
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])


def test_one_step_lands_on_lstsq_and_rho_is_one():
    x, y = regression()
    model = linear()
    opt = hessian_free(model, MSE, damping=1e-12, cg_maxiter=50, cg_tol=1e-14)
    step = train.make_train_step(objective_of(model), opt, model.trainable_variables)
    logs = step((x, y))
    ones = np.hstack([x, np.ones((N, 1))])
    solution = np.linalg.lstsq(ones, y, rcond=None)[0]
    w, b = (v.numpy() for v in model.trainable_variables)
    np.testing.assert_allclose(np.vstack([w, b[None]]), solution, atol=1e-6)
    # a quadratic objective: the model is exact
    assert float(logs["rho"]) == pytest.approx(1.0, abs=1e-8)
    assert float(logs["lr"]) == 1.0 and float(logs["damping"]) == pytest.approx(1e-12)
    step((x, y))
    assert step.experimental_get_tracing_count() == 1


def design(x):
    """A with z.ravel() = A theta, theta = [kernel.ravel(), bias] (Dense's variables)."""
    a = np.zeros((N * OUT, D * OUT + OUT))
    for i in range(N):
        for o in range(OUT):
            a[i * OUT + o, [j * OUT + o for j in range(D)]] = x[i]
            a[i * OUT + o, D * OUT + o] = 1.0
    return a


def numpy_pcg(matrix, b, x, m_inv, steps):
    r = b - matrix @ x
    z = m_inv * r
    p, rz = z, r @ z
    for _ in range(steps):
        ap = matrix @ p
        alpha = rz / (p @ ap)
        x, r = x + alpha * p, r - alpha * ap
        z = m_inv * r
        p, rz = z + (r @ z) / rz * p, r @ z
    return x


def numpy_hf(theta, x, y, steps, damping, cg_steps, l2, power=0.75, decay=0.95):
    """Martens' HF steps at rate 1 without backtracking or line search, in numpy."""
    a, yf, scale = design(x), y.ravel(), 2.0 / (N * OUT)
    value = lambda t: np.mean((yf - a @ t) ** 2)  # noqa: E731
    curvature = scale * a.T @ a + l2 * np.eye(len(theta))
    previous, used = np.zeros_like(theta), []
    for _ in range(steps):
        residual = yf - a @ theta
        g = -scale * a.T @ residual
        rows = np.stack([-(2.0 / OUT) * a[i * OUT:(i + 1) * OUT].T
                         @ residual[i * OUT:(i + 1) * OUT] for i in range(N)])
        m_inv = 1.0 / (np.mean(rows ** 2, 0) + l2 + damping) ** power
        d = numpy_pcg(curvature + damping * np.eye(len(theta)), -g, decay * previous, m_inv,
                      cg_steps)
        rho = (value(theta + d) - value(theta)) / (g @ d + d @ curvature @ d / 2)
        used.append((damping, rho))
        damping = damping * 2 / 3 if rho > 0.75 else damping * 1.5 if rho < 0.25 else damping
        theta, previous = theta + d, d
    return theta, used


def test_truncated_preconditioned_warm_started_steps_equal_martens_in_numpy():
    x, y = regression(1)
    model = linear()
    theta = flat(model)
    opt = hessian_free(model, MSE, damping=0.5, cg_maxiter=3, cg_tol=0.0, l2_reg=0.01,
                       backtrack=False, line_search_maxiter=0, preconditioner_batch=5)
    step = train.make_train_step(objective_of(model), opt, model.trainable_variables)
    logs = [step((x, y)) for _ in range(3)]
    want, used = numpy_hf(theta, x, y, 3, 0.5, 3, 0.01)
    np.testing.assert_allclose(flat(model), want, rtol=1e-10, atol=1e-12)
    for log, (damping, rho) in zip(logs, used):
        np.testing.assert_allclose(float(log["damping"]), damping, rtol=1e-12)
        np.testing.assert_allclose(float(log["rho"]), rho, rtol=1e-8)
        assert int(log["cg_iterations"]) == 3
        assert int(log["products"]) == 4  # and the warm start's first residual


def test_damping_follows_levenberg_marquardt_on_the_ratios_of_a_non_quadratic_problem():
    v = tf.Variable([-1.2, 1.0], dtype=tf.float64)

    def objective(batch):
        del batch
        return 100.0 * (v[1] - v[0] ** 2) ** 2 + (1.0 - v[0]) ** 2

    opt = hessian_free.from_objective([v], damping=3.0, cg_maxiter=2, cg_tol=0.0,
                                      warm_start_decay=0.0, backtrack=False,
                                      line_search_maxiter=0)
    step = train.make_train_step(objective, opt, [v])
    damping, seen = 3.0, set()
    for _ in range(12):
        theta = v.numpy()
        g, h = scipy.optimize.rosen_der(theta), scipy.optimize.rosen_hess(theta)
        d = np.linalg.solve(h + damping * np.eye(2), -g)
        rho = ((scipy.optimize.rosen(theta + d) - scipy.optimize.rosen(theta))
               / (g @ d + d @ h @ d / 2))
        logs = step(tf.zeros([1]))
        np.testing.assert_allclose(v.numpy(), theta + d, rtol=1e-9)
        np.testing.assert_allclose(float(logs["rho"]), rho, rtol=1e-7)
        assert float(logs["damping"]) == pytest.approx(damping, rel=1e-12)
        seen.add("good" if rho > 0.75 else "bad" if rho < 0.25 else "kept")
        damping = damping * 2 / 3 if rho > 0.75 else damping * 1.5 if rho < 0.25 else damping
    assert seen == {"good", "bad", "kept"}  # every branch of the rule was taken
    np.testing.assert_allclose(float(opt.damping.numpy()), damping, rtol=1e-12)


def test_cg_backtracking_takes_the_best_kept_iterate():
    n = 12
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    a = q @ np.diag(np.geomspace(0.05, 10.0, n)) @ q.T
    b = rng.normal(size=n)
    v = tf.Variable(np.zeros(n))
    quadratic = lambda batch: tf.tensordot(v, tf.linalg.matvec(a, v), 1) / 2 \
        - tf.tensordot(tf.constant(b), v, 1)  # noqa: E731
    # the quadratic's gradient and Hessian at 0, but far iterates pay ||v||^4: an early
    # one is best
    objective = lambda batch: quadratic(batch) + 0.05 * tf.reduce_sum(v ** 2) ** 2  # noqa: E731
    opt = hessian_free.from_objective([v], damping=0.0, cg_maxiter=n, cg_tol=0.0,
                                      warm_start_decay=0.0, line_search_maxiter=0)
    logs = train.make_train_step(objective, opt, [v])(tf.zeros([1]))
    keep = (1, 2, 3, 4, 5, 7, 9, 11, 12)
    seen = []
    scipy.sparse.linalg.cg(a, b, rtol=1e-300, atol=0.0, maxiter=n,
                           callback=lambda xk: seen.append(np.array(xk)))
    iterates = [seen[k - 1] for k in keep]
    values = [x @ a @ x / 2 - b @ x + 0.05 * (x @ x) ** 2 for x in iterates]
    j = len(keep) - 1
    while j > 0 and values[j - 1] < values[j]:
        j -= 1
    assert j == int(np.argmin(values)) and 0 < j < len(keep) - 1
    np.testing.assert_allclose(v.numpy(), iterates[j], rtol=1e-8, atol=1e-10)
    x = iterates[j]
    np.testing.assert_allclose(float(logs["rho"]), values[j] / (x @ a @ x / 2 - b @ x),
                               rtol=1e-7)
    # f(theta), the last iterate, each one back to j, and the worse one before j
    assert int(logs["evaluations"]) == 1 + (len(keep) - j) + 1


def run_mlp(strategy, steps=3, directory=None, start=0, power=0.75):
    x, y = regression(2)
    model = linear(strategy, hidden=4)
    with strategy.scope():
        opt = hessian_free(model, MSE, damping=0.3, cg_maxiter=8, l2_reg=1e-3,
                           line_search_maxiter=5, learning_rate=3.0, preconditioner_batch=4,
                           preconditioner_power=power)
    step = train.make_train_step(objective_of(model), opt, model.trainable_variables,
                                 strategy=strategy)
    ckpt = None
    if directory is not None:
        ckpt = train.Checkpointer(directory, model=model, optimizer=opt)
        ckpt.restore()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(N).repeat()
    it = iter(distribute.distribute_dataset(strategy, data))
    logs = [step(next(it)) for _ in range(start, steps)]
    if ckpt is not None:
        ckpt.step.assign(steps)
        ckpt.save()
    keys = ("loss", "lr", "damping", "rho", "cg_iterations", "evaluations")
    return flat(model), [{k: float(log[k]) for k in keys} for log in logs], step


def test_two_replicas_step_as_one_device_without_retracing():
    one, logs_one, _ = run_mlp(tf.distribute.get_strategy())
    two, logs_two, step = run_mlp(distribute.make_strategy("mirrored"))
    np.testing.assert_allclose(two, one, rtol=1e-9, atol=1e-12)
    for a, b in zip(logs_one, logs_two):
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-8, atol=1e-12, err_msg=key)
    assert step.experimental_get_tracing_count() == 1
    # the searches did something: a rate below the first, a damping that moved
    assert min(log["lr"] for log in logs_one) < 3.0
    assert len({log["damping"] for log in logs_one}) > 1


def test_resume_after_a_kill_equals_an_uninterrupted_run(tmp_path):
    # no preconditioner (a faster trace): the state is the damping and the warm start
    whole, logs, _ = run_mlp(tf.distribute.get_strategy(), steps=3, power=0.0)
    run_mlp(tf.distribute.get_strategy(), steps=1, directory=str(tmp_path), power=0.0)
    resumed, later, _ = run_mlp(tf.distribute.get_strategy(), steps=3,
                                directory=str(tmp_path), start=1, power=0.0)
    np.testing.assert_array_equal(resumed, whole)
    assert later == logs[1:]


def test_newton_cg_on_rosenbrock_reaches_the_target_in_fewer_hvps_than_scipy(tmp_path):
    from experiments.bench import newton_cg
    _, m = harness.run(newton_cg.bench_newton_cg, [bench_config("newton_cg")], [],
                       str(tmp_path))
    ours, theirs = m["hogrod"], m["scipy_at_target"]
    assert ours["f"] < 1e-10 and ours["traces"] == 1
    assert ours["hvps"] <= theirs["hvps"] and ours["iterations"] <= theirs["iterations"]
    np.testing.assert_allclose(ours["x"], np.ones(5), atol=1e-4)
    assert m["scipy"]["f"] < 1e-10


def test_the_curvature_is_the_hessian_of_the_weighted_total_the_step_minimizes():
    v = tf.Variable([1.2, 1.3], dtype=tf.float64)

    def objective(batch):
        del batch
        return {"rosen": 100.0 * (v[1] - v[0] ** 2) ** 2 + (1.0 - v[0]) ** 2,
                "quartic": tf.reduce_sum(v ** 4),
                "monitor/curved": 1e3 * tf.reduce_sum(v ** 2) ** 2}  # logged, not minimized

    opt = hessian_free.from_objective([v], damping=0.0, cg_maxiter=2, cg_tol=0.0,
                                      warm_start_decay=0.0, backtrack=False,
                                      line_search_maxiter=0)
    step = train.make_train_step(objective, opt, [v], weights={"quartic": 0.3})
    theta = v.numpy()
    g = scipy.optimize.rosen_der(theta) + 0.3 * 4 * theta ** 3
    h = scipy.optimize.rosen_hess(theta) + 0.3 * np.diag(12 * theta ** 2)
    assert np.all(np.linalg.eigvalsh(h) > 0)
    step(tf.zeros([1]))
    np.testing.assert_allclose(v.numpy(), theta - np.linalg.solve(h, g), rtol=1e-10)


def test_negative_curvature_on_the_first_direction_steps_as_scipys_newton_cg():
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    a = q @ np.diag([2.0, -1.0, 0.5]) @ q.T
    # the gradient mostly along the negative eigenvector: b^T A b < 0
    c, v0 = q @ np.array([0.3, 1.0, 0.2]), rng.normal(size=3) * 0.1
    c -= a @ v0
    v = tf.Variable(v0)
    objective = lambda batch: 0.5 * tf.tensordot(v, tf.linalg.matvec(a, v), 1) \
        + tf.tensordot(tf.constant(c), v, 1)  # noqa: E731
    opt = hessian_free.from_objective([v], damping=0.0, cg_maxiter=10, warm_start_decay=0.0,
                                      backtrack=False, line_search_maxiter=0)
    logs = train.make_train_step(objective, opt, [v])(tf.zeros([1]))
    # scipy's _minimize_newtoncg, first CG iteration with curv < 0: dri0 / (-curv) * b
    g = a @ v0 + c
    b = -g
    curv = b @ a @ b
    assert curv < 0
    step = (b @ b) / (-curv) * b
    np.testing.assert_allclose(v.numpy(), v0 + step, rtol=1e-12)
    change = lambda s: g @ s + s @ a @ s / 2  # noqa: E731  f's exact change
    np.testing.assert_allclose(float(logs["rho"]), 1.0, rtol=1e-12)
    assert change(step) < 0
    # no CG step; one product, the one that found the negative curvature
    assert int(logs["cg_iterations"]) == 0 and int(logs["products"]) == 1


def test_a_non_finite_curvature_product_leaves_the_weights_and_grows_the_damping():
    v = tf.Variable([0.0, 1.0], dtype=tf.float64)
    # a finite value and gradient at v, an infinite second derivative in v[0]: H p is NaN
    objective = lambda batch: tf.reduce_sum(v ** 2) + tf.abs(v[0]) ** 1.5  # noqa: E731
    opt = hessian_free.from_objective([v], damping=1.0, cg_maxiter=4, warm_start_decay=0.0,
                                      line_search_maxiter=3)
    logs = train.make_train_step(objective, opt, [v])(tf.zeros([1]))
    np.testing.assert_array_equal(v.numpy(), [0.0, 1.0])
    assert float(logs["lr"]) == 0.0
    assert float(opt.damping.numpy()) == pytest.approx(1.5, rel=1e-12)  # a failed step
    assert np.all(np.isfinite(opt.previous[0].numpy()))



def test_no_accepted_rate_is_a_failed_step_though_rho_is_good():
    v = tf.Variable([1.0, -2.0], dtype=tf.float64)
    objective = lambda batch: tf.reduce_sum(v ** 2)  # noqa: E731
    # the full step is exact (rho = 1) but the search's one value, at rate 100, is worse
    opt = hessian_free.from_objective([v], damping=1.0, learning_rate=100.0,
                                      line_search_maxiter=1)
    logs = train.make_train_step(objective, opt, [v])(tf.zeros([1]))
    assert float(logs["rho"]) == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_array_equal(v.numpy(), [1.0, -2.0])
    assert float(logs["lr"]) == 0.0
    assert float(opt.damping.numpy()) == pytest.approx(1.5, rel=1e-12)

def batch_norm_model():
    keras.utils.set_random_seed(2)
    return keras.Sequential([keras.Input((D,), dtype="float64"),
                             keras.layers.Dense(4, dtype="float64"),
                             keras.layers.BatchNormalization(dtype="float64"),
                             keras.layers.Dense(OUT, dtype="float64")])


def statistics_after_a_step(make_optimizer):
    """The BatchNorm moving statistics after one step of the optimizer made from the
    model."""
    x, y = regression(4)
    model = batch_norm_model()
    objective = lambda b: batch_loss(MSE, b[1], model(b[0], training=True))  # noqa: E731
    train.make_train_step(objective, make_optimizer(model), model.trainable_variables,
                          jit_compile=False)((x, y))  # bitwise
    return [v.numpy() for v in model.non_trainable_variables]


@pytest.mark.parametrize("kind", ["gauss_newton", "hessian"])
def test_extra_passes_leave_the_batch_norm_statistics_as_the_steps_own_pass_did(kind):
    want = statistics_after_a_step(lambda model: keras.optimizers.SGD(0.1))
    start = [v.numpy() for v in batch_norm_model().non_trainable_variables]
    assert not np.allclose(want[0], start[0])  # the step's own pass moved them
    options = dict(damping=0.1, cg_maxiter=3, line_search_maxiter=3, learning_rate=2.0)
    if kind == "gauss_newton":  # products, preconditioner and values
        make = lambda model: hessian_free(model, MSE, preconditioner_batch=5,  # noqa: E731
                                          **options)
    else:
        make = lambda model: hessian_free.from_objective(  # noqa: E731
            model.trainable_variables, **options)
    for got, expected in zip(statistics_after_a_step(make), want):
        np.testing.assert_array_equal(got, expected)


def test_an_extra_value_sees_activity_losses_and_writes_no_state():
    x, y = regression(4)
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((D,), dtype="float64"),
                              keras.layers.Dense(4, dtype="float64",
                                                 activity_regularizer="l2"),
                              keras.layers.BatchNormalization(dtype="float64"),
                              keras.layers.Dense(OUT, dtype="float64")])

    def objective(batch):
        z = model(batch[0], training=True)
        return batch_loss(MSE, batch[1], z) + tf.add_n(model.losses)

    state = [v.numpy() for v in model.non_trainable_variables]
    value = float(common.value_on_batch(objective, (x, y)))
    for got, want in zip(model.non_trainable_variables, state):
        np.testing.assert_array_equal(got.numpy(), want)
    assert value == float(objective((x, y)))  # the same pass, its state written now


def test_bad_input_is_an_error_naming_the_argument():
    model = linear()
    v = tf.Variable([1.0], dtype=tf.float64)
    f = lambda batch: tf.reduce_sum(v ** 2)  # noqa: E731
    for kwargs, match in [
            (dict(learning_rate=0.0), "learning_rate must be a positive"),
            (dict(damping=-1.0), "damping must be a finite number >= 0"),
            (dict(cg_maxiter=0), "cg_maxiter must be an integer >= 1"),
            (dict(cg_tol=-1e-3), "cg_tol must be"),
            (dict(line_search_maxiter=-1), "line_search_maxiter must be an integer >= 0"),
            (dict(preconditioner_power=1.5), "preconditioner_power must be"),
            (dict(warm_start_decay=1.5), "warm_start_decay must be"),
            (dict(damping_decay=0.0), "damping_decay must be"),
            (dict(cg_tol_rule="eisenstat"), "cg_tol_rule must be one of"),
            (dict(backtrack="yes"), "backtrack must be True or False"),
            (dict(min_damping=2.0, max_damping=1.0),
             r"max_damping must be a finite number in \[2.0, inf\]"),
            (dict(preconditioner_batch=0), "preconditioner_batch must be an integer >= 1")]:
        with pytest.raises(ValueError, match=f"hessian_free: {match}"):
            hessian_free(model, MSE, **kwargs)
    with pytest.raises(ValueError, match="curvature must be one of \\('hessian',\\)"):
        hessian_free.from_objective([v], curvature="gauss_newton")
    with pytest.raises(ValueError, match="from_objective: variables is empty"):
        hessian_free.from_objective([])
    with pytest.raises(ValueError, match="from_objective: backtrack must be True or False"):
        hessian_free.from_objective([v], backtrack=np.int64(1))
    with pytest.raises(ValueError, match=r"from_objective: variables\[0\] must be a tf.Var"):
        hessian_free.from_objective(f, [v])  # it takes no objective: the step's is used
    with pytest.raises(ValueError, match="hessian_free: model must be a built keras.Model"):
        hessian_free(None, MSE)
    opt = hessian_free.from_objective([v])
    with pytest.raises(ValueError, match="the variables given to hessian_free.from_objective"):
        train.make_train_step(f, opt, model.trainable_variables)
    with pytest.raises(ValueError, match="the train step's batch must be a pair"):
        train.make_train_step(lambda b: tf.reduce_mean(model(b)), hessian_free(model, MSE),
                              model.trainable_variables)(tf.zeros([N, D], tf.float64))
