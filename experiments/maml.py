"""Meta-train MAML or one of its family on sinusoids or N-way K-shot episodes.

The algorithm, the data and the model are gin references; a config file is a few includes:

    python -m experiments.maml --gin_file=configs/maml/sinusoid_maml.gin
    HOGROD_DATA=../shared/data python -m experiments.maml \
        --gin_file=configs/maml/omniglot_5way_1shot.gin   # or episode_data.data_dir='...'

Outputs: metrics.json (query loss/accuracy after 0, 1, 10 steps on held-out tasks, with
95% intervals; training steps/s and wall time), TensorBoard events, checkpoints (a re-run
with the same --output_dir resumes; a finished run re-evaluates its final model),
operative_config.gin, eval_history.json (every evaluation, from the untrained model at step
0 on), loss.png (held-out loss on a log scale with 95% bands) and adaptation.png (three test
sinusoids with their support points and the model before and after 1 and 10 adaptation
steps), or accuracy.png for episodes.
"""

import collections
import math
import os

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

import hogrod
from hogrod import distribute, harness, meta, train
from hogrod.models import cross_entropy, mlp, mse

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


MetaData = collections.namedtuple(
    "MetaData", ["train", "eval_tasks", "loss", "classification", "meta_batch_size",
                 "more_eval_tasks"], defaults=(None,))
MetaData.__doc__ = """What a data function (`maml_experiment.data`) returns: `train`, a tf.data
stream of meta-batches (x_s, y_s, x_q, y_q), each `meta_batch_size` tasks; `eval_tasks`, one
held-out meta-batch; `loss(y_true, y_pred)`, a Keras loss; `classification` (report
accuracy); `more_eval_tasks`, None or {prefix: held-out meta-batch} evaluated too, their
metrics named `<prefix>/<metric>` (episodes of other shapes: `episode_data.also_test_n_way`)."""


@gin.configurable
def sinusoid_data(seed, meta_batch_size=25, k_shot=10, eval_tasks=600, eval_k_query=100):
    train_stream = meta.sinusoid_meta_batches(seed, meta_batch_size, k_shot, k_shot)
    xs, ys, xq, yq, amp, phase = meta.sample_sinusoids(tf.constant([seed + 10**6, 0], tf.int64),
                                                       eval_tasks, k_shot, eval_k_query)
    return MetaData(train_stream, (xs, ys, xq, yq), mse, False, meta_batch_size)


@gin.configurable
def episode_data(seed, source="omniglot", data_dir=None, n_way=5, k_shot=1, k_query=15,
                 meta_batch_size=32, eval_tasks=600, image_size=28,
                 train_n_way: harness.PositiveInt | None = None,
                 train_k_query: harness.PositiveInt | None = None,
                 also_test_n_way: tuple[harness.PositiveInt, ...] = ()):
    """N-way K-shot episodes; source 'omniglot' (the zips in data_dir) or a tfds name.

    The held-out episodes are `n_way`-way with `k_query` queries per class; the training
    episodes `train_n_way`-way with `train_k_query` (None: the same as the test's), so a
    model trains on many-way episodes (ProtoNet: 60-way) and is tested on fewer. For each N
    in `also_test_n_way`, a held-out meta-batch of N-way episodes (k_shot, k_query,
    eval_tasks as the main one) is evaluated too, its metrics prefixed '<N>way/'.
    """
    if source == "omniglot":  # data_dir None: $HOGROD_DATA/omniglot, else a named error
        train_cls = meta.load_omniglot(data_dir, "train", image_size)
        test_cls = meta.load_omniglot(data_dir, "test", image_size)
    else:
        train_cls = meta.load_tfds_classes(source, "train", image_size=image_size,
                                           data_dir=data_dir)
        test_cls = meta.load_tfds_classes(source, "test", image_size=image_size,
                                          data_dir=data_dir)
    train_stream = meta.episodes(train_cls, n_way if train_n_way is None else train_n_way,
                                 k_shot, k_query if train_k_query is None else train_k_query,
                                 meta_batch_size, seed)

    def held_out(ways):
        return next(iter(distribute.without_autotune(meta.episodes(
            test_cls, ways, k_shot, k_query, eval_tasks, seed + 10**6))))
    more = {f"{ways}way": held_out(ways) for ways in also_test_n_way}
    return MetaData(train_stream, held_out(n_way), cross_entropy, True, meta_batch_size,
                    more or None)


