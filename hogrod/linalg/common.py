"""What the solvers share: checks of their arguments and the operator's product, checked
against the vector it is applied to."""

import numpy as np
import tensorflow as tf

from hogrod import tree
from hogrod.types import MatVec, Tree

# Python control flow here is on Python values only; the loops are explicit tf.while_loops.
_no_autograph = tf.autograph.experimental.do_not_convert


def _dtype(b: Tree, fn: str, name: str) -> tf.DType:
    leaves = tf.nest.flatten(b)
    if not leaves or any(t is None for t in leaves):
        raise ValueError(f"{fn}: {name} must be a tree of tensors, got {b!r}")
    leaves = [tf.convert_to_tensor(t) for t in leaves]
    dtypes = {t.dtype for t in leaves}
    if len(dtypes) != 1 or not leaves[0].dtype.is_floating:
        raise TypeError(f"{fn}: {name}'s leaves must share one floating dtype, got "
                        f"{sorted(d.name for d in dtypes)}")
    return leaves[0].dtype


def _product(matvec: MatVec, v: Tree, like: Tree, fn: str) -> Tree:
    """matvec(v), checked against `like` and given its exact structure (loop variables of a
    tf.while_loop keep theirs)."""
    out = matvec(v)
    tree.check_same(like, out, "the vector", f"{fn}'s matvec(v)")
    return tf.nest.pack_sequence_as(like, [tf.convert_to_tensor(t)
                                           for t in tf.nest.flatten(out)])


def _eps(dtype: tf.DType) -> float:
    return float(np.finfo(dtype.as_numpy_dtype).eps)
