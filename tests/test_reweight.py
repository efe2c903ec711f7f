"""experiments/reweight.py: Ren et al.'s learned example weights against the paper's formula,
the imbalanced digits split, the binary end to end, and bad input."""

import json

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from experiments import reweight as rw
from hogrod.models import dense_net
from hogrod import harness

LR = 0.3


def _logistic(dim, seed):
    """A float64 logistic regression with random (not initial) weights, and its params."""
    model = dense_net((dim, 1), dtype="float64")
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:
        v.assign(rng.normal(size=v.shape))
    return model, [tf.convert_to_tensor(v.value) for v in model.trainable_variables]


def _paper_dots(params, x, y, x_val, y_val):
    """<d L_val(w), d l_i(w)> per training example i, in numpy float64: for logistic
    regression d l(w) / d(kernel, bias) = (sigmoid(z) - y) (x, 1)."""
    kernel, bias = (np.asarray(p, np.float64) for p in params)

    def grads(x, y):
        z = x @ kernel[:, 0] + bias[0]
        r = 1.0 / (1.0 + np.exp(-z)) - y
        return np.concatenate([r[:, None] * x, r[:, None]], axis=1)

    return grads(x, y) @ grads(x_val, y_val).mean(axis=0)


def _learned(model, params, batch, validation):
    loss = rw.per_example_loss(model)
    return rw.learned_weights(loss, params, batch, validation, None, inner_lr=LR)


def test_learned_weights_are_the_papers_formula():
    """d L_val(w - lr sum_i eps_i d l_i) / d eps_i at eps = 0 is -lr <d L_val, d l_i>: the
    weights are max(lr <d L_val, d l_i>, 0) normalized, checked against numpy float64."""
    model, params = _logistic(3, seed=0)
    rng = np.random.default_rng(1)
    x, x_val = rng.normal(size=(8, 3)), rng.normal(size=(4, 3))
    y, y_val = (rng.random(8) < 0.5).astype(np.float64), np.array([0.0, 1.0, 0.0, 1.0])
    dots = _paper_dots(params, x, y, x_val, y_val)
    assert (dots > 0).sum() >= 2 and (dots < 0).sum() >= 2  # the clip and the sign matter
    expected = np.maximum(LR * dots, 0.0)
    expected /= expected.sum()
    got = _learned(model, params, (tf.constant(x), tf.constant(y)),
                   (tf.constant(x_val), tf.constant(y_val))).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-15)


def test_learned_weights_all_clipped_are_zero_and_in_tf_function_traced_once():
    """A training example whose gradient opposes the validation gradient (the same input,
    the other label: <d L_val, d l> = s(s - 1) |(x, 1)|^2 < 0) gets weight 0, not NaN; the
    weights run in tf.function with one trace for new values of the same shapes."""
    model, params = _logistic(3, seed=2)
    fn = tf.function(lambda p, b, v: _learned(model, p, b, v))
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = tf.constant(rng.normal(size=(1, 3)))
        y = tf.constant([float(rng.random() < 0.5)], tf.float64)
        np.testing.assert_array_equal(fn(params, (x, y), (x, 1.0 - y)).numpy(), [0.0])
    assert fn.experimental_get_tracing_count() == 1


def test_class_balanced_and_plain_weights():
    """Class-balanced weights give each class half the batch's total weight over the whole
    training set: n / (2 n_class) / B."""
    params = [tf.zeros([3, 1], tf.float64)]
    y = tf.constant([0.0, 0.0, 0.0, 1.0], tf.float64)
    got = rw.class_balanced_weights(None, params, (None, y), None, np.array([98.0, 2.0]))
    np.testing.assert_allclose(got.numpy(), np.array([100 / 196] * 3 + [100 / 4]) / 4,
                               rtol=1e-15)
    np.testing.assert_array_equal(rw.plain_weights(None, params, (None, y), None, None), [0.25] * 4)


@pytest.mark.parametrize("seed,train_size,fraction", [(0, 100, 0.02), (7, 150, 0.02),
                                                      (3, 50, 0.1)])
