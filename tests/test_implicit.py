"""hogrod.implicit against closed forms: ridge regression x*(lam, b) = (A^T A + lam I)^{-1}
A^T b (d loss/d lam and d loss/d b in float64) for every solve; a linear fixed point
x = M x + c with a non-symmetric contraction M; eagerly, in tf.function, per task in
tf.vectorized_map, per replica under MirroredStrategy; the solver never differentiated;
bad input."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import distribute, implicit, train, tree

RNG = np.random.default_rng(0)
A = RNG.normal(size=(8, 5))
B = RNG.normal(size=8)
T = RNG.normal(size=5)
LAM = 0.7


def ridge_f(x, lam, a, b):  # the gradient of 0.5 |a x - b|^2 + 0.5 lam |x|^2
    return tf.linalg.matvec(a, tf.linalg.matvec(a, x) - b, transpose_a=True) + lam * x


def ridge_exact(lam, a, b):
    return tf.linalg.solve(tf.matmul(a, a, transpose_a=True) + lam * tf.eye(5, dtype=a.dtype),
                           tf.linalg.matvec(a, b, transpose_a=True)[:, None])[:, 0]


def ridge_oracle(lam=LAM, a=A, b=B, t=T):
    """Closed form: with H = A^T A + lam I, g = x - t: dL/dlam = -g^T H^{-1} x,
    dL/db = A H^{-1} g."""
    h = a.T @ a + lam * np.eye(a.shape[1])
    x = np.linalg.solve(h, a.T @ b)
    g = x - t
    return -g @ np.linalg.solve(h, x), a @ np.linalg.solve(h, g)


def outer(solver, lam, b, a=A):
    lam, b = tf.convert_to_tensor(lam, tf.float64), tf.convert_to_tensor(b, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([lam, b])
        x = solver(tf.zeros(5, tf.float64), lam, tf.constant(a), b)
        loss = 0.5 * tf.reduce_sum((x - T) ** 2)
    return tape.gradient(loss, [lam, b])


def my_solve(matvec, b):  # a user solve: dense, from matvec on the basis
    n = b.shape[0]
    cols = [matvec(tf.one_hot(i, n, dtype=b.dtype)) for i in range(n)]
    return tf.linalg.solve(tf.stack(cols, 1), b[:, None])[:, 0]


@pytest.mark.parametrize("solve,options,rtol", [
    ("cg", {"tol": 1e-13}, 1e-10), ("dense", {}, 1e-10), ("normal_cg", {"tol": 1e-14}, 1e-10),
    (my_solve, {}, 1e-10), ("neumann", {"step": None, "maxiter": 3000, "tol": 1e-10}, 1e-7)])
def test_ridge_gradient_matches_the_closed_form(solve, options, rtol):
    options = dict(options)
    if "step" in options:  # 1 / lambda_max: the series' spectral radius is < 1
        options["step"] = 1.0 / np.linalg.eigvalsh(A.T @ A + LAM * np.eye(5)).max()
    solver = implicit.custom_root(ridge_f, solve=solve, **options)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))
    d_lam, d_b = outer(solver, LAM, B)
    want_lam, want_b = ridge_oracle()
    np.testing.assert_allclose(d_lam.numpy(), want_lam, rtol=rtol)
    np.testing.assert_allclose(d_b.numpy(), want_b, rtol=rtol)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_truncated_cg_takes_exactly_maxiter_steps(steps):
    """iMAML's fixed CG budget: w is the k-step CG iterate for H w = g (H = A^T A + lam I,
    g = x - t), the minimizer of the H-norm error over the Krylov space
    span(g, Hg, ..., H^{k-1} g): w_k = K (K^T H K)^{-1} K^T g. Then dL/dlam = -w_k^T x and
    dL/db = A w_k. Short of convergence (k < 5), so the untruncated solve would raise."""
    solver = implicit.custom_root(ridge_f, maxiter=steps, truncated=True)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))
    d_lam, d_b = outer(solver, LAM, B)
    h = A.T @ A + LAM * np.eye(5)
    x = np.linalg.solve(h, A.T @ B)
    g = x - T
    k = np.stack([np.linalg.matrix_power(h, i) @ g for i in range(steps)], 1)
    w = k @ np.linalg.solve(k.T @ h @ k, k.T @ g)
    assert np.linalg.norm(h @ w - g) > 1e-3 * np.linalg.norm(g)  # truly truncated
    np.testing.assert_allclose(d_lam.numpy(), -w @ x, rtol=1e-9)
    np.testing.assert_allclose(d_b.numpy(), A @ w, rtol=1e-9)
    with pytest.raises(ValueError, match="did not reach tol"):
        outer(implicit.custom_root(ridge_f, maxiter=steps)(
            lambda init, lam, a, b: ridge_exact(lam, a, b)), LAM, B)


M = 0.3 * RNG.normal(size=(5, 5))  # non-symmetric
M *= 0.8 / np.linalg.norm(M, 2)  # a contraction
C = RNG.normal(size=5)


def split(x):
    return {"u": x[:3], "v": x[3:]}


def fixed_map(x, params):  # T(x) = M x + c on a nested x and nested params
    flat = tf.concat([x["u"], x["v"]], 0)
    return split(tf.linalg.matvec(params["m"], flat) + params["c"])


def iterate(init, params):  # a Python loop: the solver's own graph is never differentiated
    x = init
    for _ in range(200):
        x = fixed_map(x, params)
    return x


@pytest.mark.parametrize("solve", ["normal_cg", "dense", "neumann"])
def test_linear_fixed_point_gradient_matches_the_closed_form(solve):
    """x = (I - M)^{-1} c; with g = x - t and u = (I - M)^{-T} g: dL/dc = u, dL/dM = u x^T."""
    solver = implicit.custom_fixed_point(fixed_map, solve=solve)(iterate)
    params = {"m": tf.constant(M), "c": tf.constant(C)}
    with tf.GradientTape() as tape:
        tape.watch(params)
        x = solver(split(tf.zeros(5, tf.float64)), params)
        loss = 0.5 * tf.reduce_sum((tf.concat([x["u"], x["v"]], 0) - T) ** 2)
    grads = tape.gradient(loss, params)
    x = np.linalg.solve(np.eye(5) - M, C)
    u = np.linalg.solve((np.eye(5) - M).T, x - T)
    rtol = 1e-6 if solve == "neumann" else 1e-10
    np.testing.assert_allclose(grads["c"].numpy(), u, rtol=rtol)
    np.testing.assert_allclose(grads["m"].numpy(), np.outer(u, x), rtol=rtol)


def wrong_gradient_solver(init, lam, a, b):
    """x* exactly, with a deliberately wrong own gradient."""

    @tf.custom_gradient
    def exact(lam, b):
        return ridge_exact(lam, a, b), lambda dx: (tf.constant(123.0, tf.float64),
                                                   tf.ones_like(b))
    return exact(lam, b)


def test_the_solver_is_not_differentiated_eagerly_and_in_tf_function():
    solver = implicit.custom_root(ridge_f, tol=1e-13)(wrong_gradient_solver)
    want_lam, want_b = ridge_oracle()
    compiled = tf.function(lambda lam, b: outer(solver, lam, b))
    lam, b = tf.constant(LAM, tf.float64), tf.constant(B)
    for run in (lambda: outer(solver, lam, b), lambda: compiled(lam, b),
                lambda: compiled(lam, b)):
        d_lam, d_b = run()
        np.testing.assert_allclose(d_lam.numpy(), want_lam, rtol=1e-10)
        np.testing.assert_allclose(d_b.numpy(), want_b, rtol=1e-10)
    assert compiled.experimental_get_tracing_count() == 1


def test_per_task_in_vectorized_map_equals_a_loop_over_tasks():
    lams = np.array([0.1, 0.7, 3.0])
    bs = RNG.normal(size=(3, 8))
    solver = implicit.custom_root(ridge_f, tol=1e-13)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))

    def task(args):
        lam, b = args
        with tf.GradientTape() as tape:
            tape.watch([lam, b])
            x = solver(tf.zeros(5, tf.float64), lam, tf.constant(A), b)
            loss = 0.5 * tf.reduce_sum((x - T) ** 2)
        return tape.gradient(loss, [lam, b])

    d_lam, d_b = tf.function(lambda l, b: tf.vectorized_map(task, (l, b)))(lams, bs)
    for i in range(3):
        want_lam, want_b = ridge_oracle(lams[i], b=bs[i])
        np.testing.assert_allclose(d_lam[i].numpy(), want_lam, rtol=1e-10)
        np.testing.assert_allclose(d_b[i].numpy(), want_b, rtol=1e-10)


def test_a_tape_outside_the_task_map_gets_the_gradient_or_an_error_never_a_zero():
    """tf.map_fn keeps custom_root's gradient (the closed form); tf.vectorized_map's
    converted ops drop it, which would leave a silent zero: an error naming the fix."""
    lams = tf.constant([0.1, 0.7, 3.0], tf.float64)
    solver = implicit.custom_root(ridge_f, tol=1e-13)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))

    def task(lam):
        x = solver(tf.zeros(5, tf.float64), lam, tf.constant(A), tf.constant(B))
        return 0.5 * tf.reduce_sum((x - T) ** 2)

    def grad(task_map):
        with tf.GradientTape() as tape:
            tape.watch(lams)
            loss = tf.reduce_sum(task_map(task, lams))
        return tape.gradient(loss, lams)

    np.testing.assert_allclose(grad(tf.map_fn).numpy(),
                               [ridge_oracle(lam)[0] for lam in (0.1, 0.7, 3.0)], rtol=1e-10)
    with pytest.raises(LookupError, match="ridge_f: the implicit gradient was lost.*inside "
                                          "the mapped function"):
        grad(tf.vectorized_map)


def test_per_replica_under_mirrored_strategy_equals_one_device():
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    lams = tf.constant([0.2, 1.5], tf.float64)
    solver = implicit.custom_root(ridge_f, tol=1e-13)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))

    def replica():
        ctx = tf.distribute.get_replica_context()
        lam = tf.gather(lams, ctx.replica_id_in_sync_group)
        return outer(solver, lam, B)[0]

    per_replica = tf.function(lambda: strategy.run(replica))()
    got = [t.numpy() for t in strategy.experimental_local_results(per_replica)]
    np.testing.assert_allclose(got, [ridge_oracle(0.2)[0], ridge_oracle(1.5)[0]], rtol=1e-10)


def ridge_rows_f(x, lam, a, b):  # ridge_f for every row of x and b
    return tf.matmul(tf.matmul(x, a, transpose_b=True) - b, a) + lam * x


def ridge_rows_exact(lam, a, b):  # X = B A (A^T A + lam I)^{-1}, the inverse symmetric
    h = tf.matmul(a, a, transpose_a=True) + lam * tf.eye(5, dtype=a.dtype)
    return tf.transpose(tf.linalg.solve(h, tf.matmul(a, b, transpose_a=True, transpose_b=True)))


def fixed_rows(y, m, c, d):  # y = y M^T + c + d, per row: a non-symmetric contraction
    return tf.matmul(y, m, transpose_b=True) + c + d


def solve_rows(init, m, c, d):  # y = (c + d) (I - M^T)^{-1}
    return tf.transpose(tf.linalg.solve(tf.eye(5, dtype=m.dtype) - m, tf.transpose(c + d)))


def implicit_step(strategy):
    """One SGD step (rate 1) on the hyperparameters of a ridge solve (custom_root: lam and
    the design matrix) and of a linear fixed point (custom_fixed_point: M and c), every
    one a variable passed as an arg; the rows (right-hand sides, offsets, targets) are
    sharded over the replicas. Returns the change of the variables, flat."""
    rng = np.random.default_rng(1)
    rows = tuple(rng.normal(size=(4, n)) for n in (8, 5, 5))
    with strategy.scope():
        variables = [tf.Variable(LAM, dtype=tf.float64), tf.Variable(A), tf.Variable(M),
                     tf.Variable(C)]
        opt = keras.optimizers.SGD(1.0)
    lam, a, m, c = variables
    ridge = implicit.custom_root(ridge_rows_f, tol=1e-13)(
        lambda init, lam, a, b: ridge_rows_exact(lam, a, b))
    fixed = implicit.custom_fixed_point(fixed_rows, solve="normal_cg", tol=1e-14)(solve_rows)

    def loss_fn(batch):
        b, d, t = batch
        x = ridge(tf.zeros_like(t), lam, a, b)
        y = fixed(tf.zeros_like(t), m, c, d)
        return tf.reduce_mean(tf.reduce_sum((x - t) ** 2 + (y - t) ** 2, 1))

    step = train.make_train_step(loss_fn, opt, variables, strategy=strategy)
    data = tf.data.Dataset.from_tensor_slices(rows).batch(4)
    before = np.concatenate([np.ravel(v.numpy()) for v in variables])
    logs = step(next(iter(distribute.distribute_dataset(strategy, data))))
    assert float(logs["applied"]) == 1.0
    return np.concatenate([np.ravel(v.numpy()) for v in variables]) - before


def test_custom_root_and_fixed_point_steps_under_mirrored_strategy_equal_one_device():
    """The oracle is the single-device step (whose custom_root and custom_fixed_point
    gradients the closed-form tests above check); each replica solves its own rows, and
    the step all-reduces their gradients of the hyperparameters."""
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    one = implicit_step(tf.distribute.get_strategy())
    assert np.linalg.norm(one) > 1e-2
    np.testing.assert_allclose(implicit_step(strategy), one, rtol=1e-9, atol=1e-12)


def grad_of(solver, *args):
    args = [tf.convert_to_tensor(a, tf.float64) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        loss = tf.reduce_sum(solver(tf.zeros(2, tf.float64), *args) * [1.0, 3.0])
    return tape.gradient(loss, args)


def test_an_indefinite_or_singular_system_is_an_error_naming_the_optimality_function():
    def saddle(x, s):  # dF/dx = diag(s, -1): indefinite
        return x * tf.stack([s, -1.0])

    solver = implicit.custom_root(saddle)(lambda init, s: init)
    with pytest.raises(ValueError, match="saddle.*non-positive curvature"):
        grad_of(solver, 2.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="saddle.*non-positive curvature"):
        tf.function(lambda s: grad_of(solver, s))(tf.constant(2.0, tf.float64))

    def flat(x, s):  # dF/dx = diag(s, 0): singular
        return x * tf.stack([s, 0.0])

    for solve in ("dense", "normal_cg"):
        solver = implicit.custom_root(flat, solve=solve)(lambda init, s: init)
        with pytest.raises(ValueError, match="flat"):
            grad_of(solver, 2.0)
    solver = implicit.custom_root(flat, solve="dense")(lambda init, s: init)
    with pytest.raises(tf.errors.InvalidArgumentError, match="flat.*singular"):
        tf.function(lambda s: grad_of(solver, s))(tf.constant(2.0, tf.float64))

    def steep(x, s):  # dF/dx = 3 s I: I - dF/dx has spectral radius 5 at s = 2
        return 3 * s * x

    solver = implicit.custom_root(steep, solve="neumann")(lambda init, s: init)
    with pytest.raises(ValueError, match="steep.*Neumann series did not converge"):
        grad_of(solver, 2.0)


def test_bad_solver_output_unused_argument_and_bad_options_are_errors():
    def f(x, s, unused):
        return s * x

    with pytest.raises(ValueError, match="init"):
        grad_of(implicit.custom_root(f)(lambda init, s, unused: (init, 0.0)), 1.0, 1.0)
    with pytest.raises(ValueError, match="init"):
        grad_of(implicit.custom_root(f)(lambda init, s, unused: init[:1]), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"does not depend on argument\(s\) \['unused'\]"):
        grad_of(implicit.custom_root(f)(lambda init, s, unused: init), 1.0, 1.0)
    # Python numbers and integer tensors are static (no gradient, no error), used exactly:
    # x* = scale k / s, d sum(x*)/ds = -2 scale k / s^2
    def affine(x, s, scale, k):
        return s * x - scale * tf.cast(k, tf.float64)

    static = implicit.custom_root(affine)(lambda init, s, scale, k: init + scale * 3 / s)
    s = tf.constant(2.0, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(s)
        loss = tf.reduce_sum(static(tf.zeros(2, tf.float64), s, 0.1, tf.constant(3)))
    np.testing.assert_allclose(float(tape.gradient(loss, s)), -2 * 0.1 * 3 / 4, rtol=1e-14)
    v = tf.Variable(2.0, dtype=tf.float64, name="hidden")
    with pytest.raises(ValueError, match="hidden.*pass them as args"):
        grad_of(implicit.custom_root(lambda x, s: v * s * x)(lambda init, s: init), 1.0)
    with pytest.raises(ValueError, match="solve must be one of"):
        implicit.custom_root(f, solve="lu")
    with pytest.raises(ValueError, match="unknown options \\['step'\\]"):
        implicit.custom_root(f, solve="cg", step=0.5)
    with pytest.raises(ValueError, match="maxiter"):
        implicit.custom_root(f, maxiter=0)
    with pytest.raises(ValueError, match="tol must be a positive finite number"):
        implicit.custom_root(f, solve="neumann", tol=0.0)
    with pytest.raises(ValueError, match="callable solve"):
        implicit.custom_root(f, solve=my_solve, tol=1e-3)
    with pytest.raises(ValueError, match="truncated=True.*give maxiter"):
        implicit.custom_root(f, truncated=True)
    with pytest.raises(ValueError, match="truncated must be True or False"):
        implicit.custom_root(f, maxiter=3, truncated=1)
    with pytest.raises(ValueError, match=r"unknown options \['truncated'\]"):
        implicit.custom_root(f, solve="neumann", truncated=True)
    with pytest.raises(TypeError, match="optimality_fn"):
        implicit.custom_root("f")


def cube(x, a):  # F(x) = x^3 - a: the root a^(1/3), dx/da = 1 / (3 x^2)
    return x ** 3 - a


def newton(steps):
    def solve(init, a):
        x = init
        for _ in range(steps):
            x = x - cube(x, a) / (3 * x ** 2)
        return x
    return solve


def cube_gradient(solver, a=8.0):
    a = tf.convert_to_tensor(a, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(a)
        x = solver(tf.constant(1.0, tf.float64), a)
    return tape.gradient(x, a)


def test_a_solver_output_that_is_not_a_root_is_an_error_naming_the_residual():
    """One Newton step from 1 on x^3 = 8 stops at x = 10/3, F = 29.0: its implicit gradient
    1 / (3 x^2) = 0.030 is not the root's 1/12 = 0.083."""
    short = implicit.custom_root(cube)(newton(1))
    with pytest.raises(ValueError, match=r"by optimality function cube: the solver did not "
                                         r"return a root.*\|\|F\(x\)\|\| = 2\.9\d*e\+01"):
        cube_gradient(short)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="cube: the solver did not return a root"):
        tf.function(lambda a: cube_gradient(short, a))(tf.constant(8.0, tf.float64))
    # the opt-out gives the gradient of the point returned, which is wrong
    unchecked = cube_gradient(implicit.custom_root(cube, check_root=False)(newton(1)))
    np.testing.assert_allclose(float(unchecked), 1 / (3 * (10 / 3) ** 2), rtol=1e-12)
    # converged: the root's gradient, eagerly and compiled; a loose root_tol lets one step by
    np.testing.assert_allclose(float(cube_gradient(implicit.custom_root(cube)(newton(30)))),
                               1 / 12, rtol=1e-12)
    compiled = tf.function(lambda a: cube_gradient(implicit.custom_root(cube)(newton(30)), a))
    np.testing.assert_allclose(float(compiled(tf.constant(8.0, tf.float64))), 1 / 12,
                               rtol=1e-12)
    cube_gradient(implicit.custom_root(cube, root_tol=100.0)(newton(1)))
    with pytest.raises(ValueError, match="root_tol must be a positive"):
        implicit.custom_root(cube, root_tol=0.0)
    with pytest.raises(ValueError, match="check_root must be True or False"):
        implicit.custom_root(cube, check_root=1)


