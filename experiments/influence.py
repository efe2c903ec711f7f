"""Influence functions on a small L2-regularized logistic regression, checked against
leave-one-out retraining in the same run.

For chosen test points it lists the most helpful and most harmful training examples by
I_up,loss (Koh and Liang 2017), and correlates the predicted change of each test loss when
a training example is removed (-I_up,loss / n) with the change measured by retraining
without it (scipy L-BFGS to gradient 1e-12).

    python -m experiments.influence --gin_file=configs/curvature/influence_logistic.gin

Outputs: metrics.json (Pearson r per test point, top helpful/harmful indices),
influence.png (predicted vs actual).

With `influence_experiment.study = @digits_influence_study` (configs/curvature/
influence_digits.gin) it compares attribution methods, each given BY REFERENCE in
`digits_influence_study.methods` (`@exact_influence_method`, `@ekfac_influence_method`,
`@tracin_method`), on a small tanh MLP classifying scikit-learn's digits (float64):

- leave-one-out: Pearson/Spearman r between each method's scores and the test-loss change
  measured by retraining without each of the examples some method ranks most influential;
- LDS (Park et al. 2023) over random 50% subsets, each retrained;
- mislabel detection: 10% of the training labels flipped, the fraction of them among the
  top 10% / 20% of the (retrained) model's training set by self-influence.

Training is SGD (checkpoints every few epochs, the TracIn checkpoints) then full-batch
L-BFGS to a tight optimum (the point the influence functions linearize at); every
retraining restarts L-BFGS from that optimum. The loss of an example, train or test, is the
training objective per example (cross-entropy + 0.5 * l2 * |theta|^2).

    python -m experiments.influence --gin_file=configs/curvature/influence_digits.gin
"""

import types

import os

import gin
import keras
import matplotlib
import numpy as np
import scipy.optimize
import scipy.stats
import tensorflow as tf
import threadpoolctl
from absl import logging

from hogrod import curvature, harness, tree

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
def influence_experiment(output_dir, n_train: harness.PositiveInt = 200,
                         dim: harness.PositiveInt = 5, l2: harness.NonNegative = 0.01,
                         test_points: tuple[harness.Count, ...] = (0, 1, 2),
                         n_test: harness.PositiveInt = 50, top: harness.PositiveInt = 5,
                         seed: harness.Count = 0, study=None):
    """study: None (the logistic regression above) or a study `fn(output_dir) -> metrics`
    given by reference (e.g. @digits_influence_study), with its own bindings."""
    if study is not None:
        if not callable(study):
            raise ValueError("influence_experiment.study must be a study given by reference "
                             f"(e.g. @digits_influence_study), got {study!r}")
        harness.started(output_dir)
        return study(output_dir)
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
    harness.started(output_dir)
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

# ------------------------------------------------------------------ digits: methods compared

def _trainer(model, x, y, l2):
    """A compiled (loss, gradient) of the weighted training objective at a flat theta:
    sum_i w_i ce_i / sum_i w_i + 0.5 * l2 * |theta|^2 (w = 0 drops an example)."""
    params = model.trainable_variables
    x, y = tf.constant(x), tf.constant(y)

    @tf.function(reduce_retracing=True)
    def value_and_grad(theta, weights):
        for v, t in zip(params, tree.unflatten(theta, params)):
            v.assign(t)
        with tf.GradientTape() as tape:
            ce = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=False))
            value = (tf.reduce_sum(weights * ce) / tf.reduce_sum(weights)
                     + 0.5 * l2 * tf.add_n([tf.reduce_sum(v ** 2) for v in params]))
        return value, tree.flatten(tape.gradient(value, params))

    def fn(theta, weights):
        value, grad = value_and_grad(tf.constant(theta), tf.constant(weights))
        return float(value), grad.numpy()
    return fn


def _lbfgs(fn, theta, weights, gtol, maxiter):
    res = scipy.optimize.minimize(fn, theta, args=(weights,), jac=True, method="L-BFGS-B",
                                  options={"gtol": gtol, "ftol": 0, "maxiter": maxiter})
    return res.x


def _train(model, x, y, l2, epochs, batch_size, learning_rate, checkpoint_every, gtol, maxiter,
           rng):
    """SGD (checkpoints every `checkpoint_every` epochs) then L-BFGS; the model holds theta*."""
    fn = _trainer(model, x, y, l2)
    theta = tree.flatten(model.trainable_variables).numpy()
    n = len(y)
    checkpoints = []
    for epoch in range(epochs):
        order = rng.permutation(n)
        for s in range(0, n, batch_size):
            weights = np.zeros(n)
            weights[order[s:s + batch_size]] = 1.0
            theta = theta - learning_rate * fn(theta, weights)[1]
        if (epoch + 1) % checkpoint_every == 0:
            fn(theta, np.ones(n))  # assigns theta to the model
            checkpoints.append(model.get_weights())
    theta = _lbfgs(fn, theta, np.ones(n), gtol, maxiter)
    fn(theta, np.ones(n))
    return fn, theta, checkpoints


