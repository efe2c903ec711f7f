"""Laplace approximations against independent oracles: Bayesian linear regression in closed
form (posterior precision, MAP, the exact Gaussian evidence log N(y; 0, s^2 I + X X^T / d),
predictive variance, the exact evidence's maximizer by scipy), the Fisher operator's dense
matrix, numpy sampling of the linearized predictive."""

import keras
import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import tensorflow as tf

from hogrod import curvature

F64 = "float64"
SUM_MSE = keras.losses.MeanSquaredError(reduction="sum", dtype="float64")
SUM_SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum",
                                                     dtype="float64")


def linear_problem(n=20, d=3, seed=0):
    """(model Dense(1) without activation, x, y [n, 1], design [x, 1])."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=(d, 1)) + 0.3 + 0.5 * rng.normal(size=(n, 1))
    model = keras.Sequential([keras.Input((d,), dtype=F64), keras.layers.Dense(1, dtype=F64)])
    return model, tf.constant(x), tf.constant(y), np.concatenate([x, np.ones((n, 1))], 1)


def set_map(model, design, y, delta, sigma, prior_mean=0.0):
    """Assign the exact MAP (X^T X / s^2 + d I)^-1 (X^T y / s^2 + d mu0); return it and P."""
    precision = design.T @ design / sigma**2 + delta * np.eye(design.shape[1])
    theta = np.linalg.solve(precision, design.T @ np.asarray(y)[:, 0] / sigma**2
                            + delta * prior_mean)
    kernel, bias = model.trainable_variables
    kernel.assign(theta[:-1, None])
    bias.assign(theta[-1:])
    return theta, precision


def exact_evidence(design, y, delta, sigma, prior_mean=0.0):
    cov = sigma**2 * np.eye(len(design)) + design @ design.T / delta
    mean = design @ (prior_mean * np.ones(design.shape[1]))
    return scipy.stats.multivariate_normal(mean, cov).logpdf(np.ravel(y))


def mlp(outputs, frozen_first=False, seed=0):
    keras.utils.set_random_seed(seed)
    first = keras.layers.Dense(5, activation="tanh", dtype=F64)
    model = keras.Sequential([keras.Input((3,), dtype=F64), first,
                              keras.layers.Dense(outputs, dtype=F64)])
    first.trainable = not frozen_first
    return model


def data(n=16, outputs=1, classes=None, seed=1):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(n, 3)))
    if classes:
        return x, tf.constant(rng.integers(0, classes, size=n), tf.int32)
    return x, tf.constant(rng.normal(size=(n, outputs)))


def test_full_on_linear_model_is_bayesian_linear_regression():
    model, x, y, design = linear_problem()
    delta, sigma = 0.7, 0.4
    theta, precision = set_map(model, design, y, delta, sigma)
    la = curvature.Laplace(model, "regression", "all", "full", prior_precision=delta,
                           sigma_noise=sigma).fit((x, y))
    np.testing.assert_allclose(la.posterior_precision, precision, rtol=1e-12)
    np.testing.assert_allclose(la.posterior_covariance, np.linalg.inv(precision), rtol=1e-10)
    np.testing.assert_allclose(la.mean, theta, rtol=1e-12)
    # the MAP relation: P theta* = X^T y / s^2 (the log joint's gradient vanishes)
    np.testing.assert_allclose(la.posterior_precision @ la.mean,
                               design.T @ y.numpy()[:, 0] / sigma**2, rtol=1e-10)
    np.testing.assert_allclose(float(la.log_marginal_likelihood()),
                               exact_evidence(design, y, delta, sigma), rtol=1e-12)
    # the predictive: x~^T theta* and x~^T P^-1 x~ (+ s^2 with the observation noise)
    xt = np.random.default_rng(5).normal(size=(4, 3))
    xt1 = np.concatenate([xt, np.ones((4, 1))], 1)
    mean, var = la.predictive(tf.constant(xt))
    exact_var = np.einsum("np,pq,nq->n", xt1, np.linalg.inv(precision), xt1)
    np.testing.assert_allclose(mean.numpy()[:, 0], xt1 @ theta, rtol=1e-12)
    np.testing.assert_allclose(var.numpy()[:, 0, 0], exact_var, rtol=1e-10)
    _, noisy = la.predictive(tf.constant(xt), observation_noise=True)
    np.testing.assert_allclose(noisy.numpy()[:, 0, 0], exact_var + sigma**2, rtol=1e-10)
    # hessian="diag" keeps the diagonal of P: variance sum_p x~_p^2 / P_pp
    diag = curvature.Laplace(model, "regression", "all", "diag", prior_precision=delta,
                             sigma_noise=sigma).fit((x, y))
    np.testing.assert_allclose(diag.predictive(tf.constant(xt))[1].numpy()[:, 0, 0],
                               xt1**2 @ (1 / np.diag(precision)), rtol=1e-10)


def test_evidence_at_passed_hyperparameters_and_kfac_on_linear_model():
    """log_marginal_likelihood(d, s) evaluates at the arguments and stores them (as
    laplace-torch); K-FAC is exact for one Dense layer with one output (G is a constant), so
    its evidence is the exact one too; over a data set of batches nothing changes."""
    model, x, y, design = linear_problem()
    delta, sigma = 2.5, 0.6
    set_map(model, design, y, delta, sigma)
    exact = exact_evidence(design, y, delta, sigma)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(7)
    for hessian, source in [("full", (x, y)), ("full", batches), ("kron", (x, y))]:
        la = curvature.Laplace(model, hessian=hessian).fit(source)
        np.testing.assert_allclose(float(la.log_marginal_likelihood(delta, sigma)), exact,
                                   rtol=1e-10, err_msg=hessian)
        assert la.prior_precision == delta and la.sigma_noise == sigma
        la.prior_precision, la.sigma_noise = 1.0, 1.0
        assert float(la.log_marginal_likelihood()) != pytest.approx(exact)
        la.prior_precision, la.sigma_noise = delta, sigma
        np.testing.assert_allclose(float(la.log_marginal_likelihood()), exact, rtol=1e-10)
    xt = tf.constant(np.random.default_rng(2).normal(size=(3, 3)))
    full = curvature.Laplace(model, prior_precision=delta, sigma_noise=sigma).fit((x, y))
    np.testing.assert_allclose(la.predictive(xt)[1].numpy(), full.predictive(xt)[1].numpy(),
                               rtol=1e-9)


def test_prior_mean_and_float32():
    """A non-zero prior mean mu0: y ~ N(X mu0, s^2 I + X X^T / d); a float32 model gives
    the float64 model's evidence and predictive to float32 round-off."""
    model, x, y, design = linear_problem()
    mu0 = np.array([0.5, -0.2, 0.1, 1.0])
    set_map(model, design, y, 0.8, 0.5, mu0)
    la = curvature.Laplace(model, prior_precision=0.8, sigma_noise=0.5, prior_mean=mu0)
    np.testing.assert_allclose(float(la.fit((x, y)).log_marginal_likelihood()),
                               exact_evidence(design, y, 0.8, 0.5, mu0), rtol=1e-12)
    m32 = keras.Sequential([keras.Input((3,), dtype="float32"), keras.layers.Dense(1)])
    for a, b in zip(m32.trainable_variables, model.trainable_variables):
        a.assign(tf.cast(b, tf.float32))
    for hessian in ("full", "diag"):
        kw = dict(hessian=hessian, prior_precision=0.8, sigma_noise=0.5, prior_mean=mu0)
        l64 = curvature.Laplace(model, **kw).fit((x, y))
        l32 = curvature.Laplace(m32, **kw).fit((tf.cast(x, tf.float32), tf.cast(y, tf.float32)))
        np.testing.assert_allclose(float(l32.log_marginal_likelihood()),
                                   float(l64.log_marginal_likelihood()), rtol=1e-5)
        var32 = l32.predictive(tf.cast(x[:3], tf.float32))[1]
        assert var32.dtype == tf.float32
        np.testing.assert_allclose(var32.numpy(), l64.predictive(x[:3])[1].numpy(), rtol=1e-4)


