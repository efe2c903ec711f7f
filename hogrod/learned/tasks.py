"""Task families for meta-training learned optimizers, and the inner problem of one task.

A `TaskFamily` draws a task (its starting weights and what defines its data) from a task
seed; `digits_mlp(...)` is learned_optimization's fixed image-MLP task made a family: a
small ReLU MLP (64-32-`classes`) classifying sklearn's 8x8 digits (`load_digits`, shipped
with scikit-learn: offline) on a random subset of `classes` of the ten digits, from random
starting weights. `optimizer_problem(learned, family)` is the `InnerProblem` of training
one task with ``learned.optimizer(theta)``: its state is a `TaskState` (the task's params,
the optimizer's state, the task), its step one update on the step's batch. A batch only
says which of the task's examples a step sees (for the digits, a label and an example
index per row), so the task itself (class subset and weights) is a function of the seed
given to ``init`` alone, whatever seed the unroll gives ``batch``.

Training and held-out tasks: a particle's stateless seed ``[a, b]`` becomes the task seed
``task_seed(seed, split) = [a, 2 b + s]`` (s = 0 for "train", 1 for "heldout", in int64
arithmetic: wrapping keeps the parity), and every random draw of a task is a function of
its task seed only. Training task seeds are even in their second entry, held-out ones
odd: no held-out task shares its seed with any task a meta-training run can draw,
whatever seeds the estimator gives its particles.
"""

import math
from typing import Callable, List, NamedTuple, Sequence, Union

import gin
import numpy as np
import tensorflow as tf

from hogrod import checks, optim, taskmap
from hogrod.learned import base
from hogrod.learned.problem import InnerProblem
from hogrod.types import DType, Seed, Tree

__all__ = ["SPLITS", "TaskFamily", "TaskState", "task_seed", "digits_mlp",
           "optimizer_problem", "training_curves"]

SPLITS = ("train", "heldout")
_SUBSET, _BATCH = 0, 1  # fold-in tags of a task seed's draws (the weights use 2, 3, ...)


class TaskFamily(NamedTuple):
    """A family of training tasks, every draw a function of a seed.

    Attributes:
        name: the family's name (with its settings).
        init: ``init(task_seed) -> (params, task)``: the task's starting weights (a list of
            tensors) and the task (a nest of tensors: for the digits, its class subset).
        loss: ``loss(params, task, batch) -> scalar``, the training loss (a mean over the
            batch).
        batch: ``batch(seed, t) -> batch``, which examples training step t sees.
        data: ``data(task) -> batch``, every example of the task (for evaluation).
        examples: ``examples(task, batch) -> (x, y)``, a batch's inputs and labels.
    """

    name: str
    init: Callable
    loss: Callable
    batch: Callable
    data: Callable
    examples: Callable


class TaskState(NamedTuple):
    """The state of one particle of `optimizer_problem`.

    Attributes:
        params: the task's weights, a list of tensors.
        opt_state: the learned optimizer's state.
        task: the task, as the family's ``init`` returns it.
    """

    params: List[tf.Tensor]
    opt_state: Tree
    task: Tree


def task_seed(seed: Seed, split: str) -> tf.Tensor:
    """The task seed of a particle's seed in `split` (the module docstring says why the
    splits never share one).

    Args:
        seed: an int >= 0 or a ``[2]`` integer stateless seed.
        split: "train" or "heldout".

    Returns:
        ``[a, 2 b + s]``, a ``[2]`` int64 tensor (s = 0 for "train", 1 for "heldout").

    Raises:
        ArgumentError: `seed` or `split` is not one of those.
    """
    s = SPLITS.index(checks.choice(split, SPLITS, "split", "hogrod.learned.task_seed"))
    seed = checks.stateless_seed(seed, "seed", "hogrod.learned.task_seed")
    return tf.stack([seed[0], 2 * seed[1] + s])