@gin.configurable
def exact_influence_method(run, test=None, damping=1e-3):
    """I_up,loss with the exact Hessian (CG), or the self-influence (dense Hessian)."""
    if test is None:
        return curvature.self_influence(curvature.influence, run.model, run.loss, run.train,
                                        damping=damping)
    return curvature.influence(run.model, run.loss, run.train, test, damping=damping)


@gin.configurable
def ekfac_influence_method(run, test=None, damping=1e-3):
    """I_up,loss with EK-FAC of the Gauss-Newton matrix; the l2 regularizer's curvature is
    added to `damping` (the factors see only the cross-entropy)."""
    kw = dict(damping=run.l2 + damping, operator=run.ekfac)
    if test is None:
        return curvature.self_influence(curvature.ekfac_influence, run.model, run.loss,
                                        run.train, **kw)
    return curvature.ekfac_influence(run.model, run.loss, run.train, test, **kw)


@gin.configurable
def tracin_method(run, test=None):
    """TracIn over the SGD checkpoints, negated to I_up,loss's sign (positive = harmful)."""
    kw = dict(checkpoints=run.checkpoints, learning_rates=run.learning_rates)
    if test is None:
        return curvature.self_influence(curvature.tracin, run.model, run.loss, run.train, **kw)
    return -curvature.tracin(run.model, run.loss, run.train, test, **kw)


def _digits_run(x, y, hidden, l2, train_args, seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((x.shape[1],), dtype="float64"),
                              keras.layers.Dense(hidden, activation="tanh", dtype="float64"),
                              keras.layers.Dense(10, dtype="float64")])

    def loss(yt, logits):  # the training objective per example
        return (tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(yt, tf.int32), logits)
                + 0.5 * l2 * tf.add_n([tf.reduce_sum(v ** 2) for v in model.trainable_variables]))

    fn, theta, checkpoints = _train(model, x, y, l2, rng=np.random.default_rng(seed),
                                    **train_args)
    # the EK-FAC factors of the cross-entropy, fitted once; each method adds its damping
    ekfac = curvature.EKFACOperator(
        model, keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64"),
        (x, y))
    return types.SimpleNamespace(
        model=model, loss=loss, train=(x, y), l2=l2, fn=fn, theta=theta, ekfac=ekfac,
        checkpoints=checkpoints,
        learning_rates=[train_args["learning_rate"]] * len(checkpoints))


def _objective_at(run, theta, x, y):
    """Per-example objective (ce + 0.5 l2 |theta|^2) of (x, y) at theta."""
    run.fn(theta, np.ones(len(run.train[1])))  # assigns theta
    out = run.loss(tf.constant(y), run.model(tf.constant(x))).numpy()
    run.fn(run.theta, np.ones(len(run.train[1])))
    return out


def _retrainer(run, x_test, y_test, gtol, maxiter):
    n = len(run.train[1])

    def retrain(indices):
        weights = np.zeros(n)
        weights[indices] = 1.0
        theta = _lbfgs(run.fn, run.theta, weights, gtol, maxiter)
        return _objective_at(run, theta, x_test, y_test)
    return retrain


def _name(method):
    return getattr(method, "__name__", repr(method)).replace("_method", "")


@gin.configurable
def digits_influence_study(output_dir, methods=gin.REQUIRED, n_train=300, n_test=200,
                           hidden=16, l2=1e-3, epochs=30, batch_size=32, learning_rate=0.2,
                           checkpoint_every=5, gtol=1e-8, maxiter=3000, loo_test_points=(0, 1, 2),
                           loo_top=8, lds_test_points=10, lds_subsets=20, lds_fraction=0.5,
                           flip_fraction=0.1, seed=0):
    """Exact-Hessian influence, EK-FAC influence and TracIn (the `methods`, by reference)
    against leave-one-out retraining, LDS and mislabel detection on scikit-learn's digits."""
    # scipy's L-BFGS on small vectors with multi-threaded BLAS beside TF's threads runs ~10x
    # slower on a few cores: one BLAS thread
    with threadpoolctl.threadpool_limits(1):
        return _digits_study(output_dir, methods, n_train, n_test, hidden, l2, epochs,
                             batch_size, learning_rate, checkpoint_every, gtol, maxiter,
                             loo_test_points, loo_top, lds_test_points, lds_subsets,
                             lds_fraction, flip_fraction, seed)


