"""PINN loss weighting schemes and gPINN terms against their formulas, computed by hand (numpy,
float64 central differences) on problems small enough to do so."""

import functools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod import pinn

LINE = pinn.Box((0.0,), (1.0,))
LEFT_X = np.array([[0.0], [0.5]])  # the condition's two points


def line_problem(pde=None):
    """u' = cos(x) on [0, 1] with a soft condition u = 0 at the points LEFT_X."""
    pde = pde or pinn.PDE([(0,)], lambda x, d: d[(0,)] - tf.cos(x))
    return pinn.Problem(name="line", pde=pde, domain=LINE, conditions=[
        ("left", lambda n, s: LEFT_X[:n], lambda x: tf.zeros_like(x))])


def mlp(dim, hidden, seed=0):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((dim,), dtype="float64")]
    if hidden:
        layers.append(keras.layers.Dense(hidden, activation="tanh", dtype="float64"))
    return keras.Sequential(layers + [keras.layers.Dense(1, dtype="float64")])


def line_points(n=7):
    return tf.constant(np.linspace(0.05, 0.95, n)[:, None])


def test_ntk_weights_of_a_linear_model_are_the_hand_computed_trace_ratios():
    """u = a + b x: the residual b - cos x has gradient (a: 0, b: 1) at every point, the
    condition a + b x has (1, x): mean NTK diagonals 1 and mean(1 + x^2)."""
    prob, net = line_problem(), mlp(1, 0)
    conds = [tf.constant(LEFT_X)]
    scheme = pinn.ntk_weights(prob, net, line_points(), conds, net.trainable_variables,
                              alpha=0.9, every=7)
    assert scheme.every == 7 and set(scheme.weights) == {"residual", "left"}
    got = {k: float(v) for k, v in scheme.update().items()}
    k_rr, k_bb = 1.0, np.mean(1.0 + LEFT_X ** 2)
    target = {"residual": (k_rr + k_bb) / k_rr, "left": (k_rr + k_bb) / k_bb}
    for name in target:  # one moving-average step from 1
        np.testing.assert_allclose(got[name], 0.9 * 1.0 + 0.1 * target[name], rtol=1e-12)
    np.testing.assert_allclose(
        float(pinn.weighting.ntk_trace(net, conds[0], net.trainable_variables)), k_bb, rtol=1e-12)
    loss = pinn.pinn_loss(prob, net, line_points(), conds, scheme.weights)()
    plain = pinn.pinn_loss(prob, net, line_points(), conds)()
    np.testing.assert_allclose(float(loss["left"]), got["left"] * float(plain["left"]),
                               rtol=1e-12)


def fd_jacobian(values_fn, variables, h=1e-6):
    """d values_fn() / d parameters by float64 central differences, [values, parameters]."""
    rows = []
    for v in variables:
        base = v.numpy()
        for i in range(base.size):
            sides = []
            for sign in (1, -1):
                shifted = base.copy().ravel()
                shifted[i] += sign * h
                v.assign(shifted.reshape(base.shape))
                sides.append(values_fn().numpy().ravel())
            v.assign(base)
            rows.append((sides[0] - sides[1]) / (2 * h))
    return np.stack(rows, axis=1)


def test_ntk_weights_of_a_network_match_finite_difference_jacobians():
    """A second-order residual (u'' + u) of a tanh network: the per-point Jacobians with
    respect to every parameter by float64 central differences; 7 points in chunks of 4
    (every point counted, the remainder included)."""
    pde = pinn.PDE([(), (0, 0)], lambda x, d: d[(0, 0)] + d[()])
    prob, net = line_problem(pde), mlp(1, 3)
    x, conds = line_points(), [tf.constant(LEFT_X)]
    variables = net.trainable_variables
    trace_r = np.mean(np.sum(fd_jacobian(lambda: pinn.residual(pde, net, x), variables) ** 2, 1))
    trace_b = np.mean(np.sum(fd_jacobian(lambda: net(conds[0]), variables) ** 2, 1))
    scheme = pinn.ntk_weights(prob, net, x, conds, variables, alpha=0.0, chunk=4)
    got = scheme.update()  # alpha = 0: the targets themselves
    np.testing.assert_allclose(float(got["residual"]), (trace_r + trace_b) / trace_r, rtol=1e-6)
    np.testing.assert_allclose(float(got["left"]), (trace_r + trace_b) / trace_b, rtol=1e-6)


