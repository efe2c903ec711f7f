"""Meta-learning on a linear model with MSE, against numpy: the support gradient
g = 2/n X^T (X theta - y) and Hessian H = 2/n X^T X are closed form, so every inner step,
learned rate, multi-step weight and meta-gradient is a few lines of float64 numpy
(forward-mode through the unrolled steps). Float64 runs must agree to 1e-12 relative: a
Python hyperparameter such as 0.05 must meet the float64 tensors as float64's 0.05, not
float32's 0.05000000074505806. Also ANIL's head (only layers with weights count), MAML++'s
per-step rates at evaluation, and XLA compiling MAML's step once. The gradients are
`meta.meta_gradient`'s; MAML++ and Reptile run in every task mapping."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import meta, train
from conftest import central_differences

LR = 0.05  # not a float32 number


def mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def linear_model(dim=2):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((dim,), dtype="float64"),
                             keras.layers.Dense(1, dtype="float64")])


def linear_tasks(n=2, k_support=6, k_query=5, dim=2, seed=0):
    rng = np.random.default_rng(seed)
    xs, xq = rng.normal(size=(n, k_support, dim)), rng.normal(size=(n, k_query, dim))
    w = rng.normal(size=(n, dim, 1))
    return xs, xs @ w + 0.1, xq, xq @ w - 0.2


def theta_of(model):  # kernel entries, then the bias
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])


def flat(tensors):
    return np.concatenate([np.asarray(t).ravel() for t in tensors])


def augmented(x):
    return np.concatenate([x, np.ones((len(x), 1))], 1)


def loss_np(theta, x, y):
    return np.mean((augmented(x) @ theta - y[:, 0]) ** 2)


def grad_np(theta, x, y):
    a = augmented(x)
    return 2 * a.T @ (a @ theta - y[:, 0]) / len(x)


def hess_np(x):
    a = augmented(x)
    return 2 * a.T @ a / len(x)


def unrolled(theta, task, rates, weights, rate_basis=None):
    """sum_s w_s L_q(theta_{s+1}), theta_{s+1} = theta_s - r_s * g(theta_s), and its
    gradients with respect to theta and to the rate parameters rho (r_s = R_s rho,
    R_s = rate_basis[s]), carried forward through the steps."""
    xs, ys, xq, yq = task
    p = len(theta)
    h = hess_np(xs)
    d_theta = np.eye(p)
    d_rho = None if rate_basis is None else np.zeros((p, rate_basis[0].shape[1]))
    value, g_theta, g_rho = 0.0, np.zeros(p), None if rate_basis is None else 0.0
    for s, (r, w) in enumerate(zip(rates, weights)):
        g = grad_np(theta, xs, ys)
        step = np.eye(p) - np.asarray(r).reshape(-1, 1) * h
        if d_rho is not None:
            d_rho = step @ d_rho - g[:, None] * rate_basis[s]
        d_theta = step @ d_theta
        theta = theta - r * g
        gq = grad_np(theta, xq, yq)
        value += w * loss_np(theta, xq, yq)
        g_theta = g_theta + w * d_theta.T @ gq
        if d_rho is not None:
            g_rho = g_rho + w * d_rho.T @ gq
    return value, g_theta, g_rho


def over_tasks(tasks, fn):
    results = [fn(tuple(t[i] for t in tasks)) for i in range(tasks[0].shape[0])]
    return [None if results[0][j] is None else np.mean([r[j] for r in results], 0)
            for j in range(len(results[0]))]


def run(algo, model, tasks, step=None):
    """The meta-loss's terms, and `meta.meta_gradient` (model weights, then the
    algorithm's variables)."""
    tasks = tuple(tf.constant(t) for t in tasks)
    out = algo.meta_loss(tasks, step)
    loss, grads = meta.meta_gradient(algo, model, tasks, step)
    assert float(loss) == float(out["loss"])
    return out, grads


def assert_close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15 * np.abs(want).max())


