"""Curvature beyond the Hessian on your own small Keras classifier: the Fisher (type-2, Monte
Carlo, empirical) and the Gauss-Newton matrix, K-FAC and EK-FAC (products, solve, logdet),
the Laplace approximation (evidence, prior tuning, predictive), and influence functions at
scale (EK-FAC, LiSSA) against leave-one-out retraining.

    python docs/guide/curvature_beyond_hessian.py            # full size
    python docs/guide/curvature_beyond_hessian.py --quick    # small (HOGROD_GUIDE_QUICK=1 too)

It extends docs/guide/curvature_own_classifier.py (the Hessian's eigenvalues, trace,
density and exact influence). The oracles are dense float64 matrices built here from tape
Jacobians and the softmax's closed-form Hessian, closed forms of Bayesian linear
regression, and models retrained without an example.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
from hogrod import curvature  # noqa: E402

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
MSE = keras.losses.MeanSquaredError(dtype="float64")


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def blobs(n, seed=0, n_classes=3):
    rng = np.random.default_rng(seed)
    centers = 1.5 * rng.normal(size=(n_classes, 2))
    labels = rng.integers(0, n_classes, n)
    return tf.constant(centers[labels] + rng.normal(size=(n, 2))), tf.constant(labels, tf.int32)


def classifier(hidden):
    """Your own model; `hidden=()` is softmax regression (one Dense layer)."""
    layers = [keras.Input((2,), dtype="float64")]
    layers += [keras.layers.Dense(h, activation="tanh", dtype="float64") for h in hidden]
    return keras.Sequential(layers + [keras.layers.Dense(3, dtype="float64", name="head")])


def regularized(model, x, y, l2):
    """Your training objective: mean CE + l2/2 |theta|^2 (a make_train_step objective)."""
    params = model.trainable_variables

    def objective(batch):
        per = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
        return tf.reduce_mean(per) + 0.5 * l2 * tf.add_n([tf.reduce_sum(p * p) for p in params])

    return objective


def fit_softmax_regression(model, x, y, l2, weights, theta=None, steps=8):
    """The exact optimum of sum_i weights_i CE_i + l2/2 |theta|^2 for a one-Dense-layer
    model, by Newton's method in numpy (the oracle's own solver; the closed-form gradient
    and Hessian of softmax regression). theta: the flat start (kernel row-major, then bias)."""
    a = np.hstack([x.numpy(), np.ones((len(x), 1))])         # [n, d + 1]: kernel rows, bias
    onehot = np.eye(3)[y.numpy()]
    theta = np.zeros(a.shape[1] * 3) if theta is None else theta
    for _ in range(steps):
        z = a @ theta.reshape(-1, 3)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = np.einsum("n,nk,nc->kc", weights, a, p - onehot).ravel() + l2 * theta
        h_logits = np.einsum("nc,cd->ncd", p, np.eye(3)) - np.einsum("nc,nd->ncd", p, p)
        hess = np.einsum("n,nk,nl,ncd->kcld", weights, a, a, h_logits).reshape(
            theta.size, theta.size) + l2 * np.eye(theta.size)
        theta = theta - np.linalg.solve(hess, grad)
    model.set_weights([theta[:-3].reshape(-1, 3), theta[-3:]])
    return theta


def train(model, x, y, l2, steps):
    """Adam on your objective with the library's compiled step."""
    objective = regularized(model, x, y, l2)
    step = hogrod.train.make_train_step(objective, keras.optimizers.Adam(0.05),
                                        model.trainable_variables)
    for _ in range(steps):
        logs = step(None)
    return float(logs["loss"])


def dense_ggn(model, x, y):
    """The oracle: J^T H_L J per example, H_L = diag(p) - p p^T the softmax cross-entropy's
    Hessian in the logits; also the per-example gradients J^T (p - onehot). [n, P, P], [n, P]."""
    params = model.trainable_variables
    with tf.GradientTape() as tape:
        z = model(x)
    J = np.concatenate([np.reshape(j, (len(x), 3, -1))
                        for j in tape.jacobian(z, params)], axis=2)       # [n, C, P]
    p = tf.nn.softmax(z).numpy()
    H_L = np.einsum("nc,cd->ncd", p, np.eye(3)) - np.einsum("nc,nd->ncd", p, p)
    per_example = np.einsum("ncp,ncd,ndq->npq", J, H_L, J)
    grads = np.einsum("ncp,nc->np", J, p - np.eye(3)[y.numpy()])
    return per_example, grads, J, z.numpy()


# ---- 1. Fisher (type-2, Monte Carlo, empirical) and the Gauss-Newton matrix -----------------

