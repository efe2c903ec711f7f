"""A per-parameter MLP learned optimizer, as learned_optimization's small MLP optimizer.

`mlp_optimizer(...)` returns a `LearnedOptimizer` whose theta is the weights of a small MLP
applied to every scalar parameter independently (learned_optimization's
`learned_optimizers/mlp_lopt.py`, "LOLv2", Metz et al. 2019; the Adam-like and second-moment
features of its `adafac_mlp_lopt.py`). One update, for each tensor p of the params with
gradient g (shapes flattened to n entries; t the step count before the update):

    m_i <- d_i m_i + (1 - d_i) g        for each decay d_i in `decays` (k momenta)
    v   <- b v + (1 - b) g^2            b = `second_moment_decay`
    features (n x F, F = 3 + 2k): g, p, m_1..m_k, v, m_1/sqrt(v + 1e-6)..m_k/sqrt(v + 1e-6)
    normalized column by column over the tensor:  f <- f / sqrt(1e-5 + mean_n(f^2))
    x = [normalized features, tanh(t / s - 1) for each timescale s]     (n x (F + S))
    (direction, magnitude) = MLP(x): `hidden_layers` ReLU layers of `hidden_size`, then 2
    p <- p - (step_mult * direction + adam) * exp(exp_mult * magnitude)
    adam = adam_learning_rate * sqrt(1 - b^(t+1)) / (1 - 0.9^(t+1)) * m_0.9 / (sqrt(v) + 1e-7)

`adam` is Adam's step (`hogrod.optim.adam`'s, b1 = 0.9 being one of the decays, b2 = b) at
`adam_learning_rate`, 0 by default (learned_optimization's optimizer). With a rate, the
learned optimizer starts as that Adam (its direction small, its magnitude 0) and
meta-training learns a correction and a per-entry scale of Adam's step, rather than an
update from scratch.

The momenta and second moment are updated before the features are taken (as
learned_optimization does); a scalar parameter is a tensor of one entry (its normalization
is then per entry, as learned_optimization's reshape to [1] gives). Every constant is
applied at the params' dtype (`tf.constant(x, dtype)`): in float64 the update is the
formula above in float64.

At `init(seed)`: each kernel is drawn from a normal of standard deviation 1/sqrt(fan_in)
truncated at two deviations (Haiku's `Linear`, which learned_optimization uses), each bias
is 0, and the magnitude column of the last kernel is 0 (learned_optimization draws it like
the direction's; with exp_mult = 1e-3 that changes the first steps by a factor
``exp(1e-3 * abs(magnitude))`` at most). Then the step is ``step_mult * direction`` exactly, and,
ReLU being 1-Lipschitz with zero biases, the root mean square of the step over a tensor is
at most ``step_mult * sqrt(F + S) * ||w_dir|| * prod_l ||W_l||_2`` (the spectral norms of
the hidden kernels, w_dir the last kernel's direction column): each normalized column has
mean square below 1 and tanh lies in (-1, 1), whatever the gradients' scale.
"""

import math
from typing import NamedTuple, Sequence

import gin
import tensorflow as tf

from hogrod import checks, optim, tree
from hogrod.learned import base
from hogrod.types import DType, Tree

__all__ = ["MLPOptimizerState", "mlp_optimizer", "feature_count"]

_no_autograph = tf.autograph.experimental.do_not_convert

#: learned_optimization's constants: the normalizer's epsilon, the Adam-like feature's.
NORMALIZER_EPS = 1e-5
RMS_EPS = 1e-6
#: learned_optimization's decays and the timescales of its step embedding.
DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
TIMESCALES = (1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000)
#: Adam's first-moment decay and epsilon (`hogrod.optim.adam`'s) for `adam_learning_rate`.
ADAM_B1, ADAM_EPS = 0.9, 1e-7


class MLPOptimizerState(NamedTuple):
    """The state of an `mlp_optimizer`'s optimizer.

    Attributes:
        count: the steps taken, an int64 scalar tensor.
        momenta: the momenta, a tree of the params' structure, each leaf of shape
            ``param.shape + [len(decays)]``.
        second_moment: the moving average of the squared gradients, a tree of the params'
            structure, shapes and dtypes.
    """

    count: tf.Tensor
    momenta: Tree
    second_moment: Tree