def plot_sinusoids(path, algo, model, seed):
    xs, ys, _, _, amp, phase = meta.sample_sinusoids(tf.constant([seed + 2 * 10**6, 0], tf.int64),
                                                     3, 10, 1)
    grid = tf.linspace(-5.0, 5.0, 200)[:, None]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, ax in enumerate(axes):
        ax.plot(grid[:, 0], amp[i, 0, 0] * np.sin(grid[:, 0] - phase[i, 0, 0]), "k", label="true")
        ax.plot(xs[i, :, 0], ys[i, :, 0], "k^", label="support")
        for steps, style in [(0, ":"), (1, "--"), (10, "-")]:
            fast = algo.adapt((xs[i], ys[i]), steps)
            pred = hogrod.functional_call(model, fast, grid, training=True)
            ax.plot(grid[:, 0], pred[:, 0], style, label=f"{steps} step(s)")
        ax.set_title(f"test task {i}")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_curves(path, history, accuracy):
    """Held-out query loss (log scale) or accuracy against meta-iterations, one curve per
    number of adaptation steps, from the untrained model (step 0) on, with the 95%
    intervals `meta.evaluate` gives as bands."""
    key = "accuracy" if accuracy else "loss"
    fig, ax = plt.subplots(figsize=(6, 4))
    counts = sorted({int(k.split("_")[-1]) for h in history for k in h
                     if k.startswith(f"{key}_after_") and k.split("_")[-1].isdigit()})
    for s in counts:  # each over the evaluations that measured it (settings may change)
        points = [h for h in history if f"{key}_after_{s}" in h]
        steps = np.array([h["step"] for h in points])
        mean = np.array([h[f"{key}_after_{s}"] for h in points], float)
        line, = ax.plot(steps, mean, marker=".", label=f"after {s} step(s)")
        if all(f"{key}_after_{s}_ci95" in h for h in points):
            half = np.array([h[f"{key}_after_{s}_ci95"] for h in points], float)
            low = mean - half if accuracy else np.maximum(mean - half, mean * 1e-3)
            ax.fill_between(steps, low, mean + half, color=line.get_color(), alpha=0.2,
                            lw=0)
    if not accuracy:
        ax.set_yscale("log")  # the loss falls over orders of magnitude
    ax.set_xlabel("meta-iteration")
    ax.set_ylabel(f"held-out query {key}" + ("" if accuracy else " (log scale)"))
    ax.set_title("mean over held-out tasks, 95% interval shaded")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


INNER_OPTIMIZER_ALGORITHMS = ("maml", "fomaml")  # the algorithms with inner_optimizer


def check_model(net, algorithm, data):
    """The model fits the algorithm: a classifier with one output per class of the episodes
    for the gradient-based algorithms; for a few-shot head (`meta.FEW_SHOT`) classification
    episodes and an embedding network, `[batch, d]`, whose last layer is not a Dense layer
    as wide as the episodes' classes (a classifier such as `conv4`: its logits are no
    embedding the papers' heads fit).

    Raises:
      ValueError: naming the bindings to change.
    """
    ways = int(np.max(data.eval_tasks[1])) + 1 if data.classification else None
    width = net.output_shape[-1]
    if algorithm not in meta.FEW_SHOT.values():
        if data.classification and width != ways:
            raise ValueError(f"the model has {width} outputs but the episodes are {ways}-way: "
                             "set conv4.n_way and episode_data.n_way alike (the Omniglot "
                             "configs bind both to N_WAY)")
        return
    name = next(k for k, v in meta.FEW_SHOT.items() if v is algorithm)
    if not data.classification:
        raise ValueError(f"maml_experiment.algorithm = @{name} is a few-shot classification "
                         "head; give it classification episodes (maml_experiment.data = "
                         "@episode_data)")
    last = net.layers[-1] if net.layers else None
    if len(net.output_shape) != 2 or (isinstance(last, keras.layers.Dense) and width == ways):
        raise ValueError(f"maml_experiment.algorithm = @{name} fits a head to embeddings "
                         f"[batch, d], but the model's output is {net.output_shape}"
                         + (f", a Dense layer of {width} = n_way units (a classifier)"
                            if len(net.output_shape) == 2 else "")
                         + ": give an embedding network, maml_experiment.model = "
                         "@conv4_embedding")


