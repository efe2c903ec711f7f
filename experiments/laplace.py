"""Laplace approximations (`hogrod.curvature.Laplace`) on laplace-torch's documented examples.

1. Sinusoid regression, laplace-torch's regression example (docs/regression_example.md,
   examples/regression_example.py): X ~ U(0, 8), y = sin(X) + N(0, 0.3^2), 150 points; an
   MLP 1-50-tanh-1 (PyTorch's default initialization) trained full-batch with Adam (lr 1e-2,
   1000 steps); then all-weights and last-layer Laplace with the full Hessian, the prior
   precision and the noise tuned by the evidence (Adam on their logs from log = 1, lr 0.1,
   1000 steps, as the example), for each data seed of `seeds`. laplace-torch reports
   sigma ~ 0.28 and a prior precision ~ 0.10 (all weights, its one draw). predictive.png:
   the data and the linearized predictive mean with +-2 standard deviations (functional
   variance + sigma^2) on [-5, 13], first seed.
2. Calibration on scikit-learn's digits (8x8, 10 classes): an MLP 64-`hidden`-10 trained
   with Adam; accuracy, NLL and ECE (15 bins) on a held-out test split for the MAP softmax
   and for last-layer Laplace (K-FAC, hessian="kron", and full; the prior precision tuned by the evidence
   and by grid search on a validation split, laplace-torch's two methods; the probit
   predictive, laplace-torch's default). calibration.png: reliability diagrams.

    python -m experiments.laplace --gin_file=configs/laplace/sinusoid_digits.gin

Outputs: metrics.json, operative_config.gin, predictive.png, calibration.png.
"""

import math
import os

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import curvature, harness

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402



def torch_dense(width, fan_in, activation=None, dtype="float64"):
    """A Dense layer initialized as torch.nn.Linear: kernel and bias ~ U(+-1/sqrt(fan_in))."""
    bound = 1 / math.sqrt(fan_in)
    return keras.layers.Dense(width, activation=activation, dtype=dtype,
                              kernel_initializer=keras.initializers.RandomUniform(-bound, bound),
                              bias_initializer=keras.initializers.RandomUniform(-bound, bound))


def sinusoid(n, noise, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 8, size=(n, 1))
    return x, np.sin(x) + noise * rng.normal(size=(n, 1))