def _digits(dtype):
    """The 8x8 digits in [0, 1] at `dtype` and a [10, n] table of each class's first n
    example indices (n the smallest class's size)."""
    from sklearn.datasets import load_digits  # imported here: only this family needs it
    digits = load_digits()
    x, y = digits.data / 16.0, digits.target
    per_class = [np.flatnonzero(y == c) for c in range(10)]
    n = min(len(i) for i in per_class)
    table = np.stack([i[:n] for i in per_class]).astype(np.int32)
    return tf.constant(x, dtype), tf.constant(table)


def _cross_entropy(params, x, y):
    h = x
    for i in range(0, len(params), 2):
        h = tf.matmul(h, params[i]) + params[i + 1]
        if i + 2 < len(params):
            h = tf.nn.relu(h)
    # written out, not the fused sparse cross-entropy, whose gradient has no gradient
    picked = tf.reduce_sum(tf.one_hot(y, tf.shape(h)[-1], dtype=h.dtype) * h, axis=-1)
    return tf.reduce_mean(tf.reduce_logsumexp(h, axis=-1) - picked)


def _sizes(where, classes, hidden_sizes, batch_size):
    classes = checks.integer(classes, "classes", where, least=2, most=10)
    if isinstance(hidden_sizes, (str, bytes)) or not hasattr(hidden_sizes, "__iter__"):
        raise checks.ArgumentError(f"{where}: hidden_sizes must be a sequence of ints >= 1, "
                                   f"got {hidden_sizes!r}")
    hidden = [checks.integer(h, f"hidden_sizes[{i}]", where, least=1)
              for i, h in enumerate(hidden_sizes)]
    return [64] + hidden + [classes], checks.integer(batch_size, "batch_size", where, least=1)


@gin.configurable(module="hogrod.learned")
def digits_mlp(classes: int = 5, hidden_sizes: Sequence[int] = (32,), batch_size: int = 32,
               dtype: DType = "float32") -> TaskFamily:
    """Small ReLU MLPs on random class subsets of sklearn's 8x8 digits.

    A task seed draws the task, `classes` distinct digits in a random order (label i is
    digit ``task[i]``), and the weights: each kernel from a normal of deviation
    1/sqrt(fan_in) truncated at two deviations, biases 0. A batch is `batch_size` rows of
    (label, position), each uniform: the row's example is example number `position` of
    digit ``task[label]`` (among each digit's first n = 174, the smallest class's size).
    The loss is the softmax cross-entropy. Images are scaled to [0, 1] (exact in any
    floating dtype).

    Args:
        classes: the classes per task, an int in [2, 10]; default 5.
        hidden_sizes: the hidden layers' widths, each an int >= 1 (may be empty: a linear
            classifier); default (32,): a 64-32-`classes` MLP.
        batch_size: the examples per step, an int >= 1; default 32.
        dtype: the weights' and images' dtype; default "float32".

    Returns:
        The `TaskFamily`; params are ``[kernel_0, bias_0, kernel_1, bias_1, ...]``, the
        task an int32 ``[classes]`` tensor of digits.

    Raises:
        ArgumentError: a setting is out of range (named).
    """
    where = "hogrod.learned.digits_mlp"
    sizes, batch_size = _sizes(where, classes, hidden_sizes, batch_size)
    classes = sizes[-1]
    dtype = base.float_dtype(dtype, where)
    images, table = _digits(dtype)
    per_class = int(table.shape[1])

    def init(seed):
        key = tf.random.experimental.stateless_fold_in(seed, _SUBSET)
        task = tf.math.top_k(tf.random.stateless_uniform([10], key), classes).indices
        params = []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            key = tf.random.experimental.stateless_fold_in(seed, 2 + i)
            params += [tf.random.stateless_truncated_normal(
                [n_in, n_out], key, stddev=tf.constant(1 / math.sqrt(n_in), dtype),
                dtype=dtype), tf.zeros([n_out], dtype)]
        return params, task

    def batch(seed, t):
        key = tf.random.experimental.stateless_fold_in(
            tf.random.experimental.stateless_fold_in(seed, _BATCH), tf.cast(t, tf.int64))
        keys = tf.random.experimental.stateless_split(key, 2)
        return (tf.random.stateless_uniform([batch_size], keys[0], 0, classes, tf.int32),
                tf.random.stateless_uniform([batch_size], keys[1], 0, per_class, tf.int32))

    def data(task):
        del task  # every task has the same positions: each label's n examples
        return (tf.repeat(tf.range(classes), per_class),
                tf.tile(tf.range(per_class), [classes]))

    def examples(task, batch):
        label, position = batch
        rows = tf.gather_nd(tf.gather(table, task), tf.stack([label, position], axis=1))
        return tf.gather(images, rows), label

    def loss(params, task, batch):
        return _cross_entropy(params, *examples(task, batch))

    name = f"digits_mlp({'-'.join(map(str, sizes))}, batch_size={batch_size})"
    return TaskFamily(name, init, loss, batch, data, examples)