def test_maml_two_steps_float64_is_exact():
    model, tasks = linear_model(), linear_tasks()
    algo = meta.maml(model, mse, inner_lr=LR, inner_steps=2)
    out, grads = run(algo, model, tasks)
    value, g_theta, _ = over_tasks(
        tasks, lambda t: unrolled(theta_of(model), t, [LR, LR], [0.0, 1.0]))
    assert_close(out["loss"], value)
    assert_close(flat(grads), g_theta)


def test_meta_sgd_float64_is_exact():
    model, tasks = linear_model(), linear_tasks()
    algo = meta.meta_sgd(model, mse, inner_lr=LR, inner_steps=2)
    assert_close(flat(algo.variables), np.full(3, LR))
    out, grads = run(algo, model, tasks)
    value, g_theta, g_rates = over_tasks(tasks, lambda t: unrolled(
        theta_of(model), t, [np.full(3, LR)] * 2, [0.0, 1.0], [np.eye(3)] * 2))
    assert_close(out["loss"], value)
    assert_close(flat(grads[:2]), g_theta)
    assert_close(flat(grads[2:]), g_rates)


def maml_plus_plus_oracle(model, tasks):
    """MAML++ at outer step 3 of 10 (weights 3/10 of the way to the last step only)."""
    weights = 0.7 * np.full(3, 1 / 3) + 0.3 * np.eye(3)[2]
    basis = [np.outer(np.ones(3), np.eye(3)[s]) for s in range(3)]  # one layer, one rate a step
    return over_tasks(tasks, lambda t: unrolled(theta_of(model), t, [LR] * 3, weights, basis))


@pytest.mark.parametrize("mode", ["sequential", "recomputed"])
def test_maml_plus_plus_float64_is_exact(mode):
    # the outer step given to meta_loss (no counter at construction); the other task
    # mappings (the vectorized default: below). Recomputed: one task (a Python loop over
    # the tasks, each a cond of both phases, recomputed: slow to trace)
    model, tasks = linear_model(), linear_tasks(n=1 if mode == "recomputed" else 2)
    algo = meta.maml_plus_plus(model, mse, inner_lr=LR, inner_steps=3, task_map=mode,
                               multi_step_iterations=10, first_order_iterations=0)
    out, grads = run(algo, model, tasks, step=3)
    value, g_theta, g_rates = maml_plus_plus_oracle(model, tasks)
    assert_close(out["loss"], value)
    assert_close(flat(grads[:2]), g_theta)
    assert_close(flat(grads[2:]), g_rates)


def test_maml_plus_plus_reads_the_counter_it_was_built_with():
    model, tasks = linear_model(), linear_tasks()
    counter = tf.Variable(0, dtype=tf.int64)
    algo = meta.maml_plus_plus(model, mse, inner_lr=LR, inner_steps=3, iterations=counter,
                               multi_step_iterations=10, first_order_iterations=0)
    counter.assign(3)  # read on every call
    out, grads = run(algo, model, tasks)
    value, g_theta, g_rates = maml_plus_plus_oracle(model, tasks)
    assert_close(out["loss"], value)
    assert_close(flat(grads), np.concatenate([g_theta, g_rates]))
    counter.assign(0)  # a step given to meta_loss wins
    _, grads = run(algo, model, tasks, step=3)
    assert_close(flat(grads), np.concatenate([g_theta, g_rates]))
    without = meta.maml_plus_plus(model, mse, inner_lr=LR, inner_steps=3)
    with pytest.raises(ValueError, match=r"meta_loss\(tasks, step\)"):
        without.meta_loss(tuple(tf.constant(t) for t in tasks))


@pytest.mark.parametrize("mode", ["vectorized", "sequential", "recomputed"])
def test_reptile_float64_is_exact(mode):
    """Reptile's loss 0.5 ||theta - phi||^2 (mean over tasks), its gradient theta - mean
    phi, phi after 2 SGD steps on support and query together; the query loss at phi is
    logged as monitor/query."""
    model, tasks = linear_model(), linear_tasks()
    algo = meta.reptile(model, mse, inner_lr=LR, inner_steps=2, task_map=mode)
    out, grads = run(algo, model, tasks)

    def exact(task):
        xs, ys, xq, yq = task
        x, y = np.concatenate([xs, xq]), np.concatenate([ys, yq])
        theta = phi = theta_of(model)
        for _ in range(2):
            phi = phi - LR * grad_np(phi, x, y)
        return 0.5 * np.sum((theta - phi) ** 2), theta - phi, loss_np(phi, xq, yq)

    value, grad, query = over_tasks(tasks, exact)
    assert_close(out["loss"], value)
    assert_close(out["monitor/query"], query)
    assert_close(flat(grads), grad)


