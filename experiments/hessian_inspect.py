"""Train a small classifier, then inspect its loss curvature with hogrod's primitives.

For logistic regression the Hessian has a closed form, X^T diag(p(1-p)) X / n, so the
run checks `hogrod.hessian` against it; for any model it checks both HVP modes and the
Gauss-Newton product against the dense Hessian, and writes the Hessian's spectrum.

    python -m experiments.hessian_inspect --gin_file=configs/hessian_inspect/logistic.gin

Outputs: metrics.json, operative_config.gin, TensorBoard events (train/), checkpoints
(ckpt/; a re-run with the same --output_dir resumes), hessian.png.
"""

import os
import time

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

import hogrod
from hogrod import harness

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def make_data(n_examples, n_features, n_classes, seed, dtype):
    """A seeded Gaussian-blob classification problem."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(n_classes, n_features))
    labels = rng.integers(0, n_classes, size=n_examples)
    x = centers[labels] + rng.normal(size=(n_examples, n_features))
    return tf.constant(x, dtype), tf.constant(labels, tf.int32)


def make_model(n_features, n_outputs, hidden, dtype):
    layers = [keras.Input((n_features,), dtype=dtype)]
    layers += [keras.layers.Dense(h, activation="tanh", dtype=dtype) for h in hidden]
    layers += [keras.layers.Dense(n_outputs, dtype=dtype)]
    return keras.Sequential(layers)


def loss_from_logits(labels, logits, n_classes):
    if n_classes == 2:  # one logit: the logistic-regression form with its closed-form Hessian
        t = tf.cast(labels, logits.dtype)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(t, logits[:, 0]))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def plot(path, H, eigvals):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    lim = np.abs(H).max()
    im = a.imshow(H, cmap="RdBu_r", vmin=-lim, vmax=lim)
    a.set_title(f"Hessian ({H.shape[0]} x {H.shape[0]})")
    fig.colorbar(im, ax=a)
    b.plot(np.arange(1, len(eigvals) + 1), eigvals[::-1], ".")
    b.set_yscale("symlog", linthresh=1e-4)
    b.axhline(0.0, color="gray", lw=0.5)
    b.set_title("eigenvalues, largest first (symlog)")
    b.set_xlabel("index")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@gin.configurable
def hessian_inspect(output_dir, n_examples=512, n_features=5, n_classes=2, hidden=(),
                    steps=300, learning_rate=0.5, checkpoint_every=100, seed=0,
                    dtype="float64"):
    """Train by gradient descent, then check and plot the curvature at the solution."""
    if n_classes < 2:
        raise ValueError(f"hessian_inspect.n_classes must be >= 2, got {n_classes}")
    keras.utils.set_random_seed(seed)
    x, labels = make_data(n_examples, n_features, n_classes, seed, dtype)
    n_out = 1 if n_classes == 2 else n_classes
    model = make_model(n_features, n_out, tuple(hidden), dtype)
    params = model.trainable_variables
    loss_fn = lambda: loss_from_logits(labels, model(x), n_classes)  # noqa: E731

    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, step=step)
    manager = tf.train.CheckpointManager(ckpt, os.path.join(output_dir, "ckpt"), max_to_keep=2)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        logging.info("resumed from %s at step %d", manager.latest_checkpoint, int(step))
    writer = tf.summary.create_file_writer(os.path.join(output_dir, "train"))

    @tf.function
    def train_step():
        loss, grads = hogrod.value_and_grad(loss_fn, params)
        for p, g in zip(params, grads):
            p.assign_sub(learning_rate * g)
        step.assign_add(1)
        return loss

    first, start = int(step), time.perf_counter()
    with writer.as_default():
        while int(step) < steps:
            loss = train_step()
            tf.summary.scalar("loss", loss, step=step)
            if int(step) % checkpoint_every == 0 or int(step) == steps:
                manager.save(checkpoint_number=int(step))

    trained = int(step) - first
    train_seconds = time.perf_counter() - start
    logging.info("dense Hessian of %d parameters, HVP checks", sum(int(tf.size(p)) for p in params))
    loss, grads = hogrod.value_and_grad(loss_fn, params)
    H = hogrod.hessian(loss_fn, params).numpy()
    eigvals = np.linalg.eigvalsh((H + H.T) / 2)
    flat = lambda t: np.concatenate([np.ravel(a) for a in t])  # noqa: E731
    rng = np.random.default_rng(seed + 1)
    v = [tf.constant(rng.normal(size=p.shape), dtype) for p in params]
    dense_hv = H @ flat(v)
    metrics = {
        "steps": int(step),
        "loss": float(loss),
        "grad_norm": float(np.linalg.norm(flat(grads))),
        "n_params": int(H.shape[0]),
        "eig_max": float(eigvals[-1]),
        "eig_min": float(eigvals[0]),
        "top5_eigenvalues": [float(e) for e in eigvals[::-1][:5]],
        "hessian_asymmetry": float(np.abs(H - H.T).max()),
    }
    if trained:
        metrics.update(train_steps=trained, train_seconds=train_seconds,
                       train_steps_per_s=trained / train_seconds)
    for mode in hogrod.autodiff.HVP_MODES:
        hv = flat(hogrod.hvp(loss_fn, params, v, mode=mode))
        metrics[f"hvp_rel_err_{mode}"] = float(np.linalg.norm(hv - dense_hv)
                                               / np.linalg.norm(dense_hv))
    if n_classes == 2 and not hidden:  # logistic regression: H = X~^T diag(p(1-p)) X~ / n
        X1 = np.concatenate([x.numpy(), np.ones((n_examples, 1))], axis=1)  # kernel then bias
        p = tf.sigmoid(model(x)[:, 0]).numpy()
        H_closed = X1.T @ (X1 * (p * (1 - p))[:, None]) / n_examples
        metrics["closed_form_rel_err"] = float(np.linalg.norm(H - H_closed)
                                               / np.linalg.norm(H_closed))
    plot(os.path.join(output_dir, "hessian.png"), H, eigvals)
    logging.info("hessian_inspect: %s", metrics)
    return metrics


def main():
    """The console command `hogrod-hessian-inspect` (see the module docstring)."""
    harness.main(hessian_inspect)


if __name__ == "__main__":
    main()