def heat_u(x):
    """u = x t + sin(pi x): the heat residual u_t - alpha u_xx = x + alpha pi^2 sin(pi x)."""
    return x[:, :1] * x[:, 1:] + tf.sin(math.pi * x[:, :1])


def test_causal_residual_is_the_papers_chunk_weighted_mean():
    alpha, eps, chunks = 0.1, 3.0, 4
    prob = pinn.problems.heat_problem(alpha=alpha, grid_shape=(3, 3))
    x = pinn.sample(prob.domain, 200, "uniform", 0).astype(np.float64)
    conds = [fn(8, i).astype(np.float64) for i, (_, fn, _) in enumerate(prob.conditions)]
    scheme = pinn.causal_weights(prob, heat_u, x, conds, [], eps=eps, chunks=chunks)
    got = float(pinn.pinn_loss(prob, heat_u, x, conds, reducers=scheme.reducers)()["residual"])
    r2 = (x[:, 0] + alpha * np.pi ** 2 * np.sin(np.pi * x[:, 0])) ** 2
    chunk = np.minimum((x[:, 1] * chunks).astype(int), chunks - 1)
    losses = np.array([r2[chunk == i].mean() for i in range(chunks)])
    w = np.exp(-eps * np.concatenate([[0.0], np.cumsum(losses)[:-1]]))
    np.testing.assert_allclose(got, np.mean(w * losses), rtol=1e-12)
    assert w[0] == 1.0 and np.all(np.diff(w) < 0)  # the case is not degenerate


def test_causal_chunk_weights_are_monotone_and_carry_no_gradient():
    losses = tf.constant(np.random.default_rng(0).uniform(0, 2, 16))
    w = pinn.weighting.causal_chunk_weights(losses, 0.7).numpy()
    np.testing.assert_allclose(w, np.exp(-0.7 * (np.cumsum(losses) - losses)), rtol=1e-12)
    assert w[0] == 1.0 and np.all(np.diff(w) <= 0)
    # the causal residual's gradient is sum_i w_i grad L_r(t_i) / M with w held fixed: each
    # chunk's gradient from pinn_loss on that chunk's points alone
    prob = pinn.problems.heat_problem(alpha=0.1, grid_shape=(3, 3))
    net = mlp(2, 4)
    x = pinn.sample(prob.domain, 60, "uniform", 1).astype(np.float64)
    conds = [fn(4, i).astype(np.float64) for i, (_, fn, _) in enumerate(prob.conditions)]
    scheme = pinn.causal_weights(prob, net, x, conds, [], eps=5.0, chunks=3)
    causal = pinn.pinn_loss(prob, net, x, conds, reducers=scheme.reducers)
    got = hogrod.grad(lambda: causal()["residual"], net.trainable_variables)
    parts = [x[np.minimum((x[:, 1] * 3).astype(int), 2) == i] for i in range(3)]
    chunk_terms = [pinn.pinn_loss(prob, net, p, conds) for p in parts]
    losses = np.array([float(t()["residual"]) for t in chunk_terms])
    w = np.exp(-5.0 * np.concatenate([[0.0], np.cumsum(losses)[:-1]]))
    want = [sum(wi * g[k].numpy() for wi, g in zip(w, [
        hogrod.grad(lambda t=t: t()["residual"], net.trainable_variables)
        for t in chunk_terms])) / 3 for k in range(len(got))]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("mask", ["polynomial", "softplus"])
