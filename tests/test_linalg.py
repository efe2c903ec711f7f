"""hogrod.linalg against dense numpy: CG against np.linalg.solve and the Krylov-subspace
(Galerkin) solution, preconditioned CG and kept iterates against scipy's CG iterates and CG
on the transformed system, power iteration and Lanczos against np.linalg.eigh; eagerly, in
tf.function and per task in tf.vectorized_map; bad input."""

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from hogrod import linalg, tree


def spd(eigenvalues, seed=0):
    n = len(eigenvalues)
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return q @ np.diag(eigenvalues) @ q.T


def nested_like():
    """A tree of 7 float64 entries: {"b": [3], "w": [2, 2]}."""
    return {"w": tf.zeros([2, 2], tf.float64), "b": tf.zeros([3], tf.float64)}


def nested_matvec(a):
    like, a = nested_like(), tf.constant(a)
    return lambda v: tree.unflatten(tf.linalg.matvec(a, tree.flatten(v)), like)


def test_cg_matches_solve_with_damping_on_a_nested_structure_eagerly_and_compiled():
    a = spd(np.linspace(0.2, 5.0, 7))
    b = np.random.default_rng(1).normal(size=7)
    exact = np.linalg.solve(a + 0.3 * np.eye(7), b)
    rhs = tree.unflatten(tf.constant(b), nested_like())
    x, info = linalg.cg(nested_matvec(a), rhs, damping=0.3, tol=1e-12)
    tree.check_same(rhs, x)
    np.testing.assert_allclose(tree.flatten(x).numpy(), exact, rtol=1e-10)
    assert 1 <= int(info.iterations) <= 10 and not bool(info.negative_curvature)
    assert float(info.residual_norm) <= 1e-12 * np.linalg.norm(b)
    compiled = tf.function(lambda r, x0: linalg.cg(nested_matvec(a), r, x0, damping=0.3,
                                                   tol=1e-12))
    x0 = tree.unflatten(tf.constant(exact + 0.1), nested_like())  # a warm start
    np.testing.assert_allclose(tree.flatten(compiled(rhs, x0)[0]).numpy(), exact, rtol=1e-10)
    # loose tol: the residual criterion ||r|| <= tol ||b|| holds, and not much more
    x, info = linalg.cg(nested_matvec(a), rhs, damping=0.3, tol=1e-2)
    residual = np.linalg.norm(b - (a + 0.3 * np.eye(7)) @ tree.flatten(x).numpy())
    assert residual <= 1e-2 * np.linalg.norm(b) and int(info.iterations) < 7


def test_cg_per_task_in_vectorized_map_equals_a_loop_over_tasks():
    spectra = [np.linspace(1, 2, 6), np.linspace(0.01, 50, 6), np.array([1, 1, 1, 3, 3, 3.0])]
    mats = np.stack([spd(s, seed=i) for i, s in enumerate(spectra)])
    rhs = np.random.default_rng(2).normal(size=(3, 6))

    def solve(args):
        a, b = args
        return linalg.cg(lambda v: [tf.linalg.matvec(a, v[0])], [b], tol=1e-10, damping=0.5)

    batched = tf.function(lambda a, b: tf.vectorized_map(solve, (a, b)))(mats, rhs)
    for i in range(3):
        x, info = solve((tf.constant(mats[i]), tf.constant(rhs[i])))
        np.testing.assert_allclose(batched[0][0][i], x[0], rtol=1e-12, atol=1e-14)
        assert int(batched[1].iterations[i]) == int(info.iterations)
        np.testing.assert_allclose(x[0], np.linalg.solve(mats[i] + 0.5 * np.eye(6), rhs[i]),
                                   rtol=1e-9)
    # each task stopped at its own iteration (two distinct eigenvalues: two steps)
    assert int(batched[1].iterations[2]) == 2 < int(batched[1].iterations[1])


def krylov_solution(a, b, k):
    """argmin of the quadratic 1/2 x^T A x - b^T x over span{b, .., A^{k-1} b}: the k-th CG
    iterate, as long as A is positive definite on that space."""
    v, _ = np.linalg.qr(np.stack([np.linalg.matrix_power(a, j) @ b for j in range(k)], 1))
    return v @ np.linalg.solve(v.T @ a @ v, v.T @ b), v


