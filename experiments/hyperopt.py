"""Learn per-feature L2 penalties of a softmax classifier on a validation loss.

Inner problem: multinomial logistic regression on scikit-learn's digits (64 pixel features,
10 classes) with a deliberately small training split, weights W [64, 10] and biases b [10],

    inner(W, b; s) = mean CE(train) + 0.5 sum_j exp(s_j) ||W_j||^2 + 0.5 bias_l2 ||b||^2,

one log-penalty s_j per input pixel. Outer problem: the mean cross-entropy on a validation
split, minimized over s by Adam (`hogrod.optim.adam`) with the hypergradient from
`hogrod.hypergrad.hypergradient` by the method the config binds
(`hyperopt_experiment.method = @hogrod.hypergrad.implicit()`, `@...unrolled()`,
`@...one_step()`; the Neumann series is `implicit` with `solve = @neumann_series()`):

    python -m experiments.hyperopt --gin_file=configs/hyperopt/digits_implicit.gin
    hogrod-hyperopt --gin_file=hyperopt/digits_unrolled.gin --output_dir=runs/unrolled

The inner weights are warm-started: each outer step starts the method from the weights
the previous one reached (`hyperopt_experiment.warm_start`).

At every outer step the run also solves the inner problem exactly (`exact_hypergradient`:
Newton's method in numpy float64, then a dense solve) and records, for the weights that
minimize the inner loss at the current penalties, the validation loss, test loss and test
accuracy, and for the method's hypergradient its cosine and relative error against the
exact one.

Outputs: metrics.json (final losses and accuracy, mean and smallest cosine to the exact
hypergradient), eval_history.json and TensorBoard events (every outer step), checkpoints
(re-using --output_dir resumes; a finished run re-evaluates), operative_config.gin,
loss.png (validation and test loss against outer steps), hypergradient.png (cosine and
relative error to the exact hypergradient along the run). `plot_compare`, or

    python -m experiments.hyperopt --compare OUT_DIR RUN_DIR [RUN_DIR ...]

draws several runs' curves in one figure (OUT_DIR/compare_loss.png,
compare_hypergradient.png).
"""

import json
import os
import re
import sys
import time

import gin
import matplotlib
import numpy as np
import scipy.linalg
import tensorflow as tf
import threadpoolctl
from absl import logging

from hogrod import checks, harness, hypergrad, optim, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


# ---- data ----------------------------------------------------------------------------------