def feature_count(decays: int) -> int:
    """F, the number of per-entry features normalized over a tensor (without the step
    embedding): gradient, parameter, the momenta, the second moment and the Adam-like
    ratios.

    Args:
        decays: the number of momentum decays k.

    Returns:
        ``3 + 2 k``.
    """
    return 3 + 2 * decays


def _check_config(hidden_size, hidden_layers, decays, second_moment_decay, step_mult,
                  exp_mult, timescales, dtype, adam_learning_rate=0.0):
    where = "hogrod.learned.mlp_optimizer"
    hidden_size = checks.integer(hidden_size, "hidden_size", where, least=1)
    hidden_layers = checks.integer(hidden_layers, "hidden_layers", where, least=0)
    if isinstance(decays, (str, bytes)) or not hasattr(decays, "__iter__") or not decays:
        raise checks.ArgumentError(f"{where}: decays must be a non-empty sequence of numbers "
                                   f"in (0, 1), got {decays!r}")
    decays = [checks.probability(d, f"decays[{i}]", where, open_ends=True)
              for i, d in enumerate(decays)]
    second_moment_decay = checks.probability(second_moment_decay, "second_moment_decay",
                                             where, open_ends=True)
    step_mult = checks.positive(step_mult, "step_mult", where)
    exp_mult = checks.nonnegative(exp_mult, "exp_mult", where)
    if isinstance(timescales, (str, bytes)) or not hasattr(timescales, "__iter__"):
        raise checks.ArgumentError(f"{where}: timescales must be a sequence of positive "
                                   f"numbers, got {timescales!r}")
    timescales = [checks.positive(s, f"timescales[{i}]", where)
                  for i, s in enumerate(timescales)]
    dtype = base.float_dtype(dtype, where)
    adam_learning_rate = checks.nonnegative(adam_learning_rate, "adam_learning_rate", where)
    if adam_learning_rate and ADAM_B1 not in decays:
        raise checks.ArgumentError(f"{where}: adam_learning_rate > 0 takes Adam's momentum "
                                   f"from the decay {ADAM_B1}, which decays {decays} lacks")
    return dict(hidden_size=hidden_size, hidden_layers=hidden_layers, decays=decays,
                second_moment_decay=second_moment_decay, step_mult=step_mult,
                exp_mult=exp_mult, timescales=timescales, dtype=dtype.name,
                adam_learning_rate=adam_learning_rate)


def _layer_sizes(config):
    inputs = feature_count(len(config["decays"])) + len(config["timescales"])
    return [inputs] + [config["hidden_size"]] * config["hidden_layers"] + [2]


def _spec(config):
    dtype, sizes = tf.as_dtype(config["dtype"]), _layer_sizes(config)
    return [{"bias": tf.TensorSpec([n_out], dtype), "kernel": tf.TensorSpec([n_in, n_out], dtype)}
            for n_in, n_out in zip(sizes[:-1], sizes[1:])]


def _init(config, seed):
    dtype, sizes = tf.as_dtype(config["dtype"]), _layer_sizes(config)
    theta = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        key = tf.random.experimental.stateless_fold_in(seed, i)
        kernel = tf.random.stateless_truncated_normal([n_in, n_out], key, dtype=dtype,
                                                      stddev=tf.constant(1 / math.sqrt(n_in),
                                                                         dtype))
        if i == len(sizes) - 2:  # the magnitude head starts at 0: the step is step_mult * direction
            kernel = tf.concat([kernel[:, :1], tf.zeros([n_in, 1], dtype)], axis=1)
        theta.append({"bias": tf.zeros([n_out], dtype), "kernel": kernel})
    return theta