def check_config():
    """The bindings an algorithm would refuse only once built (after the data are loaded),
    checked from the gin config alone, so a bad combination fails at once: an
    `inner_optimizer` bound on top of a config whose include binds `inner_lr`; and an
    algorithm's own `task_map` binding, which `maml_experiment.task_map` (passed to the
    algorithm) would silently override.

    Returns:
      None.

    Raises:
      ValueError: naming the binding to add.
    """
    for name in meta.ALGORITHMS:
        try:
            mode = gin.query_parameter(f"{name}.task_map")
        except ValueError:  # not bound
            continue
        raise ValueError(f"{name}.task_map = {mode!r} is bound, but maml_experiment gives "
                         f"the algorithm and the evaluation maml_experiment.task_map: bind "
                         f"`maml_experiment.task_map = {mode!r}` instead")
    for name in INNER_OPTIMIZER_ALGORITHMS:
        bound = {}
        for param in ("inner_lr", "inner_optimizer"):
            try:
                bound[param] = gin.query_parameter(f"{name}.{param}")
            except ValueError:  # not bound: the default, None
                bound[param] = None
        if bound["inner_lr"] is not None and bound["inner_optimizer"] is not None:
            raise ValueError(
                f"{name}.inner_optimizer is bound, and so is {name}.inner_lr = "
                f"{bound['inner_lr']!r} (the shipped algorithm configs bind it): give one or "
                f"the other (the optimizer's learning_rate is the step size); add the "
                f"binding `{name}.inner_lr = None` (e.g. --gin_param=\"{name}.inner_lr = "
                f"None\")")