def test_self_adaptive_weights_rise_where_residuals_are_large_after_an_ascent_step(mask):
    """One SGD step of the train step: lambda_j gains lr m'(lambda_j) r_j^2 / n (ascent),
    most where the residual is largest; the network descends the same loss."""
    prob, net = line_problem(), mlp(1, 0)
    x, conds = line_points(), [tf.constant(LEFT_X)]
    scheme = pinn.self_adaptive_weights(prob, net, x, conds, net.trainable_variables,
                                        mask=mask, initial=0.5)
    lam = dict(zip(["residual", "left"], scheme.ascent))
    assert set(scheme.reducers) == {"residual", "left"} and lam["residual"].shape == (7, 1)
    loss_fn = pinn.pinn_loss(prob, net, x, conds, reducers=scheme.reducers)
    r = {"residual": pinn.residual(prob.pde, net, x).numpy(), "left": net(LEFT_X).numpy()}
    m = {"polynomial": lambda v: v ** 2, "softplus": lambda v: np.log1p(np.exp(v))}[mask]
    dm = {"polynomial": lambda v: 2 * v, "softplus": lambda v: 1 / (1 + np.exp(-v))}[mask]
    np.testing.assert_allclose(float(loss_fn()["residual"]),
                               np.mean(m(0.5) * r["residual"] ** 2), rtol=1e-12)
    params = [v.numpy() for v in net.trainable_variables]
    net_grad = [g.numpy() for g in hogrod.grad(
        lambda: sum(loss_fn().values()), net.trainable_variables)]
    lr = 0.125  # exact in float32, the optimizer's learning-rate dtype
    step = hogrod.train.make_train_step(loss_fn, [
        (keras.optimizers.SGD(lr), net.trainable_variables),
        (keras.optimizers.SGD(lr), list(scheme.ascent))])
    step(None)
    for name, v in lam.items():
        rise = v.numpy() - 0.5
        np.testing.assert_allclose(rise, lr * dm(0.5) * r[name] ** 2 / len(r[name]), rtol=1e-10)
        assert np.argmax(rise) == np.argmax(np.abs(r[name]))
    for p, g, v in zip(params, net_grad, net.trainable_variables):  # descent for the network
        np.testing.assert_allclose(v.numpy(), p - lr * g, rtol=1e-10)


def test_gpinn_term_matches_finite_differences_of_the_residual():
    """"gpinn" = sum_j w_j mean((d r / d x_j)^2), d r / d x_j by float64 central differences
    of the residual of a tanh network on the heat equation."""
    prob, net = pinn.problems.heat_problem(alpha=0.3, grid_shape=(3, 3)), mlp(2, 5)
    x = pinn.sample(prob.domain, 16, "sobol", 0).astype(np.float64)
    conds = [fn(4, i).astype(np.float64) for i, (_, fn, _) in enumerate(prob.conditions)]
    gpinn = {0: 0.3, 1: 0.02}
    terms = pinn.pinn_loss(prob, net, x, conds, gpinn=gpinn)()
    assert list(terms) == pinn.term_names(prob, gpinn) == ["residual", "initial", "boundary",
                                                           "gpinn"]
    h, want = 1e-5, 0.0
    for j, w in gpinn.items():
        e = np.zeros(2)
        e[j] = h
        d = (pinn.residual(prob.pde, net, tf.constant(x + e)).numpy()
             - pinn.residual(prob.pde, net, tf.constant(x - e)).numpy()) / (2 * h)
        want += w * np.mean(d ** 2)
    np.testing.assert_allclose(float(terms["gpinn"]), want, rtol=1e-6)
    weighted = pinn.pinn_loss(prob, net, x, conds, {"gpinn": 2.0}, gpinn=gpinn)()
    np.testing.assert_allclose(float(weighted["gpinn"]), 2.0 * want, rtol=1e-6)
    # its gradient in the parameters along a random direction, against central differences
    term = lambda: pinn.pinn_loss(prob, net, x, conds, gpinn=gpinn)()["gpinn"]  # noqa: E731
    variables = net.trainable_variables
    grads = hogrod.grad(term, variables)
    rng = np.random.default_rng(1)
    direction = [rng.standard_normal(v.shape) for v in variables]
    base = [v.numpy() for v in variables]
    sides = []
    for sign in (1, -1):
        for v, b, d in zip(variables, base, direction):
            v.assign(b + sign * 1e-6 * d)
        sides.append(float(term()))
    for v, b in zip(variables, base):
        v.assign(b)
    np.testing.assert_allclose(sum(np.sum(g.numpy() * d) for g, d in zip(grads, direction)),
                               (sides[0] - sides[1]) / 2e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="gpinn: coordinate 2 is not an index of the 2-D"):
        pinn.pinn_loss(prob, net, x, conds, gpinn={2: 0.1})
    with pytest.raises(ValueError, match="weight of coordinate 0 must be a finite number > 0"):
        pinn.pinn_loss(prob, net, x, conds, gpinn={0: -1.0})