def _features(config, p, g, m, v):
    """The normalized features of one tensor, [n, F], and the new momenta [n, k] and second
    moment [n] (all flattened)."""
    dtype = p.dtype
    decays = tf.constant(config["decays"], dtype)
    b = tf.constant(config["second_moment_decay"], dtype)
    g, p = tf.reshape(g, [-1]), tf.reshape(p, [-1])
    m = decays * tf.reshape(m, [-1, len(config["decays"])]) + (1 - decays) * g[:, None]
    v = b * tf.reshape(v, [-1]) + (1 - b) * tf.square(g)
    adam_like = m * tf.math.rsqrt(v[:, None] + tf.constant(RMS_EPS, dtype))
    f = tf.concat([g[:, None], p[:, None], m, v[:, None], adam_like], axis=1)
    scale = tf.math.rsqrt(tf.constant(NORMALIZER_EPS, dtype)
                          + tf.reduce_mean(tf.square(f), axis=0, keepdims=True))
    return f * scale, m, v


def _step_embedding(config, count, dtype):
    t = tf.cast(count, dtype)
    return tf.tanh(t / tf.constant(config["timescales"], dtype) - 1)


def _mlp(theta, x):
    h = x
    for i, layer in enumerate(theta):
        h = tf.matmul(h, layer["kernel"]) + layer["bias"]
        if i < len(theta) - 1:
            h = tf.nn.relu(h)
    return h[:, 0], h[:, 1]


def _adam_step(config, m, v, count):
    """Adam's step at `adam_learning_rate` from the momentum of decay 0.9 and the second
    moment (flattened, already updated), as `hogrod.optim.adam` takes it at step count+1."""
    dtype = v.dtype
    t = tf.cast(count + 1, dtype)
    b1, b2 = tf.constant(ADAM_B1, dtype), tf.constant(config["second_moment_decay"], dtype)
    alpha = (tf.constant(config["adam_learning_rate"], dtype) * tf.sqrt(1 - tf.pow(b2, t))
             / (1 - tf.pow(b1, t)))
    m1 = m[:, config["decays"].index(ADAM_B1)]
    return alpha * m1 / (optim.safe_sqrt(v) + tf.constant(ADAM_EPS, dtype))


def _step_of(config, theta, p, features, embedding, adam):
    """The step of one tensor (flattened) from its features and Adam's step (None: none)."""
    n = tf.shape(features)[0]
    x = tf.concat([features, tf.tile(embedding[None, :], tf.stack([n, 1]))], axis=1)
    direction, magnitude = _mlp(theta, x)
    dtype = p.dtype
    step = tf.constant(config["step_mult"], dtype) * direction
    if adam is not None:
        step = step + adam
    return step * tf.exp(tf.constant(config["exp_mult"], dtype) * magnitude)


def _init_state(config, params):
    """Zero momenta and second moment, step count 0 (whatever theta)."""
    leaves = tree.leaves(params, "params", "hogrod.learned.mlp_optimizer: optimizer.init",
                         floating=True)
    k = len(config["decays"])
    pack = lambda xs: tf.nest.pack_sequence_as(params, xs)  # noqa: E731
    return MLPOptimizerState(tf.zeros([], tf.int64),
                             pack([tf.stack([tf.zeros_like(p)] * k, axis=-1) for p in leaves]),
                             pack([tf.zeros_like(p) for p in leaves]))


def _shape(x):
    return x.shape if x.shape.is_fully_defined() else tf.shape(x)


def _build(config, theta_in):
    where = "hogrod.learned.mlp_optimizer"

    def init(params):
        return _init_state(config, params)

    @_no_autograph
    def update(grads, state, params):
        theta = [{key: tf.convert_to_tensor(t) for key, t in layer.items()}
                 for layer in theta_in]
        p_leaves, g_leaves, m_leaves, v_leaves = _check_update(where, config, grads, state,
                                                               params, theta)
        count = state.count
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(p_leaves, g_leaves, m_leaves, v_leaves):
            features, m_new, v_new = _features(config, p, g, m, v)
            adam = (_adam_step(config, m_new, v_new, count)
                    if config["adam_learning_rate"] else None)
            step = _step_of(config, theta, p, features,
                            _step_embedding(config, count, p.dtype), adam)
            new_p.append(p - tf.reshape(step, _shape(p)))
            new_m.append(tf.reshape(m_new, _shape(m)))
            new_v.append(tf.reshape(v_new, _shape(v)))
        pack = lambda xs: tf.nest.pack_sequence_as(params, xs)  # noqa: E731
        return pack(new_p), MLPOptimizerState(count + 1, pack(new_m), pack(new_v))

    return optim.Optimizer(init, update, "mlp_optimizer", None)


