"""The Dirac-GAN (hogrod.gan.dirac) and its binary (experiments/dirac_gan.py), in float64.

Oracles: the closed-form Jacobian ``[[0, -f'(0)], [f'(0), -c]]`` at the equilibrium and its
eigenvalues ``-c/2 +- sqrt(c^2/4 - f'(0)^2)`` for every loss and penalty (1e-10); the
trajectories of the paper's notebook vector fields (LMescheder/GAN_stability,
notebooks/diracgan), written again here in numpy; the paper's behaviour after 1,000 steps of
0.1 from (1, 1)."""

import functools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, gan, harness
from experiments import dirac_gan

F_PRIME = 0.5  # f'(0) of the cross-entropy losses: sigmoid(0)

CASES = {  # name: (loss, penalties, weights, f'(0), c: the penalty's curvature in psi)
    "saturating": (gan.saturating_loss, [], [], F_PRIME, 0.0),
    "nonsaturating": (gan.nonsaturating_loss, [], [], F_PRIME, 0.0),
    "relativistic": (gan.relativistic_loss, [], [], F_PRIME, 0.0),
    "wasserstein": (gan.wasserstein_loss, [], [], 1.0, 0.0),
    "r1": (gan.saturating_loss, [gan.r1_penalty], [0.15], F_PRIME, 0.3),
    "r1_overdamped": (gan.saturating_loss, [gan.r1_penalty], [0.75], F_PRIME, 1.5),
    "nonsaturating_r2": (gan.nonsaturating_loss, [gan.r2_penalty], [0.15], F_PRIME, 0.3),
    "rpgan_r1_r2": (gan.relativistic_loss, [gan.r1_penalty, gan.r2_penalty], [0.15, 0.15],
                    F_PRIME, 0.6),
    "zero_centred_gp": (gan.saturating_loss, [functools.partial(gan.gradient_penalty, target=0.0)],
                        [0.15], F_PRIME, 0.3),
    # bCR with T(x) = x + 0.5 on real and generated data: 2 psi^2 0.5^2, weight 0.2
    "bcr_shift": (gan.saturating_loss, [functools.partial(gan.consistency_penalty,
                                                          augment=lambda x: x + 0.5)],
                  [0.2], F_PRIME, 4 * 0.2 * 0.25),
}


def ordered(values):
    values = np.asarray(values, complex)
    return values[np.lexsort((values.real, values.imag))]


@pytest.mark.parametrize("name", sorted(CASES))
def test_jacobian_and_eigenvalues_at_the_equilibrium_are_the_closed_forms(name):
    loss, penalties, weights, f, c = CASES[name]
    game = gan.dirac_gan(loss, penalties, weights)
    assert gan.dirac_fixed_point(game)
    jacobian = gan.dirac_jacobian(game).numpy()
    np.testing.assert_allclose(jacobian, [[0.0, -f], [f, -c]], atol=1e-12)
    root = np.sqrt(complex(c ** 2 / 4 - f ** 2))
    # dirac_eigenvalues itself (the same Jacobian, one more trace) is the binary test's
    np.testing.assert_allclose(ordered(np.linalg.eigvals(jacobian)),
                               ordered([-c / 2 + root, -c / 2 - root]), atol=1e-10)


def test_wgan_gp_equilibrium_is_not_a_fixed_point():
    """(|psi| - 1)^2's gradient is -+2 lambda on either side of psi = 0: no Jacobian
    describes the dynamics there, and there are no eigenvalues to report."""
    game = gan.dirac_gan(gan.wasserstein_loss, [gan.gradient_penalty], [0.35])
    assert not gan.dirac_fixed_point(game)
    assert gan.dirac_eigenvalues(game).shape == (0,)
    np.testing.assert_allclose(gan.dirac_vector_field(game, tf.constant([0.0, 1e-9], tf.float64)),
                               [-1e-9, 0.7], atol=1e-8)


# ---- the paper's notebook, in numpy -------------------------------------------------------

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def notebook_field(kind, theta, psi):
    """GAN_stability's `GAN`, `GAN_GradPenalty(reg=0.3)` and `WGAN_GP(reg=0.7, target=1)`."""
    if kind == "wgan_gp":
        return -psi, theta - 0.7 * (abs(psi) - 1.0) * np.sign(psi)
    fp = sigmoid(-psi * theta)
    return -psi * fp, theta * fp - (0.3 * psi if kind == "r1" else 0.0)