def test_a_scheme_on_a_problem_without_the_terms_it_needs_is_a_named_error():
    net = mlp(2, 0)
    poisson = pinn.problems.poisson_problem(grid_points=3)
    x = pinn.sample(poisson.domain, 40, "uniform", 0, dtype=np.float64)
    conds = [fn(8, 0).astype(np.float64) for _, fn, _ in poisson.conditions]
    with pytest.raises(ValueError, match=r"no time coordinate \(Problem.time_dependent is "
                                         r"False\).*pinn_experiment.weighting"):
        pinn.causal_weights(poisson, net, x, conds, [])
    burgers = pinn.problems.burgers_problem(grid_shape=(3, 3))  # hard conditions: residual alone
    for scheme in (pinn.ntk_weights, pinn.grad_norm_weights):
        with pytest.raises(ValueError, match=r"residual as its only loss term.*"
                                             r"burgers_problem.hard_constraints = False"):
            scheme(burgers, net, x, [], net.trainable_variables)
    with pytest.raises(ValueError, match=r"7 of the 10 time chunks hold no collocation point.*"
                                         r"causal_weights.chunks"):
        pinn.causal_weights(burgers, net, np.array([[0.0, 0.05], [0.0, 0.15], [0.0, 0.95]]),
                            [], [], chunks=10)
    with pytest.raises(ValueError, match=r"self_adaptive_weights.terms must name terms of "
                                         r"problem 'poisson2d' \(\['residual', 'boundary'\]\)"):
        pinn.self_adaptive_weights(poisson, net, x, conds, [], terms=["initial"])
    scheme = pinn.self_adaptive_weights(poisson, net, x, conds, [])
    loss_fn = pinn.pinn_loss(poisson, net, x, conds, reducers=scheme.reducers)
    with pytest.raises(ValueError, match="40 per-point weights but was evaluated at 20"):
        loss_fn((tf.constant(x[:20]), [tf.constant(c) for c in conds]))


def test_self_adaptive_config_trains_and_checkpoints_its_weights(tmp_path):
    from experiments import pinn as exp
    from hogrod import harness
    _, m = harness.run(exp.pinn_experiment, ["configs/pinn/burgers_sa.gin"], [
        "pinn_experiment.width = 8", "pinn_experiment.depth = 2",
        "pinn_experiment.n_collocation = 128", "pinn_experiment.n_condition = 32",
        "pinn_experiment.adam_steps = 3", "pinn_experiment.lbfgs_maxiter = 0",
        "burgers_problem.grid_shape = (8, 4)",
        "pinn_experiment.jit_compile = False"], str(tmp_path))  # XLA's compile: 3 steps
    assert np.isfinite(m["relative_l2"]) and {"term_residual", "term_initial"} <= set(m)
    saved = [n for n, _ in tf.train.list_variables(str(tmp_path / "ckpt"))]
    assert any(n.startswith("sa_residual/") for n in saved), saved
    assert any(n.startswith("ascent_optimizer/") for n in saved), saved


def test_the_binary_takes_none_or_a_scheme_and_names_bad_choices():
    from experiments import pinn as exp
    prob, net = pinn.problems.heat_problem(grid_shape=(3, 3)), mlp(2, 0)
    x = tf.constant(pinn.sample(prob.domain, 128, "sobol", 0), tf.float64)  # 4 per time chunk
    conds = [tf.constant(fn(4, i), tf.float64) for i, (_, fn, _) in enumerate(prob.conditions)]
    args = (prob, net, x, conds, net.trainable_variables)
    assert exp.make_weighting(*args, None, None, None) == pinn.Weighting()
    annealing = exp.make_weighting(
        *args, None, functools.partial(pinn.grad_norm_weights, every=7), None)
    assert annealing.every == 7 and set(annealing.weights) == {"initial", "boundary"}
    assert annealing.weights["initial"].dtype == tf.float64  # the terms' dtype
    ntk = exp.make_weighting(*args, None, pinn.ntk_weights, {0: 0.1})
    assert set(ntk.weights) == {"residual", "initial", "boundary", "gpinn"}
    with pytest.raises(ValueError, match="pinn_experiment.weighting must be None or a "
                                         "weighting scheme by reference"):
        exp.make_weighting(*args, None, "ntk", None)
    with pytest.raises(ValueError, match="pinn_experiment.weights must be None"):
        exp.make_weighting(*args, {"initial": 2.0}, pinn.ntk_weights, None)
    causal = exp.make_weighting(*args, {"initial": 2.0}, pinn.causal_weights, None)
    assert set(causal.reducers) == {"residual"}  # no weights of its own: fixed ones apply


