"""Returns, advantages and the linear feature baseline: the policy-gradient pieces a user
composes, on `[batch, T]` tensors in TensorFlow (inside `tf.function` and
`tf.vectorized_map` alike).

A `mask` (`[batch, T]`, 1 before an episode ends, 0 after) lets episodes of different
lengths share a batch: rewards, values and observations after the end are ignored (treated
as 0), and every output is 0 there. The last step of the window, `T - 1`, ends the horizon:
nothing is bootstrapped beyond it, which is exact for a finite-horizon return
``sum_{t<T} discount**t r_t``.
"""

from typing import Optional

import keras
import tensorflow as tf

from hogrod import checks
from hogrod.types import DType, Tensor, TensorLike

__all__ = ["discounted_returns", "gae_advantages", "LinearFeatureBaseline"]


def _powers(base: float, steps: TensorLike, dtype: DType) -> tf.Tensor:
    """`[base**0, ..., base**(steps-1)]` at `dtype` (the base a Python number applied at
    `dtype`, never through float32).

    Args:
      base: a Python number.
      steps: the length, a scalar int tensor or int.
      dtype: the floating dtype.

    Returns:
      A `[steps]` tensor.
    """
    return tf.pow(tf.constant(base, dtype), tf.cast(tf.range(steps), dtype))


def _masked(x, mask):
    return x if mask is None else tf.where(mask > 0, x, tf.zeros_like(x))


def _discounted_sum(x, rate):
    """``y_t = sum_{k>=t} rate**(k-t) x_k`` along axis 1, as one product with the
    upper-triangular `[T, T]` matrix of powers (``T**2`` memory; exact, no sequential loop)."""
    steps = tf.shape(x)[1]
    index = tf.range(steps)
    lag = index[:, None] - index[None, :]  # [k, t]: k - t
    weights = tf.where(lag >= 0,
                       tf.pow(tf.constant(rate, x.dtype), tf.cast(tf.maximum(lag, 0), x.dtype)),
                       tf.zeros([], x.dtype))
    return tf.matmul(x, weights)


def discounted_returns(rewards: TensorLike, discount: float,
                       mask: Optional[TensorLike] = None) -> tf.Tensor:
    """The discounted return from each step, ``R_t = sum_{k=t}^{T-1} discount**(k-t) r_k``.

    Args:
      rewards: `[batch, T]` floating rewards.
      discount: the discount, a Python number in (0, 1], applied at the rewards' dtype.
      mask: optional `[batch, T]` mask of the rewards' dtype (1 before an episode ends, 0
        after; only 0 and 1, non-increasing in time); rewards after the end are ignored.

    Returns:
      A `[batch, T]` tensor of the rewards' dtype, 0 where `mask` is 0.

    Raises:
      ArgumentError: `rewards` is not a floating `[batch, T]` tensor, `discount` is not in
        (0, 1], or `mask` differs in shape or dtype, or holds other values than 0 and 1, or
        increases along time (eagerly or for a constant mask; in a graph an assertion
        fails when it runs, except under XLA, `jit_compile=True`, which drops it).
    """
    where = "discounted_returns"
    r = checks.floating(rewards, "rewards", where)
    r = checks.like(r, "rewards", where, r, "rewards", rank=2)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    mask = checks.mask_of(mask, where, r, "rewards")
    return _masked(_discounted_sum(_masked(r, mask), discount), mask)


def gae_advantages(rewards: TensorLike, values: TensorLike, discount: float, gae_lambda: float,
                   mask: Optional[TensorLike] = None) -> tf.Tensor:
    """Generalized advantage estimates (Schulman et al. 2016).

    ``delta_t = r_t + discount V_{t+1} - V_t`` with ``V_T = 0`` (and ``V_{t+1} = 0`` after an
    episode's end), ``A_t = sum_{k>=t} (discount gae_lambda)**(k-t) delta_k``. With
    `gae_lambda` = 1 it is the discounted return minus the baseline, ``R_t - V_t``; with 0 the
    one-step temporal difference ``delta_t``.

    Args:
      rewards: `[batch, T]` floating rewards.
      values: `[batch, T]` baseline values ``V(s_t)``, the rewards' dtype.
      discount: the discount, a Python number in (0, 1].
      gae_lambda: GAE's lambda, a Python number in [0, 1].
      mask: optional `[batch, T]` mask (1 before an episode ends, 0 after).

    Returns:
      A `[batch, T]` tensor of the rewards' dtype, 0 where `mask` is 0.

    Raises:
      ArgumentError: a shape or dtype differs, `discount` is not in (0, 1], `gae_lambda` not
        in [0, 1], or `mask` is not a 0/1 non-increasing mask.
    """
    where = "gae_advantages"
    r = checks.floating(rewards, "rewards", where)
    r = checks.like(r, "rewards", where, r, "rewards", rank=2)
    v = checks.like(values, "values", where, r, "rewards", rank=2)
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    gae_lambda = checks.probability(gae_lambda, "gae_lambda", where)
    mask = checks.mask_of(mask, where, r, "rewards")
    return _advantages(r, v, discount, gae_lambda, mask)


