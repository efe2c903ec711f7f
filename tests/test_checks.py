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
