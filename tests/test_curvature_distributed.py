"""K-FAC, EK-FAC and Laplace under MirroredStrategy on two logical CPU devices (conftest.py)
against the same computation on one device: each batch is split over the replicas, the
per-replica sums all-reduced and normalized by the global number of examples. The data
set's batches (15 and 1 of 16 examples) split unevenly (8/7) and leave one replica an empty
shard (1/0)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import curvature, distribute

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
MSE = keras.losses.MeanSquaredError(dtype="float64")
TOL = dict(rtol=1e-6, atol=1e-12)
# batches of 15 and 1: shards 8/7 and 1/0. More examples than the reduce factor's 10 inputs:
# a degenerate (null) eigenspace of A would make EK-FAC's basis, and its correction, arbitrary
N, BATCH = 16, 15


@pytest.fixture(scope="module")
def mirrored():
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    return strategy


def conv_classifier(strategy, seed=0):
    """Conv2D (4 locations: expand != reduce) -> Flatten -> Dense, its weights made under
    `strategy` (mirrored variables) from the same seed."""
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return keras.Sequential([
            keras.Input((4, 4, 1), dtype="float64"),
            keras.layers.Conv2D(2, 3, strides=2, padding="same", activation="tanh",
                                dtype="float64", name="conv"),
            keras.layers.Flatten(dtype="float64"),
            keras.layers.Dense(3, dtype="float64", name="dense")])


def images(seed=1):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(N, 4, 4, 1)))
    y = tf.constant(rng.integers(0, 3, size=N), tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def one_device():
    return tf.distribute.get_strategy()


def kronecker(cls, strategy, **kw):
    strategy = one_device() if strategy is None else strategy
    model = conv_classifier(strategy)
    dist = None if strategy is one_device() else strategy
    return cls(model, CE, images(), strategy=dist, **kw)


@pytest.mark.parametrize("fisher,approx", [("type2", "expand"), ("empirical", "reduce")])
def test_kfac_factors_equal_one_device(mirrored, fisher, approx):
    """(type2 with reduce is in the EK-FAC test, whose factors are K-FAC's.)"""
    one = kronecker(curvature.KFACOperator, None, approx=approx, fisher=fisher)
    two = kronecker(curvature.KFACOperator, mirrored, approx=approx, fisher=fisher)
    assert set(two.factors) == set(one.factors) and len(one.factors) == 2
    for name, (a, g) in one.factors.items():
        np.testing.assert_allclose(two.factors[name][0], a, **TOL)
        np.testing.assert_allclose(two.factors[name][1], g, **TOL)
    v = tf.constant(np.random.default_rng(2).normal(size=one.shape[0]))
    np.testing.assert_allclose(two.with_damping(0.1).solve(v[:, None]),
                               one.with_damping(0.1).solve(v[:, None]), **TOL)


@pytest.mark.parametrize("approx", ["expand", "reduce"])
def test_ekfac_corrected_eigenvalues_equal_one_device(mirrored, approx):
    one = kronecker(curvature.EKFACOperator, None, approx=approx)
    two = kronecker(curvature.EKFACOperator, mirrored, approx=approx)
    for name, (a, g) in one.factors.items():
        np.testing.assert_allclose(two.factors[name][0], a, **TOL)
        np.testing.assert_allclose(two.factors[name][1], g, **TOL)
    for name, values in one.corrected_eigenvalues.items():
        np.testing.assert_allclose(two.corrected_eigenvalues[name], values, **TOL)
    v = tf.constant(np.random.default_rng(2).normal(size=one.shape[0]))
    np.testing.assert_allclose(two.matvec(v), one.matvec(v), **TOL)


def test_refresh_recomputes_under_the_strategy(mirrored):
    """refresh (factors and correction pass) at new weights equals a fresh one-device
    operator at those weights."""
    two = kronecker(curvature.EKFACOperator, mirrored)
    model = two._f._model
    for w in model.trainable_variables:
        w.assign(1.5 * w)
    two.refresh()
    one = kronecker(curvature.EKFACOperator, None)
    for w in one._f._model.trainable_variables:
        w.assign(1.5 * w)
    one.refresh()
    for name, values in one.corrected_eigenvalues.items():
        np.testing.assert_allclose(two.corrected_eigenvalues[name], values, **TOL)


def test_mc_fisher_under_a_strategy_is_close_to_type2(mirrored):
    """Sampled labels differ from one device's (the replica id is folded into the key), so
    only the expectation is compared: many samples approach the exact (type-2) factors."""
    mc = kronecker(curvature.KFACOperator, mirrored, fisher="mc", mc_samples=2000)
    exact = kronecker(curvature.KFACOperator, one_device())
    for name, (a, g) in exact.factors.items():
        assert np.all(np.isfinite(mc.factors[name][1]))
        np.testing.assert_allclose(mc.factors[name][0], a, **TOL)  # A needs no labels
        assert np.abs(mc.factors[name][1] - g).max() < 0.1 * np.abs(g).max()


def mlp(strategy, outputs, seed=0):
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((3,), dtype="float64"),
                                 keras.layers.Dense(4, activation="tanh", dtype="float64"),
                                 keras.layers.Dense(outputs, dtype="float64")])