def test_a_fixed_point_iteration_caught_in_a_cycle_is_an_error():
    def flip(x, c):  # x -> c - x: from 0 the iteration cycles 0, c, 0, ...; x* = c / 2
        return c - x

    def iterate_flip(init, c):
        x = init
        for _ in range(10):
            x = flip(x, c)
        return x

    solver = implicit.custom_fixed_point(flip, solve="dense")(iterate_flip)
    with pytest.raises(ValueError, match=r"flip\(x\): the solver did not return a root.*"
                                         r"\|\|F\(x\)\|\| = 1\.202e\+00"):  # |(.85, .85)|
        grad_of(solver, [0.85, 0.85])


def ridge_tasks_f(x, lam, a, b):  # ridge_f per task: x [B, 5], lam [B], a [B, 8, 5], b [B, 8]
    r = tf.einsum("tij,tj->ti", a, x) - b
    return tf.einsum("tij,ti->tj", a, r) + lam[:, None] * x


def ridge_tasks_exact(init, lam, a, b):
    h = tf.einsum("tij,tik->tjk", a, a) + lam[:, None, None] * tf.eye(5, dtype=a.dtype)
    return tf.linalg.solve(h, tf.einsum("tij,ti->tj", a, b)[..., None])[..., 0]


def tasks(n=3):
    rng = np.random.default_rng(2)
    return (tf.constant(rng.uniform(0.1, 3.0, size=n)),
            tf.constant(A + 0.3 * rng.normal(size=(n, 8, 5))), tf.constant(rng.normal(size=(n, 8))))


