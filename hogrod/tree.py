"""Arithmetic on nested structures ("trees") of tensors, in the spirit of `optax.tree`.

A tree is any `tf.nest` structure (list, tuple, dict, namedtuple) whose leaves are tensors,
variables (tf or Keras 3) or arrays: a list of parameters, their gradients, an HVP's
vector. The solvers of `hogrod.linalg` and every family use these operations so that a dot
product or a norm over a list of tensors is written once.

Rules, checked on every call (a violation is an error naming the argument):

- binary operations need the same structure (a list and a tuple with the same leaves
  count as the same) and, leaf by leaf, the same shape and dtype; nothing broadcasts. The
  result has the first tree's structure;
- a leaf is never None (fill unconnected gradients with zeros first);
- a Python-number scalar is applied at each leaf's dtype, so `scale(0.05, x)` on a float64
  tree is exact; a scalar *tensor* must already have the leaves' dtype (casting a float32
  0.05 to float64 would not give 0.05);
- `dot` and `norm` need one dtype across the tree's leaves.
"""

import numbers
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf

from hogrod.types import DType, Scalar, Seed, TensorLike, Tree

# Python control flow here is on Python values only (structure, dtypes, static shapes).
_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["leaves", "check_same", "dot", "vdot", "norm", "add", "sub", "scale", "axpy", "zeros_like",
           "ones_like", "normal_like", "rademacher_like", "flatten", "unflatten", "size"]


def leaves(tree: Tree, name: str, where: str, floating: bool = False) -> List[tf.Tensor]:
    """The leaves of `tree` as tensors, in `tf.nest.flatten` order.

    Every module that takes a nested structure checks it here; each leaf is converted with
    `tf.convert_to_tensor` (a variable is read).

    Args:
        tree: a nest (`tf.nest`) of tensors, variables or arrays.
        name: the argument's name, used in the messages.
        where: the public function checked, first in the messages.
        floating: whether every leaf must have a floating-point dtype; default False.

    Returns:
        The list of leaves as tensors, in `tf.nest.flatten` order.

    Raises:
        ValueError: `tree` has no leaves, or a leaf is None.
        TypeError: `floating` is set and a leaf is not floating point.
    """
    flat = tf.nest.flatten(tree)
    if not flat:
        raise ValueError(f"{where}: {name} has no tensors (got {tree!r})")
    out = []
    for i, leaf in enumerate(flat):
        if leaf is None:
            raise ValueError(f"{where}: leaf {i} of {name} is None (an unconnected "
                             "gradient?); give zeros instead")
        t = tf.convert_to_tensor(leaf)
        if floating and not t.dtype.is_floating:
            raise TypeError(f"{where}: leaf {i} of {name} is {t.dtype.name}; {name} must be "
                            "floating point")
        out.append(t)
    return out


def _leaves(tree: Tree, fn: str, name: str) -> List[tf.Tensor]:
    return leaves(tree, name, f"tree.{fn}")


def _pair(a: Tree, b: Tree, fn: str, a_name: str = "a",
          b_name: str = "b") -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    """The leaves of two trees of the same structure, shapes and dtypes."""
    try:
        tf.nest.assert_same_structure(a, b, check_types=False)
    except (ValueError, TypeError) as e:
        raise ValueError(f"tree.{fn}: {a_name} and {b_name} have different structures: "
                         f"{e}") from None
    la, lb = _leaves(a, fn, a_name), _leaves(b, fn, b_name)
    for i, (x, y) in enumerate(zip(la, lb)):
        if not x.shape.is_compatible_with(y.shape):
            raise ValueError(f"tree.{fn}: leaf {i} has shape {x.shape} in {a_name} but "
                             f"{y.shape} in {b_name}")
        if x.dtype != y.dtype:
            raise TypeError(f"tree.{fn}: leaf {i} is {x.dtype.name} in {a_name} but "
                            f"{y.dtype.name} in {b_name}")
    return la, lb


def _pack(like: Tree, leaves: List[tf.Tensor]) -> Tree:
    return tf.nest.pack_sequence_as(like, leaves)


def _one_dtype(leaves: List[tf.Tensor], fn: str, name: str) -> tf.DType:
    dtypes = {t.dtype for t in leaves}
    if len(dtypes) > 1:
        raise TypeError(f"tree.{fn}: the leaves of {name} mix dtypes "
                        f"{sorted(d.name for d in dtypes)}; cast them to one first")
    return leaves[0].dtype


