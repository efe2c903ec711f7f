"""Train one task with one optimizer on a wall-time budget: the second-order comparison.

The optimizer is a gin reference to a factory; the binary calls it with `model=`, `loss=`
and `l2_reg=` only where its signature names them (`hogrod.second_order.kfac` and
`hessian_free` take the model and its Keras loss; `adahessian`, Keras's Adam or SGD take
neither), then trains with `hogrod.train.make_train_step`, which hands a step optimizer each
step's objective and batch:

    python -m experiments.second_order --gin_file=second_order/autoencoder_adam.gin
    python -m experiments.second_order --gin_file=second_order/autoencoder_kfac.gin \
        --gin_param='second_order_experiment.seed = 1' --output_dir=runs/ae_kfac_1

Tasks (`second_order_experiment.task`):
- `@autoencoder_task`: Hinton and Salakhutdinov's deep autoencoder
  (`hogrod.models.deep_autoencoder`) on Omniglot's 28x28 drawings flattened to 784, pixels
  in [0, 1] (strokes 1), trained on the background alphabets, a held-out loss on the
  evaluation alphabets. The objective is Keras's `BinaryCrossentropy(from_logits=True)`,
  a mean over pixels and examples (the loss the optimizers are given), plus
  `l2_reg / 2 ||theta||^2`; `train_loss` reports the K-FAC paper's loss, the sum over
  pixels (784 times the mean), mean over the batch. The paper's constants in the
  objective's convention are divided by 784 (L2 1e-5, initial damping 150; the configs do it).
- `@classifier_task`: conv4 (`hogrod.models.conv4`) on the background alphabets' characters
  as one classification (964 ways), each character's first 15 drawings for training, the
  other 5 for the test accuracy.

Every optimizer sees the same initialization (`keras.utils.set_random_seed(seed)` before the
model is built) and the same batches: batch i is a slice of a permutation of the training
set drawn from (seed, epoch), so a resumed run draws the batches an uninterrupted one draws.
Training stops at `max_steps` or once the training clock passes `wall_seconds`: the clock
counts the steps, not the evaluations, checkpoints and plots, nor the first step of each
invocation (its tracing; a resumed run traces again).

Outputs: metrics.json (`train_loss` and `train_wall_seconds` per step, the training clock at
the end of each step; harness's `wall_seconds` is the invocation's time), eval_history.json
(held-out metrics every `eval_every` steps or `eval_every_seconds` of training), TensorBoard
events (`train/`, `eval/`), checkpoints with the training clock (a re-run with the same
--output_dir resumes the steps and the clock), curves.png. Overlay several runs with
`python -m experiments.plot_second_order`; `python -m experiments.second_order_grid` runs
the first-order rate grids.
"""

import contextlib
import inspect
import json
import math
import os
from typing import Any, Callable, NamedTuple

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import distribute, harness, meta, second_order, train  # noqa: F401 (factories)
from hogrod.curvature import data as curvature_data
from hogrod.models import conv4, deep_autoencoder
from hogrod.pinn import training as pinn_training

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CURVE = "train_curve.json"


class Task(NamedTuple):
    """What a task function (`second_order_experiment.task`) returns.

    Attributes:
      name: the task's name.
      model: the Keras model, built (the caller seeds Keras and enters the strategy scope).
      loss: the Keras loss the objective and the optimizers use, a mean over the batch.
      train: (images uint8 [n, ...], labels [n]) of the training set.
      test: (images, labels) of the held-out set.
      prepare: `prepare(images, labels) -> (x, y)`, a batch as the model and loss take it.
      term: the objective's name for the loss term.
      scale: `train_loss` is `scale` times the loss term (784 for the sum over pixels).
      evaluate: `evaluate(model, x, y) -> {name: float}` on a prepared held-out batch
        (summed over batches with weights; every value a mean over examples).
    """

    name: str
    model: keras.Model
    loss: keras.losses.Loss
    train: tuple
    test: tuple
    prepare: Callable
    term: str
    scale: float
    evaluate: Callable