def test_evidence_is_differentiable_in_both_hyperparameters():
    model, x, y, design = linear_problem()
    set_map(model, design, y, 1.0, 1.0)
    la = curvature.Laplace(model).fit((x, y))
    logs = tf.Variable([0.3, -0.2], dtype=tf.float64)
    with tf.GradientTape() as tape:
        value = la.log_marginal_likelihood(tf.exp(logs[0]), tf.exp(logs[1]))
    grad = tape.gradient(value, logs).numpy()
    h = 1e-6
    for i in range(2):
        e = np.eye(2)[i] * h
        up = la.log_marginal_likelihood(*np.exp(logs.numpy() + e))
        down = la.log_marginal_likelihood(*np.exp(logs.numpy() - e))
        np.testing.assert_allclose(grad[i], (float(up) - float(down)) / (2 * h), rtol=1e-6)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_full_is_fisher_operator_and_diag_is_its_diagonal(likelihood):
    """H of the summed log-likelihood: FisherOperator's dense type-2 Fisher of the summed
    loss (C/2 times for MSE, whose per-example value is a mean over the C outputs)."""
    classes = 3 if likelihood == "classification" else None
    model = mlp(3 if classes else 2)
    batch = data(outputs=2, classes=classes)
    loss, scale = (SUM_SCE, 1.0) if classes else (SUM_MSE, 2 / 2)
    fisher = curvature.FisherOperator(model, loss, batch).to_dense().numpy() * scale
    delta = 0.3
    full = curvature.Laplace(model, likelihood, hessian="full", prior_precision=delta).fit(batch)
    np.testing.assert_allclose(full.posterior_precision, fisher + delta * np.eye(len(fisher)),
                               rtol=1e-10, atol=1e-12)
    diag = curvature.Laplace(model, likelihood, hessian="diag", prior_precision=delta).fit(batch)
    np.testing.assert_allclose(diag.posterior_precision, np.diag(full.posterior_precision),
                               rtol=1e-10)
    expected = float(full.log_likelihood()) - 0.5 * (
        np.sum(np.log(diag.posterior_precision)) - len(fisher) * np.log(delta)
        + delta * np.sum(full.mean**2))
    np.testing.assert_allclose(float(diag.log_marginal_likelihood()), expected, rtol=1e-12)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_last_layer_equals_all_when_only_the_last_layer_trains(likelihood):
    classes = 3 if likelihood == "classification" else None
    model = mlp(3 if classes else 2, frozen_first=True)
    batch = data(outputs=2, classes=classes)
    xt = data(n=5, seed=7)[0]
    kw = dict(prior_precision=0.5)
    all_ = curvature.Laplace(model, likelihood, "all", **kw).fit(batch)
    last = curvature.Laplace(model, likelihood, "last_layer", **kw).fit(batch)
    np.testing.assert_allclose(last.posterior_precision, all_.posterior_precision, rtol=1e-12)
    np.testing.assert_allclose(float(last.log_marginal_likelihood()),
                               float(all_.log_marginal_likelihood()), rtol=1e-12)
    for a, b in zip(tf.nest.flatten(last.predictive(xt)), tf.nest.flatten(all_.predictive(xt))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)