@pytest.mark.parametrize("solve", ["cg", "dense"])
def test_batched_custom_root_with_the_tape_outside_equals_a_loop_over_tasks(solve):
    """batched=True: one call on every task (no tf.vectorized_map), the gradient of a sum
    over tasks; oracles: the closed form of d/dlam and d/db per task, and a loop of
    single-task custom_roots for d/da."""
    solver = implicit.custom_root(ridge_tasks_f, solve=solve, batched=True)(ridge_tasks_exact)
    lams, a_s, b_s = tasks()

    def grads(lams, a_s, b_s):
        with tf.GradientTape() as tape:
            tape.watch([lams, a_s, b_s])
            x = solver(tf.zeros([3, 5], tf.float64), lams, a_s, b_s)
            loss = 0.5 * tf.reduce_sum((x - T) ** 2)
        return tape.gradient(loss, [lams, a_s, b_s])

    single = implicit.custom_root(ridge_f, solve=solve)(
        lambda init, lam, a, b: ridge_exact(lam, a, b))
    rtol = 1e-10
    for d_lam, d_a, d_b in (grads(lams, a_s, b_s), tf.function(grads)(lams, a_s, b_s)):
        for i in range(3):
            want_lam, want_b = ridge_oracle(lams[i].numpy(), a_s[i].numpy(), b_s[i].numpy())
            np.testing.assert_allclose(d_lam[i].numpy(), want_lam, rtol=rtol)
            np.testing.assert_allclose(d_b[i].numpy(), want_b, rtol=rtol)
            a_i = tf.identity(a_s[i])
            with tf.GradientTape() as tape:
                tape.watch(a_i)
                x = single(tf.zeros(5, tf.float64), lams[i], a_i, b_s[i])
                loss = 0.5 * tf.reduce_sum((x - T) ** 2)
            np.testing.assert_allclose(d_a[i].numpy(), tape.gradient(loss, a_i).numpy(),
                                       rtol=rtol)


