"""Influence functions on a small L2-regularized logistic regression, checked against
leave-one-out retraining in the same run.

For chosen test points it lists the most helpful and most harmful training examples by
I_up,loss (Koh and Liang 2017), and correlates the predicted change of each test loss when
a training example is removed (-I_up,loss / n) with the change measured by retraining
without it (scipy L-BFGS to gradient 1e-12).

    python -m experiments.influence --gin_file=configs/curvature/influence_logistic.gin

Outputs: metrics.json (Pearson r per test point, top helpful/harmful indices),
influence.png (predicted vs actual).
"""

import os

import gin
import keras
import matplotlib
import numpy as np
import scipy.optimize
import tensorflow as tf
from absl import logging

from hogrod import curvature, harness

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fit_logistic(x, y, l2, w0=None):
    def f(w):
        z = x @ w
        p = 1 / (1 + np.exp(-z))
        return (np.mean(np.logaddexp(0, z) - y * z) + 0.5 * l2 * w @ w,
                x.T @ (p - y) / len(y) + l2 * w)
    return scipy.optimize.minimize(f, np.zeros(x.shape[1]) if w0 is None else w0, jac=True,
                                   method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 0}).x


@gin.configurable
def influence_experiment(output_dir, n_train=200, dim=5, l2=0.01, test_points=(0, 1, 2),
                         n_test=50, top=5, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)
    x = rng.normal(size=(n_train + n_test, dim))
    y = (x @ w_true + rng.normal(size=len(x)) > 0).astype(np.float64)
    x_tr, y_tr, x_te, y_te = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    w = fit_logistic(x_tr, y_tr, l2)
    model = keras.Sequential([keras.Input((dim,), dtype="float64"),
                              keras.layers.Dense(1, use_bias=False, dtype="float64")])
    model.trainable_variables[0].assign(w[:, None])

    def per_example(yt, logits):
        return (tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(yt, logits.dtype), logits[:, 0])
                + 0.5 * l2 * tf.reduce_sum(model.trainable_variables[0] ** 2))

    chosen = list(test_points)
    infl = curvature.influence(model, per_example, (x_tr, y_tr), (x_te[chosen], y_te[chosen]))
    test_loss = lambda w_: np.logaddexp(0, x_te[chosen] @ w_) - y_te[chosen] * (  # noqa: E731
        x_te[chosen] @ w_)
    base = test_loss(w)
    logging.info("leave-one-out: refitting without each of the %d training examples", n_train)
    actual = np.stack([test_loss(fit_logistic(np.delete(x_tr, i, 0), np.delete(y_tr, i), l2, w))
                       - base for i in range(n_train)], axis=1)
    predicted = -infl / n_train
    metrics = {"n_train": n_train, "pearson": [], "most_helpful": [], "most_harmful": []}
    fig, axes = plt.subplots(1, len(chosen), figsize=(4 * len(chosen), 4), squeeze=False)
    for j, t in enumerate(chosen):
        r = float(np.corrcoef(predicted[j], actual[j])[0, 1])
        metrics["pearson"].append(r)
        order = np.argsort(infl[j])
        metrics["most_helpful"].append(order[:top].tolist())    # most negative I_up,loss
        metrics["most_harmful"].append(order[::-1][:top].tolist())
        ax = axes[0, j]
        ax.scatter(actual[j], predicted[j], s=8)
        lim = np.abs(np.concatenate([actual[j], predicted[j]])).max()
        ax.plot([-lim, lim], [-lim, lim], "k:", lw=0.8)
        ax.set_title(f"test point {t}: r = {r:.4f}")
        ax.set_xlabel("actual change (leave-one-out retraining)")
        ax.set_ylabel("predicted (-I_up,loss / n)")
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "influence.png"), dpi=90)
    plt.close(fig)
    metrics["min_pearson"] = min(metrics["pearson"])
    return metrics


def main():
    """The console command `hogrod-influence` (see the module docstring)."""
    harness.main(influence_experiment)


if __name__ == "__main__":
    main()
