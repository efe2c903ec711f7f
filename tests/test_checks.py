"""`hogrod.checks`: the checks without another family's test to cover them."""

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks


def test_boolean_takes_python_and_numpy_bools_and_refuses_lookalikes():
    assert checks.boolean(True, "flag", "f") is True
    assert checks.boolean(np.bool_(False), "flag", "f") is False
    for bad in ["False", "yes", 0, 1, 1.0, None, np.int64(1), tf.constant(True)]:
        with pytest.raises(checks.ArgumentError,
                           match=r"^f: flag must be True or False, got "):
            checks.boolean(bad, "flag", "f")


def test_describe_shows_keras_variables_as_dtype_and_shape_in_error_messages():
    import keras
    import hogrod
    model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(1)])
    model.build((None, 3))
    assert checks.describe(model.trainable_variables) == (
        "[float32[3, 4], float32[4], float32[4, 1], float32[1]]")
    # a Keras model's variables in an error path: the message, not a crash inside it
    loss = lambda: tf.reduce_sum(model(tf.ones([2, 3])))  # noqa: E731
    with pytest.raises(ValueError, match=r"params is \[float32\[3, 4\], .*vector is float32\[21\]"):
        hogrod.hvp(loss, model.trainable_variables, tf.ones([21]))


def test_stateless_seed_takes_an_int_a_pair_or_a_tensor_and_names_anything_else():
    for value, want in [(5, [5, 0]), ([5, 7], [5, 7]), ((5, 7), [5, 7]),
                        (np.array([5, 7], np.int32), [5, 7]), (tf.constant([5, 7]), [5, 7])]:
        got = checks.stateless_seed(value, "seed", "f")
        assert got.dtype == tf.int64 and got.numpy().tolist() == want
    for bad in [-1, 1.5, True, "x", [1, 2, 3], [1.0, 2.0], [[1, 2]], tf.constant([1.0, 2.0])]:
        with pytest.raises(checks.ArgumentError, match=r"^f: seed must be "):
            checks.stateless_seed(bad, "seed", "f")
