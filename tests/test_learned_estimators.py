"""hogrod.learned's unrolls and estimators, each against an independent oracle (float64).

Oracles: the closed-form Gaussian-smoothed gradient of a quartic (ES, in expectation: the
mean of the per-pair terms within 4.5 standard errors); the exact gradient of a linear
dynamical system's full unroll, in numpy (PES summed over an episode's truncations, in
expectation; smoothing changes no gradient of a linear-quadratic problem; truncated ES and
TBPTT are shown biased there); `hogrod.hypergrad.unrolled` and a hand-written float64 tape
(TBPTT); full ES with the same perturbations (PES and ES with K = T); the algebra of an
antithetic pair (exact); an episode run by hand after a reset; one device (two logical
CPUs); a rebuilt state (resume).
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, distribute, hypergrad, learned, optim
from hogrod.learned import unroll as unroll_lib

F64 = tf.float64


def compiled(estimator, problem):
    """The estimator's `estimate` on `problem` as one tf.function."""
    return tf.function(lambda theta, state, seed: estimator.estimate(problem, theta, state, seed),
                       autograph=False)


def seed(i):
    return tf.constant([i, 7], tf.int64)


def direct_problem(objective, dim):
    """A problem whose state becomes theta at each step: a truncation's value is
    objective(theta)."""
    return learned.InnerProblem(init=lambda s: tf.zeros([dim], F64),
                                step=lambda s, theta, b: theta,
                                objective=lambda s, b: objective(s))


def standard_error(rows):
    rows = np.asarray(rows)
    return rows.std(axis=0, ddof=1) / np.sqrt(rows.shape[0])


# ---- evolution strategies on closed forms ------------------------------------------------

H = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 3.0]])
G = np.array([1.0, -1.0, 0.5])


def quartic(x):
    return (0.5 * tf.tensordot(x, tf.linalg.matvec(tf.constant(H), x), 1)
            + tf.tensordot(tf.constant(G), x, 1) + 0.25 * tf.reduce_sum(x ** 4))


def test_es_is_in_expectation_the_gradient_of_the_gaussian_smoothed_objective():
    """E[f(theta + eps)] of f = x'Hx/2 + g'x + sum x^4/4 has the gradient
    H theta + g + theta^3 + 3 sigma^2 theta; the estimate is within 4.5 standard errors of
    it and many standard errors from the unsmoothed gradient."""
    sigma, theta = 0.5, np.array([1.0, -0.5, 2.0])
    estimator = learned.es(sigma=sigma, particles=80_000, truncation=1)
    problem = direct_problem(quartic, 3)
    state = estimator.init(problem, tf.constant(theta), 0)
    estimate, _ = compiled(estimator, problem)(tf.constant(theta), state, seed(1))
    plain = H @ theta + G + theta ** 3
    smoothed = plain + 3 * sigma ** 2 * theta
    se = standard_error(estimate.per_particle)
    mean = np.mean(estimate.per_particle.numpy(), axis=0)
    np.testing.assert_allclose(mean, estimate.grads.numpy(), rtol=1e-12)
    assert np.all(np.abs(mean - smoothed) < 4.5 * se), (mean, smoothed, se)
    assert np.abs(mean - plain)[2] > 8 * se[2], (mean, plain, se)