def test_maml_plus_plus_adapts_with_each_steps_own_rate():
    model, tasks = linear_model(), linear_tasks(n=1)
    algo = meta.maml_plus_plus(model, mse, inner_lr=LR, inner_steps=2,
                               iterations=tf.Variable(0, dtype=tf.int64))
    algo.variables[0].assign([0.1, 0.3])
    xs, ys = tasks[0][0], tasks[1][0]
    theta = theta_of(model)
    for rate in (0.1, 0.3, 0.3):  # past inner_steps: the last step's rate
        theta = theta - rate * grad_np(theta, xs, ys)
    assert_close(flat(algo.adapt((tf.constant(xs), tf.constant(ys)), 3)), theta)


def test_imaml_float64_is_exact():
    model, tasks = linear_model(), linear_tasks()
    lam, steps = 0.5, 5
    for x in tasks[0]:  # the rate stays inner_lr: below 1 / (largest curvature + lam)
        assert LR < 1 / (np.linalg.eigvalsh(hess_np(x)).max() + lam)
    algo = meta.imaml(model, mse, inner_lr=LR, inner_steps=steps, lam=lam, maxiter=3,
                      curvature_probes=3)
    out, grads = run(algo, model, tasks)

    def exact(task):
        xs, ys, xq, yq = task
        theta = phi = theta_of(model)
        for _ in range(steps):
            phi = phi - LR * (grad_np(phi, xs, ys) + lam * (phi - theta))
        implicit = np.linalg.solve(np.eye(3) + hess_np(xs) / lam, grad_np(phi, xq, yq))
        return loss_np(phi, xq, yq), implicit

    query, implicit = over_tasks(tasks, exact)
    assert_close(out["monitor/query"], query)
    assert_close(flat(grads), implicit)


def anil_model(head_activation=True):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((3,), dtype="float64"),
              keras.layers.Dense(2, use_bias=False, dtype="float64"),
              keras.layers.Dense(1, use_bias=False, dtype="float64")]
    if head_activation:
        layers.append(keras.layers.Activation("linear", dtype="float64"))
    return keras.Sequential(layers)


def test_anil_adapts_the_head_and_its_meta_gradient_is_the_closed_form():
    # pred = x W1 w (body W1, head w); one inner step on w only
    model, a = anil_model(), 0.1
    body, head = (v.numpy() for v in model.trainable_variables)
    xs, ys, xq, yq = (t[0] for t in linear_tasks(n=1, k_support=6, k_query=5, dim=3))
    algo = meta.anil(model, mse, inner_lr=a, head_layers=1)
    hs, hq = xs @ body, xq @ body
    rs = hs @ head - ys
    head1 = head - a * 2 * hs.T @ rs / len(xs)
    fast = algo.adapt((tf.constant(xs), tf.constant(ys)), 1)
    np.testing.assert_array_equal(fast[0], body)  # the body is never adapted
    assert_close(fast[1], head1)
    rq = hq @ head1 - yq
    u = 2 * hq.T @ rq / len(xq)  # dL_q / d head1
    g_head = (np.eye(2) - a * 2 * hs.T @ hs / len(xs)) @ u
    g_body = (2 * xq.T @ rq @ head1.T / len(xq)
              - a * 2 / len(xs) * (xs.T @ rs @ u.T + xs.T @ xs @ body @ u @ head.T))
    out, grads = run(algo, model, tuple(t[None] for t in (xs, ys, xq, yq)))
    assert_close(out["loss"], np.mean(rq ** 2))
    assert_close(grads[0], g_body)
    assert_close(grads[1], g_head)


