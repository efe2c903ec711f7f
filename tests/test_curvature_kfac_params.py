"""K-FAC and EK-FAC on a subset of the variables (`params=`): the principal submatrix of the
operator over every trainable variable (K-FAC is block-diagonal over layers), in the order
of `params`, and an error naming `params` for what cannot be factored."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, curvature

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")


def mlp(extra=()):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,), dtype="float64"),
                             keras.layers.Dense(5, activation="tanh", dtype="float64",
                                                name="d1"),
                             *extra,
                             keras.layers.Dense(4, activation="tanh", dtype="float64",
                                                name="d2"),
                             keras.layers.Dense(3, dtype="float64", name="d3")])


def conv():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4, 4, 1), dtype="float64"),
                             keras.layers.Conv2D(2, 3, activation="tanh", dtype="float64",
                                                 name="c1"),
                             keras.layers.Flatten(dtype="float64"),
                             keras.layers.Dense(3, dtype="float64", name="d3")])


def batch(shape, n=7, classes=3):
    rng = np.random.default_rng(1)
    return (tf.constant(rng.normal(size=(n,) + shape)),
            tf.constant(rng.integers(0, classes, size=n), tf.int32))


def indices(model, variables):
    """The positions of `variables` in the flat vector of `model.trainable_variables`."""
    sizes = [int(np.prod(v.shape)) for v in model.trainable_variables]
    offsets = np.cumsum([0] + sizes)
    where = {id(v): i for i, v in enumerate(model.trainable_variables)}
    return np.concatenate([np.arange(offsets[where[id(v)]], offsets[where[id(v)] + 1])
                           for v in variables])


@pytest.mark.parametrize("cls", [curvature.KFACOperator, curvature.EKFACOperator])
@pytest.mark.parametrize("approx", ["expand", "reduce"])
def test_a_subset_of_layers_is_the_full_operators_submatrix(cls, approx):
    for model, shape, subsets in (
            (mlp(), (4,), [["d2"], ["d3", "d1"]]),
            (conv(), (4, 4, 1), [["c1"], ["d3"]])):
        data = batch(shape)
        full = cls(model, CE, data, approx=approx).to_dense().numpy()
        for names in subsets:
            params = [v for name in names for v in curvature.layer_params(model, name)]
            op = cls(model, CE, data, approx=approx, params=params)
            idx = indices(model, params)
            assert op.shape == (len(idx), len(idx))
            # the order of params (d3 before d1) is the operator's
            np.testing.assert_allclose(op.to_dense(), full[np.ix_(idx, idx)], rtol=1e-10,
                                       atol=1e-14)


def test_kfac_of_a_kernel_without_its_bias_is_the_kernels_rows_and_columns():
    model = mlp()
    data = batch((4,))
    full = curvature.KFACOperator(model, CE, data, damping=0.1)
    dense = full.to_dense().numpy()
    kernels = [model.get_layer("d3").kernel, model.get_layer("d1").kernel,
               model.get_layer("d2").bias, model.get_layer("d2").kernel]
    op = curvature.KFACOperator(model, CE, data, damping=0.1, params=kernels)
    sub = dense[np.ix_(*[indices(model, kernels)] * 2)]
    np.testing.assert_allclose(op.to_dense(), sub, rtol=1e-10, atol=1e-14)
    # the eigendecompositions of the smaller factors: solve and logdet of the submatrix
    rhs = np.random.default_rng(2).normal(size=len(sub))
    np.testing.assert_allclose(op.solve(tf.constant(rhs[:, None]))[:, 0],
                               np.linalg.solve(sub, rhs), rtol=1e-8)
    np.testing.assert_allclose(op.logdet(), np.linalg.slogdet(sub)[1], rtol=1e-10)
    a, g = full.factors["d1"]
    a_k, g_k = op.factors["d1"]
    np.testing.assert_allclose(a_k, a[:-1, :-1], rtol=1e-12)
    np.testing.assert_allclose(g_k, g, rtol=1e-12)


def test_ekfac_of_a_kernel_is_corrected_in_its_own_basis():
    model = mlp()
    data = batch((4,))
    kernel = model.get_layer("d2").kernel
    op = curvature.EKFACOperator(model, CE, data, params=[kernel])
    block = curvature.GaussNewtonOperator(model, CE, data, params=[kernel]).to_dense().numpy()
    _, qa, _, qg = op.eigendecompositions["d2"]
    q = np.kron(qa.numpy(), qg.numpy())
    np.testing.assert_allclose(op.corrected_eigenvalues["d2"],
                               np.diag(q.T @ block @ q).reshape(qa.shape[0], qg.shape[0]),
                               rtol=1e-9, atol=1e-14)


def test_layers_left_out_of_params_are_not_factored():
    # a BatchNormalization K-FAC refuses (other_layers="raise") is simply not in params
    model = mlp([keras.layers.BatchNormalization(dtype="float64", name="bn")])
    data = batch((4,))
    params = curvature.layer_params(model, "d2")
    full = curvature.KFACOperator(model, CE, data, other_layers="diagonal").to_dense().numpy()
    op = curvature.KFACOperator(model, CE, data, params=params)
    idx = indices(model, params)
    np.testing.assert_allclose(op.to_dense(), full[np.ix_(idx, idx)], rtol=1e-10, atol=1e-14)


def test_what_cannot_be_factored_is_named():
    model = mlp([keras.layers.BatchNormalization(dtype="float64", name="bn")])
    other = mlp()
    data = batch((4,))
    d2 = model.get_layer("d2")
    cases = [([model.get_layer("bn").gamma], "params\\[0\\].*not the kernel or bias"),
             ([d2.kernel, tf.constant(d2.bias)], "params\\[1\\].*not the kernel or bias"),
             ([other.get_layer("d2").kernel], "params\\[0\\].*not the kernel or bias"),
             ([d2.bias], "bias of layer 'd2' without its kernel"),
             ([d2.kernel, d2.kernel], "params\\[1\\].*repeats params\\[0\\]"),
             ([], "params is empty")]
    for cls in (curvature.KFACOperator, curvature.EKFACOperator):
        for params, message in cases:
            with pytest.raises(checks.ArgumentError, match=message):
                cls(model, CE, data, params=params)
