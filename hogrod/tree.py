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

import numpy as np
import tensorflow as tf

# Python control flow here is on Python values only (structure, dtypes, static shapes).
_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["leaves", "check_same", "dot", "vdot", "norm", "add", "sub", "scale", "axpy", "zeros_like",
           "ones_like", "normal_like", "rademacher_like", "flatten", "unflatten", "size"]


def leaves(tree, name, where, floating=False):
    """The leaves of `tree` as tensors, in `tf.nest.flatten` order; an empty tree, a None
    leaf or (with `floating`) a non-floating leaf is an error starting with `where` and
    naming `name`. Every module that takes a nested structure checks it here."""
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


def _leaves(tree, fn, name):
    return leaves(tree, name, f"tree.{fn}")


def _pair(a, b, fn, a_name="a", b_name="b"):
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


def _pack(like, leaves):
    return tf.nest.pack_sequence_as(like, leaves)


def _one_dtype(leaves, fn, name):
    dtypes = {t.dtype for t in leaves}
    if len(dtypes) > 1:
        raise TypeError(f"tree.{fn}: the leaves of {name} mix dtypes "
                        f"{sorted(d.name for d in dtypes)}; cast them to one first")
    return leaves[0].dtype


def _scalar(s, dtype, fn, name):
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
def check_same(a, b, a_name="a", b_name="b"):
    """Raise ValueError/TypeError, naming `a_name`/`b_name`, unless `a` and `b` have the same
    structure and, leaf by leaf, shapes and dtypes."""
    _pair(a, b, "check_same", a_name, b_name)


@_no_autograph
def dot(a, b):
    """sum over leaves of sum(conj(a_i) * b_i) (`vdot` of the flattened trees): a scalar of
    the leaves' dtype."""
    la, lb = _pair(a, b, "dot")
    _one_dtype(la, "dot", "a")
    conj = la[0].dtype.is_complex
    return tf.add_n([tf.reduce_sum((tf.math.conj(x) if conj else x) * y)
                     for x, y in zip(la, lb)])


vdot = dot


@_no_autograph
def norm(a):
    """sqrt(dot(a, a)): the Euclidean norm of the flattened tree (a real scalar)."""
    leaves = _leaves(a, "norm", "a")
    _one_dtype(leaves, "norm", "a")
    squares = [tf.reduce_sum(tf.math.real(tf.math.conj(x) * x) if x.dtype.is_complex
                             else x * x) for x in leaves]
    return tf.sqrt(tf.add_n(squares))


@_no_autograph
def add(a, b):
    """a + b, leaf by leaf."""
    la, lb = _pair(a, b, "add")
    return _pack(a, [x + y for x, y in zip(la, lb)])


@_no_autograph
def sub(a, b):
    """a - b, leaf by leaf."""
    la, lb = _pair(a, b, "sub")
    return _pack(a, [x - y for x, y in zip(la, lb)])


@_no_autograph
def scale(s, a):
    """s * a for a scalar `s` (a Python number, applied at each leaf's dtype)."""
    leaves = _leaves(a, "scale", "a")
    return _pack(a, [_scalar(s, x.dtype, "scale", "s") * x for x in leaves])


@_no_autograph
def axpy(alpha, x, y):
    """alpha * x + y, leaf by leaf, for a scalar `alpha`; the result is shaped like `x`."""
    lx, ly = _pair(x, y, "axpy", "x", "y")
    return _pack(x, [_scalar(alpha, u.dtype, "axpy", "alpha") * u + v
                     for u, v in zip(lx, ly)])


@_no_autograph
def zeros_like(a):
    """A tree of zeros shaped and typed like `a`."""
    return _pack(a, [tf.zeros_like(x) for x in _leaves(a, "zeros_like", "a")])


@_no_autograph
def ones_like(a):
    """A tree of ones shaped and typed like `a`."""
    return _pack(a, [tf.ones_like(x) for x in _leaves(a, "ones_like", "a")])


def _seeds(seed, count, fn):
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


def _floating(leaves, fn):
    for i, x in enumerate(leaves):
        if not x.dtype.is_floating:
            raise TypeError(f"tree.{fn}: leaf {i} of like is {x.dtype.name}; random trees "
                            "are floating point")


@_no_autograph
def normal_like(like, seed):
    """Standard normal entries shaped and typed like `like` (stateless: a function of
    `seed` and the structure only; each leaf draws from its own folded seed)."""
    leaves = _leaves(like, "normal_like", "like")
    _floating(leaves, "normal_like")
    seeds = _seeds(seed, len(leaves), "normal_like")
    return _pack(like, [tf.random.stateless_normal(tf.shape(x), s, dtype=x.dtype)
                        for x, s in zip(leaves, seeds)])


@_no_autograph
def rademacher_like(like, seed):
    """Independent +-1 entries (probability 1/2 each) shaped and typed like `like`
    (stateless, as `normal_like`)."""
    leaves = _leaves(like, "rademacher_like", "like")
    _floating(leaves, "rademacher_like")
    seeds = _seeds(seed, len(leaves), "rademacher_like")
    return _pack(like, [tf.cast(2 * tf.random.stateless_uniform(
        tf.shape(x), s, minval=0, maxval=2, dtype=tf.int32) - 1, x.dtype)
        for x, s in zip(leaves, seeds)])


def _specs(tree, fn, name):
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
def size(a):
    """The total number of entries of the tree's leaves (a Python int; static shapes)."""
    return sum(shape.num_elements() for shape, _ in _specs(a, "size", "a"))


@_no_autograph
def flatten(a, dtype=None):
    """One vector: every leaf flattened row-major, concatenated in `tf.nest.flatten` order
    (the order `hogrod.hessian` uses). Leaves of several dtypes need `dtype` (a cast)."""
    leaves = _leaves(a, "flatten", "a")
    if dtype is None:
        _one_dtype(leaves, "flatten", "a (or pass dtype=)")
    else:
        leaves = [tf.cast(x, dtype) for x in leaves]
    return tf.concat([tf.reshape(x, [-1]) for x in leaves], 0)


@_no_autograph
def unflatten(vector, like):
    """Split a vector of length `size(like)` into leaves shaped (and cast to the dtypes) of
    `like`'s leaves: the inverse of `flatten`."""
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