def train(model, loss, x, y, steps, learning_rate, batch_size, seed):
    """Adam on minibatches (`batch_size` None: the whole set each step)."""
    opt = keras.optimizers.Adam(learning_rate)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, model(xb, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return value

    rng = np.random.default_rng(seed)
    n = len(x)
    for _ in range(steps):
        idx = slice(None) if batch_size is None else rng.choice(n, batch_size, replace=False)
        value = step(tf.constant(x[idx]), tf.constant(y[idx]))
    return float(value)


def regression_fit(n, noise, hidden, steps, learning_rate, hyper_steps, hyper_lr, seed):
    """One data draw and training run; (metrics, data, {subset: fitted Laplace})."""
    keras.utils.set_random_seed(seed)
    x, y = sinusoid(n, noise, seed)
    model = keras.Sequential([keras.Input((1,), dtype="float64"),
                              torch_dense(hidden, 1, "tanh"), torch_dense(1, hidden)])
    mse = keras.losses.MeanSquaredError(dtype="float64")
    final_loss = train(model, mse, x, y, steps, learning_rate, None, seed)
    metrics, fitted = {"train_rmse": math.sqrt(final_loss)}, {}
    for subset in ("all", "last_layer"):
        la = curvature.Laplace(model, "regression", subset, "full").fit(
            (tf.constant(x), tf.constant(y)))
        found = la.optimize_prior_precision(
            steps=hyper_steps, lr=hyper_lr, init_prior_prec=math.e, optimize_sigma_noise=True,
            init_sigma_noise=math.e)
        metrics[subset] = {**found, "n_params": la.n_params}
        fitted[subset] = la
        logging.info("regression seed %d, %s weights: sigma=%.3f prior precision=%.3f", seed,
                     subset, found["sigma_noise"], found["prior_precision"])
    return metrics, (x, y), fitted


def regression(output_dir, n, noise, hidden, steps, learning_rate, hyper_steps, hyper_lr,
               seeds):
    runs = []
    for seed in seeds:
        metrics, (x, y), fitted = regression_fit(n, noise, hidden, steps, learning_rate,
                                                 hyper_steps, hyper_lr, seed)
        runs.append(metrics)
        if seed == seeds[0]:
            plot_regression(os.path.join(output_dir, "predictive.png"), x, y, fitted)
    summary = {"runs": runs, "seeds": list(seeds)}
    for subset in ("all", "last_layer"):
        for key in ("sigma_noise", "prior_precision"):
            values = np.array([r[subset][key] for r in runs])
            summary[f"{subset}_{key}_mean"] = float(values.mean())
            summary[f"{subset}_{key}_sd"] = float(values.std(ddof=1)) if len(runs) > 1 else 0.0
    summary["train_rmse_mean"] = float(np.mean([r["train_rmse"] for r in runs]))
    return summary


def plot_regression(path, x, y, fitted):
    x_test = np.linspace(-5, 13, 500)[:, None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (subset, la) in zip(axes, fitted.items()):
        mean, var = la.predictive(tf.constant(x_test), observation_noise=True)
        mu, sd = mean.numpy()[:, 0], np.sqrt(var.numpy()[:, 0, 0])
        ax.scatter(x[:, 0], y[:, 0], s=8, c="k", label="data")
        ax.plot(x_test[:, 0], mu, label="MAP mean")
        ax.fill_between(x_test[:, 0], mu - 2 * sd, mu + 2 * sd, alpha=0.3,
                        label="+-2 sd (with noise)")
        ax.set_title(f"{subset}: sigma={la.sigma_noise:.3f}, prior prec="
                     f"{la.prior_precision:.3f}")
        ax.set_ylim(-4, 4)
        ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def calibration_metrics(probs, labels, bins=15):
    """accuracy, NLL (mean), ECE (equal-width confidence bins) and the reliability curve."""
    conf, pred = probs.max(1), probs.argmax(1)
    correct = (pred == labels).astype(np.float64)
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1]), 0, bins - 1)
    ece, curve = 0.0, []
    for b in range(bins):
        mask = which == b
        if mask.any():
            ece += mask.mean() * abs(correct[mask].mean() - conf[mask].mean())
            curve.append((conf[mask].mean(), correct[mask].mean()))
    nll = -np.mean(np.log(np.maximum(probs[np.arange(len(labels)), labels], 1e-300)))
    return {"accuracy": float(correct.mean()), "nll": float(nll), "ece": float(ece)}, curve