def test_an_antithetic_pair_cancels_the_even_terms_exactly():
    """For f = c + g'x + x'Hx/2, f(theta + eps) - f(theta - eps) = 2 (H theta + g)'eps
    exactly: each pair's term is ((H theta + g)'eps) eps / sigma^2, the same for es and pes
    (one truncation from the start: PES's accumulated perturbation is the pair's eps)."""
    sigma, theta = 0.3, np.array([0.2, -1.0, 0.7])

    def quadratic(x):
        return 4.0 + tf.tensordot(tf.constant(G), x, 1) + 0.5 * tf.tensordot(
            x, tf.linalg.matvec(tf.constant(H), x), 1)

    problem = direct_problem(quadratic, 3)
    runs = {}
    for name, make in (("pes", learned.pes), ("es", learned.es)):
        estimator = make(sigma=sigma, particles=6, truncation=1)
        state = estimator.init(problem, tf.constant(theta), 3)
        runs[name] = compiled(estimator, problem)(tf.constant(theta), state, seed(4))
    (pes_estimate, pes_state), (es_estimate, _) = runs["pes"], runs["es"]
    eps = pes_state.accumulated.numpy()
    np.testing.assert_array_equal(eps[3:], -eps[:3])
    expected = (eps[:3] @ (H @ theta + G))[:, None] * eps[:3] / sigma ** 2
    np.testing.assert_allclose(pes_estimate.per_particle.numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(es_estimate.per_particle.numpy(), expected, rtol=1e-10)
    values = [4.0 + G @ x + 0.5 * x @ H @ x for x in theta + eps]
    np.testing.assert_allclose(pes_estimate.meta_loss.numpy(), np.mean(values), rtol=1e-12)


# ---- a linear dynamical system over truncations ------------------------------------------

A = np.array([[0.9, 0.2, 0.0], [0.0, 0.8, 0.3], [0.1, 0.0, 0.7]])
B = np.array([[1.0, 0.0], [0.5, -1.0], [0.0, 0.3]])
Y = np.array([1.0, -1.0, 0.5])


def linear_problem():
    return learned.InnerProblem(
        init=lambda s: tf.ones([3], F64),
        step=lambda s, theta, b: tf.linalg.matvec(tf.constant(A), s)
        + tf.linalg.matvec(tf.constant(B), theta),
        objective=lambda s, b: 0.5 * tf.reduce_sum((s - tf.constant(Y)) ** 2))


def full_unroll_gradient(theta, horizon, truncation):
    """d/dtheta of sum_t l(s_t) / K over t = 1..T, in numpy: s_t and ds_t/dtheta = M_t."""
    s, m, grad = np.ones(3), np.zeros((3, 2)), np.zeros(2)
    for _ in range(horizon):
        s, m = A @ s + B @ theta, A @ m + B
        grad += m.T @ (s - Y)
    return grad / truncation


def episode(estimator, problem, theta, truncations):
    """Per-row terms and grads summed over `truncations` estimates from the start."""
    state = estimator.init(problem, tf.constant(theta), 5)
    run = compiled(estimator, problem)
    rows, grads = 0.0, 0.0
    for k in range(truncations):
        estimate, state = run(tf.constant(theta), state, seed(10 + k))
        rows, grads = rows + estimate.per_particle.numpy(), grads + estimate.grads.numpy()
    return rows, grads


def test_pes_over_an_episode_is_unbiased_for_the_full_unroll_gradient():
    """Summed over the T / K truncations of an episode, PES's mean is within 4.5 standard
    errors of the exact gradient of the (smoothed) full unroll; truncated ES and TBPTT,
    blind to theta's effect on the state a truncation starts from, are far from it."""
    theta, horizon, truncation = np.array([0.3, -0.2]), 6, 2
    exact = full_unroll_gradient(theta, horizon, truncation)
    problem = linear_problem()
    kwargs = dict(particles=20_000, truncation=truncation, horizon=horizon, stagger=False)
    rows, grads = episode(learned.pes(sigma=0.1, **kwargs), problem, theta, 3)
    se = standard_error(rows)
    assert np.all(np.abs(grads - exact) < 4.5 * se), (grads, exact, se)
    rows, es_grads = episode(learned.es(sigma=0.1, **kwargs), problem, theta, 3)
    assert np.max(np.abs(es_grads - exact) / standard_error(rows)) > 10, (es_grads, exact)
    _, tbptt_grads = episode(learned.tbptt(**dict(kwargs, particles=1)), problem, theta, 3)
    assert np.linalg.norm(tbptt_grads - exact) > 0.2 * np.linalg.norm(exact)


# ---- truncated backpropagation -----------------------------------------------------------

RNG = np.random.default_rng(0)
X_TRAIN, Y_TRAIN = RNG.normal(size=(6, 3)), RNG.normal(size=6)
X_VAL, Y_VAL = RNG.normal(size=(5, 3)), RNG.normal(size=5)
W0 = np.array([0.5, -0.3, 0.8])
LR = 0.1


def inner_objective(w, h):
    residual = tf.linalg.matvec(tf.constant(X_TRAIN), w) - tf.constant(Y_TRAIN)
    return 0.5 * tf.reduce_mean(residual ** 2) + 0.5 * tf.reduce_sum(tf.exp(h) * w ** 2)


def outer_objective(w, h=None):
    return 0.5 * tf.reduce_mean((tf.linalg.matvec(tf.constant(X_VAL), w)
                                 - tf.constant(Y_VAL)) ** 2)


def ridge_step(w, theta, batch):
    with tf.GradientTape() as tape:
        tape.watch(w)
        value = inner_objective(w, theta)
    return w - LR * tape.gradient(value, w)


def ridge_problem(meta_objective):
    return learned.InnerProblem(lambda s: tf.constant(W0), ridge_step,
                                lambda w, b: outer_objective(w), meta_objective=meta_objective)


def taped(theta, w, steps):
    """A hand-written float64 tape: d/dtheta of the mean validation loss after each of
    `steps` ridge steps from w (a constant), and w after them."""
    theta = tf.constant(theta)
    with tf.GradientTape() as tape:
        tape.watch(theta)
        total = 0.0
        for _ in range(steps):
            w = ridge_step(w, theta, ())
            total += outer_objective(w)
        total /= steps
    return tape.gradient(total, theta).numpy(), tf.stop_gradient(w)


def test_tbptt_with_k_equal_to_t_is_full_backpropagation():
    """Against hogrod.hypergrad.unrolled (SGD through 5 steps, the last step's loss) and
    a hand tape (the mean loss); K < T: each truncation is the tape from the state the
    last one left, held constant."""
    theta = np.array([-1.0, 0.5, -2.0])
    oracle = hypergrad.hypergradient(inner_objective, outer_objective, tf.constant(W0),
                                     tf.constant(theta), hypergrad.unrolled(optim.sgd(LR), 5))
    estimator = learned.tbptt(particles=2, truncation=5, horizon=5)
    problem = ridge_problem("last")
    state = estimator.init(problem, tf.constant(theta), 0)
    estimate, _ = compiled(estimator, problem)(tf.constant(theta), state, seed(0))
    np.testing.assert_allclose(estimate.grads.numpy(), oracle.grads.numpy(), rtol=1e-12)
    np.testing.assert_allclose(estimate.per_particle.numpy(), [oracle.grads.numpy()] * 2,
                               rtol=1e-12)
    np.testing.assert_allclose(estimate.meta_loss.numpy(), oracle.value.numpy(), rtol=1e-12)

    problem = ridge_problem("sum")
    estimator = learned.tbptt(particles=1, truncation=2, horizon=4)
    state = estimator.init(problem, tf.constant(theta), 0)
    run = compiled(estimator, problem)
    w = tf.constant(W0)
    for _ in range(2):
        estimate, state = run(tf.constant(theta), state, seed(0))
        expected, w = taped(theta, w, 2)
        np.testing.assert_allclose(estimate.grads.numpy(), expected, rtol=1e-12)
        np.testing.assert_allclose(state.particles.inner.numpy()[0], w.numpy(), rtol=1e-12)


# ---- K = T, resets, staggered starts -----------------------------------------------------

def noisy_problem():
    """Ridge steps on fresh data each step (from the data seed and t), the initial weights
    drawn from the episode's seed: resets and seeds show in every number."""
    def batch(s, t):
        x = tf.random.stateless_normal([4, 3], tf.random.experimental.stateless_fold_in(s, t),
                                       dtype=F64)
        return x, tf.linalg.matvec(x, tf.constant([1.0, -2.0, 0.5], F64))

    def loss(w, theta, data):
        x, y = data
        return (0.5 * tf.reduce_mean((tf.linalg.matvec(x, w) - y) ** 2)
                + 0.5 * tf.reduce_sum(tf.exp(theta) * w ** 2))

    def step(w, theta, data):
        with tf.GradientTape() as tape:
            tape.watch(w)
            value = loss(w, theta, data)
        return w - 0.2 * tape.gradient(value, w)

    return learned.InnerProblem(lambda s: tf.random.stateless_normal([3], s, dtype=F64), step,
                                lambda w, data: loss(w, tf.constant([-30.0] * 3, F64), data),
                                batch=batch)


THETA = np.array([-1.0, -2.0, 0.0])


def test_pes_with_k_equal_to_t_is_full_es_with_the_same_perturbations():
    """Two estimates (the second after a reset) equal full ES's with the same seeds."""
    problem = noisy_problem()
    results = []
    for estimator in (learned.full_es(sigma=0.1, particles=4, horizon=3),
                      learned.pes(sigma=0.1, particles=4, truncation=3, horizon=3)):
        state = estimator.init(problem, tf.constant(THETA), 2)
        run = compiled(estimator, problem)
        results.append([])
        for k in range(2):  # the second from fresh states of episode 1
            estimate, state = run(tf.constant(THETA), state, seed(k))
            results[-1].append([t.numpy() for t in tf.nest.flatten(estimate)])
    for a, b in zip(*results):
        for x, y in zip(a, b):
            np.testing.assert_allclose(y, x, rtol=1e-13, atol=0)


def test_a_reset_at_the_horizon_restarts_the_state_and_the_accumulated_perturbation():
    """T = 2K: the perturbations of the first two truncations add up; the third starts
    episode 1 from problem.init with the next episode's seeds, its accumulated perturbation
    its own (each checked against a run of the same seed from the start)."""
    problem = noisy_problem()
    theta = tf.constant(THETA)
    estimator = learned.pes(sigma=0.1, particles=4, truncation=2, horizon=4, stagger=False)
    run = compiled(estimator, problem)
    start = estimator.init(problem, theta, 1)
    alone = {k: run(theta, start, seed(k))[1].accumulated.numpy() for k in (1, 2, 3)}
    state = start
    for k in (1, 2, 3):
        _, state = run(theta, state, seed(k))
        if k == 2:
            np.testing.assert_allclose(state.accumulated.numpy(), alone[1] + alone[2],
                                       rtol=1e-14)
    eps = alone[3]
    np.testing.assert_array_equal(state.accumulated.numpy(), eps)
    particles = state.particles
    np.testing.assert_array_equal(particles.episode.numpy(), [1] * 4)
    np.testing.assert_array_equal(particles.steps.numpy(), [2] * 4)
    for p in range(4):  # episode 1 by hand: init and data from the next episode's seeds
        s = particles.seeds.numpy()[p]
        w = tf.random.stateless_normal([3], tf.constant([s[0], s[1] + 2]), dtype=F64)
        for t in range(2):  # t an int64 tensor, as the unroll counts steps
            data = problem.batch(tf.constant([s[0], s[1] + 3]), tf.constant(t, tf.int64))
            w = problem.step(w, theta + eps[p], data)
        np.testing.assert_allclose(particles.inner.numpy()[p], w.numpy(), rtol=1e-12)


def test_staggered_starts_spread_the_particles_over_the_horizon():
    assert unroll_lib.start_offsets(4, 1, 4, True) == [0, 1, 2, 3]
    assert unroll_lib.start_offsets(3, 2, 8, True) == [0, 2, 4]
    assert unroll_lib.start_offsets(3, 2, 8, False) == [0, 0, 0]
    assert unroll_lib.start_offsets(2, 2, None, True) == [0, 0]
    problem = linear_problem()
    estimator = learned.es(sigma=0.1, particles=8, truncation=1, horizon=4)
    state = estimator.init(problem, tf.constant([0.1, 0.2], F64), 0)
    np.testing.assert_array_equal(state.particles.length.numpy(), [4, 3, 2, 1] * 2)
    run = compiled(estimator, problem)
    for k in range(4):
        _, state = run(tf.constant([0.1, 0.2], F64), state, seed(k))
    np.testing.assert_array_equal(state.particles.steps.numpy(), [4, 1, 2, 3] * 2)
    np.testing.assert_array_equal(state.particles.episode.numpy(), [0, 1, 1, 1] * 2)
    inner = state.particles.inner.numpy()
    np.testing.assert_array_equal(inner[:4], inner[4:])  # ES pairs continue from one state


# ---- bad input ---------------------------------------------------------------------------

def test_bad_input_is_named():
    problem = linear_problem()
    theta = tf.constant([0.1, 0.2], F64)
    with pytest.raises(checks.ArgumentError, match="truncation=3 must divide horizon=10"):
        learned.pes(sigma=0.1, particles=4, truncation=3, horizon=10)
    with pytest.raises(checks.ArgumentError, match="sigma must be a positive"):
        learned.es(sigma=0.0, particles=4, truncation=1)
    with pytest.raises(checks.ArgumentError, match="sigma must be a positive"):
        learned.full_es(sigma=-1.0, particles=4, horizon=2)
    with pytest.raises(checks.ArgumentError, match="particles must be even"):
        learned.pes(sigma=0.1, particles=5, truncation=1)
    with pytest.raises(checks.ArgumentError, match="problem must be a hogrod.learned"):
        learned.tbptt(particles=2, truncation=1).init((lambda s: s,), theta, 0)
    changing = problem._replace(step=lambda s, theta, b: tf.concat([s, theta], 0))
    estimator = learned.tbptt(particles=2, truncation=2)
    state = estimator.init(changing, theta, 0)
    with pytest.raises(checks.ArgumentError, match=r"problem.step changed leaf 0 .*float64\[3\] "
                                                   r"to float64\[5\]"):
        estimator.estimate(changing, theta, state, 0)
    regrouped = problem._replace(step=lambda s, theta, b: (s, s))
    with pytest.raises(checks.ArgumentError, match="problem.step returned a state of another "
                                                   "structure"):
        estimator.estimate(regrouped, theta, state, 0)
    with pytest.raises(checks.ArgumentError, match=r"problem.objective\(state, batch\) must "
                                                   "return a floating scalar"):
        estimator.estimate(problem._replace(objective=lambda s, b: s), theta, state, 0)
    with pytest.raises(checks.ArgumentError, match="state holds 2 particles but the estimator "
                                                   "has particles=4"):
        learned.tbptt(particles=4, truncation=1).estimate(problem, theta, state, 0)
    with pytest.raises(checks.ArgumentError, match="outer_lr must be a positive"):
        learned.meta_step(problem, estimator, outer_lr=0.0)
    with pytest.raises(checks.ArgumentError, match="clip_norm must be a positive"):
        learned.meta_step(problem, estimator, outer_lr=0.1, clip_norm=-1.0)


# ---- the outer step ----------------------------------------------------------------------

def test_the_outer_step_clips_to_the_global_norm_in_float64():
    """SGD at rate 1 moves theta by the estimate scaled to norm clip_norm (numpy)."""
    problem, theta = linear_problem(), np.array([0.3, -0.2])
    meta = learned.meta_step(problem, learned.tbptt(particles=1, truncation=2), outer_lr=1.0,
                             clip_norm=0.5)
    state, estimate = meta.step(meta.init(tf.constant(theta), 0))
    grads = estimate.grads.numpy()
    assert np.linalg.norm(grads) > 1
    np.testing.assert_allclose(state.theta.numpy(),
                               theta - 0.5 * grads / np.linalg.norm(grads), rtol=1e-15)


def _run(meta, state, steps):
    for _ in range(steps):
        state, _ = meta.step(state)
    return state


def test_the_meta_step_traces_once_resumes_exactly_and_two_cpus_equal_one():
    """Three outer steps trace once; two steps, a state rebuilt from numpy (a checkpoint)
    and one more equal three; split over two logical CPUs (MirroredStrategy) they equal one
    device's (PES: rows of unrolls; TBPTT: a tape inside each replica)."""
    problem = linear_problem()
    theta = tf.constant([0.3, -0.2], F64)
    flat = lambda s: [t.numpy() for t in tf.nest.flatten(s)]  # noqa: E731
    strategy = distribute.make_strategy("mirrored")  # the process's one MirroredStrategy
    for estimator in (learned.pes(sigma=0.1, particles=8, truncation=2, horizon=6),
                      learned.tbptt(particles=4, truncation=2, horizon=6)):
        meta = learned.meta_step(problem, estimator, outer_lr=0.01, optimizer=optim.adam,
                                 clip_norm=5.0)
        start = meta.init(theta, 3)
        two = _run(meta, start, 2)
        state = _run(meta, two, 1)
        assert meta.step.experimental_get_tracing_count() == 1
        rebuilt = tf.nest.map_structure(lambda t: tf.constant(t.numpy()), two)
        for a, b in zip(flat(state), flat(_run(meta, rebuilt, 1))):
            np.testing.assert_array_equal(a, b)
        split = learned.meta_step(problem, estimator, outer_lr=0.01, optimizer=optim.adam,
                                  clip_norm=5.0, strategy=strategy)
        for a, b in zip(flat(state), flat(_run(split, start, 3))):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)


