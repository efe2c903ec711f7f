"""The inner problem a meta-gradient estimator unrolls, and its checks.

An inner problem is three pure functions of one particle (and an optional fourth):

- ``init(seed) -> state``: the inner state at step 0 (a nest of tensors: parameters, an
  optimizer's state, a step count, ...), from a ``[2]`` int64 stateless seed;
- ``step(state, theta, batch) -> state``: one inner step under the meta-parameters
  `theta`; the new state has the structure, shapes and dtypes of the old one;
- ``objective(state, batch) -> scalar``: the inner loss at `state`;
- ``batch(seed, t) -> batch``: the data of inner step `t` (counted from 0 after each
  reset) for a particle whose data seed is `seed`; None: every batch is ``()``.

A truncation of K steps from state s_0 runs ``s_{k+1} = step(s_k, theta, b_k)`` and its
meta-objective is ``mean_k objective(s_{k+1}, b_k)`` (`meta_objective="sum"`: the sum
over the steps, divided by K so that a rate does not depend on K) or
``objective(s_K, b_{K-1})`` (`"last"`: the loss at the end of the truncation, the PES
paper's influence balancing).
"""

from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf

from hogrod import checks
from hogrod.types import Tree

__all__ = ["InnerProblem", "META_OBJECTIVES", "check_problem", "check_state", "check_step"]

#: How a truncation's meta-objective is read from its steps' inner objectives.
META_OBJECTIVES = ("sum", "last")


class InnerProblem(NamedTuple):
    """An inner problem, as the module docstring describes.

    Attributes:
        init: ``init(seed) -> state``, a nest of tensors for ONE particle; `seed` a ``[2]``
            int64 stateless seed (a new one for each episode of each particle).
        step: ``step(state, theta, batch) -> state`` of the same structure, shapes and
            dtypes (anything else is an error naming the problem's step).
        objective: ``objective(state, batch) -> scalar``, the inner loss at `state`.
        batch: ``batch(seed, t) -> batch`` for inner step `t` of a particle whose data seed
            is `seed`, or None (default): the batch is ``()``.
        meta_objective: a truncation's meta-loss, one of `META_OBJECTIVES`: ``"sum"``
            (default; the mean of the inner objectives after each of its steps) or
            ``"last"`` (the inner objective after its last step).
    """

    init: Callable[[tf.Tensor], Tree]
    step: Callable[[Tree, Tree, Any], Tree]
    objective: Callable[[Tree, Any], tf.Tensor]
    batch: Optional[Callable[[tf.Tensor, tf.Tensor], Any]] = None
    meta_objective: str = "sum"


def check_problem(problem: Any, where: str) -> InnerProblem:
    """An `InnerProblem` checked: its functions callable, its meta-objective known.

    Args:
        problem: the value given as the problem.
        where: the public function checked, first in the message.

    Returns:
        `problem`, unchanged.

    Raises:
        ArgumentError: `problem` is not an `InnerProblem`, a function is not callable, or
            `meta_objective` is not one of `META_OBJECTIVES`.
    """
    if not isinstance(problem, InnerProblem):
        raise checks.ArgumentError(
            f"{where}: problem must be a hogrod.learned.InnerProblem(init, step, objective, "
            f"batch=None, meta_objective='sum'), got {type(problem).__name__}")
    checks.function(problem.init, "problem.init", where, "init(seed) -> state")
    checks.function(problem.step, "problem.step", where, "step(state, theta, batch) -> state")
    checks.function(problem.objective, "problem.objective", where,
                    "objective(state, batch) -> scalar")
    if problem.batch is not None:
        checks.function(problem.batch, "problem.batch", where, "batch(seed, t) -> batch")
    checks.choice(problem.meta_objective, META_OBJECTIVES, "problem.meta_objective", where)
    return problem


def check_state(state: Tree, name: str, where: str) -> Tree:
    """An inner state checked: a non-empty nest whose every leaf is a tensor (or array).

    Args:
        state: the nest, e.g. what ``problem.init(seed)`` returned.
        name: what returned it, in the message (``"problem.init(seed)"``).
        where: the public function checked, first in the message.

    Returns:
        `state` with every leaf converted to a tensor.

    Raises:
        ArgumentError: the nest is empty or a leaf is not a tensor (a Python number has
            no dtype to keep).
    """
    flat = tf.nest.flatten(state)
    if not flat:
        raise checks.ArgumentError(f"{where}: {name} is empty; an inner state holds at least "
                                   "one tensor")
    for i, leaf in enumerate(flat):
        if not hasattr(leaf, "dtype") or not hasattr(leaf, "shape"):
            raise checks.ArgumentError(
                f"{where}: {name} leaf {i} is a {type(leaf).__name__}; every leaf of an "
                "inner state must be a tensor (tf.constant(x, dtype))")
    return tf.nest.map_structure(tf.convert_to_tensor, state)


def check_step(before: Tree, after: Tree, where: str) -> Tree:
    """The state `problem.step` returned, checked against the state it was given.

    A state whose structure, shapes or dtypes change between steps cannot be carried by a
    compiled loop (nor stacked over particles), so the change is named here, when the step
    is traced, rather than as TensorFlow's loop-variable error.

    Args:
        before: the state given to the step.
        after: the state it returned.
        where: the public function that unrolls the problem, first in the message.

    Returns:
        `after` with its leaves as tensors, in the structure of `before`.

    Raises:
        ArgumentError: the structures, a leaf's shape or a leaf's dtype differ.
    """
    try:
        tf.nest.assert_same_structure(before, after, check_types=False)
    except (ValueError, TypeError) as e:
        raise checks.ArgumentError(
            f"{where}: problem.step returned a state of another structure than the one it "
            f"was given ({checks.describe(before)} -> {checks.describe(after)}): {e}; the "
            "step must keep the state's structure, shapes and dtypes") from None
    after = check_state(after, "problem.step(state, theta, batch)", where)
    for i, (old, new) in enumerate(zip(tf.nest.flatten(before), tf.nest.flatten(after))):
        shape, dtype = tf.TensorShape(old.shape), tf.as_dtype(old.dtype)
        if new.dtype != dtype or new.shape.rank != shape.rank \
                or not new.shape.is_compatible_with(shape):
            raise checks.ArgumentError(
                f"{where}: problem.step changed leaf {i} of the state from "
                f"{dtype.name}{shape.as_list()} to {new.dtype.name}{new.shape.as_list()}; "
                "the step must keep the state's structure, shapes and dtypes")
    return tf.nest.pack_sequence_as(before, tf.nest.flatten(after))  # a list for a tuple: kept