def fisher_types(model, x, y, quick):
    ggn_examples, grads, _, _ = dense_ggn(model, x, y)
    ggn = ggn_examples.mean(0)
    type2 = curvature.FisherOperator(model, CE, (x, y), fisher="type2").to_dense().numpy()
    assert _rel(type2, ggn) < 1e-10, "type-2 Fisher = Gauss-Newton for softmax cross-entropy"
    empirical = curvature.FisherOperator(model, CE, (x, y), fisher="empirical")
    assert _rel(empirical.to_dense().numpy(), grads.T @ grads / len(grads)) < 1e-10
    samples = 20 if quick else 400        # labels drawn from the model, per example
    mc = curvature.FisherOperator(model, CE, (x, y), fisher="mc", mc_samples=samples, seed=1)
    mc_error = _rel(mc.to_dense().numpy(), type2)            # E[mc] = type-2
    assert mc_error < 1.0 / np.sqrt(samples), mc_error   # about 0.3 / sqrt(samples) here
    return {"mc_error": mc_error, "empirical_error": _rel(grads.T @ grads / len(grads), type2)}


# ---- 2. K-FAC and EK-FAC -------------------------------------------------------------------

def kfac_exact_for_one_linear_layer(quick):
    """One Dense layer under MSE: the Gauss-Newton matrix (here also the Hessian: the model
    is linear) is E[a a^T] (x) (2/C) I, which is exactly K-FAC's A (x) G."""
    rng = np.random.default_rng(4)
    x, y = tf.constant(rng.normal(size=(32, 3))), tf.constant(rng.normal(size=(32, 2)))
    model = keras.Sequential([keras.Input((3,), dtype="float64"),
                              keras.layers.Dense(2, dtype="float64", name="linear")])
    kfac = curvature.KFACOperator(model, MSE, (x, y))
    a = np.hstack([x.numpy(), np.ones((32, 1))])              # layer inputs and the bias's 1
    exact = np.kron(a.T @ a / 32, (2 / 2) * np.eye(2))         # MSE's Hessian: (2 / C) I
    assert _rel(kfac.to_dense().numpy(), exact) < 1e-10        # flat order: kernel, then bias
    A, G = kfac.factors["linear"]           # A over [inputs..., 1], G over the outputs
    assert _rel(np.kron(A.numpy(), G.numpy()), exact) < 1e-10


def kfac_and_ekfac(model, x, y):
    ggn = dense_ggn(model, x, y)[0].mean(0)
    kfac = curvature.KFACOperator(model, CE, (x, y))
    ekfac = curvature.EKFACOperator(model, CE, (x, y))
    # the layers' blocks, in flat order ([kernel, bias] of each Dense)
    offsets, start = [], 0
    for layer in model.layers:
        size = sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
        offsets.append((layer.name, slice(start, start + size)))
        start += size
    blocks_of_ggn = np.zeros_like(ggn)      # the GGN's block diagonal, what both approximate
    kron = np.zeros_like(ggn)
    for name, s in offsets:
        blocks_of_ggn[s, s] = ggn[s, s]
        A, G = kfac.factors[name]
        kron[s, s] = np.kron(A.numpy(), G.numpy())
        # EK-FAC: K-FAC's eigenbasis, eigenvalues the exact diagonal of the GGN in it
        _, QA, _, QG = kfac.eigendecompositions[name]
        Q = np.kron(QA.numpy(), QG.numpy())
        corrected = ekfac.corrected_eigenvalues[name].numpy().ravel()
        assert _rel(corrected, np.diag(Q.T @ ggn[s, s] @ Q)) < 1e-9, name
    K, E = kfac.to_dense().numpy(), ekfac.to_dense().numpy()
    assert _rel(K, kron) < 1e-10               # products: blockwise A (x) G, 0 across layers
    kfac_error, ekfac_error = _rel(K, blocks_of_ggn), _rel(E, blocks_of_ggn)
    assert ekfac_error <= kfac_error           # the best diagonal in that basis
    # solve and logdet need damping > 0; with_damping reuses the factors
    damped = kfac.with_damping(1e-2)
    v = np.random.default_rng(5).normal(size=len(K))
    solved = damped.solve(tf.constant(v[:, None]))[:, 0].numpy()
    assert _rel(solved, np.linalg.solve(kron + 1e-2 * np.eye(len(K)), v)) < 1e-8
    sign, logdet = np.linalg.slogdet(kron + 1e-2 * np.eye(len(K)))
    assert sign > 0 and abs(float(damped.logdet()) - logdet) < 1e-8 * abs(logdet)
    return {"kfac_error": kfac_error, "ekfac_error": ekfac_error}


# ---- 3. Laplace ----------------------------------------------------------------------------