def _check_family(family, where):
    if not isinstance(family, TaskFamily):
        raise checks.ArgumentError(f"{where}: family must be a TaskFamily (digits_mlp(...)), "
                                   f"got {type(family).__name__}")


def _gradient(loss, params):
    with tf.GradientTape() as tape:
        tape.watch(params)
        value = loss(params)
    return tape.gradient(value, params, unconnected_gradients=tf.UnconnectedGradients.ZERO)


@gin.configurable(module="hogrod.learned")
def optimizer_problem(learned: base.LearnedOptimizer, family: TaskFamily,
                      split: str = "train", meta_objective: str = "sum") -> InnerProblem:
    """The inner problem of training a task of `family` with ``learned.optimizer(theta)``.

    ``init(seed)`` draws the task of ``task_seed(seed, split)`` and starts the optimizer's
    state; ``step(state, theta, batch)`` takes one update on the loss's gradient at
    `batch`; ``objective(state, batch)`` is the loss; ``batch(seed, t)`` draws which
    examples step t sees from ``task_seed(seed, split)`` (any seed: the task is in the
    state).

    Args:
        learned: a `LearnedOptimizer` (`mlp_optimizer(...)`, `learned_schedule(...)`).
        family: a `TaskFamily` (`digits_mlp(...)`).
        split: "train" (default) or "heldout": which task seeds the particles draw.
        meta_objective: "sum" (default: a truncation's mean loss over its steps) or
            "last".

    Returns:
        The `InnerProblem`; its state is a `TaskState`.

    Raises:
        ArgumentError: an argument is not one of those.
    """
    where = "hogrod.learned.optimizer_problem"
    if not isinstance(learned, base.LearnedOptimizer):
        raise checks.ArgumentError(f"{where}: learned must be a LearnedOptimizer "
                                   f"(mlp_optimizer(...), learned_schedule(...)), got "
                                   f"{type(learned).__name__}")
    _check_family(family, where)
    checks.choice(split, SPLITS, "split", where)
    checks.choice(meta_objective, ("sum", "last"), "meta_objective", where)

    def init(seed):
        params, task = family.init(task_seed(seed, split))
        return TaskState(params, learned.init_state(params), task)

    def step(state, theta, batch):
        params = list(state.params)
        grads = _gradient(lambda p: family.loss(p, state.task, batch), params)
        params, opt_state = learned.optimizer(theta).update(grads, state.opt_state, params)
        return TaskState(list(params), opt_state, state.task)

    def objective(state, batch):
        return family.loss(list(state.params), state.task, batch)

    def batch(seed, t):
        return family.batch(task_seed(seed, split), t)

    return InnerProblem(init, step, objective, batch, meta_objective)