def test_last_layer_kfac_is_exact_for_one_regression_output():
    """The last layer's K-FAC with one Gaussian output is its exact Gauss-Newton block."""
    model = mlp(1)
    batch = data(outputs=1)
    xt = data(n=5, seed=7)[0]
    kw = dict(subset="last_layer", prior_precision=0.5, sigma_noise=0.3)
    full = curvature.Laplace(model, hessian="full", **kw).fit(batch)
    kfac = curvature.Laplace(model, hessian="kron", **kw).fit(batch)
    np.testing.assert_allclose(kfac.posterior_precision.to_dense().numpy(),
                               full.posterior_precision, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(float(kfac.log_marginal_likelihood()),
                               float(full.log_marginal_likelihood()), rtol=1e-10)
    np.testing.assert_allclose(kfac.predictive(xt)[1].numpy(), full.predictive(xt)[1].numpy(),
                               rtol=1e-8)


def test_classification_predictive_probit_and_mc():
    model = mlp(3)
    batch = data(classes=3)
    xt = data(n=4, seed=3)[0]
    la = curvature.Laplace(model, "classification", prior_precision=0.2).fit(batch)
    probit = la.predictive(xt).numpy()
    np.testing.assert_allclose(probit.sum(-1), 1.0, rtol=1e-12)
    mc = la.predictive(xt, link_approx="mc", n_samples=20000, seed=1).numpy()
    np.testing.assert_allclose(mc.sum(-1), 1.0, rtol=1e-12)
    # the reference: numpy draws from N(f(x), J P^-1 J^T) with numpy's own J (central
    # differences of the model in its weights)
    theta = la.mean.copy()
    P_inv = la.posterior_covariance

    def outputs(t):
        kernel0, bias0, kernel1, bias1 = np.split(t, np.cumsum([15, 5, 15]))
        h = np.tanh(xt.numpy() @ kernel0.reshape(3, 5) + bias0)
        return h @ kernel1.reshape(5, 3) + bias1
    eye = np.eye(len(theta)) * 1e-6
    J = np.stack([(outputs(theta + e) - outputs(theta - e)) / 2e-6 for e in eye], -1)
    mu, cov = outputs(theta), np.einsum("ncp,pq,nkq->nck", J, P_inv, J)
    rng = np.random.default_rng(0)
    draws = [scipy.special.softmax(rng.multivariate_normal(mu[i], cov[i], 100000), -1)
             for i in range(len(mu))]
    ref = np.stack([d.mean(0) for d in draws])
    se = np.stack([d.std(0) for d in draws]) * np.sqrt(1 / 20000 + 1 / 100000)
    assert np.all(np.abs(mc - ref) < 5 * se), np.abs(mc - ref) / se
    kappa = 1 / np.sqrt(1 + np.pi / 8 * np.einsum("ncc->nc", cov))
    np.testing.assert_allclose(probit, scipy.special.softmax(kappa * mu, -1), rtol=1e-7)
    assert np.abs(probit - ref).max() < 0.05  # probit is an approximation, close here
    # a posterior concentrated at theta*: both give softmax(f(x))
    sharp = curvature.Laplace(model, "classification", prior_precision=1e12).fit(batch)
    softmax = tf.nn.softmax(model(xt)).numpy()
    np.testing.assert_allclose(sharp.predictive(xt).numpy(), softmax, rtol=1e-6)
    np.testing.assert_allclose(sharp.predictive(xt, link_approx="mc").numpy(), softmax,
                               rtol=1e-5)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_optimize_reaches_the_exact_evidence_maximizer(optimizer):
    """For a linear model the Laplace evidence at the MAP is the exact evidence, and at the
    exact maximizer (d*, s*) (scipy on the closed form) with theta* = MAP(d*, s*) its
    gradient at fixed theta* vanishes (envelope theorem), so the optimization from (1, 1)
    must return (d*, s*)."""
    model, x, y, design = linear_problem(n=30)
    res = scipy.optimize.minimize(lambda t: -exact_evidence(design, y, *np.exp(t)),
                                  np.zeros(2), method="Nelder-Mead",
                                  options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 4000})
    delta, sigma = np.exp(res.x)
    set_map(model, design, y, delta, sigma)
    la = curvature.Laplace(model).fit((x, y))
    steps, lr = (200, 0.1) if optimizer == "lbfgs" else (1500, 0.05)
    found = la.optimize_prior_precision(steps=steps, maxiter=steps, lr=lr,
                                        optimize_sigma_noise=True, optimizer=optimizer)
    rtol = 1e-6 if optimizer == "lbfgs" else 2e-3
    np.testing.assert_allclose([found["prior_precision"], found["sigma_noise"]],
                               [delta, sigma], rtol=rtol)
    np.testing.assert_allclose(found["log_marginal_likelihood"], -res.fun, rtol=1e-6)
    assert (la.prior_precision, la.sigma_noise) == (found["prior_precision"],
                                                    found["sigma_noise"])