def _scalar(s: Scalar, dtype: tf.DType, fn: str, name: str) -> tf.Tensor:
    """`s` as a scalar tensor of `dtype`; a Python or numpy number converts exactly."""
    if isinstance(s, (numbers.Number, np.number)) or (isinstance(s, np.ndarray)
                                                      and s.ndim == 0):
        return tf.constant(s, dtype)
    s = tf.convert_to_tensor(s)
    if s.shape.rank != 0:
        raise ValueError(f"tree.{fn}: {name} must be a scalar, got shape {s.shape}")
    if s.dtype != dtype:
        raise TypeError(f"tree.{fn}: {name} is a {s.dtype.name} tensor but the leaves are "
                        f"{dtype.name}; pass a Python number or a {dtype.name} tensor")
    return s


@_no_autograph
def check_same(a: Tree, b: Tree, a_name: str = "a", b_name: str = "b") -> None:
    """Checks that two trees have the same structure and, leaf by leaf, shapes and dtypes.

    A list and a tuple with the same leaves count as the same structure; shapes must be
    compatible (an unknown dimension matches any).

    Args:
        a: the first tree.
        b: the second tree.
        a_name: `a`'s name in the messages; default ``"a"``.
        b_name: `b`'s name in the messages; default ``"b"``.

    Raises:
        ValueError: the structures differ, a tree is empty or has a None leaf, or a leaf's
            shape differs.
        TypeError: a leaf's dtype differs.
    """
    _pair(a, b, "check_same", a_name, b_name)


@_no_autograph
def dot(a: Tree, b: Tree) -> tf.Tensor:
    """The inner product of two trees: `vdot` of the flattened trees.

    The sum over leaves of ``sum(conj(a_i) * b_i)`` (the conjugate only for complex leaves).
    `vdot` is the same function.

    Args:
        a: a tree whose leaves all have one dtype.
        b: a tree of `a`'s structure, shapes and dtypes.

    Returns:
        A scalar tensor of the leaves' dtype.

    Raises:
        ValueError: the structures or shapes differ, or a tree is empty.
        TypeError: the dtypes differ between the trees or across `a`'s leaves.
    """
    la, lb = _pair(a, b, "dot")
    _one_dtype(la, "dot", "a")
    conj = la[0].dtype.is_complex
    return tf.add_n([tf.reduce_sum((tf.math.conj(x) if conj else x) * y)
                     for x, y in zip(la, lb)])


vdot = dot


@_no_autograph
def norm(a: Tree) -> tf.Tensor:
    """The Euclidean norm of the flattened tree, ``sqrt(dot(a, a))``.

    Args:
        a: a tree whose leaves all have one dtype (real or complex).

    Returns:
        A real scalar tensor (of the leaves' real dtype).

    Raises:
        ValueError: `a` is empty or has a None leaf.
        TypeError: the leaves mix dtypes.
    """
    leaves = _leaves(a, "norm", "a")
    _one_dtype(leaves, "norm", "a")
    squares = [tf.reduce_sum(tf.math.real(tf.math.conj(x) * x) if x.dtype.is_complex
                             else x * x) for x in leaves]
    return tf.sqrt(tf.add_n(squares))


@_no_autograph
def add(a: Tree, b: Tree) -> Tree:
    """``a + b``, leaf by leaf.

    Args:
        a: a tree.
        b: a tree of `a`'s structure, shapes and dtypes (nothing broadcasts).

    Returns:
        The sum, a tree of `a`'s structure.

    Raises:
        ValueError: the structures or shapes differ.
        TypeError: the dtypes differ.
    """
    la, lb = _pair(a, b, "add")
    return _pack(a, [x + y for x, y in zip(la, lb)])


@_no_autograph
def sub(a: Tree, b: Tree) -> Tree:
    """``a - b``, leaf by leaf.

    Args:
        a: a tree.
        b: a tree of `a`'s structure, shapes and dtypes (nothing broadcasts).

    Returns:
        The difference, a tree of `a`'s structure.

    Raises:
        ValueError: the structures or shapes differ.
        TypeError: the dtypes differ.
    """
    la, lb = _pair(a, b, "sub")
    return _pack(a, [x - y for x, y in zip(la, lb)])