@gin.configurable
def maml_experiment(output_dir, algorithm=gin.REQUIRED, data=sinusoid_data, model=mlp,
                    meta_iterations: harness.Count = 70000, outer_lr: harness.Positive = 1e-3,
                    eval_steps: tuple[harness.Count, ...] = (0, 1, 10),
                    eval_every: harness.PositiveInt = 5000,
                    checkpoint_every: harness.PositiveInt = 5000,
                    clip_norm: harness.Positive | None = None, seed: harness.Count = 0,
                    time_limit_s: harness.Positive | None = None,
                    task_map: str = "vectorized",
                    outer_lr_decay_every: harness.PositiveInt | None = None,
                    outer_lr_decay: harness.Fraction = 0.5,
                    steps_per_execution: harness.PositiveInt = 100):
    """Meta-train `algorithm` on `data` with `model`, evaluating on held-out tasks.

    Args:
      algorithm: a hogrod.meta algorithm (gin: `@maml`, `@fomaml`, `@reptile`, `@anil`,
        `@meta_sgd`, `@maml_plus_plus`, `@imaml`), or a few-shot head (`@protonet`,
        `@r2d2`, `@metaoptnet`: classification only, on an embedding network).
      data: `@sinusoid_data` or `@episode_data`: `data(seed) -> MetaData`.
      model: a function building the Keras model (`@mlp`, `@conv4`; for a few-shot head an
        embedding network, `@conv4_embedding`).
      clip_norm: clip the meta-gradient's global norm (None: no clipping).
      time_limit_s: stop meta-training after this many seconds of steps (evaluations
        excluded) and evaluate; a re-run with the same output_dir continues. None: no limit.
      task_map: how the tasks of a meta-batch are mapped, given to the algorithm and the
        evaluation: 'vectorized' (fastest for dense nets), 'sequential' (less memory,
        faster for conv nets; the Omniglot configs bind it) or 'recomputed' (the least
        memory; the evaluation maps sequentially). It is passed to the algorithm as its
        `task_map` argument, so it takes precedence over a binding such as
        `maml.task_map`.
      outer_lr: Adam's meta learning rate, or a Keras schedule of the meta-iteration
        (e.g. `@PiecewiseConstantDecay()`, registered by `hogrod.harness`).
      outer_lr_decay_every: multiply the meta learning rate by `outer_lr_decay` every this
        many meta-iterations (a staircase; Snell et al. halve it every 2,000 episodes);
        None: constant.
      outer_lr_decay: the factor, in (0, 1].
      steps_per_execution: the most meta-iterations per compiled call (`train.train_loop`:
        the meta-batches drawn inside the call, the NaN guard, logs and checkpoints per
        step, the same steps as with 1 to rounding); the calls end at multiples of its
        greatest common divisor with `eval_every`, so every evaluation sees its step's
        model. Default 100: with the meta-step under XLA the call is one XLA loop (the
        next call's meta-batches drawn beside it), and the sinusoid meta-steps run about
        twice as fast as one per call (`experiments/bench/maml.py`); the plain step (the
        Omniglot configs') draws each meta-batch inside its loop.

    The meta-step is `train.make_train_step`'s default: one XLA computation where XLA
    compiles it (`jit_compile="auto"`); `make_train_step.jit_compile = False` (the Omniglot
    configs' binding: XLA's CPU convolutions are slower) runs it as a plain `tf.function`.

    Returns:
      the final evaluation's metrics, the steps run, training speed and the last
      training logs.
    """
    check_config()
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    data = data(seed)
    if not isinstance(data, MetaData):
        raise TypeError("maml_experiment.data must return a MetaData (train, eval_tasks, "
                        f"loss, classification, meta_batch_size), got {type(data).__name__}")
    eval_tasks, loss, classification = data.eval_tasks, data.loss, data.classification
    declared = tf.nest.flatten(data.train.element_spec)[0].shape[0]
    if declared is not None and declared != data.meta_batch_size:
        raise ValueError(f"the data function's stream has meta-batches of {declared} tasks but "
                         f"its MetaData.meta_batch_size is {data.meta_batch_size}")
    if outer_lr_decay_every is not None and \
            isinstance(outer_lr, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            "maml_experiment.outer_lr is a schedule and maml_experiment.outer_lr_decay_every = "
            f"{outer_lr_decay_every} decays it again: remove one of the two bindings")
    with strategy.scope():
        net = model()
        rate = outer_lr if outer_lr_decay_every is None else \
            keras.optimizers.schedules.ExponentialDecay(outer_lr, outer_lr_decay_every,
                                                        outer_lr_decay, staircase=True)
        optimizer = keras.optimizers.Adam(rate)
        algo = algorithm(net, loss, task_map=task_map)
    check_model(net, algorithm, data)
    step = train.make_train_step(
        lambda tasks: algo.meta_loss(tasks, optimizer.iterations), optimizer,
        net.trainable_variables + algo.variables, strategy=strategy,
        transform=train.clip_by_global_norm(clip_norm) if clip_norm else None)
    # One meta-batch per step; unbatch/batch makes the stream splittable across replicas.
    stream = data.train.unbatch().batch(data.meta_batch_size) \
        if strategy.num_replicas_in_sync > 1 else data.train
    iterator = iter(distribute.distribute_dataset(strategy, stream))
    ckpt = train.Checkpointer(output_dir, model=net, optimizer=optimizer, data=iterator,
                              **{f"algo_var_{i}": v for i, v in enumerate(algo.variables)},
                              **{f"algo_state_{i}": v for i, v in enumerate(algo.state)})
    evaluate = meta.evaluator(algo, net, loss, eval_steps, classification, task_map,
                              seed=seed)
    more = {prefix: (tasks, meta.evaluator(algo, net, loss, eval_steps, classification,
                                           task_map, seed=seed))
            for prefix, tasks in (data.more_eval_tasks or {}).items()}
    history = train.read_history(output_dir, harness.started(output_dir, ckpt))

    def evaluate_now(i):
        logging.info("evaluating at meta-iteration %d on held-out tasks", i)
        result = evaluate(eval_tasks)
        for prefix, (tasks, evaluate_more) in more.items():
            result.update({f"{prefix}/{k}": v for k, v in evaluate_more(tasks).items()})
        train.record_eval(output_dir, history, dict(result, step=i))
        logging.info("eval at %d: %s", i, {k: round(v, 4) for k, v in result.items()
                                           if k.split("_")[-1].isdigit()})
        return result

    def callback(i, logs):
        if i % eval_every == 0 and i != meta_iterations:
            evaluate_now(i)

    if not history and ckpt.latest_step() == 0:
        evaluate_now(0)  # the untrained model: the curves' first point
    stats = {}
    logs = train.train_loop(step, iterator, meta_iterations, ckpt, output_dir,
                            checkpoint_every=checkpoint_every, log_every=1000,
                            callback=callback, time_limit_s=time_limit_s, stats=stats,
                            steps_per_execution=math.gcd(steps_per_execution, eval_every))
    # A finished run run again re-evaluates its final model (replacing the evaluation
    # recorded at that step), so its metrics follow the evaluation settings in force.
    result = evaluate_now(int(ckpt.step))
    logging.info("plotting")
    if classification:
        plot_curves(os.path.join(output_dir, "accuracy.png"), history, True)
    else:
        plot_sinusoids(os.path.join(output_dir, "adaptation.png"), algo, net, seed)
        plot_curves(os.path.join(output_dir, "loss.png"), history, False)
    return dict(result, meta_iterations=int(ckpt.step), **stats,
                **{f"final_train_{k}": v for k, v in logs.items()})

# the harness runs an experiment's `check_config` once the config is parsed, before it
# creates the output directory; maml_experiment also runs it first, for any other caller
maml_experiment.check_config = check_config


def main():
    """The console command `hogrod-maml` (see the module docstring)."""
    harness.main(maml_experiment)


if __name__ == "__main__":
    main()