def test_gridsearch_minimizes_the_validation_nll():
    """Regression: the closed-form predictive N(x~ theta*, x~^T P(d)^-1 x~ + s^2) of the
    linear model, its NLL by scipy for every grid value; classification: the public
    probit predictive's NLL."""
    model, x, y, design = linear_problem()
    sigma = 0.5
    set_map(model, design, y, 1.0, sigma)
    xv = np.random.default_rng(9).normal(size=(10, 3))
    yv = xv @ np.ones((3, 1)) + 0.3
    xv1 = np.concatenate([xv, np.ones((10, 1))], 1)
    grid = [0.01, 0.3, 1.0, 30.0]
    la = curvature.Laplace(model, sigma_noise=sigma).fit((x, y))
    found = la.optimize_prior_precision("gridsearch", val_data=(tf.constant(xv),
                                                                tf.constant(yv)), grid=grid)
    nll = []
    for delta in grid:
        P = design.T @ design / sigma**2 + delta * np.eye(4)
        var = np.einsum("np,pq,nq->n", xv1, np.linalg.inv(P), xv1) + sigma**2
        nll.append(-scipy.stats.norm(xv1 @ la.mean, np.sqrt(var)).logpdf(yv[:, 0]).mean())
    assert found["prior_precision"] == grid[int(np.argmin(nll))] == la.prior_precision
    np.testing.assert_allclose(found["val_nll"], min(nll), rtol=1e-10)
    model = mlp(3)
    xc, yc = data(classes=3)
    la = curvature.Laplace(model, "classification").fit((xc, yc))
    found = la.optimize_prior_precision("gridsearch", val_data=(xc[:8], yc[:8]), grid=grid)
    nll = []
    for delta in grid:
        la.prior_precision = delta
        p = la.predictive(xc[:8]).numpy()
        nll.append(-np.log(p[np.arange(8), yc.numpy()[:8]]).mean())
    assert found["prior_precision"] == grid[int(np.argmin(nll))]
    np.testing.assert_allclose(found["val_nll"], min(nll), rtol=1e-10)