def test_cg_on_an_indefinite_system_raises_naming_the_curvature_or_stops_at_the_iterate():
    # A = diag(1, -1), b = (2, 1): p_0 = b has curvature 3 > 0; p_1 = (20, 40) / 9 has
    # p_1^T A p_1 = (400 - 1600) / 81 = -14.8148...
    mv = lambda v: tf.constant([1.0, -1.0], tf.float64) * v  # noqa: E731
    b = tf.constant([2.0, 1.0], tf.float64)
    with pytest.raises(ValueError, match=r"non-positive curvature p\^T \(A \+ 0.0 I\) p = "
                                         r"-1.481481e\+01 .* at iteration 1"):
        linalg.cg(mv, b)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"non-positive curvature.*\n*.*\[-14.81481481"):
        tf.function(lambda b: linalg.cg(mv, b))(b)
    x, info = linalg.cg(mv, b, on_negative_curvature="stop")
    np.testing.assert_allclose(x, 5 / 3 * b.numpy(), rtol=1e-15)  # x_1 = (b.b / b.Ab) b
    assert int(info.iterations) == 1 and bool(info.negative_curvature)
    np.testing.assert_allclose(float(info.curvature), -1200 / 81, rtol=1e-14)
    # a larger indefinite system: the iterate where CG stops is the Krylov solution of that
    # dimension, and one more dimension makes the projected matrix indefinite
    a = spd(np.array([-0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0]), seed=4)
    rhs = np.random.default_rng(3).normal(size=8)
    x, info = linalg.cg(lambda v: tf.linalg.matvec(tf.constant(a), v), tf.constant(rhs),
                        tol=1e-12, on_negative_curvature="stop")
    k = int(info.iterations)
    assert bool(info.negative_curvature) and 1 <= k < 8
    want, v = krylov_solution(a, rhs, k)
    np.testing.assert_allclose(x, want, rtol=1e-8)
    assert np.linalg.eigvalsh(v.T @ a @ v).min() > 0
    assert np.linalg.eigvalsh(krylov_solution(a, rhs, k + 1)[1].T @ a @
                              krylov_solution(a, rhs, k + 1)[1]).min() <= 0
    # "raise" in a vectorized map fails the batch
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-positive curvature"):
        tf.function(lambda bs: tf.vectorized_map(lambda r: linalg.cg(mv, r)[0], bs))(
            tf.stack([b, b]))


def scipy_cg_iterates(a, b, steps, m_inv=None):
    """scipy.sparse.linalg.cg's iterate after each of `steps` steps (its callback), no
    stopping test: the oracle of the preconditioned and kept iterates."""
    import scipy.sparse.linalg as spla
    seen = []
    m = None if m_inv is None else spla.LinearOperator(a.shape, matvec=lambda v: m_inv @ v)
    spla.cg(a, b, rtol=1e-300, atol=0.0, maxiter=max(steps), M=m,
            callback=lambda xk: seen.append(np.array(xk)))
    return [seen[k - 1] for k in steps]