def test_grad_norm_balance_weights_of_a_linear_model_are_the_hand_computed_norm_ratios():
    """u = a + b x: L_r = mean((b - cos x)^2) has gradient (0, 2 mean(b - cos x)), the
    condition L_c = mean((a + b x)^2) has (2 mean(a + b x), 2 mean((a + b x) x)); jaxpi's
    weights are mean(||g_r||, ||g_c||) / ||g_i||. Inside `combined_weights`, after a scheme
    whose reducer quadruples the residual, the residual's gradient is measured quadrupled."""
    prob, net = line_problem(), mlp(1, 0)
    net.set_weights([np.array([[0.7]]), np.array([0.3])])  # b = 0.7, a = 0.3
    x, xc = line_points().numpy()[:, 0], LEFT_X[:, 0]
    conds = [tf.constant(LEFT_X)]
    args = (prob, net, line_points(), conds, net.trainable_variables)

    def expected(res_scale):
        g_r = res_scale * np.array([0.0, 2 * np.mean(0.7 - np.cos(x))])
        misfit = 0.3 + 0.7 * xc
        g_c = np.array([2 * np.mean(misfit), 2 * np.mean(misfit * xc)])
        norms = {"residual": np.linalg.norm(g_r), "left": np.linalg.norm(g_c)}
        mean = (norms["residual"] + norms["left"]) / 2
        return {n: 0.9 * 1.0 + 0.1 * mean / v for n, v in norms.items()}

    scheme = pinn.weighting.grad_norm_balance_weights(*args, alpha=0.9, every=5)
    assert scheme.every == 5 and set(scheme.weights) == {"residual", "left"}
    got = {k: float(v) for k, v in scheme.update().items()}
    for name, want in expected(1.0).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-12)

    def quadruple(problem, u_fn, points, condition_points, variables, gpinn=None):
        return pinn.Weighting(reducers={"residual": lambda x, sq: 4.0 * tf.reduce_mean(sq)})
    both = pinn.weighting.combined_weights(*args, schemes=[
        quadruple, functools.partial(pinn.weighting.grad_norm_balance_weights, every=5)])
    got = {k: float(v) for k, v in both.update().items()}
    for name, want in expected(4.0).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-12)
    with pytest.raises(ValueError, match="grad_norm_balance_weights.alpha"):
        pinn.weighting.grad_norm_balance_weights(*args, alpha=1.0)


def test_annealed_causal_eps_rises_only_once_every_chunk_is_open():
    """heat_u's chunk losses sum to about 2.6: at eps 1e-3 the last weight exp(-eps sum_{l<M})
    is above tol = 0.99 (the next loss uses eps 0.1), at 0.1 it is below (eps stays); each
    loss equals the paper's chunk-weighted mean at the eps it was computed with (numpy)."""
    alpha, chunks, schedule = 0.1, 4, (1e-3, 0.1, 10.0)
    prob = pinn.problems.heat_problem(alpha=alpha, grid_shape=(3, 3))
    x = pinn.sample(prob.domain, 200, "uniform", 0).astype(np.float64)
    conds = [fn(8, i).astype(np.float64) for i, (_, fn, _) in enumerate(prob.conditions)]
    scheme = pinn.weighting.annealed_causal_weights(prob, heat_u, x, conds, [], eps=schedule,
                                                    tol=0.99, chunks=chunks)
    loss = pinn.pinn_loss(prob, heat_u, x, conds, reducers=scheme.reducers)
    r2 = (x[:, 0] + alpha * np.pi ** 2 * np.sin(np.pi * x[:, 0])) ** 2
    chunk = np.minimum((x[:, 1] * chunks).astype(int), chunks - 1)
    losses = np.array([r2[chunk == i].mean() for i in range(chunks)])
    before = np.concatenate([[0.0], np.cumsum(losses)[:-1]])
    index = scheme.state["causal_eps_index"]
    for eps, index_after in [(1e-3, 1), (0.1, 1), (0.1, 1)]:
        w = np.exp(-eps * before)
        np.testing.assert_allclose(float(loss()["residual"]), np.mean(w * losses), rtol=1e-12)
        assert int(index) == index_after
    assert np.exp(-1e-3 * before[-1]) > 0.99 > np.exp(-0.1 * before[-1])  # not degenerate
    index.assign(2)
    np.testing.assert_allclose(float(loss()["residual"]),
                               np.mean(np.exp(-10.0 * before) * losses), rtol=1e-12)
    assert int(index) == 2  # the last eps stays
    for bad in [(), (1.0, 0.1), (1.0, float("nan"))]:
        with pytest.raises(ValueError, match="annealed_causal_weights.eps"):
            pinn.weighting.annealed_causal_weights(prob, heat_u, x, conds, [], eps=bad)
