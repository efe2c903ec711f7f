"""MAML with a `hogrod.optim` inner optimizer, on a float64 linear model with MSE:
inner sgd equals plain MAML to 1e-12 (values and meta-gradients); an inner Adam's
meta-gradient, and the gradient with respect to learned inner hyperparameters (log learning
rate, logit b1), against float64 central differences; `Algorithm.adapt` takes the
optimizer's steps; a compiled train step moves the learned hyperparameters; bad input."""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import meta, optim, train
from conftest import central_differences

LR = 0.05  # not a float32 number


@pytest.fixture(autouse=True)
def no_gin_bindings():
    # maml's arguments left out here must take their defaults, not a parsed config's
    gin.clear_config()


def mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def linear_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((2,), dtype="float64"),
                             keras.layers.Dense(1, dtype="float64")])


def linear_tasks(n=2, k_support=6, k_query=5, seed=0):
    rng = np.random.default_rng(seed)
    xs, xq = rng.normal(size=(n, k_support, 2)), rng.normal(size=(n, k_query, 2))
    w = rng.normal(size=(n, 2, 1))
    return tuple(tf.constant(t) for t in (xs, xs @ w + 0.1, xq, xq @ w - 0.2))


def flat(tensors):
    return np.concatenate([np.asarray(t).ravel() for t in tensors])


def assert_close(got, want, rtol=1e-12):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-3 * np.abs(want).max())


@pytest.mark.parametrize("algorithm", ["maml", "fomaml"])
def test_inner_sgd_equals_plain_maml_float64(algorithm):
    model, tasks = linear_model(), linear_tasks()
    build = getattr(meta, algorithm)
    plain = build(model, mse, inner_lr=LR, inner_steps=2)
    with_opt = build(model, mse, inner_steps=2, inner_optimizer=optim.sgd(LR))
    want_loss, want = meta.meta_gradient(plain, model, tasks)
    loss, got = meta.meta_gradient(with_opt, model, tasks)
    assert_close(loss, want_loss)
    for a, b in zip(got, want):
        assert_close(a, b)
    support = (tasks[0][0], tasks[1][0])
    for a, b in zip(with_opt.adapt(support, 3), plain.adapt(support, 3)):
        assert_close(a, b)


def test_inner_adam_meta_gradient_matches_central_differences_and_adapt_uses_it():
    model, tasks = linear_model(), linear_tasks()
    opt = optim.adam(0.1, 0.8, 0.95, 1e-3)
    algo = meta.maml(model, mse, inner_steps=2, inner_optimizer=opt)
    _, got = meta.meta_gradient(algo, model, tasks)
    want = central_differences(lambda: algo.meta_loss(tasks)["loss"],
                               model.trainable_variables)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-6, atol=1e-9)
    support = (tasks[0][0], tasks[1][0])
    direct = meta.adapt(model, mse, support, None, inner_steps=3, optimizer=opt)
    for a, b in zip(algo.adapt(support, 3), direct):
        assert_close(a, b)


def test_learned_inner_hyperparameters_gradient_matches_central_differences():
    model, tasks = linear_model(), linear_tasks()
    algo = meta.maml(model, mse, inner_steps=2, inner_optimizer=optim.adam(0.1, 0.8, 0.95),
                     learn_inner_hyperparameters=True)
    names = [v.name.split(":")[0] for v in algo.variables]
    assert names == ["inner_log_learning_rate", "inner_logit_b1", "inner_logit_b2"]
    assert all(v.dtype == tf.float64 for v in algo.variables)
    np.testing.assert_allclose(np.exp(algo.variables[0].numpy()), 0.1, rtol=1e-15)
    np.testing.assert_allclose(1 / (1 + np.exp(-algo.variables[1].numpy())), 0.8, rtol=1e-15)
    _, grads = meta.meta_gradient(algo, model, tasks)
    got = grads[len(model.trainable_variables):]
    want = central_differences(lambda: algo.meta_loss(tasks)["loss"], algo.variables)
    for a, b in zip(got, want):
        assert float(tf.abs(a)) > 0
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-6, atol=1e-10)
    # evaluation adapts with the learned values: a larger learning rate moves further
    support = (tasks[0][0], tasks[1][0])
    start = flat(model.trainable_variables)
    before = np.abs(flat(algo.adapt(support, 1)) - start).max()
    algo.variables[0].assign_add(np.log(2.0))
    after = np.abs(flat(algo.adapt(support, 1)) - start).max()
    np.testing.assert_allclose(after, 2 * before, rtol=1e-10)


def test_compiled_train_step_moves_learned_hyperparameters():
    model, tasks = linear_model(), linear_tasks()
    algo = meta.maml(model, mse, inner_optimizer=optim.sgd(LR, momentum=0.5),
                     learn_inner_hyperparameters=["learning_rate"])
    variables = model.trainable_variables + algo.variables
    start = [v.numpy() for v in variables]
    step = train.make_train_step(algo.meta_loss, keras.optimizers.SGD(0.1), variables)
    for _ in range(2):
        step(tasks)
    for v, s in zip(variables, start):
        assert not np.allclose(v.numpy(), s), v.name