def _as_seeds(seeds, where):
    if isinstance(seeds, (tf.Tensor, tf.Variable, np.ndarray)):
        s = tf.convert_to_tensor(seeds)
        if not s.dtype.is_integer or s.shape.rank != 2 or s.shape[1] != 2:
            raise checks.ArgumentError(f"{where}: seeds must be a [tasks, 2] integer tensor or "
                                       f"a sequence of ints >= 0, got {checks.describe(s)}")
        if s.shape[0] is None:
            raise checks.ArgumentError(f"{where}: seeds must have a static number of rows, "
                                       f"got {checks.describe(s)}")
        return tf.cast(s, tf.int64)
    seeds = checks.counts(seeds, "seeds", where)
    return tf.constant([[s, 0] for s in seeds], tf.int64)


def training_curves(optimizer: optim.Optimizer, family: TaskFamily,
                    seeds: Union[Sequence[int], tf.Tensor], steps: int,
                    split: str = "heldout", mode: str = "vectorized") -> tf.Tensor:
    """Each task's loss on all its examples after 0, 1, ..., `steps` updates of `optimizer`.

    Task i and its batches are those `optimizer_problem` draws from ``seeds[i]`` and
    `split` (its seed given to both ``init`` and ``batch``), so a learned optimizer and a
    baseline (`hogrod.optim.adam(lr)`) meet the same tasks and batches. One compiled
    `tf.while_loop` over the steps (traced once per call), each step mapped over the tasks
    by `hogrod.taskmap.map_tasks`, the tasks' random draws taken one task at a time
    outside the map.

    Args:
        optimizer: a `hogrod.optim` optimizer (``learned.optimizer(theta)``, ``adam(lr)``).
        family: a `TaskFamily`.
        seeds: the tasks' seeds, a sequence of ints >= 0 or a ``[tasks, 2]`` integer
            tensor (a static number of tasks).
        steps: the updates, an int >= 0.
        split: "heldout" (default) or "train".
        mode: how the tasks are mapped, one of `hogrod.taskmap.MODES`; default
            "vectorized".

    Returns:
        A ``[tasks, steps + 1]`` tensor of the params' dtype.

    Raises:
        ArgumentError: an argument is out of range (named).
    """
    where = "hogrod.learned.training_curves"
    if not isinstance(optimizer, optim.Optimizer):
        raise checks.ArgumentError(f"{where}: optimizer must be a hogrod.optim optimizer, "
                                   f"got {type(optimizer).__name__}")
    _check_family(family, where)
    steps = checks.integer(steps, "steps", where)
    checks.choice(split, SPLITS, "split", where)
    taskmap.check_task_map(mode, where)
    seeds = _as_seeds(seeds, where)

    keys = [task_seed(seeds[i], split) for i in range(seeds.shape[0])]

    def stacked(draw):
        # the random draws task by task, outside the map: a per-task seed would make pfor
        # loop over the tasks inside every vectorized step
        return tf.nest.map_structure(lambda *x: tf.stack(x), *[draw(k) for k in keys])

    def start(elem, _, __):
        params, task = list(elem[0]), elem[1]
        return optimizer.init(params), family.loss(params, task, family.data(task))

    def advance(elem, _, __):
        params, state, task, batch = elem
        grads = _gradient(lambda p: family.loss(p, task, batch), list(params))
        params, state = optimizer.update(grads, state, list(params))
        return list(params), state, family.loss(list(params), task, family.data(task))

    @tf.function  # compiled once per call (eagerly, every step would map anew)
    def curves():
        params, tasks = stacked(family.init)
        state, first = taskmap.map_tasks(start, (params, tasks), mode=mode)
        positions = tf.range(steps + 1, dtype=tf.int64)[None, :]
        losses = tf.where(positions == 0, first[:, None], tf.zeros_like(positions, first.dtype))

        def body(t, params, state, losses):
            batches = stacked(lambda k: family.batch(k, t))
            params, state, loss = taskmap.map_tasks(advance, (params, state, tasks, batches),
                                                    mode=mode)
            # written in place (a diverged step leaves the earlier entries finite)
            return t + 1, params, state, tf.where(positions == t + 1, loss[:, None], losses)

        return tf.while_loop(lambda t, *_: t < steps, body,
                             (tf.constant(0, tf.int64), params, state, losses))[-1]

    return curves()
