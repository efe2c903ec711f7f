"""Oracles and tiny problems shared by the few-shot heads' tests (test_meta_heads.py) and
their algorithms' (test_meta_fewshot.py): episodes, scipy's solve of the Crammer-Singer
primal, an embedding network and its episodes."""

import keras
import numpy as np
import scipy.optimize
import tensorflow as tf


def episode_arrays(seed=0, n_way=4, k=2, d=10, q=5):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(n_way * k, d))
    ys = rng.permutation(np.repeat(np.arange(n_way), k))
    xq = rng.normal(size=(q, d))
    return xs, ys, xq


def one_hot(ys, n_way):
    return np.eye(n_way)[ys]


def relative(got, want):
    return np.abs(got - want).max() / np.abs(want).max()


def svm_primal(xs, ys, n_way, c, active=None, scaled=False):
    """The Crammer-Singer primal, solved by scipy (SLSQP) and polished on its active set
    (an equality-constrained QP solved exactly), or solved on the given active set alone
    (checked to be the right one: feasible, multipliers >= 0): (W [n_way, d], active).

    `scaled`: solved in the variables W / c and (xi - 1) / c (an exact affine change of
    variables), in which the problem's scale is 1 for any c: at a small c the slacks are
    all near 1 and W near 0, below the thresholds that find the active set in the
    original variables."""
    if scaled:  # (W, xi) = (c V, 1 + c z): constraints a (V, z) >= -delta / c, objective
        # c^2 (1/2 ||V||^2 + sum z) + constant; the constraints xi >= 0 (z >= -1 / c) left
        # out and checked to hold (then the relaxation's solution is the problem's)
        w, active, z = _svm_primal(xs, ys, n_way, 1.0, active, scaled=True)
        assert np.all(1 + c * z > 0)
        return c * w, active
    return _svm_primal(xs, ys, n_way, c, active)[:2]


def _svm_primal(xs, ys, n_way, c, active=None, scaled=False):
    n, d = xs.shape
    size = n_way * d + n
    rows, rhs = [], []
    for i in range(n):
        for k in range(n_way):
            if scaled and k == ys[i]:
                continue
            row = np.zeros(size)
            row[ys[i] * d:(ys[i] + 1) * d] += xs[i]
            row[k * d:(k + 1) * d] -= xs[i]
            row[n_way * d + i] = 1.0
            rows.append(row)
            rhs.append(0.0 if scaled else 1.0 - (k == ys[i]))
    a, b = np.array(rows), np.array(rhs)
    hess = np.diag(np.r_[np.ones(n_way * d), np.zeros(n)])
    lin = np.r_[np.zeros(n_way * d), c * np.ones(n)]
    if active is None:
        res = scipy.optimize.minimize(
            lambda z: 0.5 * z @ hess @ z + lin @ z, np.zeros(size),
            jac=lambda z: hess @ z + lin, method="SLSQP", options={"ftol": 1e-15, "maxiter": 2000},
            constraints=[{"type": "ineq", "fun": lambda z: a @ z - b, "jac": lambda z: a}])
        # scaled, SLSQP often ends on a failed line search near the solution; the active
        # set it finds is then certified below (the KKT system solved, feasible, multipliers
        # >= 0)
        assert res.success or scaled, res.message
        active = a @ res.x - b < 1e-6
    aa = a[active]
    kkt = np.block([[hess, -aa.T], [aa, np.zeros((len(aa), len(aa)))]])
    rhs = np.r_[-lin, b[active]]
    sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    np.testing.assert_allclose(kkt @ sol, rhs, atol=1e-9)
    z, mult = sol[:size], sol[size:]
    assert np.all(a @ z - b > -1e-9) and np.all(mult > -1e-9)  # the active set was right
    return z[:n_way * d].reshape(n_way, d), active, z[n_way * d:]


def augmented(xs, ridge):
    """The support embeddings each extended by sqrt(ridge) times a unit vector of its own:
    the plain SVM on them is the SVM of the kernel X X^T + ridge I."""
    return np.hstack([xs, np.sqrt(ridge) * np.eye(len(xs))])


def embedding_net():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,), dtype="float64"),
                             keras.layers.Dense(8, activation="tanh", dtype="float64"),
                             keras.layers.Dense(5, dtype="float64")])


def tiny_episodes(tasks=2, n_way=3, k=2, q=2, seed=10):
    rng = np.random.default_rng(seed)
    ys = np.stack([rng.permutation(np.repeat(np.arange(n_way), k)) for _ in range(tasks)])
    yq = np.stack([rng.permutation(np.repeat(np.arange(n_way), q)) for _ in range(tasks)])
    return (tf.constant(rng.normal(size=(tasks, n_way * k, 6))), tf.constant(ys, tf.int32),
            tf.constant(rng.normal(size=(tasks, n_way * q, 6))), tf.constant(yq, tf.int32))


def cross_entropy(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(y, tf.int32), logits=logits))