@_no_autograph
def scale(s: Scalar, a: Tree) -> Tree:
    """``s * a`` for a scalar `s`, leaf by leaf.

    Args:
        s: a Python or numpy number (applied exactly at each leaf's dtype) or a scalar
            tensor of the leaves' dtype.
        a: a tree.

    Returns:
        The scaled tree, of `a`'s structure.

    Raises:
        ValueError: `s` is a tensor that is not a scalar.
        TypeError: `s` is a tensor of another dtype than a leaf.
    """
    leaves = _leaves(a, "scale", "a")
    return _pack(a, [_scalar(s, x.dtype, "scale", "s") * x for x in leaves])


@_no_autograph
def axpy(alpha: Scalar, x: Tree, y: Tree) -> Tree:
    """``alpha * x + y``, leaf by leaf, for a scalar `alpha`.

    Args:
        alpha: a Python or numpy number (applied exactly at each leaf's dtype) or a scalar
            tensor of the leaves' dtype.
        x: a tree.
        y: a tree of `x`'s structure, shapes and dtypes.

    Returns:
        The tree ``alpha * x + y``, of `x`'s structure.

    Raises:
        ValueError: the structures or shapes differ, or `alpha` is not a scalar.
        TypeError: the dtypes differ, or `alpha` is a tensor of another dtype.
    """
    lx, ly = _pair(x, y, "axpy", "x", "y")
    return _pack(x, [_scalar(alpha, u.dtype, "axpy", "alpha") * u + v
                     for u, v in zip(lx, ly)])


@_no_autograph
def zeros_like(a: Tree) -> Tree:
    """A tree of zeros shaped and typed like `a`.

    Args:
        a: a tree (no None leaves).

    Returns:
        A tree of `a`'s structure whose leaves are zeros of each leaf's shape and dtype.
    """
    return _pack(a, [tf.zeros_like(x) for x in _leaves(a, "zeros_like", "a")])


@_no_autograph
def ones_like(a: Tree) -> Tree:
    """A tree of ones shaped and typed like `a`.

    Args:
        a: a tree (no None leaves).

    Returns:
        A tree of `a`'s structure whose leaves are ones of each leaf's shape and dtype.
    """
    return _pack(a, [tf.ones_like(x) for x in _leaves(a, "ones_like", "a")])


def _seeds(seed: Seed, count: int, fn: str) -> List[tf.Tensor]:
    """One stateless seed per leaf, folded from `seed` (an int or a shape-[2] int tensor)."""
    if isinstance(seed, (bool, np.bool_)) or seed is None:
        raise TypeError(f"tree.{fn}: seed must be an int or a shape-[2] integer tensor, "
                        f"got {seed!r}")
    if isinstance(seed, (numbers.Integral, np.integer)):
        seed = tf.constant([int(seed), 0], tf.int64)
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer or seed.shape != [2]:
        raise TypeError(f"tree.{fn}: seed must be an int or a shape-[2] integer tensor, got "
                        f"{seed.dtype.name} of shape {seed.shape}")
    return [tf.random.experimental.stateless_fold_in(seed, i) for i in range(count)]


def _floating(leaves: List[tf.Tensor], fn: str) -> None:
    for i, x in enumerate(leaves):
        if not x.dtype.is_floating:
            raise TypeError(f"tree.{fn}: leaf {i} of like is {x.dtype.name}; random trees "
                            "are floating point")


@_no_autograph
def normal_like(like: Tree, seed: Seed) -> Tree:
    """Standard normal entries shaped and typed like `like`.

    Stateless: a function of `seed` and the structure only; each leaf draws from its own
    seed, `seed` folded with the leaf's index.

    Args:
        like: a tree of floating-point leaves giving the shapes and dtypes.
        seed: a Python or numpy int, or a shape-``[2]`` integer tensor (a stateless seed).

    Returns:
        A tree of `like`'s structure of independent standard normal samples.

    Raises:
        TypeError: a leaf is not floating point, or `seed` is None, a bool or not an int /
            shape-``[2]`` integer tensor.
    """
    leaves = _leaves(like, "normal_like", "like")
    _floating(leaves, "normal_like")
    seeds = _seeds(seed, len(leaves), "normal_like")
    return _pack(like, [tf.random.stateless_normal(tf.shape(x), s, dtype=x.dtype)
                        for x, s in zip(leaves, seeds)])