def test_bad_input_is_named():
    model = mlp(1)
    batch = data()
    with pytest.raises(ValueError, match="likelihood"):
        curvature.Laplace(model, "gaussian")
    with pytest.raises(ValueError, match="subset"):
        curvature.Laplace(model, subset="first_layer")
    with pytest.raises(ValueError, match="hessian"):
        curvature.Laplace(model, hessian="lowrank")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="prior_precision"):
            curvature.Laplace(model, prior_precision=bad)
        with pytest.raises(ValueError, match="sigma_noise"):
            curvature.Laplace(model, sigma_noise=bad)
    la = curvature.Laplace(model)
    with pytest.raises(ValueError, match="fit"):
        la.predictive(batch[0])
    with pytest.raises(ValueError, match="fit"):
        la.log_marginal_likelihood()
    la.fit(batch)
    with pytest.raises(ValueError, match="prior_precision"):
        la.log_marginal_likelihood(prior_precision=-2.0)
    with pytest.raises(ValueError, match="sigma_noise"):
        la.log_marginal_likelihood(sigma_noise=tf.constant(0.0, tf.float64))
    # a width-1 output cannot hold class scores; a softmax head gives probabilities
    with pytest.raises(ValueError, match="at least 2 outputs"):
        curvature.Laplace(model, "classification").fit(data(classes=2))
    soft = keras.Sequential([keras.Input((3,), dtype=F64),
                             keras.layers.Dense(3, activation="softmax", dtype=F64)])
    with pytest.raises(ValueError, match="LOGITS"):
        curvature.Laplace(soft, "classification")
    with pytest.raises(ValueError, match="sigma_noise"):
        curvature.Laplace(mlp(3), "classification", sigma_noise=0.5)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        curvature.Laplace(mlp(3), "classification").fit(data(classes=4, n=40))
    with pytest.raises(ValueError, match="targets have shape"):
        curvature.Laplace(mlp(2)).fit(data(outputs=3))
    tail = keras.Sequential([keras.Input((3,), dtype=F64), keras.layers.Dense(2, dtype=F64),
                             keras.layers.Activation("tanh")])
    with pytest.raises(ValueError, match="last_layer"):
        curvature.Laplace(tail, subset="last_layer")
    with pytest.raises(ValueError, match="method"):
        la.optimize_prior_precision(method="cross_validation")
    with pytest.raises(ValueError, match="val_data"):
        la.optimize_prior_precision(method="gridsearch")
    with pytest.raises(ValueError, match="grid"):
        la.optimize_prior_precision(method="gridsearch", val_data=batch, grid=[1.0, -1.0])
    with pytest.raises(ValueError, match="optimize_sigma_noise"):
        curvature.Laplace(mlp(3), "classification").fit(data(classes=3)) \
            .optimize_prior_precision(optimize_sigma_noise=True)