@gin.configurable
def hyperopt_digits(seed, n_train=100, n_val=300, n_test=None):
    """scikit-learn's digits (shipped with the package, no download), pixels / 16, split at
    random into train (n_train), validation (n_val) and test (n_test; None: the rest).
    Returns {"train": (x, y), "val": (x, y), "test": (x, y)}, x float64, y int."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float64) / 16.0
    rest = len(x) - n_train - n_val
    if n_test is None:
        n_test = rest
    for name, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        checks.integer(value, f"hyperopt_digits.{name}", "hyperopt_digits", least=1)
    if n_test > rest:
        raise ValueError(f"hyperopt_digits: n_train + n_val + n_test = "
                         f"{n_train + n_val + n_test} exceeds the {len(x)} digits")
    order = np.random.default_rng(seed).permutation(len(x))
    cuts = np.cumsum([n_train, n_val, n_test])
    parts = np.split(order, cuts)[:3]
    return {name: (x[idx], y[idx]) for name, idx in zip(("train", "val", "test"), parts)}


def _check_data(data, where):
    if not isinstance(data, dict) or set(data) != {"train", "val", "test"}:
        raise TypeError(f"{where} must return a dict with keys train, val, test, got "
                        f"{type(data).__name__}{sorted(data) if isinstance(data, dict) else ''}")
    d = data["train"][0].shape[1]
    for name, (x, y) in data.items():
        if x.ndim != 2 or x.shape[1] != d or y.shape != (len(x),):
            raise ValueError(f"{where}: split {name} has x {x.shape} and y {y.shape}; every "
                             f"split needs x [n, {d}] and y [n]")
    return d, int(max(np.max(y) for _, y in data.values())) + 1


# ---- the exact hypergradient (numpy float64) -----------------------------------------------

def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _augment(x):
    return np.concatenate([x, np.ones((len(x), 1))], axis=1)


def _one_hot(y, classes):
    return np.eye(classes)[y]


def _ce(theta, xa, y):
    z = xa @ theta
    zmax = z.max(axis=1, keepdims=True)
    lse = zmax[:, 0] + np.log(np.exp(z - zmax).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(y)), y]))


def _penalties(log_l2, bias_l2):
    return np.append(np.exp(log_l2), bias_l2)


def _inner_value(theta, xa, y, pen):
    return _ce(theta, xa, y) + 0.5 * float(np.sum(pen[:, None] * theta ** 2))


def _inner_grad(theta, xa, y1h, pen):
    return xa.T @ (_softmax(xa @ theta) - y1h) / len(xa) + pen[:, None] * theta


def _inner_hessian(theta, xa, pen):
    """The dense Hessian of the inner loss in theta = [W; b] ([d + 1, c], flattened row
    major): (1/n) sum_i (diag p_i - p_i p_i^T) (x) x_i x_i^T plus the penalties."""
    p = _softmax(xa @ theta)
    c = p.shape[1]
    a = p[:, :, None] * np.eye(c)[None] - p[:, :, None] * p[:, None, :]
    h = np.einsum("ij,ikl,im->jkml", xa, a, xa, optimize=True) / len(xa)
    size = theta.size
    return h.reshape(size, size) + np.diag(np.repeat(pen, c))


def _one_blas_thread():
    # OpenBLAS's threads spin against TensorFlow's on a loaded CPU: a 650 x 650 Cholesky
    # takes 1 s with them, 20 ms without.
    return threadpoolctl.threadpool_limits(1, user_api="blas")


def solve_inner(log_l2, bias_l2, x, y, classes, theta0=None, tol=1e-11, maxiter=100):
    """The inner minimizer theta* = [W*; b*] ([d + 1, classes]) by Newton's method with a
    backtracking line search, to ||grad||_inf <= tol; an error if it is not reached."""
    with _one_blas_thread():
        return _newton(log_l2, bias_l2, x, y, classes, theta0, tol, maxiter)


def _newton(log_l2, bias_l2, x, y, classes, theta0, tol, maxiter):
    xa, y1h = _augment(x), _one_hot(y, classes)
    pen = _penalties(log_l2, bias_l2)
    theta = np.zeros((xa.shape[1], classes)) if theta0 is None else np.array(theta0)
    for _ in range(maxiter):
        g = _inner_grad(theta, xa, y1h, pen)
        if np.max(np.abs(g)) <= tol:
            return theta
        step = scipy.linalg.cho_solve(scipy.linalg.cho_factor(_inner_hessian(theta, xa, pen)),
                                      g.ravel()).reshape(theta.shape)
        f0, t = _inner_value(theta, xa, y, pen), 1.0
        slope = float(np.sum(g * step))
        # Armijo backtracking; the slack of a few ulps of f0 accepts the full step near the
        # optimum, where the decrease is below the rounding of f.
        slack = 64 * np.finfo(np.float64).eps * abs(f0)
        while _inner_value(theta - t * step, xa, y, pen) > f0 - 1e-4 * t * slope + slack \
                and t > 1e-10:
            t *= 0.5
        theta = theta - t * step
    raise ValueError(f"solve_inner: Newton's method did not reach ||grad||_inf <= {tol} in "
                     f"{maxiter} iterations (gradient {np.max(np.abs(g)):.3g}); the penalties "
                     f"exp(s) range over [{pen.min():.3g}, {pen.max():.3g}]")


def exact_hypergradient(log_l2, bias_l2, train_xy, val_xy, classes, theta0=None):
    """d val_loss(theta*(s)) / ds, exact up to rounding.

    Why exact: the inner loss is strictly convex in theta (the cross-entropy is convex and
    every weight carries a penalty exp(s_j) > 0 or bias_l2 > 0), so its minimizer
    theta*(s) is unique and the optimality condition g(theta*(s), s) = 0 holds identically
    in s; the implicit function theorem then gives d theta*/ds = -H^{-1} d_s g with H the
    (positive definite) inner Hessian. Newton's method reaches ||g||_inf <= 1e-11 (so theta*
    is exact to rounding, not truncated like an unroll), H is formed in closed form and the
    system is solved by a dense Cholesky factorization (no iterative truncation either).
    Since d g_{jk} / d s_j = exp(s_j) W_jk,

        dL_val/ds_j = -exp(s_j) sum_k W*_jk v_jk,   v = H^{-1} grad_theta L_val(theta*).

    Returns (hypergradient [d], theta* [d + 1, classes], validation loss at theta*).
    """
    log_l2 = np.asarray(log_l2, np.float64)
    (x, y), (xv, yv) = train_xy, val_xy
    d = x.shape[1]
    if log_l2.shape != (d,):
        raise ValueError(f"exact_hypergradient: log_l2 must have shape ({d},), one per "
                         f"feature, got {log_l2.shape}")
    theta = solve_inner(log_l2, bias_l2, x, y, classes, theta0)
    xva = _augment(xv)
    g_val = xva.T @ (_softmax(xva @ theta) - _one_hot(yv, classes)) / len(xv)
    with _one_blas_thread():
        h = _inner_hessian(theta, _augment(x), _penalties(log_l2, bias_l2))
        v = scipy.linalg.cho_solve(scipy.linalg.cho_factor(h), g_val.ravel())
    v = v.reshape(theta.shape)
    grads = -np.exp(log_l2) * np.sum(theta[:d] * v[:d], axis=1)
    return grads, theta, _ce(theta, xva, yv)


def evaluate(theta, xy):
    """(mean cross-entropy, accuracy) of the classifier theta = [W; b] on (x, y)."""
    xa = _augment(xy[0])
    return _ce(theta, xa, xy[1]), float(np.mean(np.argmax(xa @ theta, axis=1) == xy[1]))


# ---- the TensorFlow problem ----------------------------------------------------------------

def cross_entropy(y_true, logits):
    """Mean softmax cross-entropy of integer labels under logits [n, classes]."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y_true, logits=logits))


