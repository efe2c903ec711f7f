"""Train a small classifier, then measure its loss curvature with hogrod.curvature.

Top eigenvalues by Lanczos, the trace by Hutch++ (with its standard error), and the
spectral density by stochastic Lanczos quadrature; when the model is small enough
(`dense_check_max_params`) every estimate is checked against the dense Hessian and
`numpy.linalg.eigh` in the same run.

    python -m experiments.hessian_spectrum --gin_file=configs/curvature/spectrum_mlp.gin

Outputs: metrics.json, TensorBoard events, checkpoints, density.png.
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
from hogrod import curvature, distribute, harness, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def blobs(n, dim, classes, seed):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(classes, dim))
    labels = rng.integers(0, classes, size=n)
    return (tf.constant(centers[labels] + rng.normal(size=(n, dim)), tf.float32),
            tf.constant(labels, tf.int32))


class _Phases:
    """Log each phase of the curvature analysis as it starts, with the time the last took
    (each takes seconds to minutes with no other output)."""

    def __init__(self):
        self.name, self.start = None, None

    def __call__(self, name):
        now = time.perf_counter()
        if self.name is not None:
            logging.info("%s: done in %.1f s", self.name, now - self.start)
        if name is not None:
            logging.info("%s ...", name)
        self.name, self.start = name, now


@gin.configurable
def hessian_spectrum(output_dir, dim=10, hidden=(40, 40), classes=3, n_examples=1024,
                     batch_size=128, steps=500, learning_rate=1e-2, top_k=5, hutchpp_matvecs=150,
                     slq_iterations=80, slq_runs=5, layer=None, dense_check_max_params=3000,
                     seed=0):
    """Args: layer: restrict every estimate to this layer's parameters (per-layer variant)."""
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    x, y = blobs(n_examples, dim, classes, seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input((dim,))] +
                                 [keras.layers.Dense(h, activation="tanh") for h in hidden] +
                                 [keras.layers.Dense(classes, name="head")])
        opt = keras.optimizers.Adam(learning_rate)

    def loss(batch):
        xb, yb = batch
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, model(xb)))

    step = train.make_train_step(loss, opt, model.trainable_variables, strategy=strategy)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n_examples, seed=seed).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(data.batch(batch_size)))
    ckpt = train.Checkpointer(output_dir, model=model, optimizer=opt, data=iterator)
    stats = {}
    logs = train.train_loop(step, iterator, steps, ckpt, output_dir, checkpoint_every=steps,
                            stats=stats)

    params = (curvature.layer_params(model, layer) if layer else model.trainable_variables)
    full = tf.data.Dataset.from_tensor_slices((x, y)).batch(256)  # the whole training set
    # under a strategy each batch's HVP is split over the replicas and all-reduced
    op = curvature.HessianOperator(loss, params, full, tf.float64, strategy=strategy)
    n = int(op.shape[0])
    phase = _Phases()
    phase(f"Lanczos: the top {top_k} Hessian eigenvalues of {n} parameters")
    top, _, lanczos_matvecs = curvature.lanczos(op, top_k, tol=1e-8)
    phase("Lanczos: the smallest eigenvalue")
    low, _, _ = curvature.lanczos(op, 1, which="smallest", tol=1e-8)
    phase(f"Hutch++ trace estimate with {hutchpp_matvecs} Hessian-vector products")
    trace, trace_se = curvature.hutchpp(op, hutchpp_matvecs, seed=seed)
    phase(f"spectral density: {slq_runs} stochastic Lanczos runs of {slq_iterations} steps")
    grid, density, _, _ = curvature.spectral_density(op, slq_iterations, slq_runs, seed=seed)
    metrics = {**stats, "n_params": n, "train_loss": logs.get("loss", float("nan")),
               "top_eigenvalues": top.tolist(), "min_eigenvalue": float(low[0]),
               "lanczos_hvps": lanczos_matvecs, "trace_hutchpp": trace,
               "trace_hutchpp_se": trace_se, "density_integral": float(np.trapezoid(density, grid))}
    if n <= dense_check_max_params:
        phase(f"dense {n} x {n} Hessian and its eigenvalues, to check the estimates")
        H = hogrod.hessian(lambda: loss((tf.cast(x, tf.float32), y)), params).numpy()
        exact = np.linalg.eigvalsh(((H + H.T) / 2).astype(np.float64))[::-1]
        metrics.update(
            exact_top_eigenvalues=exact[:top_k].tolist(),
            top_eigenvalue_max_rel_err=float(np.max(np.abs(top - exact[:top_k])
                                                    / np.abs(exact[:top_k]))),
            exact_trace=float(np.trace(H)),
            trace_error_in_se=float(abs(trace - np.trace(H)) / max(trace_se, 1e-30)))
    phase("plotting")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.semilogy(grid, np.maximum(density, 1e-12))
    for e in top:
        ax.axvline(e, color="r", lw=0.5)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density (SLQ)")
    ax.set_title(f"Hessian spectral density, {n} params (red: Lanczos top-{top_k})")
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "density.png"), dpi=90)
    plt.close(fig)
    phase(None)
    return metrics


def main():
    """The console command `hogrod-hessian-spectrum` (see the module docstring)."""
    harness.main(hessian_spectrum)


if __name__ == "__main__":
    main()