def test_the_xla_unroll_takes_the_plain_steps_and_auto_stays_plain_where_a_step_draws(caplog):
    """PES with its unrolls as XLA computations ("auto", the default, and True) equals
    jit_compile=False over three estimates through a reset, float64 to rounding (the
    perturbations, initial states and batches are drawn outside XLA). A step that draws
    random numbers keeps "auto" plain, with one warning, and the plain numbers (rounding:
    its batches drawn before the steps)."""
    theta = tf.constant(THETA)

    def three(problem, jit):
        estimator = learned.pes(sigma=0.1, particles=4, truncation=2, horizon=4, jit_compile=jit)
        state, run, out = estimator.init(problem, theta, 1), compiled(estimator, problem), []
        for k in range(3):
            estimate, state = run(theta, state, seed(k))
            out += [t.numpy() for t in tf.nest.flatten((estimate, state))]
        return out

    def warnings():
        return [r.getMessage() for r in caplog.records
                if "jit_compile='auto' runs the inner steps without XLA" in r.getMessage()]

    problem = noisy_problem()
    plain = three(problem, False)
    with caplog.at_level(logging.WARNING):
        for jit in ("auto", True):
            for a, b in zip(plain, three(problem, jit)):
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
        assert warnings() == []  # "auto" took XLA
        noise = tf.constant([1e-3, -1e-3, 2e-3], F64)
        drawing = problem._replace(step=lambda w, theta, data: problem.step(w, theta, data)
                                   + noise * tf.random.stateless_normal([3], [1, 2], dtype=F64))
        auto = three(drawing, "auto")
        assert len(warnings()) == 1 and "random" in warnings()[0], warnings()
    for a, b in zip(three(drawing, False), auto):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
    with pytest.raises(checks.ArgumentError, match="hogrod.learned.pes.jit_compile must be"):
        learned.pes(sigma=0.1, particles=4, truncation=2, jit_compile="yes")