def make_objectives(train_xy, val_xy, bias_l2):
    """(inner, outer) as `hogrod.hypergrad` takes them: f([W, b], s) -> scalar."""
    x, y = tf.constant(train_xy[0]), tf.constant(train_xy[1], tf.int32)
    xv, yv = tf.constant(val_xy[0]), tf.constant(val_xy[1], tf.int32)

    def inner(params, log_l2):
        w, b = params
        penalty = tf.reduce_sum(tf.exp(log_l2)[:, None] * w * w)
        return (cross_entropy(y, tf.matmul(x, w) + b) + 0.5 * penalty
                + 0.5 * bias_l2 * tf.reduce_sum(b * b))

    def outer(params, log_l2):
        del log_l2  # the validation loss reads the penalties only through the weights
        w, b = params
        return cross_entropy(yv, tf.matmul(xv, w) + b)

    return inner, outer


def _init_log_l2(value, d):
    """The initial log-penalties [d] from one number or d numbers; an error naming the
    binding otherwise."""
    try:
        arr = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is not None and arr.ndim == 0:
        arr = np.full(d, float(arr))
    if arr is None or arr.shape != (d,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"hyperopt_experiment.init_log_l2 must be a finite number or a "
                         f"sequence of {d} finite numbers (one log-penalty per input feature), "
                         f"got {value!r}")
    return arr


def _cosine(a, b):
    """cos(a, b); 0 (no agreement) when a is zero, such as one_step's hypergradient at
    zero weights (exactly zero there: d_s of the gradient is exp(s) W = 0)."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if nb == 0:
        raise ValueError("the exact hypergradient is zero: the penalties do not affect the "
                         "validation loss; check hyperopt_experiment.data")
    return float(a @ b / (na * nb)) if na > 0 else 0.0


# ---- plots ---------------------------------------------------------------------------------

def _series(history, key):
    points = [h for h in history if key in h]
    return np.array([h["step"] for h in points]), np.array([h[key] for h in points], float)


def plot_losses(path, runs):
    """Validation and test loss against outer steps; `runs` is [(label, history)]."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "val_loss", "validation loss"),
                           (axes[1], "test_loss", "test loss")):
        for label, history in runs:
            ax.plot(*_series(history, key), label=label)
        ax.set_xlabel("outer step")
        ax.set_ylabel(f"{title} (at the exact inner solution)")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_hypergradients(path, runs):
    """Cosine and relative error of each run's hypergradient against the exact one."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, history in runs:
        axes[0].plot(*_series(history, "cosine_to_exact"), label=label)
        axes[1].plot(*_series(history, "rel_err_to_exact"), label=label)
    axes[0].set_ylabel("cosine(method, exact)")
    axes[1].set_ylabel("||method - exact|| / ||exact||")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("outer step")
        ax.legend()
    fig.suptitle("hypergradient against the exact one (implicit, Newton + dense solve)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _read_history(output_dir):
    path = os.path.join(output_dir, "eval_history.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"plot_compare: {path} does not exist; pass output dirs of "
                                "finished hyperopt runs")
    with open(path) as f:
        return json.load(f)


def plot_compare(output_dirs, out_dir):
    """One loss figure and one hypergradient figure (compare_loss.png,
    compare_hypergradient.png in `out_dir`) with the curves of every run in `output_dirs`,
    each labelled by its metrics.json's method."""
    if not output_dirs:
        raise ValueError("plot_compare: output_dirs is empty; pass hyperopt runs' dirs")
    runs = []
    for d in output_dirs:
        label = os.path.basename(os.path.normpath(d))
        metrics = os.path.join(d, "metrics.json")
        if os.path.exists(metrics):
            with open(metrics) as f:
                label = json.load(f).get("method", label)
        runs.append((label, _read_history(d)))
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "compare_loss.png"),
             os.path.join(out_dir, "compare_hypergradient.png")]
    plot_losses(paths[0], runs)
    plot_hypergradients(paths[1], runs)
    return paths


