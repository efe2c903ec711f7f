"""Train a small Keras classifier on a tfds image data set with the training-loop toolkit.

Everything is a gin binding: the data set, the model size, the optimizer of each variable
group (backbone, head), term weights (`make_train_step.weights`), clipping, gradient
accumulation, precision and the strategy (`make_strategy.kind`).

    python -m experiments.train_classifier --gin_file=configs/train/mnist_mlp.gin

Outputs: metrics.json (test accuracy), TensorBoard events, checkpoints (a re-run with the
same --output_dir resumes), curves.png (loss and accuracy), attribution.png (saliency and
integrated gradients of a few test images). Tests run it on `tfds.testing.mock_data`.
"""

import os

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from hogrod.models import classifier, cross_entropy
from hogrod import distribute, harness, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "adamw": keras.optimizers.AdamW}


def load(dataset, split, data_dir, batch_size, seed, repeat):
    ds = tfds.load(dataset, split=split, data_dir=data_dir, shuffle_files=False)

    def prepare(example):
        return tf.cast(example["image"], tf.float32) / 255.0, tf.cast(example["label"], tf.int32)

    ds = ds.map(prepare)
    if repeat:
        ds = ds.shuffle(10_000, seed=seed).repeat()
    return ds.batch(batch_size, drop_remainder=repeat)


def plot_curves(path, history):
    steps, loss, acc = zip(*history)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(steps, loss)
    a.set_title("training loss")
    a.set_xlabel("step")
    b.plot(steps, acc)
    b.set_title("batch accuracy")
    b.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_attribution(path, model, images, labels):
    sal = np.abs(train.saliency(model, images, labels).numpy())
    ig = train.integrated_gradients(model, images, None, labels, steps=32).numpy()
    n = len(images)
    fig, axes = plt.subplots(3, n, figsize=(2 * n, 6), squeeze=False)
    for i in range(n):
        for row, (img, title) in enumerate([(images[i], f"label {labels[i]}"),
                                            (sal[i], "|saliency|"), (ig[i], "integrated grads")]):
            axes[row, i].imshow(np.asarray(img)[..., 0], cmap="gray" if row == 0 else "magma")
            axes[row, i].set_title(title, fontsize=8)
            axes[row, i].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


@gin.configurable
def train_classifier(output_dir, dataset: str = "mnist", data_dir: str | None = None,
                     conv_filters: tuple[harness.PositiveInt, ...] = (),
                     hidden: tuple[harness.PositiveInt, ...] = (128,),
                     batch_size: harness.PositiveInt = 64, steps: harness.Count = 2000,
                     optimizer: str = "adam", backbone_lr: harness.Positive = 1e-3,
                     head_lr: harness.Positive = 1e-3, clip_norm: harness.Positive | None = None,
                     clip_value: harness.Positive | None = None, l2: bool = True,
                     precision: str = "float32", eval_batches: harness.PositiveInt | None = None,
                     checkpoint_every: harness.PositiveInt = 500, seed: harness.Count = 0):
    """Train, evaluate on the test split, and plot.

    Args:
      precision: "float32", "mixed_float16" (loss-scaled; one learning rate for all) or
        "mixed_bfloat16".
      l2: add an "l2" loss term (sum of squared kernels); weight it with
        `make_train_step.weights = {'l2': 1e-4}`.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"train_classifier.optimizer must be one of {sorted(OPTIMIZERS)}, "
                         f"got {optimizer!r}")
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    info_ds = load(dataset, "train", data_dir, batch_size, seed, repeat=True)
    image_shape = tuple(info_ds.element_spec[0].shape[1:])
    builder = tfds.builder(dataset, data_dir=data_dir)
    num_classes = builder.info.features["label"].num_classes
    with strategy.scope():
        opt_cls = OPTIMIZERS[optimizer]
        if precision == "float32":
            model = classifier(image_shape, num_classes, conv_filters, hidden)
            head = model.layers[-1].trainable_variables
            backbone = [v for v in model.trainable_variables if all(v is not h for h in head)]
            groups = [(opt_cls(backbone_lr), backbone), (opt_cls(head_lr), head)]
            opts = {"optimizer_backbone": groups[0][0], "optimizer_head": groups[1][0]}
            step_args = dict(optimizer=groups)
        else:
            if backbone_lr != head_lr:
                raise ValueError("precision='mixed_*' uses one optimizer: set "
                                 "train_classifier.backbone_lr == head_lr")
            with train.precision_policy(precision):  # this model's layers only
                model = classifier(image_shape, num_classes, conv_filters, hidden)
                opt = train.mixed_precision(opt_cls(head_lr), precision)
            opts = {"optimizer": opt}
            step_args = dict(optimizer=opt, variables=model.trainable_variables)

    def objective(batch):
        x, y = batch
        logits = tf.cast(model(x, training=True), tf.float32)
        terms = {"ce": cross_entropy(y, logits)}
        if l2:
            terms["l2"] = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32) ** 2)
                                    for v in model.trainable_variables if len(v.shape) > 1])
        return terms

    transforms = []
    if clip_norm:
        transforms.append(train.clip_by_global_norm(clip_norm))
    if clip_value:
        transforms.append(train.clip_by_value(clip_value))
    step = train.make_train_step(objective, transform=train.chain(*transforms), strategy=strategy,
                                 **step_args)
    iterator = iter(distribute.distribute_dataset(strategy, info_ds))
    ckpt = train.Checkpointer(output_dir, model=model, data=iterator, **opts)

    @tf.function
    def batch_accuracy(x, y):
        return tf.reduce_mean(tf.cast(tf.argmax(model(x), -1, output_type=tf.int32) == y,
                                      tf.float32))

    history = []
    probe = next(iter(load(dataset, "train", data_dir, 256, seed + 1, repeat=False)))

    def record(i, logs):
        if i % max(1, steps // 50) == 0 or i == steps:
            history.append((i, logs["loss"], float(batch_accuracy(*probe))))

    harness.started(output_dir, ckpt)
    stats = {}
    logs = train.train_loop(step, iterator, steps, ckpt, output_dir,
                            checkpoint_every=checkpoint_every, callback=record, stats=stats)
    logging.info("evaluating on the test split")
    test = load(dataset, "test", data_dir, 256, seed, repeat=False)
    correct = total = 0
    for x, y in test.take(eval_batches) if eval_batches else test:
        correct += float(batch_accuracy(x, y)) * len(y)
        total += len(y)
    if history:
        plot_curves(os.path.join(output_dir, "curves.png"), history)
    x_test, y_test = next(iter(test))
    plot_attribution(os.path.join(output_dir, "attribution.png"), model, x_test[:4],
                     y_test[:4].numpy())
    return {"steps": int(ckpt.step), "test_accuracy": correct / max(total, 1),
            "test_examples": total, **stats, **{f"final_{k}": v for k, v in logs.items()}}


def main():
    """The console command `hogrod-train-classifier` (see the module docstring)."""
    harness.main(train_classifier)


if __name__ == "__main__":
    main()