def _digits_study(output_dir, methods, n_train, n_test, hidden, l2, epochs, batch_size,
                  learning_rate, checkpoint_every, gtol, maxiter, loo_test_points, loo_top,
                  lds_test_points, lds_subsets, lds_fraction, flip_fraction, seed):
    import sklearn.datasets
    if not methods or not all(callable(m) for m in methods):
        raise ValueError("digits_influence_study.methods must be a tuple of methods by "
                         "reference, e.g. (@exact_influence_method, @tracin_method)")
    data = sklearn.datasets.load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data.target))
    if n_train + n_test > len(order):
        raise ValueError(f"digits_influence_study: n_train + n_test = {n_train + n_test} but "
                         f"digits has {len(order)} examples")
    x, y = data.data[order] / 16.0, data.target[order].astype(np.int64)
    x_tr, y_tr, x_te, y_te = x[:n_train], y[:n_train], x[n_train:n_train + n_test], y[
        n_train:n_train + n_test]
    train_args = dict(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                      checkpoint_every=checkpoint_every, gtol=gtol, maxiter=maxiter)
    run = _digits_run(x_tr, y_tr, hidden, l2, train_args, seed)
    names = [_name(m) for m in methods]
    logits = run.model(tf.constant(x_te)).numpy()
    metrics = {"n_train": n_train, "n_params": int(run.theta.size),
               "test_accuracy": float(np.mean(logits.argmax(1) == y_te)),
               "checkpoints": len(run.checkpoints), "methods": names}

    # leave-one-out on the examples some method ranks most influential
    loo = list(loo_test_points)
    test = (x_te[loo], y_te[loo])
    scores = {nm: m(run, test) for nm, m in zip(names, methods)}
    cand = sorted({int(i) for s in scores.values() for row in s
                   for i in np.argsort(-np.abs(row))[:loo_top]})
    logging.info("leave-one-out: %d retrainings", len(cand))
    retrain = _retrainer(run, *test, gtol, maxiter)
    base = retrain(np.arange(n_train))
    actual = np.stack([retrain(np.delete(np.arange(n_train), i)) - base for i in cand], 1)
    fig, axes = plt.subplots(len(names), len(loo), figsize=(3.5 * len(loo), 3.2 * len(names)),
                             squeeze=False)
    for r, nm in enumerate(names):
        pred = -scores[nm][:, cand] / n_train  # removing z changes the loss by -I_up,loss / n
        metrics[f"loo_pearson_{nm}"] = [float(np.corrcoef(p, a)[0, 1])
                                        for p, a in zip(pred, actual)]
        metrics[f"loo_spearman_{nm}"] = [float(scipy.stats.spearmanr(p, a).statistic)
                                         for p, a in zip(pred, actual)]
        for j in range(len(loo)):
            ax = axes[r, j]
            ax.scatter(actual[j], pred[j], s=8)
            ax.set_title(f"{nm}, test {loo[j]}: r={metrics[f'loo_pearson_{nm}'][j]:.3f}",
                         fontsize=9)
            ax.set_xlabel("actual change (retrained)", fontsize=8)
            ax.set_ylabel("predicted (-score / n)", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "influence_digits_loo.png"), dpi=80)
    plt.close(fig)
    metrics["loo_retrainings"] = len(cand)

    # LDS over random subsets
    lds_pts = np.arange(lds_test_points)
    test = (x_te[lds_pts], y_te[lds_pts])
    logging.info("LDS: %d retrainings on %.0f%% subsets", lds_subsets, 100 * lds_fraction)
    subsets, losses = curvature.subset_retraining(_retrainer(run, *test, gtol, maxiter),
                                                  n_train, lds_subsets, lds_fraction, seed)
    for nm, m in zip(names, methods):
        metrics[f"lds_{nm}"] = curvature.linear_datamodeling_score(m(run, test), subsets, losses)

    # mislabel detection: flip a fraction of the labels, retrain, rank by self-influence
    flip_rng = np.random.default_rng(seed + 1)
    flipped = np.sort(flip_rng.choice(n_train, int(round(flip_fraction * n_train)), False))
    y_flip = y_tr.copy()
    y_flip[flipped] = (y_tr[flipped] + flip_rng.integers(1, 10, len(flipped))) % 10
    noisy = _digits_run(x_tr, y_flip, hidden, l2, train_args, seed)
    train_loss = noisy.loss(tf.constant(y_flip), noisy.model(tf.constant(x_tr))).numpy()
    for nm, m in [("train_loss", lambda run_, test_: train_loss)] + list(zip(names, methods)):
        rates = curvature.mislabel_detection_rate(m(noisy, None), flipped, (0.1, 0.2))
        metrics[f"mislabel_top10_{nm}"], metrics[f"mislabel_top20_{nm}"] = rates[0.1], rates[0.2]
    return metrics


def main():
    """The console command `hogrod-influence` (see the module docstring)."""
    harness.main(influence_experiment)


if __name__ == "__main__":
    main()
