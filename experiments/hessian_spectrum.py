"""Train a small classifier on Gaussian blobs, then inspect and measure its loss curvature.

Estimates (`estimates = True`): the top eigenvalues by Lanczos, the smallest, the trace by
Hutch++ (with its standard error) and the spectral density by stochastic Lanczos quadrature
(density.png). When the model is small enough (`dense_check_max_params`) the run also forms
the dense Hessian and checks against it, in the same run: every estimate (against
`numpy.linalg.eigh` and the exact trace), both Hessian-vector-product modes, and, for
logistic regression (`classes = 2`, no hidden layer: one logit), the closed form
X~^T diag(p(1-p)) X~ / n (hessian.png: the matrix and its eigenvalues).

    python -m experiments.hessian_spectrum --gin_file=configs/curvature/spectrum_mlp.gin
    python -m experiments.hessian_spectrum --gin_file=configs/curvature/inspect_logistic.gin

(The dense and closed-form checks of a small model are the configs
`configs/curvature/inspect_logistic.gin` and `inspect_mlp.gin`, bindings `hessian_spectrum.*`.)

Outputs: metrics.json, operative_config.gin, TensorBoard events (train/), checkpoints (ckpt/;
a re-run with the same --output_dir resumes), density.png, hessian.png.
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
from hogrod.models import binary_cross_entropy, cross_entropy, dense_net
from hogrod import curvature, distribute, harness, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPTIMIZERS = ("adam", "gd")
DTYPES = ("float32", "float64")


def blobs(n, dim, classes, seed, dtype):
    """A seeded Gaussian-blob classification problem: (x [n, dim] in dtype, int32 labels)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(classes, dim))
    labels = rng.integers(0, classes, size=n)
    return (tf.constant(centers[labels] + rng.normal(size=(n, dim)), dtype),
            tf.constant(labels, tf.int32))


def gd_step(loss, params, learning_rate):
    """A full-batch gradient-descent step `step(batch) -> {"loss"}`. The Python float
    learning rate meets the gradient in its own dtype (a Keras optimizer would store it in
    float32 and break the float64 closed-form check)."""

    @tf.function
    def step(batch):
        value, grads = hogrod.value_and_grad(lambda: loss(batch), params)
        for p, g in zip(params, grads):
            p.assign_sub(learning_rate * g)
        return {"loss": value}
    return step


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


