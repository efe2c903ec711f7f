"""EK-FAC influence, TracIn, self-influence, LDS and mislabel detection against oracles:
closed-form gradients of a softmax regression in numpy, the exact influence where EK-FAC is
exact (linear regression with MSE), ridge regression retrained in closed form, a Spearman
correlation computed from ranks by hand, a planted ranking."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from curvature_fixtures import small_problem

from hogrod import curvature


def softmax_regression(seed=0, n=12, d=4, k=3):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((d,), dtype="float64"),
                              keras.layers.Dense(k, dtype="float64")])
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, d)), rng.integers(0, k, size=n)
    return model, x, y


def numpy_gradients(weights, x, y):
    """Per-example gradients of softmax cross-entropy, [kernel row-major, bias] per row."""
    w, b = weights
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    r = p - np.eye(w.shape[1])[y]
    return np.concatenate([(x[:, :, None] * r[:, None, :]).reshape(len(x), -1), r], axis=1)


CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")


def test_tracin_equals_a_numpy_loop_over_checkpoints(tmp_path):
    model, x, y = softmax_regression()
    rng = np.random.default_rng(1)
    ckpts = [[rng.normal(size=w.shape) for w in model.get_weights()] for _ in range(3)]
    lrs = [0.3, 0.1, 0.02]
    oracle_pairs = sum(lr * numpy_gradients(c, x[:4], y[:4]) @ numpy_gradients(c, x, y).T
                       for lr, c in zip(lrs, ckpts))
    oracle_self = sum(lr * np.sum(numpy_gradients(c, x, y) ** 2, 1) for lr, c in zip(lrs, ckpts))
    # the same checkpoints as a weight list, a saved weights file and a model
    other = keras.models.clone_model(model)
    other.set_weights(ckpts[2])
    model.set_weights(ckpts[1])
    model.save_weights(str(tmp_path / "c1.weights.h5"))
    before = [w.copy() for w in ckpts[0]]
    model.set_weights(before)
    given = [ckpts[0], str(tmp_path / "c1.weights.h5"), other]
    scores = curvature.tracin(model, CE, (x, y), (x[:4], y[:4]), given, lrs)
    np.testing.assert_allclose(scores, oracle_pairs, rtol=1e-10, atol=1e-12)
    self_scores = curvature.self_influence(curvature.tracin, model, CE, (x, y),
                                           checkpoints=given, learning_rates=lrs)
    np.testing.assert_allclose(self_scores, oracle_self, rtol=1e-10)
    for w, b in zip(model.get_weights(), before):  # the model's weights are restored
        np.testing.assert_array_equal(w, b)


def test_tracin_refuses_mismatched_checkpoints_and_learning_rates(tmp_path):
    model, x, y = softmax_regression()
    w = model.get_weights()
    with pytest.raises(ValueError, match="2 checkpoints but 1 learning_rates"):
        curvature.tracin(model, CE, (x, y), (x, y), [w, w], [0.1])
    with pytest.raises(ValueError, match=r"checkpoints\[1\] holds weights of shapes"):
        curvature.tracin(model, CE, (x, y), (x, y), [w, w[:1]], [0.1, 0.1])
    with pytest.raises(ValueError, match=r"learning_rates\[0\] must be a positive finite number"):
        curvature.tracin(model, CE, (x, y), (x, y), [w], [0.0])
    with pytest.raises(ValueError, match="weights.h5"):
        curvature.tracin(model, CE, (x, y), (x, y), [str(tmp_path / "c.h5")], [0.1])
    with pytest.raises(ValueError, match="checkpoints is empty"):
        curvature.tracin(model, CE, (x, y), (x, y), [], [])
    with pytest.raises(TypeError, match=r"self_influence\(tracin\): missing .*learning_rates"):
        curvature.self_influence(curvature.tracin, model, CE, (x, y), checkpoints=[w])
    with pytest.raises(TypeError, match="method must be one of"):
        curvature.self_influence(curvature.hutchinson, model, CE, (x, y))


def linear_regression(n=30, d=3, k=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=(d, k)) + 0.3 * rng.normal(size=(n, k))
    model = keras.Sequential([keras.Input((d,), dtype="float64"),
                              keras.layers.Dense(k, dtype="float64")])
    xa = np.concatenate([x, np.ones((n, 1))], 1)
    w = np.linalg.lstsq(xa, y, rcond=None)[0]
    model.set_weights([w[:-1], w[-1]])
    return model, x, y


def mse(yt, z):
    return tf.reduce_mean((yt - z) ** 2, axis=-1)


def test_ekfac_influence_equals_exact_influence_where_ekfac_is_exact():
    # a Dense layer (kernel and bias) under MSE: Gauss-Newton = Hessian = A (x) G exactly
    model, x, y = linear_regression()
    test = (np.concatenate([x[:3], x[:4] + 0.5]), np.concatenate([y[:3], y[:4]]))
    exact = curvature.influence(model, mse, (x, y), test, damping=0.01)
    ekfac = curvature.ekfac_influence(model, mse, (x, y), test, damping=0.01)
    np.testing.assert_allclose(ekfac, exact, rtol=1e-8, atol=1e-10)
    self_exact = curvature.self_influence(curvature.influence, model, mse, (x, y), damping=0.01)
    np.testing.assert_allclose(self_exact[:3], -np.diag(exact[:3, :3]), rtol=1e-8)
    np.testing.assert_allclose(curvature.self_influence(curvature.ekfac_influence, model, mse,
                                                        (x, y), damping=0.01),
                               self_exact, rtol=1e-8)
    with pytest.raises(ValueError, match="damping must be a positive finite number"):
        curvature.ekfac_influence(model, mse, (x, y), test, damping=0.0)


def test_ekfac_influence_on_an_mlp_equals_the_dense_ekfac_inverse():
    model, _, (x, y) = small_problem(n=20)
    damping = 0.05
    op = curvature.EKFACOperator(model, CE, (x, y), damping=damping)
    g_train = curvature.per_example_gradients(model, CE, x, y)
    dense = op.to_dense().numpy()
    scores = curvature.ekfac_influence(model, CE, (x, y), (x[3:6], y[3:6]), damping=damping,
                                       batch_size=7)
    g_test = curvature.per_example_gradients(model, CE, x[3:6], y[3:6])
    np.testing.assert_allclose(scores, -g_test @ np.linalg.solve(dense, g_train.T),
                               rtol=1e-7, atol=1e-10)
    reused = curvature.ekfac_influence(model, CE, (x, y), (x[3:6], y[3:6]), damping=damping,
                                       operator=op.with_damping(1.0))
    np.testing.assert_allclose(reused, scores, rtol=1e-10, atol=1e-12)
    self_scores = curvature.self_influence(curvature.ekfac_influence, model, CE, (x, y),
                                           damping=damping, operator=op, batch_size=7)
    np.testing.assert_allclose(self_scores, np.einsum(
        "ij,ji->i", g_train, np.linalg.solve(dense, g_train.T)), rtol=1e-7)


def test_lds_equals_a_spearman_correlation_from_ranks_by_hand():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(2, 6))
    subsets = [np.array([0, 1, 2]), np.array([1, 3, 5]), np.array([0, 4]),
               np.array([2, 3, 4, 5]), np.array([5])]
    losses = rng.normal(size=(5, 2))
    rank = lambda v: np.argsort(np.argsort(v)).astype(float)  # noqa: E731 (no ties here)
    oracle = []
    for t in range(2):
        predicted = np.array([scores[t, s].sum() for s in subsets])
        oracle.append(np.corrcoef(rank(predicted), rank(losses[:, t]))[0, 1])
    mean, per_test = curvature.linear_datamodeling_score(scores, subsets, losses, per_test=True)
    np.testing.assert_allclose(per_test, oracle, rtol=1e-12)
    np.testing.assert_allclose(mean, np.mean(oracle), rtol=1e-12)
    mask = np.zeros((5, 6), bool)
    for j, s in enumerate(subsets):
        mask[j, s] = True
    assert curvature.linear_datamodeling_score(scores, mask, losses) == mean


def test_lds_of_exact_influence_on_ridge_regression_is_near_one():
    rng = np.random.default_rng(3)
    n, d, l2 = 40, 3, 0.1
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=d) + 0.5 * rng.normal(size=n)
    x_test, y_test = rng.normal(size=(5, d)), rng.normal(size=5)

    def fit(idx):
        xs, ys = x[idx], y[idx]
        return np.linalg.solve(xs.T @ xs / len(idx) + l2 * np.eye(d), xs.T @ ys / len(idx))

    def retrain(idx):
        return (x_test @ fit(idx) - y_test) ** 2

    model = keras.Sequential([keras.Input((d,), dtype="float64"),
                              keras.layers.Dense(1, use_bias=False, dtype="float64")])
    model.set_weights([fit(np.arange(n))[:, None]])

    def loss(yt, z):  # the training objective per example: squared error + ridge
        return (yt - z[:, 0]) ** 2 + l2 * tf.reduce_sum(model.trainable_variables[0] ** 2)

    scores = curvature.influence(model, loss, (x, y), (x_test, y_test))
    subsets, losses = curvature.subset_retraining(retrain, n, num_subsets=30, fraction=0.5)
    assert subsets.shape == (30, n) and np.all(subsets.sum(1) == 20)
    lds = curvature.linear_datamodeling_score(scores, subsets, losses)
    assert lds > 0.9, lds
    assert curvature.linear_datamodeling_score(-scores, subsets, losses) < -0.9


def test_lds_and_subset_retraining_refuse_bad_subsets():
    scores, losses = np.zeros((2, 5)) + np.arange(5), np.arange(8.0).reshape(4, 2)
    lds = curvature.linear_datamodeling_score
    with pytest.raises(ValueError, match=r"subsets\[1\] has indices outside \[0, 5\)"):
        lds(scores, [[0, 1], [4, 5], [2], [3]], losses)
    with pytest.raises(ValueError, match=r"subsets\[0\] repeats an index"):
        lds(scores, [[0, 0], [1], [2], [3]], losses)
    with pytest.raises(ValueError, match=r"boolean mask must have shape \[num_subsets, "):
        lds(scores, np.ones((4, 6), bool), losses)
    with pytest.raises(ValueError, match=r"subset_test_losses must have shape \[num_subsets=4"):
        lds(scores, [[0], [1], [2], [3]], losses[:, :1])
    with pytest.raises(ValueError, match="at least 3 subsets"):
        lds(scores, [[0], [1]], losses[:2])
    with pytest.raises(ValueError, match="test point 0 has a constant loss"):
        lds(scores, [[0], [1], [2], [3]], np.ones((4, 2)))
    with pytest.raises(ValueError, match="fraction must be in"):
        curvature.subset_retraining(lambda idx: np.zeros(2), 10, 5, fraction=1.0)
    with pytest.raises(ValueError, match="the same length each time"):
        lengths = iter([2, 2, 3, 2, 2])
        curvature.subset_retraining(lambda idx: np.zeros(next(lengths)), 10, 5)


def test_mislabel_detection_rate_on_a_planted_ranking():
    scores = np.arange(20.0)[::-1].copy()  # example i ranks i-th
    flipped = np.array([1, 3, 15])         # top 2: one of three; top 4: two of three
    rates = curvature.mislabel_detection_rate(scores, flipped, fractions=(0.1, 0.2, 1.0))
    assert rates == {0.1: 1 / 3, 0.2: 2 / 3, 1.0: 1.0}
    mask = np.zeros(20, bool)
    mask[flipped] = True
    assert curvature.mislabel_detection_rate(scores, mask, fractions=(0.1, 0.2, 1.0)) == rates
    with pytest.raises(ValueError, match="distinct indices in"):
        curvature.mislabel_detection_rate(scores, np.array([1, 20]))
    with pytest.raises(ValueError, match="flipped marks no example"):
        curvature.mislabel_detection_rate(scores, np.zeros(20, bool))
    with pytest.raises(ValueError, match=r"each fraction must be in \(0, 1\]"):
        curvature.mislabel_detection_rate(scores, flipped, fractions=(0.0,))


def test_digits_config_selects_the_methods_by_reference():
    import gin
    from experiments import influence
    from hogrod import harness
    harness.parse_config(["configs/curvature/influence_digits.gin"], [])
    try:
        methods = gin.query_parameter("digits_influence_study.methods")
        assert [r.configurable.name for r in methods] == [
            "exact_influence_method", "ekfac_influence_method", "tracin_method"]
        assert (gin.query_parameter("influence_experiment.study").scoped_configurable_fn
                is influence.digits_influence_study)
    finally:
        gin.clear_config()
    with pytest.raises(ValueError, match="influence_experiment.study must be a study"):
        influence.influence_experiment("/nonexistent", study="digits")
    with pytest.raises(ValueError, match="digits_influence_study.methods must be a tuple"):
        influence.digits_influence_study("/nonexistent", methods=("exact",))