def notebook_trajectory(kind, mode, steps=1000, h=0.1):
    theta, psi = 1.0, 1.0
    out = [(theta, psi)]
    for _ in range(steps):
        if mode == "simultaneous":
            v1, v2 = notebook_field(kind, theta, psi)
            theta, psi = theta + h * v1, psi + h * v2
        else:
            theta += h * notebook_field(kind, theta, psi)[0]
            psi += h * notebook_field(kind, theta, psi)[1]
        out.append((theta, psi))
    return np.array(out)


GAMES = {"unregularized": (gan.saturating_loss, [], []),
         "r1": (gan.saturating_loss, [gan.r1_penalty], [0.15]),
         "wgan_gp": (gan.wasserstein_loss, [gan.gradient_penalty], [0.35])}
# the distance to the equilibrium after 1,000 steps of 0.1 from (1, 1)
DISTANCES = {("unregularized", "simultaneous"): (2.65, 0.01),
             ("unregularized", "alternating"): (1.42, 0.01)}


@pytest.mark.parametrize("name", sorted(GAMES))
def test_trajectories_follow_the_papers_notebook_and_its_figures(name):
    game = gan.dirac_gan(*GAMES[name])
    for mode in gan.DIRAC_MODES:
        points = gan.dirac_trajectory(game, (1.0, 1.0), 0.1, 1000, mode)
        assert points.shape == (1001, 2)
        kind = "unregularized" if name == "unregularized" else name
        np.testing.assert_allclose(points, notebook_trajectory(kind, mode), atol=1e-9,
                                   err_msg=f"{name}, {mode}")
        distance = np.linalg.norm(points[-1])
        if name == "r1":  # converges, about 1e-6 after 1,000 steps
            assert distance < 3e-6, (mode, distance)
        elif name == "wgan_gp":  # does not converge
            assert distance > 0.1, (mode, distance)
        else:
            expected, tol = DISTANCES[name, mode]
            assert abs(distance - expected) < tol, (mode, distance)


def test_bad_input_is_named():
    with pytest.raises(checks.ArgumentError, match="one weight per penalty"):
        gan.dirac_gan(gan.saturating_loss, [gan.r1_penalty], [])
    with pytest.raises(checks.ArgumentError, match=r"penalty_weights\[0\]"):
        gan.dirac_gan(gan.saturating_loss, [gan.r1_penalty], [-1.0])
    game = gan.dirac_gan()
    with pytest.raises(checks.ArgumentError, match="mode"):
        gan.dirac_trajectory(game, mode="sideways")
    with pytest.raises(checks.ArgumentError, match="step"):
        gan.dirac_trajectory(game, step=0.0)
    with pytest.raises(checks.ArgumentError, match="params"):
        gan.dirac_vector_field(game, tf.zeros([3], tf.float64))


def test_binary_writes_the_metrics_and_the_figure(tmp_path):
    """configs/gan/dirac_r1.gin, 20 steps: `dirac_eigenvalues` through the binary to
    metrics.json ([real, imaginary] pairs; WGAN-GP's empty list is the test above)."""
    out, m = harness.run(dirac_gan.dirac_gan_experiment, ["configs/gan/dirac_r1.gin"],
                         ["dirac_gan_experiment.steps = 20"], str(tmp_path))
    with open(os.path.join(out, "metrics.json")) as f:
        assert json.load(f)["eigenvalues"] == m["eigenvalues"]
    assert os.path.exists(os.path.join(out, "trajectories.png")) and m["fixed_point"]
    # R1 contracts: after 20 steps both are inside the circle of the start (1, 1)
    distances = m["distance_simultaneous"], m["distance_alternating"]
    assert m["steps"] == 20 and max(distances) < 2 ** 0.5
    root = np.sqrt(0.3 ** 2 / 4 - 0.25 + 0j)
    np.testing.assert_allclose(np.array(m["eigenvalues"]) @ [1, 1j],
                               ordered([-0.15 + root, -0.15 - root]), atol=1e-10)