def test_batched_custom_fixed_point_and_per_task_root_check():
    """y = M_t y + c_t per task: dL/dc_t = (I - M_t)^{-T} (y_t - t) in closed form; a task
    the solver leaves unconverged fails the root check, named by its index."""
    rng = np.random.default_rng(3)
    m = np.stack([0.8 * q / np.linalg.norm(q, 2) for q in rng.normal(size=(2, 5, 5))])
    c = rng.normal(size=(2, 5))

    def affine(y, m, c):
        return tf.einsum("tij,tj->ti", m, y) + c

    def exact(init, m, c):
        return tf.linalg.solve(tf.eye(5, dtype=m.dtype) - m, c[..., None])[..., 0]

    def one_task_converged(init, m, c):  # task 1 stops at its init
        return tf.concat([exact(init, m, c)[:1], init[1:]], 0)

    m_, c_ = tf.constant(m), tf.constant(c)
    for solve in ("normal_cg", "dense"):
        solver = implicit.custom_fixed_point(affine, solve=solve, batched=True)(exact)
        with tf.GradientTape() as tape:
            tape.watch(c_)
            y = solver(tf.zeros([2, 5], tf.float64), m_, c_)
            loss = 0.5 * tf.reduce_sum((y - T) ** 2)
        d_c = tape.gradient(loss, c_).numpy()
        for i in range(2):
            y_i = np.linalg.solve(np.eye(5) - m[i], c[i])
            np.testing.assert_allclose(d_c[i], np.linalg.solve((np.eye(5) - m[i]).T, y_i - T),
                                       rtol=1e-9)
    bad = implicit.custom_fixed_point(affine, batched=True)(one_task_converged)
    with pytest.raises(ValueError, match=r"did not return a root.*\(task 1\)"):
        bad(tf.zeros([2, 5], tf.float64), m_, c_)


def test_batched_needs_one_task_axis_on_every_tensor():
    solver = implicit.custom_root(ridge_tasks_f, batched=True)(ridge_tasks_exact)
    lams, a_s, b_s = tasks()
    with pytest.raises(ValueError, match=r"one leading task axis.*sizes differ"):
        solver(tf.zeros([3, 5], tf.float64), lams[:2], a_s, b_s)
    with pytest.raises(ValueError, match="lam is a scalar"):
        solver(tf.zeros([3, 5], tf.float64), lams[0], a_s, b_s)
    with pytest.raises(ValueError, match="batched must be True or False"):
        implicit.custom_root(ridge_tasks_f, batched="yes")
