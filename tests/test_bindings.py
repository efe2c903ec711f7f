"""The binding annotations at both of their bounds: the value just inside fits, the value just
outside is refused, a bool is no integer and NaN and the infinities are no real numbers. The
oracle is each annotation's interval as written in `hogrod.bindings` (`Count` is [0, inf),
`Positive` (0, inf), ...), probed with the adjacent floats (`math.nextafter`)."""

import math
import typing

import gin
import pytest

from hogrod import bindings, harness

TINY = 5e-324  # the least positive float: just above 0
NAN, INF = float("nan"), float("inf")
BELOW_ONE, ABOVE_ONE = math.nextafter(1.0, 0.0), math.nextafter(1.0, 2.0)
OPEN_UNIT = typing.Annotated[float, bindings.Range(0, 1, low_open=True, high_open=True)]
INT_RANGE = typing.Annotated[int, bindings.Range(-2, 3, high_open=True)]

# annotation: (values that fit, values refused)
CASES = {
    "Count": (bindings.Count, [0, 1, 10**18], [-1, True, False, 0.0, 1.0, "1", None]),
    "PositiveInt": (bindings.PositiveInt, [1, 2], [0, -1, True, False, 1.0]),
    "Positive": (bindings.Positive, [TINY, 1, 1e308],
                 [0.0, 0, -0.0, -TINY, NAN, INF, -INF, True, "1"]),
    "NonNegative": (bindings.NonNegative, [0.0, 0, -0.0, TINY, 1e308],
                    [-TINY, -1, NAN, INF, -INF, True, False]),
    "Fraction": (bindings.Fraction, [0.0, 0, TINY, BELOW_ONE, 1.0, 1],
                 [-TINY, ABOVE_ONE, 2, NAN, INF, -INF, True, False]),
    "Range(0, 1, open, open)": (OPEN_UNIT, [TINY, 0.5, BELOW_ONE], [0.0, 0, 1.0, 1, NAN, True]),
    "Range(-2, 3, high_open) int": (INT_RANGE, [-2, 0, 2], [-3, 3, 2.0, True, False]),
    "PositiveInt | None": (bindings.PositiveInt | None, [None, 1], [0, True, 1.0]),
    "tuple[Count, ...]": (tuple[bindings.Count, ...], [(), (0,), [0, 3]],
                          [(0, -1), (0, True), 0, (0, 1.0)]),
    "int": (int, [0, -1], [True, 1.0]),
    "float": (float, [0.0, -1e308, 3], [NAN, INF, -INF, True, "1.0"]),
}


@pytest.mark.parametrize("name", CASES)
def test_each_annotation_takes_the_values_just_inside_its_bounds_and_refuses_those_outside(name):
    hint, inside, outside = CASES[name]
    assert [v for v in inside if not bindings.fits(v, hint)] == []
    assert [v for v in outside if bindings.fits(v, hint)] == []


@gin.configurable
def annotated_probe(count: harness.Count = 5, positive_int: harness.PositiveInt = 5,
                    positive: harness.Positive = 0.5, nonnegative: harness.NonNegative = 0.5,
                    fraction: harness.Fraction = 0.5):
    """A configurable with one parameter of each annotation, for the bindings below.

    Args:
      count: a Count.
      positive_int: a PositiveInt.
      positive: a Positive.
      nonnegative: a NonNegative.
      fraction: a Fraction.
    """


@pytest.fixture
def parsed():
    def parse(*params):
        harness.parse_config([], [f"annotated_probe.{p}" for p in params])
        bindings.check_values()
    yield parse
    with gin.unlock_config():
        gin.clear_config()


def test_bindings_at_the_bounds_pass_the_harness_check(parsed):
    parsed("count = 0", "positive_int = 1", "positive = 5e-324", "nonnegative = 0.0",
           "fraction = 0.0")
    parsed("nonnegative = 0", "fraction = 1.0", "fraction = 1")


@pytest.mark.parametrize("binding,wanted", [
    ("count = -1", "an integer >= 0"), ("count = True", "an integer >= 0"),
    ("positive_int = 0", "an integer >= 1"), ("positive_int = True", "an integer >= 1"),
    ("positive = 0.0", "a finite number > 0"),
    ("nonnegative = -5e-324", "a finite number >= 0"),
    ("nonnegative = False", "a finite number >= 0"),
    ("fraction = 1.0000000000000002", "a finite number in [0, 1]"),
])
def test_bindings_just_outside_the_bounds_are_refused_naming_them(parsed, binding, wanted):
    with pytest.raises(harness.ConfigError) as e:
        parsed(binding)
    assert f"annotated_probe.{binding}: must be {wanted}" in str(e.value)


@pytest.mark.parametrize("binding", ["positive = 1e999", "fraction = -1e999",
                                     "count = (1, 1e999)"])
def test_an_infinite_binding_is_refused_though_gin_leaves_it_out_of_its_config_text(
        parsed, binding):
    """gin cannot write inf (nor NaN) in its config text, which `check_values` reads and
    config.gin records: such a binding is refused when parsed, naming it."""
    with pytest.raises(harness.ConfigError, match=rf"annotated_probe\.{binding.split()[0]} = "
                                                  r".*inf.*must hold finite numbers only"):
        parsed(binding)


def test_an_infinite_binding_in_a_file_is_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "probe.gin"
    path.write_text("annotated_probe.count = 3\nannotated_probe.positive = -1e999\n")
    with pytest.raises(harness.ConfigError, match=rf"positive = -inf in {path}, line 2"):
        harness.parse_config([str(path)], [])
