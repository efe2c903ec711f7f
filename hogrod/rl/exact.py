"""The exact expected return of a tabular softmax policy on a small finite-horizon MDP: the
oracle the estimators are tested against.

``J(theta) = sum_{t<T} discount**t E[r(s_t, a_t)]`` with ``s_0 ~ initial``,
``a_t ~ softmax(theta[s_t])`` and ``s_{t+1} ~ transitions[s_t, a_t]``, computed by
propagating the state distribution forward (dynamic programming) in TensorFlow, so its
derivatives of every order in `theta` come from nested tapes.
"""

import tensorflow as tf

from hogrod import checks
from hogrod.types import TensorLike

__all__ = ["expected_return"]


def expected_return(logits: TensorLike, transitions: TensorLike, rewards: TensorLike,
                    initial: TensorLike, discount: float, horizon: int) -> tf.Tensor:
    """The expected discounted return of the policy ``softmax(logits[s])`` over `horizon`
    steps, exactly.

    Args:
      logits: `[S, A]` floating policy logits (differentiable).
      transitions: `[S, A, S]` probabilities of the next state, `logits`' dtype (each row
        sums to 1; not checked numerically).
      rewards: `[S, A]` expected rewards ``r(s, a)``, `logits`' dtype.
      initial: `[S]` initial state distribution, `logits`' dtype.
      discount: the discount, a Python number in (0, 1].
      horizon: the number of steps T, an int >= 1.

    Returns:
      A scalar of `logits`' dtype.

    Raises:
      ArgumentError: shapes or dtypes that do not match, `discount` not in (0, 1] or
        `horizon` not a positive int.
    """
    where = "expected_return"
    theta = checks.floating(logits, "logits", where)
    if theta.shape.rank != 2:
        raise checks.ArgumentError(f"{where}: logits must be [S, A], got "
                                   f"{theta.shape.as_list()}")
    n_s, n_a = theta.shape
    p = checks.floating(transitions, "transitions", where)
    r = checks.like(rewards, "rewards", where, theta, "logits")
    mu = checks.floating(initial, "initial", where)
    for name, t, shape in (("transitions", p, [n_s, n_a, n_s]), ("initial", mu, [n_s])):
        if t.dtype != theta.dtype or t.shape.as_list() != shape:
            raise checks.ArgumentError(f"{where}: {name} must be {theta.dtype.name}{shape}, "
                                       f"got {checks.describe(t)}")
    discount = checks.number(discount, "discount", where, 0.0, 1.0, low_open=True)
    horizon = checks.integer(horizon, "horizon", where, 1)
    pi = tf.nn.softmax(theta)
    step_reward = tf.reduce_sum(pi * r, axis=1)  # [S]
    step_transition = tf.einsum("sa,sax->sx", pi, p)  # [S, S]
    total, weight, d = tf.zeros([], theta.dtype), tf.constant(1.0, theta.dtype), mu
    gamma = tf.constant(discount, theta.dtype)
    for _ in range(horizon):
        total += weight * tf.tensordot(d, step_reward, 1)
        d = tf.linalg.matvec(step_transition, d, transpose_a=True)
        weight *= gamma
    return total