def test_preconditioned_cg_is_cg_on_the_transformed_system_and_scipy_preconditioned():
    a = spd(np.geomspace(0.1, 30.0, 8), seed=3)
    b = np.random.default_rng(4).normal(size=8)
    d = np.random.default_rng(5).uniform(0.5, 4.0, size=8)  # M = diag(d)
    precondition = lambda v: [v[0] / tf.constant(d)]  # noqa: E731
    mv = lambda v: [tf.linalg.matvec(tf.constant(a), v[0])]  # noqa: E731
    s = np.diag(d ** -0.5)  # M^{-1/2}
    for k in (1, 2, 4, 8):
        x, _ = linalg.cg(mv, [tf.constant(b)], maxiter=k, tol=0.0, damping=0.2,
                         preconditioner=precondition)
        # CG on M^{-1/2} (A + 0.2 I) M^{-1/2} y = M^{-1/2} b, then x = M^{-1/2} y
        y, _ = linalg.cg(lambda v: [tf.linalg.matvec(tf.constant(s @ (a + 0.2 * np.eye(8)) @ s),
                                                     v[0])],
                         [tf.constant(s @ b)], maxiter=k, tol=0.0)
        np.testing.assert_allclose(x[0].numpy(), s @ y[0].numpy(), rtol=1e-7, atol=1e-10)
        want = scipy_cg_iterates(a + 0.2 * np.eye(8), b, [k], np.diag(1 / d))[0]
        np.testing.assert_allclose(x[0].numpy(), want, rtol=1e-7, atol=1e-10)
    # the stopping test stays on ||r|| <= tol ||b||, and the solve converges
    x, info = tf.function(lambda r: linalg.cg(mv, r, tol=1e-10, preconditioner=precondition))(
        [tf.constant(b)])
    np.testing.assert_allclose(x[0].numpy(), np.linalg.solve(a, b), rtol=1e-8)
    assert float(info.residual_norm) <= 1e-10 * np.linalg.norm(b)
    residual = np.linalg.norm(b - a @ x[0].numpy())
    np.testing.assert_allclose(float(info.residual_norm), residual, rtol=1e-3, atol=1e-14)
    # a tolerance computed in the graph: a tensor tol stops where the number does
    for tol in (1e-3, 0.3):
        _, by_number = linalg.cg(mv, [tf.constant(b)], tol=tol)
        _, by_tensor = tf.function(lambda t: linalg.cg(mv, [tf.constant(b)], tol=t))(
            tf.constant(tol, tf.float64))
        assert int(by_number.iterations) == int(by_tensor.iterations)


def test_kept_iterates_equal_separate_runs_and_the_quadratic_at_each():
    a = spd(np.geomspace(0.05, 20.0, 9), seed=6)
    b = np.random.default_rng(7).normal(size=9)
    x0 = 0.3 * np.random.default_rng(8).normal(size=9)
    d = np.random.default_rng(9).uniform(0.5, 2.0, size=9)
    mv = lambda v: [tf.linalg.matvec(tf.constant(a), v[0])]  # noqa: E731
    keep = (0, 1, 2, 3, 5, 7, 40)
    for pre in (None, lambda v: [v[0] / tf.constant(d)]):
        run = tf.function(lambda r, x0: linalg.cg(mv, r, x0, tol=1e-12, damping=0.1,
                                                  preconditioner=pre, keep=keep))
        x, info, kept = run([tf.constant(b)], [tf.constant(x0)])
        assert 7 < int(info.iterations) < 40
        np.testing.assert_array_equal(kept.steps.numpy(),
                                      [min(k, int(info.iterations)) for k in keep])
        full = a + 0.1 * np.eye(9)
        for j, k in enumerate(keep):
            got = kept.iterates[0][j].numpy()
            if k == 0:
                want = x0
            else:
                want = linalg.cg(mv, [tf.constant(b)], [tf.constant(x0)], maxiter=k, tol=1e-12,
                                 damping=0.1, preconditioner=pre)[0][0].numpy()
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(float(kept.quadratic[j]), got @ full @ got / 2 - b @ got,
                                       rtol=1e-9)
        np.testing.assert_array_equal(kept.iterates[0][-1].numpy(), x[0].numpy())
    # from zeros, against scipy's iterates
    _, _, kept = linalg.cg(mv, [tf.constant(b)], tol=0.0, maxiter=6, keep=(2, 4, 6))
    for j, want in enumerate(scipy_cg_iterates(a, b, [2, 4, 6])):
        np.testing.assert_allclose(kept.iterates[0][j].numpy(), want, rtol=1e-9, atol=1e-12)