def table(likelihood, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, 3))
    y = (rng.integers(0, 3, size=N).astype(np.int32) if likelihood == "classification"
         else rng.normal(size=(N, 2)))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


@pytest.mark.parametrize("hessian,subset,likelihood", [
    ("kron", "all", "classification"), ("kron", "last_layer", "regression"),
    ("diag", "all", "regression"), ("diag", "last_layer", "classification")])
def test_laplace_equals_one_device(mirrored, hessian, subset, likelihood):
    xt = tf.constant(np.random.default_rng(5).normal(size=(4, 3)))
    outputs = 3 if likelihood == "classification" else 2
    kw = dict(likelihood=likelihood, subset=subset, hessian=hessian, prior_precision=0.7)
    if likelihood == "regression":
        kw["sigma_noise"] = 0.4
    one = curvature.Laplace(mlp(one_device(), outputs), **kw).fit(table(likelihood))
    two = curvature.Laplace(mlp(mirrored, outputs), strategy=mirrored, **kw).fit(
        table(likelihood))
    assert two.n_data == one.n_data == N
    np.testing.assert_allclose(float(two.log_marginal_likelihood()),
                               float(one.log_marginal_likelihood()), **TOL)
    np.testing.assert_allclose(two.eigenvalues, one.eigenvalues, **TOL)
    if likelihood == "regression":
        for a, b in zip(two.predictive(xt), one.predictive(xt)):  # mean and variance
            np.testing.assert_allclose(a, b, **TOL)
    else:
        np.testing.assert_allclose(two.predictive(xt), one.predictive(xt), **TOL)
        # the functional variance itself (probit's input), not only the probabilities
        _, jac = one.output_jacobian(xt)
        np.testing.assert_allclose(two.functional_variance(jac), one.functional_variance(jac),
                                   **TOL)


def test_bad_strategy_and_data_are_named(mirrored):
    model = conv_classifier(one_device())
    batch = next(iter(images()))
    for make in (lambda **kw: curvature.KFACOperator(model, CE, images(), **kw),
                 lambda **kw: curvature.EKFACOperator(model, CE, images(), **kw),
                 lambda **kw: curvature.Laplace(model, "classification", **kw),
                 lambda **kw: curvature.FisherOperator(model, CE, images(), **kw)):
        with pytest.raises(TypeError, match=r"strategy must be a tf.distribute.Strategy .* "
                                            "got str"):
            make(strategy="mirrored")
    # one batch, not a Dataset: FisherOperator's error, with each one's name
    expected = "with a strategy, data must be a tf.data.Dataset of batches"
    with pytest.raises(ValueError, match="FisherOperator: " + expected):
        curvature.FisherOperator(model, CE, batch, strategy=mirrored)
    with pytest.raises(ValueError, match="KFACOperator: " + expected):
        curvature.KFACOperator(model, CE, batch, strategy=mirrored)
    with pytest.raises(ValueError, match="EKFACOperator: " + expected):
        curvature.EKFACOperator(model, CE, batch, strategy=mirrored)
    with pytest.raises(ValueError, match=r"Laplace.fit: " + expected):
        curvature.Laplace(model, "classification", strategy=mirrored).fit(batch)


def test_mc_replicas_draw_independently(mirrored):
    """One example twice, split 1/1: replica 0 draws what one device draws for it (the key
    folded with replica id 0); were replica 1's key the same, the two draws would coincide
    and G would equal the one-example G exactly. (G depends on the draws only through the
    counts of each class: 100 draws make equal counts by chance unlikely.)"""
    x = tf.constant(0.1 * np.random.default_rng(3).normal(size=(1, 4)))  # p near uniform
    y = tf.constant([1], tf.int32)
    twice = tf.data.Dataset.from_tensor_slices((tf.concat([x, x], 0), tf.concat([y, y], 0)))

    def g_factor(strategy, data):
        with (strategy or one_device()).scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,), dtype="float64"),
                                      keras.layers.Dense(3, dtype="float64", name="dense")])
        op = curvature.KFACOperator(model, CE, data, fisher="mc", mc_samples=100,
                                    strategy=strategy)
        return op.factors["dense"][1].numpy()
    once = g_factor(None, tf.data.Dataset.from_tensor_slices((x, y)).batch(1))
    split = g_factor(mirrored, twice.batch(2))
    assert np.all(np.isfinite(split))
    assert np.abs(split - once).max() > 1e-3 * np.abs(once).max()