def _omniglot(data_dir, cache_dir, image_size, alphabets, where):
    return meta.omniglot_characters(data_dir, image_size, alphabets, cache_dir,
                                    binding=f"{where}.data_dir")


@gin.configurable
def autoencoder_task(data_dir: str | None = None, cache_dir: str | None = None,
                     image_size: harness.PositiveInt = 28) -> Task:
    """The deep autoencoder on Omniglot's drawings (widths: `deep_autoencoder.widths`)."""
    train_chars = _omniglot(data_dir, cache_dir, image_size, "background", "autoencoder_task")
    test_chars = _omniglot(data_dir, cache_dir, image_size, "evaluation", "autoencoder_task")
    pixels = image_size * image_size
    model = deep_autoencoder(inputs=pixels)
    loss = keras.losses.BinaryCrossentropy(from_logits=True)

    def prepare(images, labels):
        x = tf.reshape(tf.cast(images, tf.float32) / 255.0, [-1, pixels])
        return x, x

    def evaluate(model, x, y):
        z = model(x, training=False)
        per_pixel = tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z)
        return {"test_loss": tf.reduce_mean(tf.reduce_sum(per_pixel, -1))}

    as_set = lambda chars: (np.concatenate(chars), np.zeros(sum(map(len, chars)), np.int32))  # noqa: E731
    return Task("autoencoder", model, loss, as_set(train_chars), as_set(test_chars), prepare,
                "bce", float(pixels), evaluate)


@gin.configurable
def classifier_task(data_dir: str | None = None, cache_dir: str | None = None,
                    image_size: harness.PositiveInt = 28,
                    train_per_class: harness.PositiveInt = 15,
                    statistics_size: harness.PositiveInt = 4096) -> Task:
    """conv4 on the background characters, one class each (filters: `conv4.filters`);
    BatchNorm's statistics re-estimated on `statistics_size` training images before each
    evaluation."""
    chars = _omniglot(data_dir, cache_dir, image_size, "background", "classifier_task")
    if min(map(len, chars)) <= train_per_class:
        raise ValueError(f"classifier_task.train_per_class = {train_per_class} leaves no test "
                         f"drawing: the smallest character has {min(map(len, chars))}")
    model = conv4(image_size=image_size, channels=1, n_way=len(chars))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def split(part):
        images = [c[:train_per_class] if part == "train" else c[train_per_class:] for c in chars]
        labels = [np.full(len(c), i, np.int32) for i, c in enumerate(images)]
        return np.concatenate(images), np.concatenate(labels)

    def prepare(images, labels):
        return tf.cast(images, tf.float32)[..., None] / 255.0, labels

    # BatchNorm's moving averages (momentum 0.99) lag the weights by about a hundred steps,
    # and K-FAC takes a hundred steps in all: every evaluation re-estimates the statistics
    # from a fixed sample of training images (precise BatchNorm), so that both optimizers
    # are scored on the statistics of their current weights.
    pick = np.random.default_rng(0).permutation(len(chars) * train_per_class)[:statistics_size]
    statistics_x, _ = prepare(*(part[pick] for part in split("train")))
    norms = [layer for layer in model.layers
             if isinstance(layer, keras.layers.BatchNormalization)]

    def evaluate(model, x, y):
        z = _with_statistics(model, norms, statistics_x, x)
        hits = tf.cast(tf.argmax(z, -1, output_type=tf.int32) == y, tf.float32)
        return {"test_accuracy": tf.reduce_mean(hits),
                "test_loss": tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, z))}

    return Task("classifier", model, loss, split("train"), split("test"), prepare, "ce", 1.0,
                evaluate)


def _with_statistics(model, norms, statistics_x, x):
    """The model's inference output on `x` with every BatchNorm's statistics those of
    `statistics_x` in a training-mode pass (momentum 0 in a stateless scope: no write)."""
    momenta = [layer.momentum for layer in norms]
    try:
        for layer in norms:
            layer.momentum = 0.0
        with keras.StatelessScope() as scope:
            model(statistics_x, training=True)
    finally:
        for layer, momentum in zip(norms, momenta):
            layer.momentum = momentum
    mapping = [(v, scope.get_current_value(v)) for layer in norms
               for v in (layer.moving_mean, layer.moving_variance)]
    with keras.StatelessScope(state_mapping=mapping):
        return model(x, training=False)