def _advantages(rewards, values, discount, gae_lambda, mask):
    """`gae_advantages` on checked tensors (shared with `dice_surrogate`)."""
    r, v = _masked(rewards, mask), _masked(values, mask)
    following = tf.concat([v[:, 1:], tf.zeros_like(v[:, :1])], axis=1)
    delta = r + tf.constant(discount, r.dtype) * following - v
    return _masked(_discounted_sum(delta, discount * gae_lambda), mask)


class LinearFeatureBaseline(tf.Module):
    """The linear feature baseline of MAML's reinforcement-learning experiments (rllab's).

    Features per step: ``[s, s**2, t, t**2, t**3, 1]`` with ``s`` the observation clipped to
    [-10, 10] and ``t = step / 100`` (``2 observation_dim + 4`` features). The coefficients
    are the ridge solution ``(F^T F + reg I)^-1 F^T R`` over the unmasked steps, with ``reg``
    starting at `reg_coeff` and multiplied by 10 (at most 4 times) while ``F^T F + reg I``
    is not numerically positive definite or the solution is not finite, as rllab does on a
    failed solve. The coefficients live in a variable (`coefficients`, saved with a
    checkpoint of the module); `solve` is the pure fit for a per-task use inside
    `tf.vectorized_map`.

    Args:
      observation_dim: the size of an observation (the last axis), a positive int.
      reg_coeff: the first ridge regularization, a positive Python number.
      dtype: the observations' floating dtype; None: Keras's floatx.

    Raises:
      ArgumentError: an argument out of range or a dtype not floating.
    """

    def __init__(self, observation_dim: int, reg_coeff: float = 1e-5,
                 dtype: Optional[DType] = None) -> None:
        super().__init__(name="linear_feature_baseline")
        where = "LinearFeatureBaseline"
        self.observation_dim = checks.integer(observation_dim, "observation_dim", where, 1)
        self.reg_coeff = checks.positive(reg_coeff, "reg_coeff", where)
        self.dtype = tf.as_dtype(dtype or keras.backend.floatx())
        if not self.dtype.is_floating:
            raise checks.ArgumentError(f"{where}: dtype must be floating, got "
                                       f"{self.dtype.name}")
        self.coefficients = tf.Variable(tf.zeros([2 * self.observation_dim + 4], self.dtype),
                                        trainable=False, name="coefficients")

    def _observations(self, observations, where):
        obs = checks.floating(observations, "observations", where)
        if obs.dtype != self.dtype:
            raise checks.ArgumentError(f"{where}: observations have dtype {obs.dtype.name}, "
                                       f"the baseline {self.dtype.name}")
        if obs.shape.rank != 3 or obs.shape[-1] not in (None, self.observation_dim):
            raise checks.ArgumentError(
                f"{where}: observations must have shape [batch, T, {self.observation_dim}], "
                f"got {obs.shape.as_list()}")
        return obs

    def features(self, observations: TensorLike, mask: Optional[TensorLike] = None
                 ) -> tf.Tensor:
        """The features ``[s, s**2, t, t**2, t**3, 1]`` of every step, 0 where masked.

        Args:
          observations: `[batch, T, observation_dim]` observations of the baseline's dtype.
          mask: optional `[batch, T]` mask (1 before an episode ends, 0 after).

        Returns:
          A `[batch, T, 2 observation_dim + 4]` tensor.

        Raises:
          ArgumentError: a shape or dtype differs, or a bad mask.
        """
        where = "LinearFeatureBaseline.features"
        obs = self._observations(observations, where)
        mask = checks.mask_of(mask, where, obs[..., 0], "observations[..., 0]")
        s = tf.clip_by_value(obs, tf.constant(-10.0, obs.dtype), tf.constant(10.0, obs.dtype))
        steps = tf.shape(obs)[1]
        t = tf.cast(tf.range(steps), obs.dtype) / tf.constant(100.0, obs.dtype)
        t = tf.broadcast_to(t[None, :, None], tf.concat([tf.shape(obs)[:2], [1]], 0))
        f = tf.concat([s, s * s, t, t * t, t * t * t, tf.ones_like(t)], axis=-1)
        # tf.where, not a product: an observation after the end may be NaN (0 * NaN is NaN)
        return f if mask is None else tf.where(mask[..., None] > 0, f, tf.zeros_like(f))

    def solve(self, observations: TensorLike, returns: TensorLike,
              mask: Optional[TensorLike] = None) -> tf.Tensor:
        """The ridge coefficients fitted to `returns`, without storing them (pure).

        Args:
          observations: `[batch, T, observation_dim]` observations.
          returns: `[batch, T]` targets (usually `discounted_returns`), the same dtype.
          mask: optional `[batch, T]` mask; masked steps are left out of the fit.

        Returns:
          The `[2 observation_dim + 4]` coefficients (no gradient flows through them).

        Raises:
          ArgumentError: a shape or dtype differs, a bad mask, or no regularization tried
            gives a finite solution (eagerly; in a graph an assertion fails when it runs,
            except under XLA, `jit_compile=True`, which drops it).
        """
        where = "LinearFeatureBaseline.solve"
        f = self.features(observations, mask)
        y = checks.like(returns, "returns", where, f[..., 0], "observations[..., 0]", rank=2)
        f = tf.stop_gradient(tf.reshape(f, [-1, f.shape[-1]]))
        y = tf.reshape(tf.stop_gradient(_masked(y, mask)), [-1, 1])
        gram = tf.matmul(f, f, transpose_a=True)
        moment = tf.matmul(f, y, transpose_a=True)[:, 0]
        usable = tf.reduce_all(tf.math.is_finite(gram)) & tf.reduce_all(
            tf.math.is_finite(moment))  # eigh fails on a NaN: decompose zeros instead
        eigenvalues, vectors = tf.linalg.eigh(tf.where(usable, gram, tf.zeros_like(gram)))
        projected = tf.linalg.matvec(vectors, moment, transpose_a=True)
        chosen, found = tf.fill(tf.shape(moment), tf.constant(float("nan"), f.dtype)), False
        for k in reversed(range(5)):  # the smallest regularization that works wins
            shifted = eigenvalues + tf.constant(self.reg_coeff * 10.0 ** k, f.dtype)
            x = tf.linalg.matvec(vectors, projected / shifted)
            ok = usable & tf.reduce_all(shifted > 0) & tf.reduce_all(tf.math.is_finite(x))
            chosen = tf.where(ok, x, chosen)
            found = ok | found
        checks.require(found, f"{where}: no ridge regularization from {self.reg_coeff} to "
                         f"{self.reg_coeff * 1e4} gives a finite fit; are the observations "
                         "or returns finite?")
        return chosen

    def fit(self, observations: TensorLike, returns: TensorLike,
            mask: Optional[TensorLike] = None) -> tf.Tensor:
        """Fits the coefficients to `returns` and stores them (see `solve`).

        Args:
          observations: `[batch, T, observation_dim]` observations.
          returns: `[batch, T]` targets, the same dtype.
          mask: optional `[batch, T]` mask; masked steps are left out of the fit.

        Returns:
          The `[2 observation_dim + 4]` coefficients stored.
        """
        coefficients = self.solve(observations, returns, mask)
        self.coefficients.assign(coefficients)
        return coefficients

    def predict(self, observations: TensorLike, mask: Optional[TensorLike] = None,
                coefficients: Optional[Tensor] = None) -> tf.Tensor:
        """The baseline's values ``V(s_t)``, 0 where masked.

        Args:
          observations: `[batch, T, observation_dim]` observations.
          mask: optional `[batch, T]` mask.
          coefficients: `[2 observation_dim + 4]` coefficients (from `solve`); None: the
            stored ones (from `fit`, zeros before the first).

        Returns:
          A `[batch, T]` tensor of the baseline's dtype.
        """
        f = self.features(observations, mask)
        c = self.coefficients if coefficients is None else coefficients
        c = tf.convert_to_tensor(c)
        if c.dtype != f.dtype or not c.shape.is_compatible_with([f.shape[-1]]):
            raise checks.ArgumentError(
                f"LinearFeatureBaseline.predict: coefficients must be {f.dtype.name}"
                f"[{f.shape[-1]}], got {checks.describe(c)}")
        return tf.linalg.matvec(f, c)