def laplace_regression_exact(quick):
    """A linear model at its exact MAP: the Laplace evidence IS the evidence of Bayesian
    linear regression, log N(y; 0, sigma^2 I + Phi Phi^T / delta), Phi = [x, 1]."""
    rng = np.random.default_rng(6)
    n, delta, sigma = (24, 2.0, 0.3) if quick else (200, 2.0, 0.3)
    x = rng.normal(size=(n, 2))
    y = (x @ np.array([1.0, -0.5]) + 0.2 + sigma * rng.normal(size=n))[:, None]
    phi = np.hstack([x, np.ones((n, 1))])
    precision = phi.T @ phi / sigma**2 + delta * np.eye(3)
    w_map = np.linalg.solve(precision, phi.T @ y[:, 0] / sigma**2)
    model = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    model.set_weights([w_map[:2, None], w_map[2:]])
    cov = sigma**2 * np.eye(n) + phi @ phi.T / delta
    exact = -0.5 * (np.linalg.slogdet(2 * np.pi * cov)[1] + y[:, 0] @ np.linalg.solve(cov, y[:, 0]))
    results = {}
    for hessian in ("full", "kron"):     # K-FAC is exact for one Dense layer under MSE
        la = curvature.Laplace(model, "regression", hessian=hessian, prior_precision=delta,
                               sigma_noise=sigma).fit((tf.constant(x), tf.constant(y)))
        results[hessian] = float(la.log_marginal_likelihood())
        assert abs(results[hessian] - exact) < 1e-9 * abs(exact), (hessian, results, exact)
    # the predictive of f (no observation noise): phi^T P^-1 phi
    x_new = rng.normal(size=(5, 2))
    mean, var = la.predictive(tf.constant(x_new))
    phi_new = np.hstack([x_new, np.ones((5, 1))])
    assert _rel(mean.numpy()[:, 0], phi_new @ w_map) < 1e-12
    assert _rel(var.numpy()[:, 0, 0], np.einsum("np,pq,nq->n", phi_new,
                                                np.linalg.inv(precision), phi_new)) < 1e-10
    return {"evidence": exact}


def laplace_classifier(model, x, y, quick):
    """The evidence and predictive of your classifier against a dense float64 computation:
    H = sum_i J_i^T H_L J_i (the SUMMED loss), P = H + delta I."""
    delta = 0.5
    la = curvature.Laplace(model, "classification", hessian="full",
                           prior_precision=delta).fit((x, y))
    per_example, _, J, z = dense_ggn(model, x, y)
    theta = hogrod.tree.flatten(model.trainable_variables).numpy()
    P = per_example.sum(0) + delta * np.eye(len(theta))
    log_lik = -float(tf.reduce_sum(
        tf.nn.sparse_softmax_cross_entropy_with_logits(y, tf.constant(z))))

    def dense_evidence(d):
        Pd = per_example.sum(0) + d * np.eye(len(theta))
        return log_lik - 0.5 * (np.linalg.slogdet(Pd)[1] - len(theta) * np.log(d)
                                + d * theta @ theta)

    assert abs(float(la.log_marginal_likelihood()) - dense_evidence(delta)) < 1e-9 * abs(
        dense_evidence(delta))
    # probit predictive: softmax(mu / sqrt(1 + pi/8 var)), var = J P^-1 J^T per example
    var = np.einsum("ncp,pq,ndq->ncd", J, np.linalg.inv(P), J)
    kappa = 1 / np.sqrt(1 + np.pi / 8 * np.einsum("ncc->nc", var))
    probs = la.predictive(x, link_approx="probit").numpy()
    assert _rel(probs, tf.nn.softmax(z * kappa).numpy()) < 1e-10
    # tuning the prior precision maximizes the evidence (at the fixed weights theta*)
    tuned = la.optimize_prior_precision(method="marglik", optimizer="lbfgs")
    best = scipy.optimize.minimize_scalar(lambda s: -dense_evidence(np.exp(s)),
                                          bounds=(-10, 10), method="bounded",
                                          options={"xatol": 1e-10})
    assert abs(np.log(float(tuned["prior_precision"])) - best.x) < 1e-4, (tuned, best.x)
    kron_evidence = float("nan")             # K-FAC's evidence: an approximation here
    if not quick:
        kron = curvature.Laplace(model, "classification", hessian="kron", prior_precision=delta)
        kron_evidence = float(kron.fit((x, y)).log_marginal_likelihood())
    return {"evidence": dense_evidence(delta), "kron_evidence": kron_evidence,
            "tuned_prior": float(tuned["prior_precision"])}


# ---- 4. Influence at scale against leave-one-out retraining --------------------------------