@_no_autograph
def rademacher_like(like: Tree, seed: Seed) -> Tree:
    """Independent +-1 entries (probability 1/2 each) shaped and typed like `like`.

    Stateless, as `normal_like`: each leaf draws from `seed` folded with its index.

    Args:
        like: a tree of floating-point leaves giving the shapes and dtypes.
        seed: a Python or numpy int, or a shape-``[2]`` integer tensor (a stateless seed).

    Returns:
        A tree of `like`'s structure whose entries are -1 or +1.

    Raises:
        TypeError: a leaf is not floating point, or `seed` is None, a bool or not an int /
            shape-``[2]`` integer tensor.
    """
    leaves = _leaves(like, "rademacher_like", "like")
    _floating(leaves, "rademacher_like")
    seeds = _seeds(seed, len(leaves), "rademacher_like")
    return _pack(like, [tf.cast(2 * tf.random.stateless_uniform(
        tf.shape(x), s, minval=0, maxval=2, dtype=tf.int32) - 1, x.dtype)
        for x, s in zip(leaves, seeds)])


def _specs(tree: Tree, fn: str, name: str) -> List[Tuple[tf.TensorShape, tf.DType]]:
    """(static shape, dtype) of each leaf, read without reading a variable's value."""
    flat = tf.nest.flatten(tree)
    if not flat:
        raise ValueError(f"tree.{fn}: {name} has no tensors (got {tree!r})")
    specs = []
    for i, leaf in enumerate(flat):
        if leaf is None:
            raise ValueError(f"tree.{fn}: leaf {i} of {name} is None")
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            leaf = tf.convert_to_tensor(leaf)
        shape = tf.TensorShape(leaf.shape)
        if not shape.is_fully_defined():
            raise ValueError(f"tree.{fn}: leaf {i} of {name} has shape {shape}; a static "
                             "shape is needed")
        specs.append((shape, tf.as_dtype(leaf.dtype)))
    return specs


@_no_autograph
def size(a: Tree) -> int:
    """The total number of entries of the tree's leaves.

    Read from the static shapes; a variable's value is not read.

    Args:
        a: a tree whose leaves have fully defined static shapes.

    Returns:
        The number of entries, a Python int.

    Raises:
        ValueError: `a` is empty, has a None leaf, or a leaf's shape is not fully defined.
    """
    return sum(shape.num_elements() for shape, _ in _specs(a, "size", "a"))


@_no_autograph
def flatten(a: Tree, dtype: Optional[DType] = None) -> tf.Tensor:
    """One vector: every leaf flattened row-major, concatenated in `tf.nest.flatten` order.

    The order is the one `hogrod.hessian` uses.

    Args:
        a: a tree.
        dtype: the dtype every leaf is cast to; None (default) keeps the leaves' dtype,
            which must then be one across the tree.

    Returns:
        A rank-1 tensor of ``size(a)`` entries.

    Raises:
        ValueError: `a` is empty or has a None leaf.
        TypeError: `dtype` is None and the leaves mix dtypes.
    """
    leaves = _leaves(a, "flatten", "a")
    if dtype is None:
        _one_dtype(leaves, "flatten", "a (or pass dtype=)")
    else:
        leaves = [tf.cast(x, dtype) for x in leaves]
    return tf.concat([tf.reshape(x, [-1]) for x in leaves], 0)


@_no_autograph
def unflatten(vector: TensorLike, like: Tree) -> Tree:
    """Splits a vector into a tree shaped like `like`: the inverse of `flatten`.

    Args:
        vector: a rank-1 tensor of ``size(like)`` entries.
        like: a tree whose leaves have fully defined static shapes; its leaves' shapes and
            dtypes are given to the pieces (each is cast to its leaf's dtype).

    Returns:
        A tree of `like`'s structure.

    Raises:
        ValueError: `vector` is not rank 1 or has the wrong length, or `like` is empty,
            has a None leaf or a leaf of unknown shape.
    """
    specs = _specs(like, "unflatten", "like")
    sizes = [shape.num_elements() for shape, _ in specs]
    vector = tf.convert_to_tensor(vector)
    if vector.shape.rank != 1:
        raise ValueError(f"tree.unflatten: vector must be rank 1, got shape {vector.shape}")
    if vector.shape[0] is not None and vector.shape[0] != sum(sizes):
        raise ValueError(f"tree.unflatten: vector has {vector.shape[0]} entries but like has "
                         f"{sum(sizes)}")
    parts = tf.split(vector, sizes)
    return _pack(like, [tf.cast(tf.reshape(p, shape), dtype)
                        for p, (shape, dtype) in zip(parts, specs)])