def test_cg_bad_input_is_an_error_naming_the_argument():
    mv = lambda v: v  # noqa: E731
    b = [tf.ones([3], tf.float64)]
    with pytest.raises(ValueError, match="on_negative_curvature must be one of"):
        linalg.cg(mv, b, on_negative_curvature="ignore")
    with pytest.raises(ValueError, match="cg: maxiter must be an integer >= 1, got 0"):
        linalg.cg(mv, b, maxiter=0)
    with pytest.raises(ValueError, match="cg: tol must be a finite number >= 0"):
        linalg.cg(mv, b, tol=-1.0)
    with pytest.raises(ValueError, match="the vector and cg's matvec\\(v\\) have different"):
        linalg.cg(lambda v: v + v, b)
    with pytest.raises(TypeError, match="tree.axpy: alpha is a float32 tensor"):
        linalg.cg(mv, b, damping=tf.constant(0.1))
    with pytest.raises(FloatingPointError, match="is not finite at iteration 0"):
        linalg.cg(lambda v: [np.nan * v[0]], b)
    with pytest.raises(ValueError, match="cg: keep must be increasing"):
        linalg.cg(mv, b, keep=(3, 2))
    with pytest.raises(ValueError, match="cg: keep\\[1\\] must be an integer >= 0"):
        linalg.cg(mv, b, keep=(1, -2))
    with pytest.raises(ValueError, match="cg: keep must be a non-empty sequence"):
        linalg.cg(mv, b, keep=5)
    with pytest.raises(TypeError, match="cg: preconditioner must be a callable"):
        linalg.cg(mv, b, preconditioner=2.0)
    with pytest.raises(ValueError, match="the vector and cg's matvec\\(v\\) have different"):
        linalg.cg(mv, b, preconditioner=lambda v: v + v)
    x, info = linalg.cg(mv, [tf.zeros([3], tf.float64)])  # b = 0: x = 0, no step
    assert int(info.iterations) == 0 and np.all(x[0].numpy() == 0)


def test_power_iteration_finds_the_largest_magnitude_eigenpair():
    spectrum = np.array([-6.0, 4.0, 3.0, 1.0, 0.5, -0.2, 2.0])
    a = spd(spectrum, seed=5)
    w, u = np.linalg.eigh(a)
    top = np.argmax(np.abs(w))
    lam, vec = linalg.power_iteration(nested_matvec(a), like=nested_like(), seed=0, maxiter=300)
    np.testing.assert_allclose(lam, w[top], rtol=1e-12)  # signed: -6
    np.testing.assert_allclose(np.abs(tree.flatten(vec).numpy() @ u[:, top]), 1.0, rtol=1e-10)
    # tol stops early, within tol of the eigenvalue
    lam, _ = linalg.power_iteration(nested_matvec(a), like=nested_like(), seed=0, tol=1e-6)
    np.testing.assert_allclose(lam, w[top], rtol=1e-5)
    # per task in a vectorized map, against eigh per task
    mats = np.stack([spd(spectrum * s, seed=i) for i, s in enumerate([1.0, 0.5, 2.0])])
    lams, vecs = tf.function(lambda m: tf.vectorized_map(
        lambda a: linalg.power_iteration(lambda v: tf.linalg.matvec(a, v),
                                         tf.ones([7], tf.float64), maxiter=300), m))(mats)
    np.testing.assert_allclose(lams, [-6.0, -3.0, -12.0], rtol=1e-12)
    for m, lam, vec in zip(mats, lams.numpy(), vecs.numpy()):
        np.testing.assert_allclose(m @ vec, lam * vec, atol=1e-9 * abs(lam))
    with pytest.raises(ValueError, match="pass either v0 .* or like and seed"):
        linalg.power_iteration(nested_matvec(a), maxiter=3)
    with pytest.raises(ValueError, match="power_iteration: v0 is zero"):
        linalg.power_iteration(nested_matvec(a), nested_like())


def test_lanczos_basis_is_orthonormal_and_the_tridiagonal_is_its_projection():
    a = spd(np.random.default_rng(6).uniform(-3, 8, 30), seed=6)
    v0 = tree.unflatten(tf.constant(np.random.default_rng(7).normal(size=30)),
                        {"x": tf.zeros([5, 4], tf.float64), "y": tf.zeros([10], tf.float64)})
    like = tf.nest.map_structure(tf.zeros_like, v0)
    mv = lambda v: tree.unflatten(tf.linalg.matvec(tf.constant(a), tree.flatten(v)), like)  # noqa
    for k, reorthogonalize in ((12, True), (30, True), (6, False)):
        alphas, betas, basis, _ = linalg.lanczos(mv, v0, k, reorthogonalize)
        q = np.concatenate([tf.reshape(basis[n], [k, -1]).numpy() for n in ("x", "y")], 1)
        # rows of q are the Lanczos vectors, in flatten order ("x" then "y")
        np.testing.assert_allclose(q @ q.T, np.eye(k), atol=1e-12)
        t = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
        np.testing.assert_allclose(q @ a @ q.T, t, atol=1e-11)
        ritz = scipy.linalg.eigh_tridiagonal(alphas.numpy(), betas.numpy(),
                                             eigvals_only=True)
        exact = np.linalg.eigvalsh(a)
        assert ritz.max() <= exact.max() + 1e-12 and ritz.min() >= exact.min() - 1e-12
        if k == 30:
            np.testing.assert_allclose(ritz, exact, atol=1e-10)
        else:  # the extreme eigenvalues converge first
            assert abs(ritz.max() - exact.max()) < 0.05 * (exact.max() - exact.min())