@pytest.mark.parametrize("head_layers", [0, 3, 1.0])
def test_anil_refuses_a_head_it_cannot_adapt(head_layers):
    with pytest.raises(ValueError, match="anil: head_layers must be an integer >= 1 and <= 2"):
        meta.anil(anil_model(), mse, head_layers=head_layers)


def test_jit_compiled_maml_step_takes_the_meta_batch_as_input():
    # Compiled with the meta-batch as a constant, XLA would compile anew on every step.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    algo = meta.maml(model, mse, inner_lr=0.05)

    @tf.function(jit_compile=True)
    def grads(batch):
        with tf.GradientTape() as tape:
            loss = algo.meta_loss(batch)["loss"]
        return tape.gradient(loss, model.trainable_variables)

    batch = tuple(tf.random.stateless_normal((3, 5, 1), (i, 0)) for i in range(4))
    hlo = grads.experimental_get_compiler_ir(batch)(stage="hlo")
    entry = hlo[hlo.index("ENTRY"):]
    assert len(set(re.findall(r"parameter\((\d+)\)", entry))) == 4 + 4  # batch, weights
    plain = train.make_train_step(algo.meta_loss, keras.optimizers.SGD(0.0),
                                  model.trainable_variables)
    jit = train.make_train_step(algo.meta_loss, keras.optimizers.SGD(0.0),
                                model.trainable_variables, jit_compile=True)
    for s in range(2):
        batch = tuple(tf.random.stateless_normal((3, 5, 1), (s, i)) for i in range(4))
        np.testing.assert_allclose(jit(batch)["loss"], plain(batch)["loss"], rtol=1e-5)


def test_a_one_task_meta_batch_of_a_conv_net_compiles_under_xla_as_the_plain_step():
    """One task under XLA: the vectorized map's pfor fails on a conv net's inner gradient
    with one iteration; the task is then mapped as itself. Oracle: the plain tf.function's
    meta-loss, float64."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5, 5, 1), dtype="float64"),
                              keras.layers.Conv2D(2, 3, dtype="float64"),
                              keras.layers.Flatten(dtype="float64"),
                              keras.layers.Dense(3, dtype="float64")])
    ce = lambda y, logits: tf.reduce_mean(  # noqa: E731
        tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    algo = meta.maml(model, ce, inner_lr=0.4, task_map="vectorized")
    rng = np.random.default_rng(0)
    batch = (tf.constant(rng.normal(size=(1, 3, 5, 5, 1))), tf.constant([[0, 1, 2]]),
             tf.constant(rng.normal(size=(1, 6, 5, 5, 1))), tf.constant([[0, 1, 2] * 2]))
    loss = lambda b: algo.meta_loss(b)["loss"]  # noqa: E731
    np.testing.assert_allclose(tf.function(loss, jit_compile=True)(batch).numpy(),
                               tf.function(loss)(batch).numpy(), rtol=1e-12)


def test_maml_through_batch_statistics_matches_central_differences_to_second_order():
    """BatchNorm on the batch's statistics: the meta-gradient against float64 central
    differences of the meta-loss. Keras's batch variance (tf.nn.moments) stops the
    gradient through its mean, which drops second-order terms of this meta-gradient; the
    bias before BatchNorm cancels out of the model, so its meta-gradient is zero."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(4, dtype="float64"),
                              keras.layers.BatchNormalization(dtype="float64"),
                              keras.layers.Activation("tanh", dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    for v in model.trainable_variables:  # away from BatchNorm's gamma 1, beta 0
        v.assign(v + 0.3 * np.random.default_rng(2).normal(size=v.shape))
    tasks = tuple(tf.constant(t) for t in linear_tasks(n=2, dim=3, seed=4))
    algo = meta.maml(model, mse, inner_lr=0.4, inner_steps=2)
    _, grads = meta.meta_gradient(algo, model, tasks)
    numeric = central_differences(lambda: algo.meta_loss(tasks)["loss"],
                                  model.trainable_variables, 1e-5)
    np.testing.assert_allclose(flat(grads), flat(numeric), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(grads[1].numpy(), 0.0, atol=1e-12)  # the cancelled bias