def batches(images, labels, prepare, batch_size, seed, start):
    """Batch i (from `start` on) is slice i mod n/b of the permutation of epoch i div n/b,
    drawn from (seed, epoch): the schedule every optimizer and every resumed run sees."""
    n = len(images)
    per_epoch = n // batch_size
    if per_epoch < 1:
        raise ValueError(f"second_order_experiment.batch_size = {batch_size} is more than the "
                         f"{n} training examples")
    images, labels = tf.constant(images), tf.constant(labels)

    def batch(i):
        epoch, j = i // per_epoch, i % per_epoch
        order = tf.argsort(tf.random.stateless_uniform(
            [n], tf.stack([tf.constant(seed, tf.int64), epoch])))
        idx = order[j * batch_size:(j + 1) * batch_size]
        return prepare(tf.gather(images, idx), tf.gather(labels, idx))

    return tf.data.Dataset.range(start, 2**62).map(batch).prefetch(2)


def make_optimizer(factory, model, loss, l2_reg):
    """`factory(**kwargs)` with the model, the loss and the L2 coefficient it names."""
    if not callable(factory):
        raise TypeError("second_order_experiment.optimizer must be a reference to an optimizer "
                        f"factory (@kfac, @keras.optimizers.Adam), got {factory!r}")
    try:
        names = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        names = {}
    given = {"model": model, "loss": loss, "l2_reg": l2_reg}
    opt = factory(**{k: v for k, v in given.items() if k in names})
    if not isinstance(opt, (keras.optimizers.Optimizer, train.StepOptimizer)):
        raise TypeError(f"second_order_experiment.optimizer = {_name(factory)} made a "
                        f"{type(opt).__name__}, not a Keras optimizer nor a "
                        "hogrod.train.StepOptimizer")
    return opt


def _name(factory):
    return getattr(factory, "__name__", type(factory).__name__)


class Curve:
    """The training loss and clock of every step, kept beside the checkpoints (CURVE):
    saved before each checkpoint, read back up to the step a resumed run starts from."""

    def __init__(self, output_dir, upto_step):
        self.path = os.path.join(output_dir, CURVE)
        self.train_loss, self.seconds = [], []
        if upto_step:
            if not os.path.exists(self.path):
                raise ValueError(f"{output_dir} holds a checkpoint at step {upto_step} but no "
                                 f"{CURVE}; use a new --output_dir")
            with open(self.path) as f:
                saved = json.load(f)
            if len(saved["train_loss"]) < upto_step:
                raise ValueError(f"{self.path} lists {len(saved['train_loss'])} steps, fewer "
                                 f"than the checkpoint's {upto_step}; use a new --output_dir")
            self.train_loss = saved["train_loss"][:upto_step]
            self.seconds = saved["train_wall_seconds"][:upto_step]

    def save(self):
        train.write_json(self.path, {"train_loss": self.train_loss,
                                     "train_wall_seconds": self.seconds})