def test_bad_input_names_the_argument():
    model = linear_model()
    with pytest.raises(ValueError, match=r"inner_lr or inner_optimizer.*`maml.inner_lr = None`"):
        meta.maml(model, mse, inner_lr=0.1, inner_optimizer=optim.sgd(0.1))
    with pytest.raises(TypeError, match="inner_optimizer"):
        meta.maml(model, mse, inner_optimizer=keras.optimizers.Adam(0.1))
    with pytest.raises(TypeError, match="inner_optimizer"):
        meta.maml(model, mse, inner_optimizer=optim.adam)  # gin's @adam without ()
    with pytest.raises(ValueError, match="learn_inner_hyperparameters.*inner_optimizer"):
        meta.fomaml(model, mse, learn_inner_hyperparameters=True)
    with pytest.raises(ValueError, match="momentum.*boundary"):  # sgd's momentum is 0
        meta.maml(model, mse, inner_optimizer=optim.sgd(0.1), learn_inner_hyperparameters=True)
    with pytest.raises(ValueError, match="no learnable hyperparameter 'rho'"):
        meta.maml(model, mse, inner_optimizer=optim.adam(0.1),
                  learn_inner_hyperparameters=["rho"])
    with pytest.raises(TypeError, match="learn_inner_hyperparameters"):
        meta.maml(model, mse, inner_optimizer=optim.adam(0.1),
                  learn_inner_hyperparameters="learning_rate")
    learned, _ = optim.learnable(optim.adam(0.1), tf.float64)
    with pytest.raises(TypeError, match="not already learnable"):
        optim.learnable(learned, tf.float64)
    with pytest.raises(TypeError, match="only a Python number"):
        optim.learnable(optim.adam(tf.constant(0.1, tf.float64)), tf.float64)


def _three_adam_steps_objective(dtype, logit_b2, eps, compile=False):
    """sum(c * params after 3 steps) of Adam with a learned b2 (logit given), and its
    derivative with respect to that logit; fixed gradients, so only b2 moves the result."""
    opt, (v,) = optim.learnable(optim.adam(0.1, 0.9, 0.5, eps), dtype, names=["b2"])
    v.assign(logit_b2)
    rng = np.random.default_rng(3)
    start = [tf.constant(rng.normal(size=5), dtype)]
    c = tf.constant(rng.normal(size=5), dtype)
    grads = [[tf.constant(np.random.default_rng(s).normal(size=5), dtype)] for s in range(3)]

    def run():
        with tf.GradientTape() as tape:
            params, state = start, opt.init(start)
            for g in grads:
                params, state = opt.update(g, state, params)
            f = tf.reduce_sum(c * params[0])
        return f, tape.gradient(f, v)

    f, grad = (tf.function(run) if compile else run)()
    return f.numpy(), grad.numpy()


def test_learned_b2_near_one_has_finite_float32_derivative_matching_float64():
    # A learned b2's logit drifts up in MAML on sinusoids (6.9 to ~17 in 17,658 steps, where
    # the meta-gradient came out NaN): in float32 sigmoid(20) is exactly 1, so 1 - sigmoid(v)
    # is 0 and sqrt(1 - b2^t) has an infinite derivative. eps is small against
    # sqrt(1 - b2) |g| ~ 5e-5, so b2 changes the steps.
    logit, eps = 20.0, 1e-5
    assert tf.sigmoid(tf.constant(logit, tf.float32)).numpy() == 1.0
    value32, grad32 = _three_adam_steps_objective(tf.float32, logit, eps)
    value64, grad64 = _three_adam_steps_objective(tf.float64, logit, eps)
    d = 1e-3
    fd = (_three_adam_steps_objective(tf.float64, logit + d, eps)[0]
          - _three_adam_steps_objective(tf.float64, logit - d, eps)[0]) / (2 * d)
    np.testing.assert_allclose(grad64, fd, rtol=1e-6)
    assert abs(fd) > 1e-2  # b2 matters here: the comparison is not 0 == 0
    np.testing.assert_allclose(value32, value64, rtol=1e-5)
    assert np.isfinite(grad32)
    np.testing.assert_allclose(grad32, fd, rtol=1e-3)


@pytest.mark.parametrize("compile", [False, True])
def test_learned_b2_past_float_range_is_an_error_naming_it(compile):
    # sigmoid(-120) underflows to 0 in float32: the exact 1 - b2 is not representable
    with pytest.raises(tf.errors.InvalidArgumentError, match="learned b2.*learnable"):
        _three_adam_steps_objective(tf.float32, 120.0, 1e-7, compile)


def test_an_inner_optimizer_on_a_config_binding_inner_lr_names_the_binding_to_add(tmp_path):
    """configs/maml/sinusoid_maml.gin includes a file binding `maml.inner_lr`, which a user
    cannot remove: the error says to bind it to None, before any data is loaded or any
    training output written; with that binding the configuration is accepted."""
    from experiments import maml as exp
    from hogrod import harness
    out = tmp_path / "run"
    adam = ["maml.inner_optimizer = @hogrod.optim.adam()",
            "hogrod.optim.adam.learning_rate = 0.01"]
    with pytest.raises(ValueError, match=r"maml.inner_lr = None"):
        harness.run(exp.maml_experiment, ["configs/maml/sinusoid_maml.gin"], adam, str(out))
    assert not out.exists()  # refused before the output directory is made
    harness.parse_config(["configs/maml/sinusoid_maml.gin"], adam + ["maml.inner_lr = None"])
    try:
        exp.check_config()
    finally:
        gin.clear_config()
    # an algorithm's own task_map binding would be overridden by maml_experiment's
    harness.parse_config(["configs/maml/sinusoid_maml.gin"], ["maml.task_map = 'sequential'"])
    try:
        with pytest.raises(ValueError, match="maml_experiment.task_map = 'sequential'"):
            exp.check_config()
    finally:
        gin.clear_config()
