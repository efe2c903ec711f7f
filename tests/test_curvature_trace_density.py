"""Trace (Hutchinson, Hutch++) and SLQ density against known spectra; fixed-seed determinism."""

import numpy as np
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
    grid, density, nodes, weights = curvature.spectral_density(A, num_iterations=20,
                                                               num_runs=10, sigma=0.1)
    np.testing.assert_allclose(np.trapezoid(density, grid), 1.0, rtol=1e-6)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-12)
    mass_near = lambda c: weights[np.abs(nodes - c) < 0.05].sum()  # noqa: E731
    np.testing.assert_allclose(mass_near(2.0), 50 / 81, atol=0.1)
    np.testing.assert_allclose(mass_near(-1.0), 30 / 81, atol=0.1)


def test_every_estimator_is_deterministic_for_a_fixed_seed():
    A = known_spectrum(np.linspace(0.5, 6.0, 40), seed=7)
    b = np.random.default_rng(8).normal(size=40)
    runs = [(curvature.power_iteration(A, k=2, seed=3)[0],
             curvature.spectral_density(A, 10, 3, seed=3)[1],
             curvature.hutchinson(A, 20, seed=3), curvature.hutchpp(A, 21, seed=3),
             curvature.conjugate_gradient(A, b, 0.1)[0],
             curvature.lissa(A, b, 0.1, scale=8.0, depth=50)) for _ in range(2)]
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)
    # ... and another seed gives another estimate (the seed is used).
    assert curvature.hutchinson(A, 20, seed=4) != runs[0][2]
