"""experiments/hyperopt.py: the exact hypergradient against float64 central differences,
each method's config end to end on a tiny problem, and bad bindings."""

import json

import numpy as np
import pytest
import tensorflow as tf

from experiments import hyperopt
from hogrod import harness

# A tiny problem: 12 training digits, the exact oracle and the binary run in seconds.
TINY = ["hyperopt_digits.n_train = 12", "hyperopt_digits.n_val = 10",
        "hyperopt_digits.n_test = 20", "hyperopt_experiment.outer_steps = 3",
        "inner/hogrod.optim.sgd.learning_rate = 0.3"]  # 12 digits curve more than 100


@pytest.fixture(scope="module")
def small():
    """8 features, 3 classes, 15 training and 10 validation points, float64."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(25, 8))
    y = np.argmax(x[:, :3] + 0.7 * rng.normal(size=(25, 3)), axis=1)
    s = np.log(rng.uniform(0.05, 0.5, size=8))
    return (x[:15], y[:15]), (x[15:], y[15:]), s


def test_exact_hypergradient_matches_central_differences(small):
    train, val, s = small
    bias_l2 = 0.01
    grads, theta, val_loss = hyperopt.exact_hypergradient(s, bias_l2, train, val, 3)

    def f(s_):  # the validation loss at the inner minimizer, re-solved at s_
        th = hyperopt.solve_inner(s_, bias_l2, *train, 3, theta0=theta, tol=1e-12)
        return hyperopt.evaluate(th, val)[0]

    eps = 1e-5
    fd = np.array([(f(s + eps * e) - f(s - eps * e)) / (2 * eps) for e in np.eye(len(s))])
    assert np.linalg.norm(fd) > 1e-3  # the penalties matter here
    np.testing.assert_allclose(grads, fd, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(val_loss, f(s), rtol=1e-12)
    # theta* is a root of the inner gradient by the other implementation (TF autodiff)
    inner, _ = hyperopt.make_objectives(train, val, bias_l2)
    params = [tf.constant(theta[:-1]), tf.constant(theta[-1])]
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = inner(params, tf.constant(s))
    g = tape.gradient(loss, params)
    assert max(float(tf.reduce_max(tf.abs(t))) for t in g) < 1e-10


@pytest.mark.parametrize("config, min_cosine", [
    ("digits_implicit.gin", 0.999), ("digits_neumann.gin", 0.9), ("digits_unrolled.gin", 0.5),
    ("digits_one_step.gin", None)])
def test_binary_runs_each_method(tmp_path, config, min_cosine):
    out = str(tmp_path / "run")
    _, m = harness.run(hyperopt.hyperopt_experiment, [f"configs/hyperopt/{config}"], TINY, out)
    with open(tmp_path / "run" / "eval_history.json") as f:
        history = json.load(f)
    assert [h["step"] for h in history] == [0, 1, 2, 3]
    assert all(np.isfinite(h["val_loss"]) and 0 <= h["test_accuracy"] <= 1 for h in history)
    assert all(abs(h["cosine_to_exact"]) <= 1 + 1e-12 for h in history[:-1])
    for name in ("loss.png", "hypergradient.png", "operative_config.gin", "metrics.json"):
        assert (tmp_path / "run" / name).exists()
    if min_cosine is not None:  # the converged methods agree with the exact hypergradient
        assert m["min_cosine_to_exact"] > min_cosine, m
    if config == "digits_implicit.gin":
        # CG at a converged inner problem is the exact hypergradient at the same penalties
        assert m["mean_rel_err_to_exact"] < 1e-4, m
        paths = hyperopt.plot_compare([out, out], str(tmp_path / "cmp"))  # the figure, once
        assert all(tf.io.gfile.exists(p) for p in paths)
    if config == "digits_unrolled.gin":  # resuming, once
        # a finished run run again trains nothing and re-evaluates the same final state
        _, again = harness.run(hyperopt.hyperopt_experiment, [f"configs/hyperopt/{config}"],
                               TINY, out)
        np.testing.assert_allclose(again["final_val_loss"], m["final_val_loss"], rtol=1e-9)
        assert again["mean_cosine_to_exact"] == m["mean_cosine_to_exact"]
        with pytest.raises(harness.ConfigError, match="outer_lr"):
            harness.run(hyperopt.hyperopt_experiment, [f"configs/hyperopt/{config}"],
                        TINY + ["hyperopt_experiment.outer_lr = 0.5"], out)


@pytest.mark.parametrize("binding, match", [
    ("hyperopt_experiment.method = @inner/hogrod.optim.sgd()", "hyperopt_experiment.method"),
    ("hyperopt_experiment.init_log_l2 = [0.0, 0.0]", "hyperopt_experiment.init_log_l2"),
    ("hyperopt_experiment.bias_l2 = 0.0", "hyperopt_experiment.bias_l2"),
])
def test_bad_binding_names_it(tmp_path, binding, match):
    with pytest.raises(ValueError, match=match):
        harness.run(hyperopt.hyperopt_experiment, ["configs/hyperopt/digits_one_step.gin"],
                    TINY + [binding], str(tmp_path / "run"))