def _check_update(where, config, grads, state, params, theta):
    """The leaves of params, grads, momenta and second moment, after checking they match
    each other and theta's dtype."""
    if not isinstance(state, MLPOptimizerState):
        raise TypeError(f"{where}: update: state must be the MLPOptimizerState its init "
                        f"returns, got {type(state).__name__}")
    p = tree.leaves(params, "params", f"{where}: update", floating=True)
    try:
        tree.check_same(grads, params, "grads", "params")
        tree.check_same(state.second_moment, params, "state.second_moment", "params")
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where}: update: {e}") from None
    dtype = theta[0]["kernel"].dtype
    for i, leaf in enumerate(p):
        if leaf.dtype != dtype:
            raise checks.ArgumentError(
                f"{where}: update: params leaf {i} is {leaf.dtype.name} but theta is "
                f"{dtype.name}; build the optimizer with mlp_optimizer(dtype="
                f"'{leaf.dtype.name}') (theta is never cast: a cast would round it)")
    m = tree.leaves(state.momenta, "state.momenta", f"{where}: update")
    k = len(config["decays"])
    if len(m) != len(p) or any(not mi.shape.is_compatible_with(pi.shape.concatenate([k]))
                               for mi, pi in zip(m, p)):
        raise ValueError(f"{where}: update: state.momenta must hold one tensor of shape "
                         f"param.shape + [{k}] per param, got {checks.describe(m)} for params "
                         f"{checks.describe(p)}")
    g = [tf.convert_to_tensor(x) for x in tf.nest.flatten(grads)]
    v = [tf.convert_to_tensor(x) for x in tf.nest.flatten(state.second_moment)]
    return p, g, m, v


@gin.configurable(module="hogrod.learned")
def mlp_optimizer(hidden_size: int = 32, hidden_layers: int = 2,
                  decays: Sequence[float] = DECAYS, second_moment_decay: float = 0.999,
                  step_mult: float = 0.001, exp_mult: float = 0.001,
                  timescales: Sequence[float] = TIMESCALES, dtype: DType = "float32",
                  adam_learning_rate: float = 0.0) -> base.LearnedOptimizer:
    """The per-parameter MLP learned optimizer (the module docstring has the update).

    Args:
        hidden_size: the width of each hidden layer, an int >= 1; default 32.
        hidden_layers: the number of hidden ReLU layers, an int >= 0; default 2.
        decays: the momenta's decays, each in (0, 1); default learned_optimization's
            (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999).
        second_moment_decay: the squared gradients' decay, in (0, 1); default 0.999.
        step_mult: the step's scale, > 0; default 1e-3 (learned_optimization's).
        exp_mult: the log-magnitude's scale, >= 0; default 1e-3 (learned_optimization's).
        timescales: the step embedding's timescales, each > 0 (may be empty); default
            learned_optimization's 1, 3, 10, ..., 100000.
        dtype: theta's dtype, which must be the params'; default "float32".
        adam_learning_rate: the rate of Adam's step added to the learned direction and
            scaled with it by the learned magnitude, >= 0 (needs 0.9 among `decays`);
            default 0 (none). With it the optimizer starts as Adam at that rate.

    Returns:
        A `LearnedOptimizer` named "mlp_optimizer"; theta is a list with one
        ``{"kernel": [n_in, n_out], "bias": [n_out]}`` per layer.

    Raises:
        ArgumentError: a setting is out of range or of the wrong type (named).
    """
    config = _check_config(hidden_size, hidden_layers, decays, second_moment_decay, step_mult,
                           exp_mult, timescales, dtype, adam_learning_rate)
    return base.LearnedOptimizer("mlp_optimizer", config, _spec(config),
                                 lambda seed: _init(config, seed),
                                 lambda theta: _build(config, theta),
                                 lambda params: _init_state(config, params))