def plot_run(path, curve, history, task):
    metric = "test_accuracy" if task == "classifier" else "test_loss"
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    steps = np.arange(1, len(curve.train_loss) + 1)
    for ax, x, label in ((axes[0], steps, "step"), (axes[1], curve.seconds, "training seconds")):
        ax.plot(x, curve.train_loss, lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("train loss (batch)")
        ax.set_yscale("log" if task == "autoencoder" else "linear")
    points = [(h["seconds"], h[metric]) for h in history if metric in h]
    if points:
        axes[2].plot(*zip(*points), "o-")
    axes[2].set_xlabel("training seconds")
    axes[2].set_ylabel(metric)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _evaluator(task, eval_batch_size):
    x, y = task.prepare(*task.test)
    n = int(x.shape[0])
    step = tf.function(lambda xb, yb: task.evaluate(task.model, xb, yb))

    def evaluate():
        totals = {}
        for i in range(0, n, eval_batch_size):
            part = step(x[i:i + eval_batch_size], y[i:i + eval_batch_size])
            weight = min(eval_batch_size, n - i) / n
            for k, v in part.items():
                totals[k] = totals.get(k, 0.0) + weight * float(v)
        return totals

    return evaluate


def _objective(task, l2_reg):
    model, loss = task.model, task.loss

    def objective(batch):
        x, y = batch
        terms = {task.term: curvature_data.batch_loss(loss, y, model(x, training=True))}
        if l2_reg:
            terms["l2"] = tf.add_n([tf.constant(0.5 * l2_reg, v.dtype) * tf.reduce_sum(v * v)
                                    for v in model.trainable_variables])
        return terms

    return objective


class _Schedule:
    """When to evaluate: every `every` steps and every `seconds` of training."""

    def __init__(self, every, seconds, history):
        self.every, self.every_seconds = every, seconds
        last = history[-1]["seconds"] if history else 0.0
        self.next = (math.floor(last / seconds) + 1) * seconds if seconds else math.inf

    def due(self, step, seconds):
        if (self.every and step % self.every == 0) or seconds >= self.next:
            if self.every_seconds:
                self.next = (math.floor(seconds / self.every_seconds) + 1) * self.every_seconds
            return True
        return False


def _train(step_fn, iterator, ckpt, clock, curve, budget, on_eval, writer, every):
    """Steps until the budget (max_steps, wall_seconds) is spent; returns the last logs."""
    max_steps, wall_seconds, scale, term = budget
    checkpoint_every, summary_every, log_every = every
    step, logs, first = int(ckpt.step), {}, True
    while ((max_steps is None or step < max_steps)
           and (wall_seconds is None or clock.seconds() < wall_seconds)):
        with clock.paused() if first else contextlib.nullcontext():  # tracing not counted
            logs = {k: float(v) for k, v in step_fn(next(iterator)).items()}
        first = False
        seconds = clock.seconds()
        with clock.paused():
            bad = [k for k, v in logs.items() if not math.isfinite(v)]
            if bad:
                raise train.NonFiniteError(f"step {step + 1}: {bad[0]} is {logs[bad[0]]}; the "
                                           "last checkpoint is the last good state")
            step += 1
            ckpt.step.assign(step)
            curve.train_loss.append(scale * logs[term])
            curve.seconds.append(seconds)
            if step % summary_every == 0:
                with writer.as_default():
                    for k, v in dict(logs, train_loss=curve.train_loss[-1]).items():
                        tf.summary.scalar(k, v, step=step)
            if log_every and step % log_every == 0:
                logging.info("step %d  train_loss %.5g  %.1f s", step, curve.train_loss[-1],
                             seconds)
            on_eval(step, seconds)
            if step % checkpoint_every == 0:
                _save(ckpt, clock, curve)
    return logs


def _save(ckpt, clock, curve):
    ckpt.trackables["train_seconds"].assign(clock.seconds())
    curve.save()  # first: a kill between the two leaves a curve at least as long
    ckpt.save()


@gin.configurable
def second_order_experiment(output_dir, task=gin.REQUIRED, optimizer=gin.REQUIRED,
                            seed: harness.Count = 0, batch_size: harness.PositiveInt = 1000,
                            wall_seconds: harness.Positive | None = 600.0,
                            max_steps: harness.PositiveInt | None = None,
                            l2_reg: harness.NonNegative = 0.0,
                            eval_every: harness.PositiveInt | None = None,
                            eval_every_seconds: harness.Positive | None = 60.0,
                            eval_batch_size: harness.PositiveInt = 1000,
                            checkpoint_every: harness.PositiveInt = 200,
                            summary_every: harness.PositiveInt = 10,
                            log_every: harness.Count = 50) -> dict[str, Any]:
    """Train `task`'s model with `optimizer` until `max_steps` or `wall_seconds` of training.

    Args:
      output_dir: the run's directory.
      task: a task function (`@autoencoder_task`, `@classifier_task`) -> `Task`.
      optimizer: an optimizer factory (`@kfac`, `@hessian_free`, `@adahessian`, `@sophia`,
        `@keras.optimizers.Adam`, `@keras.optimizers.SGD`), called with `model=`, `loss=`
        and `l2_reg=` where its signature names them.
      seed: the initialization's and the batch schedule's seed.
      batch_size: the global batch size (split over the replicas under a strategy).
      wall_seconds: the training clock's budget (evaluations, checkpoints, plots excluded;
        a resumed run continues the clock); None: `max_steps` alone.
      max_steps: the step budget; None: `wall_seconds` alone.
      l2_reg: the objective's `l2_reg / 2 ||theta||^2` over every trainable variable, also
        given to a factory that takes `l2_reg` (its curvature).
      eval_every: evaluate on the held-out set every this many steps (None: by time only).
      eval_every_seconds: and every this many training seconds (None: by steps only).
      eval_batch_size: the held-out set's batch size.
      checkpoint_every: checkpoint (and save the curve) every this many steps, and at the end.
      summary_every: TensorBoard scalars every this many steps.
      log_every: a progress line every this many steps (0: none).

    Returns:
      The metrics: `train_loss` and `train_wall_seconds` per step, `steps`,
      `train_seconds`, `final_train_loss`, the last evaluation's values, `history`.
    """
    if wall_seconds is None and max_steps is None:
        raise ValueError("second_order_experiment: bind wall_seconds or max_steps (both None "
                         "would train forever)")
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    with strategy.scope():
        job = task()
        opt = make_optimizer(optimizer, job.model, job.loss, l2_reg)
    step_fn = train.make_train_step(_objective(job, l2_reg), opt, job.model.trainable_variables,
                                    strategy=strategy)
    clock_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    ckpt = train.Checkpointer(output_dir, model=job.model, optimizer=opt,
                              train_seconds=clock_seconds)
    start = harness.started(output_dir, ckpt)
    history = train.read_history(output_dir, start)
    curve = Curve(output_dir, start)
    evaluate = _evaluator(job, eval_batch_size)
    schedule = _Schedule(eval_every, eval_every_seconds, history)
    data = batches(*job.train, job.prepare, batch_size, seed, start)
    iterator = iter(distribute.distribute_dataset(strategy, data))
    writer = tf.summary.create_file_writer(os.path.join(output_dir, "train"))
    offset = float(clock_seconds)
    clock = pinn_training.Clock(offset=offset)

    def on_eval(step, seconds, force=False):
        if force or schedule.due(step, seconds):
            with clock.paused():
                result = {"step": step, "seconds": seconds, **evaluate()}
                train.record_eval(output_dir, history, result)
                logging.info("eval at step %d (%.1f s): %s", step, seconds, result)

    if not history:
        on_eval(0, 0.0, force=True)  # the initialization, the same for every optimizer
    logs = _train(step_fn, iterator, ckpt, clock, curve,
                  (max_steps, wall_seconds, job.scale, job.term), on_eval, writer,
                  (checkpoint_every, summary_every, log_every))
    writer.flush()
    steps = int(ckpt.step)
    if steps > start:
        _save(ckpt, clock, curve)
    if steps == start or history[-1]["step"] != steps:  # a finished run re-evaluates
        on_eval(steps, curve.seconds[-1] if curve.seconds else 0.0, force=True)
    plot_run(os.path.join(output_dir, "curves.png"), curve, history, job.name)
    done = steps - start
    metrics = {"task": job.name, "optimizer": _name(optimizer), "steps": steps,
               "train_seconds": float(ckpt.trackables["train_seconds"]),
               "train_loss": curve.train_loss, "train_wall_seconds": curve.seconds,
               "history": list(history), **{f"final_{k}": v for k, v in logs.items()},
               **{k: v for k, v in history[-1].items() if k not in ("step", "seconds")}}
    if curve.train_loss:
        metrics["final_train_loss"] = curve.train_loss[-1]
    if done and curve.seconds[-1] > offset:
        metrics["train_steps_per_s"] = done / (curve.seconds[-1] - offset)
    return metrics


def main():
    """The console command `hogrod-second-order` (see the module docstring)."""
    harness.main(second_order_experiment)


if __name__ == "__main__":
    main()
