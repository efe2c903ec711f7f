"""The benchmarks' agreement check (`experiments.bench.peers.Reference`): its measured
condition is the closed form's on a linear map, each side is judged against the float64
reference alone (two float32 sides farther apart than either is from it both pass), and a
float64 side gets float64's rounding (not float32's). The benchmarks' own checks run in
their smoke runs (tests/test_bench_smoke.py)."""

import numpy as np
import pytest

from experiments.bench import peers

EPS32 = float(np.finfo(np.float32).eps)


def linear(a):
    return lambda inputs: [np.array([a @ inputs[0]])]


def test_the_condition_is_the_linear_maps_at_float32s_rounding():
    """f(x) = a . x moved by x_i (1 + eps s_i) changes by eps |sum a_i x_i s_i|: the
    condition is max over the draws of |sum a_i x_i s_i| / |a . x| (the same seeded signs)."""
    a = np.array([1.0, -1.0, 0.5, 2.0])
    x = np.array([3.0, 2.999, 1e-3, 4e-4], np.float32)  # cancellation: a large condition
    ref = peers.Reference(linear(a), [x], draws=3, seed=5)
    rng = np.random.default_rng(5)
    x64 = x.astype(np.float64)
    expected = max(abs(np.sum(a * x64 * rng.choice([-1.0, 1.0], x.shape))) for _ in range(3))
    expected /= abs(a @ x64)
    assert ref.condition == pytest.approx(expected, rel=1e-6)
    assert ref.condition > 1000
    assert ref.value[0][0] == a @ x64  # the exact result on the float32 inputs
    assert ref.tolerance("float32") == pytest.approx(peers.ROUNDING_FACTOR * EPS32 * expected)
    # integer inputs (labels) are passed through, never moved
    ref = peers.Reference(lambda inputs: [np.array([float(inputs[1].sum())])],
                          [x, np.arange(3)])
    assert ref.condition == 1.0 and ref.value[0][0] == 3.0


def test_each_side_is_judged_against_the_float64_reference_alone():
    ref = peers.Reference(lambda inputs: [inputs[0], 2 * inputs[1]],
                          [np.ones((2, 3), np.float32), np.arange(4.0, dtype=np.float32)])
    tol = ref.tolerance("float32")
    up = [v * (1 + 0.9 * tol) for v in ref.value]
    down = [v * (1 - 0.9 * tol) for v in ref.value]
    # 1.8 tol apart, each 0.9 tol from the reference: both agree
    errors = ref.check({"a": up, "b": down}, "float32", "product")
    assert errors["a"] == pytest.approx(0.9 * tol, rel=1e-6)
    with pytest.raises(AssertionError, match=r"product: c \(float32"):
        ref.check({"a": up, "c": [v * (1 + 2 * tol) for v in ref.value]}, "float32", "product")
    with pytest.raises(AssertionError, match="shapes differ"):
        ref.check({"t": [ref.value[0].T, ref.value[1]]}, "float32", "product")
    # a float64 side gets float64's rounding: float32's error is a disagreement there
    assert ref.tolerance("float64") < 1e-12
    with pytest.raises(AssertionError, match=r"product: d \(float64"):
        ref.check({"d": up}, "float64", "product")


def test_the_torch_weight_layouts_are_inverse():
    kernel = np.arange(3 * 3 * 2 * 4.0).reshape(3, 3, 2, 4)  # [h, w, in, out]
    assert peers.torch_layout(kernel).shape == (4, 2, 3, 3)  # [out, in, h, w]
    assert peers.torch_layout(kernel)[3, 1, 0, 2] == kernel[0, 2, 1, 3]
    for w in (kernel, np.arange(6.0).reshape(2, 3), np.arange(3.0)):
        np.testing.assert_array_equal(peers.keras_layout(peers.torch_layout(w)), w)