def plot_density(path, grid, density, top, n):
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.semilogy(grid, np.maximum(density, 1e-12))
    for e in top:
        ax.axvline(e, color="r", lw=0.5)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density (SLQ)")
    ax.set_title(f"Hessian spectral density, {n} params (red: Lanczos top-{len(top)})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_hessian(path, H, eigvals):
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


def _check_args(classes, optimizer, dtype, batch_size, strategy):
    if classes < 2:
        raise ValueError(f"hessian_spectrum.classes must be >= 2, got {classes}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"hessian_spectrum.optimizer must be one of {OPTIMIZERS}, got "
                         f"{optimizer!r}")
    if dtype not in DTYPES:
        raise ValueError(f"hessian_spectrum.dtype must be one of {DTYPES}, got {dtype!r}")
    if optimizer == "adam" and batch_size is not None and batch_size < 1:
        raise ValueError(f"hessian_spectrum.batch_size must be >= 1 or None (the whole set), "
                         f"got {batch_size}")
    if optimizer == "gd" and strategy.num_replicas_in_sync > 1:
        raise ValueError("hessian_spectrum.optimizer = 'gd' runs on one device: use 'adam' "
                         "under a configs/strategy/ config, or drop the strategy config")


def estimate(op, top_k, hutchpp_matvecs, slq_steps, slq_runs, seed, phase):
    """Lanczos top-k and smallest, Hutch++ trace, SLQ density: (metrics, top, grid, density)."""
    n = int(op.shape[0])
    phase(f"Lanczos: the top {top_k} Hessian eigenvalues of {n} parameters")
    top, _, lanczos_matvecs = curvature.top_eigenvalues(op, top_k, tol=1e-8)
    phase("Lanczos: the smallest eigenvalue")
    low, _, _ = curvature.top_eigenvalues(op, 1, which="smallest", tol=1e-8)
    phase(f"Hutch++ trace estimate with {hutchpp_matvecs} Hessian-vector products")
    trace, trace_se = curvature.hutchpp(op, hutchpp_matvecs, seed=seed)
    phase(f"spectral density: {slq_runs} stochastic Lanczos runs of {slq_steps} steps")
    grid, density, _, _ = curvature.spectral_density(op, slq_steps, slq_runs, seed=seed)
    metrics = {"top_eigenvalues": top.tolist(), "min_eigenvalue": float(low[0]),
               "lanczos_hvps": lanczos_matvecs, "trace_hutchpp": trace,
               "trace_hutchpp_se": trace_se,
               "density_integral": float(np.trapezoid(density, grid))}
    return metrics, top, grid, density


def dense_checks(full_loss, params, H, seed):
    """The dense Hessian's eigenvalues and every HVP mode against H @ v."""
    eigvals = np.linalg.eigvalsh(((H + H.T) / 2).astype(np.float64))
    flat = lambda t: np.concatenate([np.ravel(a) for a in t])  # noqa: E731
    rng = np.random.default_rng(seed + 1)
    v = [tf.constant(rng.normal(size=p.shape), p.dtype) for p in params]
    dense_hv = H @ flat(v)
    metrics = {"eig_max": float(eigvals[-1]), "eig_min": float(eigvals[0]),
               "top5_eigenvalues": [float(e) for e in eigvals[::-1][:5]],
               "hessian_asymmetry": float(np.abs(H - H.T).max()),
               "exact_trace": float(np.trace(H))}
    for mode in hogrod.autodiff.HVP_MODES:
        hv = flat(hogrod.hvp(full_loss, params, v, mode=mode))
        metrics[f"hvp_rel_err_{mode}"] = float(np.linalg.norm(hv - dense_hv)
                                               / np.linalg.norm(dense_hv))
    return metrics, eigvals


def logistic_closed_form(x, p):
    """The mean logistic loss's Hessian in (kernel, bias): X~^T diag(p(1-p)) X~ / n."""
    X1 = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    return X1.T @ (X1 * (p * (1 - p))[:, None]) / x.shape[0]


@gin.configurable
def hessian_spectrum(output_dir, dim: harness.PositiveInt = 10,
                     hidden: tuple[harness.PositiveInt, ...] = (40, 40),
                     classes: harness.PositiveInt = 3, n_examples: harness.PositiveInt = 1024,
                     optimizer: str = "adam", batch_size: harness.PositiveInt = 128,
                     steps: harness.Count = 500, learning_rate: harness.Positive = 1e-2,
                     checkpoint_every: harness.PositiveInt = 100, dtype: str = "float32",
                     estimates: bool = True, top_k: harness.PositiveInt = 5,
                     hutchpp_matvecs: harness.PositiveInt = 150,
                     slq_steps: harness.PositiveInt = 80, slq_runs: harness.PositiveInt = 5,
                     layer=None, dense_check_max_params: harness.Count = 3000,
                     seed: harness.Count = 0):
    """Train a tanh MLP (`dim`-`hidden`-outputs; one logit and the logistic loss when
    `classes` is 2, else softmax cross-entropy), then measure its Hessian.

    Args:
      optimizer: "adam" (minibatches of `batch_size`, None: the whole set, under the gin
        strategy) or "gd" (full-batch gradient descent at `learning_rate`, one device).
      dtype: the data's and model's dtype; "float64" for the closed-form check.
      estimates: run Lanczos, Hutch++ and SLQ (density.png); False: the dense checks only.
      layer: restrict every estimate and check to this layer's parameters (per-layer
        variant; the output layer is named "head").
      dense_check_max_params: form the dense Hessian (hessian.png, exact eigenvalues, HVP
        checks) up to this many parameters.
    """
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    _check_args(classes, optimizer, dtype, batch_size, strategy)
    x, y = blobs(n_examples, dim, classes, seed, dtype)
    logistic = classes == 2
    with strategy.scope():
        model = dense_net((dim, *hidden, 1 if logistic else classes), "tanh", dtype=dtype,
                          head_name="head")
        opt = keras.optimizers.Adam(learning_rate) if optimizer == "adam" else None

    def loss(batch):
        xb, yb = batch
        return (binary_cross_entropy if logistic else cross_entropy)(yb, model(xb))

    if optimizer == "adam":
        step = train.make_train_step(loss, opt, model.trainable_variables, strategy=strategy)
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n_examples, seed=seed)
        data = data.repeat().batch(batch_size or n_examples)
        iterator = iter(distribute.distribute_dataset(strategy, data))
        ckpt = train.Checkpointer(output_dir, model=model, optimizer=opt, data=iterator)
    else:
        step = gd_step(loss, model.trainable_variables, learning_rate)
        iterator = iter(distribute.without_autotune(tf.data.Dataset.from_tensors((x, y)).repeat()))
        ckpt = train.Checkpointer(output_dir, model=model, data=iterator)
    harness.started(output_dir, ckpt)
    stats = {}
    logs = train.train_loop(step, iterator, steps, ckpt, output_dir,
                            checkpoint_every=checkpoint_every, stats=stats)

    params = (curvature.layer_params(model, layer) if layer else model.trainable_variables)
    full_loss = lambda: loss((x, y))  # noqa: E731
    value, grads = hogrod.value_and_grad(full_loss, params)
    metrics = {**stats, "steps": int(ckpt.step), "loss": float(value),
               "train_loss": logs.get("loss", float("nan")),
               "grad_norm": float(tf.linalg.global_norm(grads))}
    full = tf.data.Dataset.from_tensor_slices((x, y)).batch(256)  # the whole training set
    # under a strategy each batch's HVP is split over the replicas and all-reduced
    op = curvature.HessianOperator.from_objective(loss, params, full, dtype=tf.float64,
                                                  strategy=strategy)
    n = metrics["n_params"] = int(op.shape[0])
    phase = _Phases()
    if estimates:
        found, top, grid, density = estimate(op, top_k, hutchpp_matvecs, slq_steps,
                                             slq_runs, seed, phase)
        metrics.update(found)
    if n <= dense_check_max_params:
        phase(f"dense {n} x {n} Hessian, its eigenvalues and the HVP checks")
        H = hogrod.hessian(full_loss, params).numpy()
        checks, eigvals = dense_checks(full_loss, params, H, seed)
        metrics.update(checks)
        if estimates:
            exact = eigvals[::-1][:top_k]
            metrics.update(
                exact_top_eigenvalues=exact.tolist(),
                top_eigenvalue_max_rel_err=float(np.max(np.abs(top - exact) / np.abs(exact))),
                trace_error_in_se=float(abs(metrics["trace_hutchpp"] - np.trace(H))
                                        / max(metrics["trace_hutchpp_se"], 1e-30)))
        if logistic and not hidden:
            p = tf.sigmoid(model(x)[:, 0]).numpy()
            H_closed = logistic_closed_form(x.numpy(), p)
            metrics["closed_form_rel_err"] = float(np.linalg.norm(H - H_closed)
                                                   / np.linalg.norm(H_closed))
        phase("plotting the Hessian")
        plot_hessian(os.path.join(output_dir, "hessian.png"), H, eigvals)
    if estimates:
        phase("plotting the density")
        plot_density(os.path.join(output_dir, "density.png"), grid, density, top, n)
    phase(None)
    logging.info("hessian_spectrum: %s", {k: v for k, v in metrics.items()
                                          if not isinstance(v, list)})
    return metrics


def main():
    """The console command `hogrod-hessian-spectrum` (see the module docstring)."""
    harness.main(hessian_spectrum)


if __name__ == "__main__":
    main()