# ---- the experiment ------------------------------------------------------------------------

@gin.configurable
def hyperopt_experiment(output_dir, method=gin.REQUIRED, data=hyperopt_digits,
                        outer_steps: harness.Count = 100, outer_lr: harness.Positive = 0.05,
                        init_log_l2=-2.0, bias_l2: harness.NonNegative = 0.1,
                        warm_start: bool = True, checkpoint_every: harness.PositiveInt = 20,
                        seed: harness.Count = 0):
    """Minimize the validation loss over per-feature log L2 penalties (module docstring).

    Args:
      method: a `hogrod.hypergrad` method (gin: `@hogrod.hypergrad.implicit()`,
        `@hogrod.hypergrad.unrolled()`, `@hogrod.hypergrad.one_step()`).
      data: `data(seed) -> {"train", "val", "test": (x, y)}` (`@hyperopt_digits`).
      outer_steps, outer_lr: Adam steps on the log-penalties and their rate.
      init_log_l2: the initial log-penalty, one number or one per feature.
      bias_l2: the fixed penalty on the biases (> 0 keeps the inner problem strictly
        convex: the cross-entropy does not change when every bias moves alike).
      warm_start: start each hypergradient's inner problem from the weights the previous
        one reached (False: from zeros every time).
    """
    where = "hyperopt_experiment"
    if not isinstance(method, hypergrad.Method):
        raise ValueError(f"{where}.method must be a hogrod.hypergrad method "
                         "(@hogrod.hypergrad.implicit(), @hogrod.hypergrad.unrolled(), "
                         f"@hogrod.hypergrad.one_step(), with the parentheses), got {method!r}")
    checks.integer(outer_steps, f"{where}.outer_steps", where, least=1)
    # > 0 keeps the inner problem strictly convex
    checks.positive(bias_l2, f"{where}.bias_l2", where)
    splits = data(seed)
    d, classes = _check_data(splits, f"{where}.data")
    s0 = _init_log_l2(init_log_l2, d)

    log_l2 = tf.Variable(s0, name="log_l2")
    w = tf.Variable(tf.zeros([d, classes], tf.float64), name="w")
    b = tf.Variable(tf.zeros([classes], tf.float64), name="b")
    adam = optim.adam(outer_lr)
    state0 = adam.init(log_l2.read_value())
    count = tf.Variable(state0.count, name="adam_count")
    mu = tf.Variable(state0.mu, name="adam_mu")
    nu = tf.Variable(state0.nu, name="adam_nu")
    ckpt = train.Checkpointer(output_dir, log_l2=log_l2, w=w, b=b, adam_count=count,
                              adam_mu=mu, adam_nu=nu)
    start = harness.started(output_dir, ckpt)
    history = train.read_history(output_dir, start)
    inner, outer = make_objectives(splits["train"], splits["val"], float(bias_l2))

    @tf.function
    def outer_step():
        s = log_l2.read_value()
        params = [w.read_value(), b.read_value()] if warm_start else \
            [tf.zeros_like(w), tf.zeros_like(b)]
        hg = hypergrad.hypergradient(inner, outer, params, s, method)
        new_s, new_state = adam.update(hg.grads, optim.AdamState(count.read_value(),
                                                                 mu.read_value(),
                                                                 nu.read_value()), s)
        for var, value in ((log_l2, new_s), (count, new_state.count), (mu, new_state.mu),
                           (nu, new_state.nu), (w, hg.params[0]), (b, hg.params[1])):
            var.assign(value)
        return hg.value, hg.grads

    theta = None  # the last exact inner solution: Newton's warm start

    def evaluate_now(step):
        """The metrics of the exact inner solution at the current penalties, and the exact
        hypergradient there."""
        nonlocal theta
        exact, theta, val_loss = exact_hypergradient(log_l2.numpy(), bias_l2, splits["train"],
                                                     splits["val"], classes, theta)
        test_loss, test_acc = evaluate(theta, splits["test"])
        return {"step": step, "val_loss": val_loss, "test_loss": test_loss,
                "test_accuracy": test_acc, "mean_log_l2": float(np.mean(log_l2.numpy()))}, exact

    seconds = 0.0
    for i in range(start, outer_steps):
        result, exact = evaluate_now(i)
        t0 = time.perf_counter()
        try:  # the method's hypergradient at the same penalties
            value, grads = outer_step()
        except tf.errors.InvalidArgumentError as e:  # a failed check inside the graph
            found = re.search(r"assertion failed: \[(.*?)\]", e.message)
            raise ValueError(f"{where}: {method.name} failed at outer step {i}: "
                             f"{found.group(1) if found else e.message[:500]} (gin: the "
                             "method's bindings in configs/hyperopt/)") from None
        grads = grads.numpy()
        seconds += time.perf_counter() - t0
        if not np.all(np.isfinite(grads)):
            raise ValueError(f"{where}: the hypergradient of {method.name} at outer step {i} "
                             "is not finite; lower hyperopt_experiment.outer_lr or tune the "
                             "method's inner optimizer")
        result.update(method_val_loss=float(value), cosine_to_exact=_cosine(grads, exact),
                      rel_err_to_exact=float(np.linalg.norm(grads - exact)
                                             / np.linalg.norm(exact)),
                      hypergradient_norm=float(np.linalg.norm(grads)),
                      exact_norm=float(np.linalg.norm(exact)))
        train.record_eval(output_dir, history, result)
        ckpt.step.assign(i + 1)
        if (i + 1) % checkpoint_every == 0 or i + 1 == outer_steps:
            ckpt.save()
        if i % 10 == 0:
            logging.info("outer step %d: val %.4f test %.4f acc %.4f cos %.4f", i,
                         result["val_loss"], result["test_loss"], result["test_accuracy"],
                         result["cosine_to_exact"])
    final, _ = evaluate_now(outer_steps)
    train.record_eval(output_dir, history, final)
    plot_losses(os.path.join(output_dir, "loss.png"), [(method.name, history)])
    plot_hypergradients(os.path.join(output_dir, "hypergradient.png"),
                        [(method.name, history)])
    cosines = [h["cosine_to_exact"] for h in history if "cosine_to_exact" in h]
    rel = [h["rel_err_to_exact"] for h in history if "rel_err_to_exact" in h]
    return {"method": method.name, "outer_steps": outer_steps,
            "initial_val_loss": history[0]["val_loss"], "final_val_loss": final["val_loss"],
            "final_test_loss": final["test_loss"], "final_test_accuracy": final["test_accuracy"],
            "initial_test_accuracy": history[0]["test_accuracy"],
            "mean_cosine_to_exact": float(np.mean(cosines)),
            "min_cosine_to_exact": float(np.min(cosines)),
            "mean_rel_err_to_exact": float(np.mean(rel)),
            "hypergradient_seconds": seconds}


def _compare(args):
    if len(args) < 2:
        print("usage: python -m experiments.hyperopt --compare OUT_DIR RUN_DIR [RUN_DIR ...]",
              file=sys.stderr)
        return 2
    try:
        paths = plot_compare(args[1:], args[0])
    except (ValueError, FileNotFoundError) as e:
        print(f"hyperopt --compare: {e}", file=sys.stderr)
        return 2
    print("\n".join(paths))
    return 0


def main():
    """The console command `hogrod-hyperopt` (see the module docstring); `--compare OUT_DIR
    RUN_DIR...` as the first argument draws finished runs in one figure instead."""
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(_compare(sys.argv[2:]))
    harness.main(hyperopt_experiment)


if __name__ == "__main__":
    main()
