"""Trace (Hutchinson, Hutch++) and SLQ density against known spectra; fixed-seed determinism."""

import numpy as np
import pytest
from curvature_fixtures import known_spectrum

from hogrod import curvature


def test_trace_estimators_within_three_standard_errors_and_deterministic():
    A = known_spectrum(np.concatenate([[50.0, 30.0, 20.0], np.random.default_rng(3).uniform(
        -1, 2, 97)]))
    exact = np.trace(A)
    for fn in (curvature.hutchinson, curvature.hutchpp):
        est, se = fn(A, 90, seed=4)
        assert abs(est - exact) <= 3 * se + 1e-9, (fn.__name__, est, exact, se)
        assert fn(A, 90, seed=4) == (est, se)
    # Hutch++ removes the dominant eigenvalues from the variance.
    assert curvature.hutchpp(A, 90, 4)[1] < curvature.hutchinson(A, 90, 4)[1]


def test_spectral_density_integrates_to_one_and_locates_the_spectrum():
    spectrum = np.concatenate([np.full(30, -1.0), np.full(50, 2.0), [9.0]])
    A = known_spectrum(spectrum)
    grid, density, nodes, weights = curvature.spectral_density(A, steps=20, num_runs=10,
                                                               sigma=0.1)
    np.testing.assert_allclose(np.trapezoid(density, grid), 1.0, rtol=1e-6)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-12)
    mass_near = lambda c: weights[np.abs(nodes - c) < 0.05].sum()  # noqa: E731
    np.testing.assert_allclose(mass_near(2.0), 50 / 81, atol=0.1)
    np.testing.assert_allclose(mass_near(-1.0), 30 / 81, atol=0.1)


def test_every_estimator_is_deterministic_for_a_fixed_seed():
    A = known_spectrum(np.linspace(0.5, 6.0, 40), seed=7)
    b = np.random.default_rng(8).normal(size=40)
    runs = [(curvature.top_eigenvalues(A, k=2, method="power", seed=3)[0],
             curvature.spectral_density(A, 10, 3, seed=3)[1],
             curvature.hutchinson(A, 20, seed=3), curvature.hutchpp(A, 21, seed=3),
             curvature.conjugate_gradient(A, b, 0.1)[0],
             curvature.lissa(A, b, 0.1, scale=8.0, maxiter=50)) for _ in range(2)]
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)
    # ... and another seed gives another estimate (the seed is used).
    assert curvature.hutchinson(A, 20, seed=4) != runs[0][2]


def test_hutchpp_equals_its_definition_with_fixed_probes(monkeypatch):
    """Meyer et al. 2021: tr(Q^T A Q) + (1/m) sum_i g_i^T P A P g_i, P = I - Q Q^T, Q an
    orthonormal basis of range(A S), for the probes S, G fixed here (the value does not
    depend on which basis: scipy's orth, not the estimator's QR)."""
    import scipy.linalg
    from hogrod.curvature import trace
    rng = np.random.default_rng(11)
    n, m = 12, 4
    A = known_spectrum(rng.uniform(-1, 3, n), seed=2)
    S, G = rng.choice([-1.0, 1.0], (n, m)), rng.choice([-1.0, 1.0], (n, m))
    probes = iter([S, G])
    monkeypatch.setattr(trace, "_rademacher", lambda rng, n_, m_: next(probes).copy())
    est, se = curvature.hutchpp(A, 3 * m, seed=0)
    Q = scipy.linalg.orth(A @ S)
    P = np.eye(n) - Q @ Q.T
    samples = np.array([g @ P @ A @ P @ g for g in G.T])
    np.testing.assert_allclose(est, np.trace(Q.T @ A @ Q) + samples.mean(), rtol=1e-12)
    np.testing.assert_allclose(se, samples.std(ddof=1) / np.sqrt(m), rtol=1e-10)


def test_hutchpp_is_exact_when_the_sketch_covers_the_rank():
    A = known_spectrum(np.concatenate([[5.0, -2.0, 1.0], np.zeros(27)]), seed=4)
    for seed in range(3):
        est, se = curvature.hutchpp(A, 12, seed=seed)  # sketch of 4 >= rank 3
        np.testing.assert_allclose(est, 4.0, atol=1e-10)
        assert se < 1e-10


def test_estimator_counts_are_checked():
    A = np.eye(4)
    with pytest.raises(ValueError, match="hutchpp: num_matvecs must be an integer >= 6, got 5"):
        curvature.hutchpp(A, 5)
    with pytest.raises(ValueError, match="hutchinson: num_samples must be an integer >= 2"):
        curvature.hutchinson(A, 1)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 2, got 10.5"):
        curvature.hutchinson(A, 10.5)