def classification(output_dir, hidden, steps, learning_rate, batch_size, val_fraction,
                   test_fraction, hessians, hyper_steps, hyper_lr, seed):
    from sklearn.datasets import load_digits
    keras.utils.set_random_seed(seed)
    x, y = load_digits(return_X_y=True)
    x, y = x / 16.0, y.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test, n_val = int(round(test_fraction * len(x))), int(round(val_fraction * len(x)))
    test, val, tr = perm[:n_test], perm[n_test:n_test + n_val], perm[n_test + n_val:]
    model = keras.Sequential([keras.Input((64,), dtype="float64"),
                              keras.layers.Dense(hidden, activation="relu", dtype="float64"),
                              keras.layers.Dense(10, dtype="float64")])
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    train(model, sce, x[tr], y[tr], steps, learning_rate, batch_size, seed)
    x_test = tf.constant(x[test])
    results, curves = {}, {}
    results["map"], curves["map"] = calibration_metrics(
        tf.nn.softmax(model(x_test)).numpy(), y[test])
    train_data = tf.data.Dataset.from_tensor_slices((x[tr], y[tr])).batch(256)
    for hessian in hessians:
        la = curvature.Laplace(model, "classification", "last_layer", hessian).fit(train_data)
        for method in ("marglik", "gridsearch"):
            if method == "marglik":
                found = la.optimize_prior_precision(steps=hyper_steps, lr=hyper_lr)
            else:
                found = la.optimize_prior_precision(
                    "gridsearch", val_data=(tf.constant(x[val]), tf.constant(y[val])))
            probs = la.predictive(x_test, link_approx="probit").numpy()
            name = f"last_layer_{hessian}_{method}"
            results[name], curves[name] = calibration_metrics(probs, y[test])
            results[name]["prior_precision"] = found["prior_precision"]
            logging.info("digits, %s: %s", name, results[name])
    results["split"] = {"train": len(tr), "val": len(val), "test": len(test)}
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    for name, curve in curves.items():
        c = np.array(curve)
        ax.plot(c[:, 0], c[:, 1], "o-", ms=3,
                label=f"{name} (ECE {results[name]['ece']:.3f})")
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title("digits, held-out reliability (probit predictive)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "calibration.png"), dpi=90)
    plt.close(fig)
    return results


@gin.configurable
def laplace_experiment(output_dir, n: harness.PositiveInt = 150,
                       noise: harness.NonNegative = 0.3, hidden: harness.PositiveInt = 50,
                       steps: harness.Count = 1000, learning_rate: harness.Positive = 1e-2,
                       hyper_steps: harness.Count = 1000, hyper_lr: harness.Positive = 0.1,
                       seeds: tuple[harness.Count, ...] = (0,),
                       digits_hidden: harness.PositiveInt = 64, digits_steps: harness.Count = 2000,
                       digits_learning_rate: harness.Positive = 1e-3,
                       digits_batch_size: harness.PositiveInt = 64,
                       val_fraction: harness.Fraction = 0.15,
                       test_fraction: harness.Fraction = 0.3,
                       digits_hessians: tuple[str, ...] = ("kron", "full"),
                       digits_hyper_steps: harness.Count = 100,
                       digits_hyper_lr: harness.Positive = 0.1, seed: harness.Count = 0):
    """The sinusoid regression for each of `seeds` (n points, noise sd, `hidden` tanh
    units, `steps` of Adam at `learning_rate`, `hyper_steps` of Adam at `hyper_lr` on the
    log hyperparameters; the first seed is plotted) and the digits calibration (`digits_*`;
    the Laplace Hessians in `digits_hessians`, the prior precision by the evidence and by
    grid search on the validation split; `seed` draws the split and the network)."""
    for name, value in (("n", n), ("hidden", hidden), ("steps", steps),
                        ("hyper_steps", hyper_steps), ("digits_hidden", digits_hidden),
                        ("digits_steps", digits_steps), ("digits_hyper_steps", digits_hyper_steps),
                        ("digits_batch_size", digits_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"laplace_experiment.{name} must be a positive int, got {value!r}")
    if not (0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1):
        raise ValueError(f"laplace_experiment.val_fraction and test_fraction must be positive "
                         f"with a sum below 1, got {val_fraction}, {test_fraction}")
    hessians = curvature.laplace.HESSIANS
    if not digits_hessians or any(h not in hessians for h in digits_hessians):
        raise ValueError(f"laplace_experiment.digits_hessians must be a non-empty tuple of "
                         f"{hessians}, got {digits_hessians!r}")
    if not seeds or not all(isinstance(s_, int) for s_ in seeds):
        raise ValueError(f"laplace_experiment.seeds must be a non-empty tuple of ints, got "
                         f"{seeds!r}")
    harness.started(output_dir)
    metrics = {"regression": regression(output_dir, n, noise, hidden, steps, learning_rate,
                                        hyper_steps, hyper_lr, tuple(seeds))}
    metrics["digits"] = classification(output_dir, digits_hidden, digits_steps,
                                       digits_learning_rate, digits_batch_size, val_fraction,
                                       test_fraction, tuple(digits_hessians),
                                       digits_hyper_steps, digits_hyper_lr, seed)
    logging.info("laplace_experiment: %s", metrics)
    return metrics


def main():
    """The console command `hogrod-laplace`."""
    harness.main(laplace_experiment)


if __name__ == "__main__":
    main()