def test_predictive_after_the_evidence_uses_the_values_it_was_given():
    """laplace-torch stores the hyperparameters passed to log_marginal_likelihood; the
    predictive then equals that of a posterior built with them."""
    model, x, y, design = linear_problem()
    delta, sigma = 3.0, 0.25
    set_map(model, design, y, delta, sigma)
    xt = tf.constant(np.random.default_rng(4).normal(size=(3, 3)))
    la = curvature.Laplace(model).fit((x, y))
    la.log_marginal_likelihood(delta, sigma)
    ref = curvature.Laplace(model, prior_precision=delta, sigma_noise=sigma).fit((x, y))
    for a, b in zip(la.predictive(xt, observation_noise=True),
                    ref.predictive(xt, observation_noise=True)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    # a tensor is stored as its value; a traced call cannot store and says so
    la.log_marginal_likelihood(tf.constant(0.5, tf.float64))
    assert la.prior_precision == 0.5 and la.sigma_noise == sigma

    @tf.function
    def traced(d):
        return la.log_marginal_likelihood(d)
    with pytest.raises(Exception, match="values given are stored"):  # AutoGraph wraps it
        traced(tf.constant(2.0, tf.float64))


def one_layer(outputs, n=12, seed=3):
    """A Dense(outputs) regression model at random weights and its data."""
    rng = np.random.default_rng(seed)
    model = keras.Sequential([keras.Input((3,), dtype=F64), keras.layers.Dense(outputs,
                                                                                dtype=F64)])
    for v in model.trainable_variables:
        v.assign(rng.normal(size=v.shape))
    return model, tf.constant(rng.normal(size=(n, 3))), tf.constant(rng.normal(size=(n, outputs)))


@pytest.mark.parametrize("kron_bias", ["joint", "separate"])
def test_kron_bias_joint_and_separate_in_closed_form(kron_bias):
    """One Dense(C) layer, MSE: the per-example Gauss-Newton in z is I (laplace-torch's
    scale), so the joint K-FAC is exactly [X 1]^T [X 1] (x) I_C, and laplace-torch's separate
    factors drop the kernel-bias cross terms: blockdiag(X^T X (x) I_C, N I_C)."""
    c, delta, sigma = 2, 0.6, 0.7
    model, x, y = one_layer(c)
    n = int(x.shape[0])
    xn = x.numpy()
    design = np.concatenate([xn, np.ones((n, 1))], 1)
    if kron_bias == "joint":
        H = np.kron(design.T @ design, np.eye(c))
    else:
        H = np.zeros((4 * c, 4 * c))
        H[:3 * c, :3 * c] = np.kron(xn.T @ xn, np.eye(c))
        H[3 * c:, 3 * c:] = n * np.eye(c)
    P = H / sigma**2 + delta * np.eye(4 * c)
    la = curvature.Laplace(model, hessian="kron", kron_bias=kron_bias, prior_precision=delta,
                           sigma_noise=sigma).fit((x, y))
    np.testing.assert_allclose(la.posterior_precision.to_dense().numpy(), P, rtol=1e-10,
                               atol=1e-12)
    theta = la.mean
    resid = y.numpy() - model(x).numpy()
    loglik = -0.5 * np.sum(resid**2) / sigma**2 - n * c * np.log(sigma * np.sqrt(2 * np.pi))
    lml = loglik - 0.5 * (np.linalg.slogdet(P)[1] - 4 * c * np.log(delta)
                          + delta * theta @ theta)
    np.testing.assert_allclose(float(la.log_marginal_likelihood()), lml, rtol=1e-12)
    xt = np.random.default_rng(8).normal(size=(4, 3))
    jac = np.stack([np.kron(np.append(row, 1.0), np.eye(c)) for row in xt])  # [N, C, n]
    var = np.einsum("ncp,pq,nkq->nck", jac, np.linalg.inv(P), jac)
    np.testing.assert_allclose(la.predictive(tf.constant(xt))[1].numpy(), var, rtol=1e-10)


def test_kron_bias_is_checked():
    model = mlp(1)
    with pytest.raises(ValueError, match="kron_bias"):
        curvature.Laplace(model, hessian="kron", kron_bias="shared")
    with pytest.raises(ValueError, match="kron_bias"):
        curvature.Laplace(model, hessian="full", kron_bias="separate")


def dense_lml(la, H, delta, sigma):
    """The evidence of P = H / s^2 + diag(delta) from a dense H (numpy)."""
    P = H / sigma**2 + np.diag(delta)
    return float(la.log_likelihood(sigma)) - 0.5 * (
        np.linalg.slogdet(P)[1] - np.sum(np.log(delta))
        + np.sum(delta * (la.mean - la.prior_mean)**2)), P


@pytest.mark.parametrize("hessian,kron_bias", [("full", "joint"), ("diag", "joint"),
                                               ("kron", "separate")])
def test_layerwise_and_diagonal_prior_precision_against_dense(hessian, kron_bias):
    """A vector prior precision (one per variable, laplace-torch's layer-wise; one per
    parameter, its diagonal): evidence, posterior precision and predictive variance equal the
    dense computations with P = H / s^2 + diag(delta); K-FAC keeps layer-wise priors only."""
    model = mlp(2)
    x, y = data(outputs=2)
    xt = data(n=4, seed=6)[0]
    sigma = 0.8
    kw = dict(hessian=hessian, sigma_noise=sigma)
    if hessian == "kron":
        kw["kron_bias"] = kron_bias
    base = curvature.Laplace(model, **kw).fit((x, y))
    n = base.n_params
    H = base.posterior_precision
    H = H.to_dense().numpy() if hessian == "kron" else H
    H = (np.diag(H) if hessian == "diag" else H) - np.eye(n)
    H = H * sigma**2
    layerwise = np.array([0.3, 2.0, 0.7, 5.0])
    structures = {"layerwise": (layerwise, np.repeat(layerwise, base.sizes))}
    if hessian != "kron":
        diag = np.random.default_rng(0).uniform(0.2, 3.0, size=n)
        structures["diag"] = (diag, diag)
    _, jac = base.output_jacobian(xt)
    for name, (value, delta) in structures.items():
        la = curvature.Laplace(model, prior_precision=value, **kw).fit((x, y))
        lml, P = dense_lml(la, H, delta, sigma)
        np.testing.assert_allclose(float(la.log_marginal_likelihood()), lml, rtol=1e-11,
                                   err_msg=name)
        got = la.posterior_precision
        got = got.to_dense().numpy() if hessian == "kron" else got
        np.testing.assert_allclose(got, np.diag(P) if hessian == "diag" else P, rtol=1e-10,
                                   atol=1e-12, err_msg=name)
        var = np.einsum("ncp,pq,nkq->nck", jac.numpy(), np.linalg.inv(P), jac.numpy())
        np.testing.assert_allclose(la.predictive(xt)[1].numpy(), var, rtol=1e-9, err_msg=name)
        # the same value through log_marginal_likelihood's argument, and stored
        np.testing.assert_allclose(float(base.log_marginal_likelihood(value)), lml, rtol=1e-11)
        np.testing.assert_array_equal(base.prior_precision, value)
    if hessian == "kron":
        with pytest.raises(ValueError, match="Kronecker block"):
            curvature.Laplace(model, prior_precision=np.ones(n) + np.arange(n), **kw)
        joint = curvature.Laplace(model, hessian="kron").fit((x, y))
        with pytest.raises(ValueError, match="kron_bias='separate'"):
            joint.optimize_prior_precision(prior_structure="layerwise")


def test_layerwise_prior_optimum_is_stationary_and_beats_the_scalar_one():
    """L-BFGS on the layer-wise log prior precisions: the evidence's central-difference
    gradient in each log precision vanishes there, and it is at least the scalar optimum."""
    model = mlp(2)
    batch = data(outputs=2)
    la = curvature.Laplace(model, sigma_noise=0.5).fit(batch)
    scalar = la.optimize_prior_precision(optimizer="lbfgs")["log_marginal_likelihood"]
    found = la.optimize_prior_precision(prior_structure="layerwise", optimizer="lbfgs",
                                        maxiter=500, tol=1e-9)
    logs = np.log(found["prior_precision"])
    assert logs.shape == (4,) and found["log_marginal_likelihood"] >= scalar - 1e-9
    for i in range(4):
        e = np.eye(4)[i] * 1e-5
        up = float(la.log_marginal_likelihood(np.exp(logs + e)))
        down = float(la.log_marginal_likelihood(np.exp(logs - e)))
        assert abs(up - down) / 2e-5 < 1e-5, (i, (up - down) / 2e-5)


def test_fit_refuses_nan_and_empty_data_by_name():
    model = mlp(1)
    x, y = data()
    bad_x = tf.tensor_scatter_nd_update(x, [[2, 1]], tf.constant([np.nan], tf.float64))
    for hessian in ("full", "diag", "kron"):
        with pytest.raises(ValueError, match=r"Laplace.fit: data's inputs x hold 1 NaN"):
            curvature.Laplace(model, hessian=hessian).fit((bad_x, y))
    bad_y = tf.tensor_scatter_nd_update(y, [[0, 0]], tf.constant([np.inf], tf.float64))
    with pytest.raises(ValueError, match=r"data's targets y hold 1 NaN or infinite"):
        curvature.Laplace(model).fit((x, bad_y))
    batches = tf.data.Dataset.from_tensor_slices((tf.concat([x, bad_x], 0),
                                                  tf.concat([y, y], 0))).batch(16)
    with pytest.raises(ValueError, match=r"inputs x hold 1 NaN .*\(batch 1\)"):
        curvature.Laplace(model, hessian="diag").fit(batches)
    for subset in ("all", "last_layer"):
        for hessian in ("full", "diag", "kron"):
            with pytest.raises(ValueError, match="holds no examples"):
                curvature.Laplace(model, subset=subset, hessian=hessian).fit((x[:0], y[:0]))
    with pytest.raises(ValueError, match="holds no examples"):
        curvature.Laplace(model).fit(tf.data.Dataset.from_tensor_slices((x[:0], y[:0])).batch(4))


def test_gridsearch_warns_at_the_end_of_its_grid():
    """The linear model's validation NLL has its minimum inside [1e-3, 1e3]; a grid that
    stops short of it warns, a grid around it does not."""
    model, x, y, design = linear_problem()
    set_map(model, design, y, 1.0, 0.5)
    la = curvature.Laplace(model, sigma_noise=0.5).fit((x, y))
    xv = tf.constant(np.random.default_rng(9).normal(size=(10, 3)))
    # residuals of sd 0.8 against the noise 0.5: the parameter variance pays at a finite delta
    yv = model(xv) + tf.constant(0.8 * np.random.default_rng(10).normal(size=(10, 1)))
    grid = 10.0 ** np.linspace(-3, 3, 25)
    wide = la.optimize_prior_precision("gridsearch", val_data=(xv, yv),
                                       grid=grid)["prior_precision"]
    assert grid[0] < wide < grid[-1]
    inner = [g for g in grid if g >= wide]
    with pytest.warns(UserWarning, match="optimum may lie outside"):
        la.optimize_prior_precision("gridsearch", val_data=(xv, yv), grid=inner[1:])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = la.optimize_prior_precision("gridsearch", val_data=(xv, yv),
                                            grid=[wide / 10, wide, wide * 10])
    assert found["prior_precision"] == wide


def test_last_layer_of_a_model_built_without_a_call_and_of_a_dict_input_model():
    """The feature model takes the structure the model is called with: no Keras
    input-structure warning, and the same posterior as subset='all' with the first layer
    frozen."""
    import warnings
    x, y = data(outputs=2)
    inp = keras.Input((3,), dtype=F64, name="features")
    hidden = keras.layers.Dense(5, activation="tanh", dtype=F64)
    functional = keras.Model({"features": inp},
                             keras.layers.Dense(2, dtype=F64)(hidden(inp)))
    hidden.trainable = False
    for model, inputs in ((mlp(2, frozen_first=True), x), (functional, {"features": x})):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            last = curvature.Laplace(model, subset="last_layer").fit((inputs, y))
            last.predictive(inputs)
        all_ = curvature.Laplace(model).fit((inputs, y))
        np.testing.assert_allclose(float(last.log_marginal_likelihood()),
                                   float(all_.log_marginal_likelihood()), rtol=1e-12)