def test_split_has_exactly_the_configured_imbalance(seed, train_size, fraction):
    split = rw.digits_imbalanced(seed, 4, 9, fraction, train_size, val_per_class=5)
    y_tr, y_val, y_te = split["train"][1], split["validation"][1], split["test"][1]
    n_pos = round(train_size * fraction)
    assert (len(y_tr), int(y_tr.sum())) == (train_size, n_pos)
    assert (len(y_val), int(y_val.sum())) == (10, 5)
    assert len(y_te) == 2 * int(y_te.sum()) > 0  # balanced
    # labels against the data set: every image is a 4 (label 0) or a 9 (label 1)
    digits = load_digits()
    targets = {}
    for row, t in zip((digits.data / 16.0).astype(np.float32), digits.target):
        targets.setdefault(row.tobytes(), set()).add(int(t))
    for x, y in split.values():
        for row, label in zip(x, y):
            assert targets[row.tobytes()] == {9 if label else 4}
    # no image in two sets (the 4s and 9s of digits are distinct images)
    rows = [r.tobytes() for x, _ in split.values() for r in x]
    assert len(rows) == len(set(rows))
    again = rw.digits_imbalanced(seed, 4, 9, fraction, train_size, val_per_class=5)
    other = rw.digits_imbalanced(seed + 1, 4, 9, fraction, train_size, val_per_class=5)
    np.testing.assert_array_equal(again["train"][0], split["train"][0])
    assert not np.array_equal(other["train"][0], split["train"][0])


TINY = ["reweight_experiment.steps = 4", "reweight_experiment.batch_size = 20",
        "reweight_experiment.num_seeds = 1", "reweight_experiment.checkpoint_every = 2",
        "reweight_model.hidden = (4,)"]


@pytest.mark.parametrize("scheme", ["plain", "class_balanced", "learned"])
def test_binary_runs_each_scheme(tmp_path, scheme):
    config = f"configs/reweight/{scheme}.gin"
    _, metrics = harness.run(rw.reweight_experiment, [config], TINY, str(tmp_path))
    assert metrics["weighting"] == f"{scheme}_weights"
    run = metrics["per_seed"][0]
    assert (run["train_examples"], run["train_positives"]) == (100, 2)
    assert 0.0 <= metrics["test_error_mean"] <= 1.0
    losses = json.loads((tmp_path / "seed_0" / "train_loss.json").read_text())
    assert [r["step"] for r in losses] == [1, 2, 3, 4]
    assert all(np.isfinite(r["train_loss"]) for r in losses)
    operative = (tmp_path / "operative_config.gin").read_text()
    assert f"reweight_experiment.weighting = @{scheme}_weights" in operative
    if scheme == "learned":  # a re-run resumes the finished seed: nothing is trained again
        _, again = harness.run(rw.reweight_experiment, [config], TINY, str(tmp_path))
        assert again["per_seed"][0]["test_error"] == run["test_error"]
        assert again["per_seed"][0]["train_steps"] == run["train_steps"] == 4  # kept
        assert len(json.loads((tmp_path / "seed_0" / "train_loss.json").read_text())) == 4
        with pytest.raises(harness.ConfigError, match="reweight_experiment.steps"):
            harness.run(rw.reweight_experiment, [config],
                        TINY + ["reweight_experiment.steps = 5"], str(tmp_path))


@pytest.mark.parametrize("binding,match", [
    ("digits_imbalanced.positive_fraction = 1.5", "digits_imbalanced.positive_fraction"),
    ("digits_imbalanced.positive_fraction = 0.0", "digits_imbalanced.positive_fraction"),
    ("digits_imbalanced.positive_fraction = 0.013", "digits_imbalanced.train_size"),
    ("digits_imbalanced.positive = 10", "digits_imbalanced.positive"),
    ("digits_imbalanced.negative = 9", "digits_imbalanced.negative"),
    ("learned_weights.inner_lr = 0.0", "learned_weights.inner_lr"),
    ("reweight_model.hidden = (0,)", "reweight_model.hidden"),
])
def test_bad_input_names_the_binding(tmp_path, capsys, binding, match):
    code = harness.run_cli(rw.reweight_experiment, ["configs/reweight/learned.gin"],
                           TINY + [binding], str(tmp_path / "run"))
    assert code == 2
    assert match in capsys.readouterr().err