def test_lanczos_stops_at_an_invariant_subspace_and_on_request_and_compiles():
    a = spd(np.concatenate([np.full(10, -1.0), np.full(15, 2.0), [9.0]]), seed=8)
    mv = lambda v: tf.linalg.matvec(tf.constant(a), v)  # noqa: E731
    v0 = tf.constant(np.random.default_rng(9).normal(size=26))
    alphas, betas, basis, beta = linalg.lanczos(mv, v0, 20)
    assert alphas.shape == [3] and basis.shape == [3, 26] and float(beta) < 1e-12
    np.testing.assert_allclose(scipy.linalg.eigh_tridiagonal(alphas.numpy(), betas.numpy(),
                                                             eigvals_only=True),
                               [-1.0, 2.0, 9.0], rtol=1e-12)
    compiled = tf.function(lambda v: linalg.lanczos(mv, v, 20))(v0)
    np.testing.assert_allclose(compiled.alphas, alphas, rtol=1e-13)
    np.testing.assert_allclose(compiled.basis, basis, atol=1e-13)
    seen = []
    out = linalg.lanczos(mv, v0, 20, stop=lambda al, be, b: seen.append(len(al)) or len(al) == 2)
    assert seen == [1, 2] and out.alphas.shape == [2] and out.betas.shape == [1]
    np.testing.assert_allclose(out.alphas, alphas[:2], rtol=1e-14)


def test_neumann_sums_the_series_to_a_fixed_count_converges_and_takes_the_term_index():
    """Oracles: numpy's partial sum step * sum_{k<=K} (I - step (A + d I))^k b for a fixed
    count; np.linalg.solve once converged; a per-term matvec (v, k) against the same sum
    with A_k = (k + 1) A."""
    a = spd(np.linspace(0.2, 1.5, 7))
    b = np.random.default_rng(2).normal(size=7)
    rhs = tree.unflatten(tf.constant(b), nested_like())
    step, damping = 0.5, 0.1
    m = np.eye(7) - step * (a + damping * np.eye(7))
    partial = step * sum(np.linalg.matrix_power(m, k) @ b for k in range(6))
    x, info = linalg.neumann(nested_matvec(a), rhs, maxiter=5, step=step, damping=damping)
    tree.check_same(rhs, x)
    np.testing.assert_allclose(tree.flatten(x).numpy(), partial, rtol=1e-12)
    assert int(info.terms) == 5 and not bool(info.converged)
    compiled = tf.function(lambda r: linalg.neumann(nested_matvec(a), r, 400, tol=1e-12,
                                                    step=step, damping=damping))
    x, info = compiled(rhs)
    np.testing.assert_allclose(tree.flatten(x).numpy(),
                               np.linalg.solve(a + damping * np.eye(7), b), rtol=1e-10)
    assert bool(info.converged) and int(info.terms) < 400
    like, at = nested_like(), tf.constant(a)
    indexed = lambda v, k: tree.unflatten(  # noqa: E731
        tf.cast(k + 1, tf.float64) * tf.linalg.matvec(at, tree.flatten(v)), like)
    x, _ = linalg.neumann(indexed, rhs, maxiter=3, step=0.2)
    term, want = b, b.copy()
    for k in range(3):
        term = term - 0.2 * (k + 1) * (a @ term)
        want = want + term
    np.testing.assert_allclose(tree.flatten(x).numpy(), 0.2 * want, rtol=1e-12)
    with pytest.raises(ValueError, match="step"):
        linalg.neumann(nested_matvec(a), rhs, 3, step=0.0)
    with pytest.raises(ValueError, match="maxiter"):
        linalg.neumann(nested_matvec(a), rhs, 2.5)
