"""hogrod.tree against numpy on nested structures (float64 exactly where the arithmetic is
one IEEE operation per entry), stateless random trees against their moments, bad input."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from hogrod import tree

Pair = collections.namedtuple("Pair", ["u", "v"])


def nested(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=s).astype(dtype) for s in [(2, 3), (4,), (), (3, 1, 2)]]
    t = {"dense": [tf.constant(arrays[0]), tf.constant(arrays[1])],
         "scalar": tf.constant(arrays[2]),
         "pair": Pair(tf.Variable(arrays[3]), tf.constant(arrays[1][::-1].copy()))}
    flat = [arrays[0], arrays[1], arrays[3], arrays[1][::-1], arrays[2]]  # tf.nest order
    return t, flat


def leaves(t):
    return [np.asarray(x) for x in tf.nest.flatten(t)]


def test_tree_ops_match_numpy_float64_exactly_on_a_nested_structure():
    a, fa = nested(0)
    b, fb = nested(1)
    for got, want in zip(leaves(a), fa):
        np.testing.assert_array_equal(got, want)  # the leaf order `nested` documents
    np.testing.assert_array_equal(tree.flatten(a).numpy(),
                                  np.concatenate([x.ravel() for x in fa]))
    for got, want in zip(leaves(tree.scale(0.05, a)), fa):
        np.testing.assert_array_equal(got, 0.05 * want)  # not float32(0.05) * want
    for got, x, y in zip(leaves(tree.axpy(0.05, a, b)), fa, fb):
        np.testing.assert_array_equal(got, 0.05 * x + y)
    for got, x, y in zip(leaves(tree.add(a, b)), fa, fb):
        np.testing.assert_array_equal(got, x + y)
    for got, x, y in zip(leaves(tree.sub(a, b)), fa, fb):
        np.testing.assert_array_equal(got, x - y)
    flat_a, flat_b = (np.concatenate([x.ravel() for x in f]) for f in (fa, fb))
    np.testing.assert_allclose(tree.dot(a, b).numpy(), flat_a @ flat_b, rtol=0,
                               atol=1e-14 * (np.abs(flat_a) @ np.abs(flat_b)))  # sum order
    np.testing.assert_allclose(tree.norm(a).numpy(), np.linalg.norm(flat_a), rtol=1e-15)
    assert tree.size(a) == flat_a.size == 21
    back = tree.unflatten(tree.flatten(a), a)
    tree.check_same(a, back)
    for got, want in zip(leaves(back), fa):
        np.testing.assert_array_equal(got, want)
    for fn, value in ((tree.zeros_like, 0.0), (tree.ones_like, 1.0)):
        out = fn(a)
        tree.check_same(a, out)
        assert all(np.all(x == value) for x in leaves(out))
    assert isinstance(tree.scale(2, a)["pair"], Pair)
    # float32 trees: the scalar is rounded once, to float32
    c, fc = nested(2, np.float32)
    for got, want in zip(leaves(tree.scale(0.05, c)), fc):
        np.testing.assert_array_equal(got, np.float32(0.05) * want)
    # complex vdot conjugates its first argument
    z = [tf.constant([1 + 2j, 3 - 1j])]
    assert tree.vdot(z, z).numpy() == pytest.approx(15.0)
    assert tree.norm(z).numpy() == pytest.approx(np.sqrt(15.0))


def test_tree_ops_work_in_a_tf_function_like_eagerly():
    a, _ = nested(0)
    b, _ = nested(1)
    fn = tf.function(lambda a, b: (tree.dot(a, b), tree.axpy(0.05, a, b), tree.flatten(a)))
    for got, want in zip(tf.nest.flatten(fn(a, b)),
                         tf.nest.flatten((tree.dot(a, b), tree.axpy(0.05, a, b),
                                          tree.flatten(a)))):
        np.testing.assert_array_equal(got, want)


def test_mismatches_are_errors_naming_the_argument():
    a, _ = nested(0)
    x = [tf.zeros([3], tf.float64)]
    with pytest.raises(ValueError, match="tree.dot: a and b have different structures"):
        tree.dot(x, x + x)
    with pytest.raises(ValueError, match=r"tree.axpy: leaf 0 has shape \(3,\) in x but "
                                         r"\(3, 1\) in y"):
        tree.axpy(1.0, x, [tf.zeros([3, 1], tf.float64)])
    with pytest.raises(TypeError, match="tree.add: leaf 0 is float64 in a but float32 in b"):
        tree.add(x, [tf.zeros([3])])
    with pytest.raises(TypeError, match="tree.scale: s is a float32 tensor but the leaves are "
                                        "float64; pass a Python number"):
        tree.scale(tf.constant(0.05), x)
    with pytest.raises(ValueError, match="tree.scale: s must be a scalar"):
        tree.scale(tf.ones([2], tf.float64), x)
    with pytest.raises(ValueError, match="tree.norm: leaf 1 of a is None"):
        tree.norm([x[0], None])
    with pytest.raises(ValueError, match="tree.unflatten: vector has 18 entries but like has 21"):
        tree.unflatten(tf.zeros([18], tf.float64), a)
    with pytest.raises(TypeError, match="tree.flatten: the leaves of a .* mix dtypes"):
        tree.flatten([tf.zeros([2]), tf.zeros([2], tf.float64)])
    assert tree.flatten([tf.zeros([2]), tf.zeros([2], tf.float64)], tf.float64).dtype == \
        tf.float64
    with pytest.raises(TypeError, match="tree.dot: the leaves of a mix dtypes"):
        tree.dot([tf.zeros([2]), tf.zeros([2], tf.float64)],
                 [tf.zeros([2]), tf.zeros([2], tf.float64)])
    with pytest.raises(ValueError, match="tree.size: a has no tensors"):
        tree.size([])
    with pytest.raises(TypeError, match="seed must be an int"):
        tree.normal_like(x, 0.5)


def test_random_trees_are_stateless_seeded_and_have_the_right_moments():
    like = {"w": tf.zeros([100, 50], tf.float64), "b": tf.zeros([5000], tf.float32)}
    first, again = tree.normal_like(like, 3), tree.normal_like(like, 3)
    for x, y in zip(leaves(first), leaves(again)):
        np.testing.assert_array_equal(x, y)
    assert first["w"].dtype == tf.float64 and first["b"].dtype == tf.float32
    assert not np.array_equal(leaves(tree.normal_like(like, 4))[0], leaves(first)[0])
    # each leaf has its own stream: two same-shaped leaves differ
    twin = tree.normal_like([tf.zeros([10]), tf.zeros([10])], 0)
    assert not np.array_equal(*leaves(twin))
    traced = tf.function(lambda: tree.normal_like(like, 3))()
    np.testing.assert_array_equal(traced["w"], first["w"])
    for x in leaves(first):  # N(0, 1): mean and variance within 5 standard errors
        assert abs(x.mean()) < 5 / np.sqrt(x.size)
        assert abs(x.var() - 1) < 5 * np.sqrt(2 / x.size)
    signs = tree.rademacher_like(like, 7)
    for x in leaves(signs):
        assert set(np.unique(x)) == {-1.0, 1.0}
        assert abs(x.mean()) < 5 / np.sqrt(x.size)
    np.testing.assert_array_equal(tree.rademacher_like(like, 7)["w"], signs["w"])
