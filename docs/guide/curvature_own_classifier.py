"""Curvature questions on your own classifier: top Hessian eigenvalues (Lanczos, power
iteration), the trace (Hutch++), the spectral density (SLQ), and influence functions.

    python docs/guide/curvature_own_classifier.py            # 2-32-32-3 MLP, 600 examples
    python docs/guide/curvature_own_classifier.py --quick    # 2-16-3 MLP, 120 examples

Every estimate is compared with the dense Hessian (`hogrod.hessian`) and numpy: the model
is small enough for that, which is how to trust the matrix-free tools on the big one.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
from hogrod import curvature  # noqa: E402


def blobs(n, seed=0, n_classes=3):
    rng = np.random.default_rng(seed)
    centers = 2.0 * rng.normal(size=(n_classes, 2))
    labels = rng.integers(0, n_classes, n)
    x = centers[labels] + rng.normal(size=(n, 2))
    return tf.constant(x), tf.constant(labels, tf.int32)


def make_classifier(hidden):
    layers = [keras.Input((2,), dtype="float64")]
    layers += [keras.layers.Dense(h, activation="tanh", dtype="float64") for h in hidden]
    return keras.Sequential(layers + [keras.layers.Dense(3, dtype="float64", name="head")])


def per_example_ce(y_true, logits):  # [batch]: influence needs per-example losses
    return tf.nn.sparse_softmax_cross_entropy_with_logits(y_true, logits)


def main(quick=False):
    keras.utils.set_random_seed(0)
    n, hidden, steps = (120, (16,), 150) if quick else (600, (32, 32), 1500)
    x, y = blobs(n)
    model = make_classifier(hidden)
    mean_loss = lambda batch: tf.reduce_mean(per_example_ce(batch[1], model(batch[0])))  # noqa

    train_step = hogrod.train.make_train_step(
        mean_loss, keras.optimizers.Adam(0.01), model.trainable_variables)
    for _ in range(steps):
        logs = train_step((x, y))

    params = model.trainable_variables
    H = hogrod.hessian(lambda: mean_loss((x, y)), params).numpy()  # the dense oracle
    exact = np.linalg.eigvalsh(H)[::-1]                             # largest first

    # A LinearOperator on flat vectors (every param, flattened, in list order).
    op = curvature.HessianOperator.from_objective(mean_loss, params, (x, y), dtype=tf.float64)
    assert op.shape == (H.shape[0], H.shape[0])

    # top_eigenvalues -> (eigenvalues [k] numpy, eigenvectors [n, k] numpy, matvecs)
    values, vectors, matvecs = curvature.top_eigenvalues(op, k=3)
    assert vectors.shape == (H.shape[0], 3)
    assert np.allclose(values, exact[:3], rtol=1e-5), (values, exact[:3])
    assert np.allclose(H @ vectors, vectors * values, atol=1e-4 * abs(values[0]))
    # power iteration finds the largest |eigenvalue|
    p_values, _, p_matvecs = curvature.top_eigenvalues(op, k=1, method="power")
    top_magnitude = exact[np.argmax(np.abs(exact))]
    assert abs(p_values[0] - top_magnitude) <= 1e-4 * abs(top_magnitude)
    low, _, low_matvecs = curvature.top_eigenvalues(op, k=1, which="smallest")  # most negative
    assert abs(low[0] - exact[-1]) <= 1e-4 * abs(exact[0])

    # hutchpp / hutchinson -> (estimate, standard error)
    trace, stderr = curvature.hutchpp(op, num_matvecs=90)
    assert abs(trace - np.trace(H)) <= max(4 * stderr, 1e-6 * abs(np.trace(H)))

    # spectral_density -> (grid, density on the grid, Lanczos nodes, their weights)
    grid, density, nodes, weights = curvature.spectral_density(op, steps=30, num_runs=3)
    assert abs(np.trapezoid(density, grid) - 1.0) < 1e-3 and abs(weights.sum() - 1.0) < 1e-9
    assert nodes.max() <= exact[0] * (1 + 1e-6) and nodes.min() >= exact[-1] - 1e-6 * exact[0]

    # Gauss-Newton: positive semi-definite for cross-entropy on logits
    gn = curvature.GaussNewtonOperator.from_output_loss(
        lambda b: model(b[0]), lambda z, b: tf.reduce_mean(per_example_ce(b[1], z)), params,
        (x, y), dtype=tf.float64)
    G = gn.to_dense().numpy()                     # n products: fine for a small model
    gn_exact = np.linalg.eigvalsh(G)
    assert gn_exact[0] > -1e-10 * gn_exact[-1]
    gn_top, _, _ = curvature.top_eigenvalues(gn, k=1)
    assert abs(gn_top[0] - gn_exact[-1]) <= 1e-5 * gn_exact[-1]

    # influence: [n_test, n_train] of -grad L(test)^T (H + damping I)^-1 grad L(train), on
    # the head's weights (convex there; damping keeps the solve positive definite)
    head = curvature.layer_params(model, "head")
    x_test, y_test = blobs(4, seed=1)
    damping = 1e-3
    scores = curvature.influence(model, per_example_ce, (x, y), (x_test, y_test),
                                 damping=damping, params=head)
    assert scores.shape == (4, n)
    g_train = curvature.per_example_gradients(model, per_example_ce, x, y, head)  # [n, P]
    g_test = curvature.per_example_gradients(model, per_example_ce, x_test, y_test, head)
    H_head = hogrod.hessian(lambda: mean_loss((x, y)), head).numpy()
    dense = -g_test @ np.linalg.solve(H_head + damping * np.eye(len(H_head)), g_train.T)
    assert np.allclose(scores, dense, rtol=1e-6, atol=1e-8 * np.abs(dense).max())
    most_harmful = np.argmax(scores, axis=1)     # train example whose up-weighting hurts most

    print(f"curvature: loss {float(logs['loss']):.3f}, {H.shape[0]} params; top-3 eigenvalues "
          f"{np.round(values, 5)} by Lanczos in {matvecs} HVPs (power iteration {p_matvecs}); "
          f"most negative {low[0]:.2e} in {low_matvecs}; trace {trace:.4f} +- {stderr:.4f} (exact {np.trace(H):.4f}); most harmful train "
          f"example per test point {most_harmful}")
    return {"top3": values, "trace": trace, "influence": scores}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
