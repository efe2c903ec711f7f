"""Meta-learning through long unrolls: your own inner problem, the estimators against its
exact gradient, and a learned learning-rate schedule meta-trained with PES, then used to
train a Keras model.

    python docs/guide/learned.py            # full size
    python docs/guide/learned.py --quick    # small (HOGROD_GUIDE_QUICK=1 too)

(a) Your own `hogrod.learned.InnerProblem`: a driven linear system x <- A x + B theta whose
    loss 1/2 ||x - target||^2 is averaged over a T-step episode. x_t is linear in theta, so
    the episode's loss is quadratic in theta and its Gaussian smoothing changes it by a
    constant only: the exact gradient (numpy, closed form) is what PES estimates without
    bias. TBPTT with K = T equals it to rounding; PES with K = T/5, averaged over an
    episode's truncations, lands within a few standard errors of it; TBPTT with K = 1 is
    biased, more than five standard errors away.
(b) A learned schedule (`hogrod.learned.learned_schedule`: SGD whose rate is linear between
    exp(theta_0) at step 0 and exp(theta_1) at step T) on your own task family (noisy
    linear regressions, `hogrod.learned.TaskFamily`), meta-trained by PES through
    `hogrod.learned.meta_step`: the held-out tasks' mean training loss over T steps falls
    below the starting schedule's. The trained optimizer is an ordinary `hogrod.optim`
    optimizer: `make_train_step` trains a Keras model with it, step for step as numpy's SGD
    at the schedule's closed-form rates.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hogrod import learned, optim, train  # noqa: E402

# ---- (a) your own inner problem against its exact gradient ---------------------------------

A = np.array([[0.9, 0.2], [0.0, 0.7]])
B = np.array([[1.0, 0.5], [-0.3, 1.0]])
TARGET = np.array([1.0, -2.0])


def driven_system():
    """x <- A x + B theta from x = 0; objective 1/2 ||x - target||^2 (averaged over a
    truncation's steps: meta_objective "sum")."""
    a, b, target = (tf.constant(m) for m in (A, B, TARGET))

    def init(seed):
        return tf.zeros([2], tf.float64)

    def step(x, theta, batch):
        return tf.linalg.matvec(a, x) + tf.linalg.matvec(b, theta)

    def objective(x, batch):
        return 0.5 * tf.reduce_sum(tf.square(x - target))

    return learned.InnerProblem(init, step, objective)


def exact_gradient(theta, steps):
    """d/dtheta of (1/T) sum_t 1/2 ||x_t - target||^2, x_t = M_t theta with
    M_t = sum_{s<t} A^s B (numpy)."""
    m, power, grad = np.zeros((2, 2)), np.eye(2), np.zeros(2)
    for _ in range(steps):
        m, power = m + power @ B, power @ A
        grad += m.T @ (m @ theta - TARGET)
    return grad / steps


def episode_average(estimator, problem, theta, truncations, seed):
    """The estimates of one episode's truncations averaged, and the standard error of that
    average from the per-row terms (rows, particles or pairs, are independent of each other;
    a row's terms over the truncations are not, so they are averaged first)."""
    estimate = tf.function(lambda state, seed: estimator.estimate(problem, theta, state, seed),
                           autograph=False)  # traced once, called once per truncation
    state = estimator.init(problem, theta, tf.constant([seed, 0], tf.int64))
    grads, rows = 0.0, 0.0
    for k in range(truncations):
        result, state = estimate(state, tf.constant([seed, k + 1], tf.int64))
        grads, rows = grads + result.grads.numpy(), rows + result.per_particle.numpy()
    rows = rows / truncations
    stderr = rows.std(0, ddof=1) / np.sqrt(len(rows)) if len(rows) > 1 else 0.0
    return grads / truncations, stderr


def own_problem_against_the_exact_gradient(quick):
    steps, k = 20, 4
    pairs = 200 if quick else 2000
    problem = driven_system()
    theta = tf.constant([0.3, -0.2], tf.float64)
    exact = exact_gradient(theta.numpy(), steps)

    full = learned.tbptt(particles=1, truncation=steps, horizon=steps, stagger=False)
    tbptt_full, _ = episode_average(full, problem, theta, 1, 0)
    np.testing.assert_allclose(tbptt_full, exact, rtol=1e-12)

    pes = learned.pes(sigma=0.1, particles=2 * pairs, truncation=k, horizon=steps, stagger=False)
    pes_mean, pes_stderr = episode_average(pes, problem, theta, steps // k, 1)
    pes_z = np.abs(pes_mean - exact) / pes_stderr

    short = learned.tbptt(particles=1, truncation=1, horizon=steps, stagger=False)
    tbptt_short, _ = episode_average(short, problem, theta, steps, 2)
    short_z = np.abs(tbptt_short - exact) / pes_stderr

    print(f"(a) exact gradient {exact}; TBPTT K=T {tbptt_full}; PES K={k} {pes_mean} "
          f"(+- {pes_stderr}, {pes_z.max():.2f} standard errors away); TBPTT K=1 "
          f"{tbptt_short} ({short_z.max():.0f} standard errors away)")
    assert np.all(pes_z < 4), pes_z  # unbiased: within 4 standard errors
    assert np.max(short_z) > 5, short_z  # biased: far outside them
    return pes_z


# ---- (b) a learned schedule on your own task family ----------------------------------------

DIM, BATCH, NOISE = 5, 8, 0.5


def regression_family():
    """Noisy linear regressions: a task seed draws the task, w* ~ N(0, I); a batch is the
    inputs x ~ N(0, I) and the noise of step t's rows, y = x w* + noise; the weights start
    at 0. (A batch says which examples a step sees; the task says what they are.)"""
    def init(seed):
        return [tf.zeros([DIM, 1], tf.float64)], tf.random.stateless_normal(
            [DIM, 1], seed, dtype=tf.float64)

    def draw(seed, n):
        keys = tf.random.experimental.stateless_split(seed, 2)
        return (tf.random.stateless_normal([n, DIM], keys[0], dtype=tf.float64),
                NOISE * tf.random.stateless_normal([n, 1], keys[1], dtype=tf.float64))

    def batch(seed, t):
        return draw(tf.random.experimental.stateless_fold_in(seed, t), BATCH)

    def data(task):
        return draw(tf.constant([0, 0], tf.int64), 256)  # the same inputs for every task

    def examples(task, batch):
        x, noise = batch
        return x, tf.matmul(x, task) + noise

    def loss(params, task, batch):
        x, y = examples(task, batch)
        return 0.5 * tf.reduce_mean(tf.square(tf.matmul(x, params[0]) - y))

    return learned.TaskFamily("noisy linear regression", init, loss, batch, data, examples)


def heldout_loss(schedule, family, steps, tasks):
    """`loss(theta)`: the mean over `tasks` held-out tasks (the "heldout" split, which no
    training particle draws) of the training loss over a fresh `steps`-step run; compiled
    once for every theta and task."""
    problem = learned.optimizer_problem(schedule, family, split="heldout")
    run = tf.function(lambda theta, seed: learned.evaluate(problem, theta, steps, seed),
                      autograph=False)
    return lambda theta: float(np.mean([run(theta, tf.constant([i, 0], tf.int64))
                                        for i in range(tasks)]))


def learn_a_schedule(quick):
    steps, k = 20, 5
    meta_steps, pairs = (30, 16) if quick else (300, 64)
    family = regression_family()
    schedule = learned.learned_schedule(kind="piecewise", horizon=steps, knots=2,
                                        initial_rate=0.02, dtype="float64")
    problem = learned.optimizer_problem(schedule, family)
    estimator = learned.pes(sigma=0.1, particles=2 * pairs, truncation=k, horizon=steps)
    meta = learned.meta_step(problem, estimator, outer_lr=0.05, optimizer=optim.adam)
    theta0 = schedule.init(0)
    state = meta.init(theta0, 0)
    for _ in range(meta_steps):
        state, estimate = meta.step(state)
    theta = state.theta
    heldout = heldout_loss(schedule, family, steps, 32)
    before, after = heldout(theta0), heldout(theta)
    rates = np.exp(theta["log_rates"].numpy())
    print(f"(b) rates at steps 0 and {steps}: {np.exp(theta0['log_rates'].numpy())} -> "
          f"{rates}; held-out mean training loss {before:.4f} -> {after:.4f}")
    assert after < before, (before, after)

    # the trained schedule trains a Keras model: SGD at the schedule's closed-form rates
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, DIM)), rng.normal(size=(32, 1))
    model = keras.Sequential([keras.Input((DIM,), dtype="float64"),
                              keras.layers.Dense(1, use_bias=False, dtype="float64")])
    w = model.trainable_variables[0].numpy()

    def objective(batch):
        xb, yb = batch
        return 0.5 * tf.reduce_mean(tf.square(model(xb) - yb))

    step = train.make_train_step(objective, schedule.optimizer(theta), model.trainable_variables)
    for t in range(5):
        step((tf.constant(x), tf.constant(y)))
        rate = rates[0] * (steps - t) / steps + rates[1] * t / steps
        w = w - rate * x.T @ (x @ w - y) / len(x)
    gap = np.abs(model.trainable_variables[0].numpy() - w).max()
    assert gap < 1e-12, gap
    return before, after


def main(quick=False):
    """Run both parts (`quick`: fewer particles and meta-steps)."""
    own_problem_against_the_exact_gradient(quick)
    learn_a_schedule(quick)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