def influence_vs_leave_one_out(quick):
    l2, n = 0.05, (40 if quick else 200)
    x, y = blobs(n, seed=7)
    x_test, y_test = blobs(3, seed=8)
    keras.utils.set_random_seed(1)
    model = classifier(())                   # softmax regression: convex, one exact optimum
    theta = fit_softmax_regression(model, x, y, l2, np.full(n, 1.0 / n), steps=12)
    grads = hogrod.grad(lambda: regularized(model, x, y, l2)(None), model.trainable_variables)
    assert np.linalg.norm(hogrod.tree.flatten(grads)) < 1e-12    # the exact optimum

    def per_example_ce(y_true, logits):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(y_true, logits)

    # exact influence, -g_test^T (H + l2 I)^-1 g_train, by CG on the Hessian of the mean CE
    # (the regularizer's curvature l2 I is the damping); `curvature.influence` does the same
    op = curvature.HessianOperator(model, CE, (x, y))
    g_train = curvature.per_example_gradients(model, per_example_ce, x, y)        # [n, P]
    g_test = curvature.per_example_gradients(model, per_example_ce, x_test, y_test)
    s_test = np.stack([curvature.conjugate_gradient(op, g, damping=l2, tol=1e-12)[0]
                       for g in g_test])
    exact = -s_test @ g_train.T                                                   # [3, n]
    # LiSSA: the same products by a Neumann series; scale must exceed the largest eigenvalue
    # (a bound: the softmax's Hessian is at most 1/2, so H <= 1/2 E[a a^T] with a = [x, 1])
    a = np.hstack([x.numpy(), np.ones((n, 1))])
    scale = 0.5 * np.linalg.eigvalsh(a.T @ a / n)[-1] + l2
    s_lissa = curvature.lissa(op, g_test[0], damping=l2, scale=scale, maxiter=300, tol=1e-12)
    assert _rel(s_lissa, s_test[0]) < 1e-7
    # EK-FAC influence (kronfluence's): the Gauss-Newton matrix in Kronecker eigenbases
    scores = curvature.ekfac_influence(model, CE, (x, y), (x_test, y_test), damping=l2)

    # leave-one-out: retrain without example i (weight 0 in the mean), measure the test loss
    def test_loss():
        return per_example_ce(y_test, model(x_test)).numpy()

    before = test_loss()
    picks = np.argsort(-np.abs(exact).sum(0))[:3 if quick else 8]   # the most influential
    predicted, actual = [], []
    for i in picks:
        weights = np.where(np.arange(n) == i, 0.0, 1.0 / n)       # example i left out
        fit_softmax_regression(model, x, y, l2, weights, theta)   # from theta*
        actual.append(test_loss() - before)
        predicted.append(-exact[:, i] / n)    # removing i changes the test loss by -I / n
    fit_softmax_regression(model, x, y, l2, np.full(n, 1.0 / n), theta, steps=0)
    predicted, actual = np.array(predicted), np.array(actual)
    assert _rel(predicted, actual) < 0.25, (predicted, actual)  # first order: O(1/n) off
    ekfac_predicted = -scores[:, picks].T / n
    ekfac_error = _rel(ekfac_predicted, actual)
    assert ekfac_error < 0.5 and np.corrcoef(ekfac_predicted.ravel(), actual.ravel())[0, 1] > 0.9
    return {"exact_error": _rel(predicted, actual), "ekfac_error": ekfac_error}


def main(quick=False):
    x, y = blobs(30 if quick else 300)
    keras.utils.set_random_seed(0)
    model = classifier((4,) if quick else (16,))
    if not quick:                    # every identity below holds at any weights
        train(model, x, y, l2=0.05, steps=1000)
    fisher = fisher_types(model, x, y, quick)
    kfac_exact_for_one_linear_layer(quick)
    kfac = kfac_and_ekfac(model, x, y)
    reg = laplace_regression_exact(quick)
    cls = laplace_classifier(model, x, y, quick)
    infl = influence_vs_leave_one_out(quick)
    print(f"curvature beyond the Hessian: MC Fisher within {fisher['mc_error']:.3f} of the "
          f"type-2 (empirical Fisher {fisher['empirical_error']:.3f} away); distance to the "
          f"GGN's blocks: K-FAC {kfac['kfac_error']:.3f}, EK-FAC {kfac['ekfac_error']:.3f}; "
          f"Laplace evidence {cls['evidence']:.3f} (kron {cls['kron_evidence']:.3f}), tuned "
          f"prior {cls['tuned_prior']:.3f}; leave-one-out predicted by exact influence to "
          f"{infl['exact_error']:.3f}, by EK-FAC to {infl['ekfac_error']:.3f}")
    return {"fisher": fisher, "kfac": kfac, "laplace": (reg, cls), "influence": infl}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
