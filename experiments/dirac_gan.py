"""The Dirac-GAN (Mescheder et al. 2018): whether a GAN loss and regularizer make gradient
descent converge, checked where the answer is exact.

    python -m experiments.dirac_gan --gin_file=configs/gan/dirac_unregularized.gin
    python -m experiments.dirac_gan --gin_file=configs/gan/dirac_r1.gin
    python -m experiments.dirac_gan --gin_file=configs/gan/dirac_wgan_gp.gin

The game (`hogrod.gan.dirac`): data at 0, the generator at theta, the critic D(x) = psi x,
played with hogrod's own loss and critic penalties (`loss`, `penalties` and their
`penalty_weights`, by gin reference). The Jacobian of its vector field at the equilibrium
(0, 0) by `hogrod.jacobian`, its eigenvalues (none where the equilibrium is not a fixed point
of the field: WGAN-GP), and `steps` gradient steps of size `step` from `start`, simultaneous
and alternating (the generator first).

Outputs: metrics.json (`eigenvalues`: a list of [real, imaginary] pairs, empty for no fixed
point; `jacobian`; `fixed_point`; `distance_simultaneous`, `distance_alternating`: the
distance to the equilibrium after the last step; `start`, `step`, `steps`), trajectories.png
(the vector field and both trajectories in the (theta, psi) plane, as the paper's figure),
operative_config.gin.
"""

import os
import time

import gin
import matplotlib
import numpy as np
import tensorflow as tf

from hogrod import gan, harness

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _name(fn):
    return getattr(fn, "__name__", type(fn).__name__)


def describe(game):
    """A one-line description of the game: its loss and weighted penalties."""
    terms = [f"{w:g} x {_name(p)}" for p, w in game.penalties]
    return _name(game.loss) + (" + " + " + ".join(terms) if terms else ", unregularized")


def plot(path, game, paths, eigenvalues, grid=15):
    """The vector field on a `grid` x `grid` lattice and each trajectory, one panel per mode,
    on [-2, 2]^2 or wider to show the whole trajectories."""
    lim = max(2.0, 1.1 * max(np.abs(points).max() for points in paths.values()))
    field = tf.function(lambda p: gan.dirac_vector_field(game, p),
                        input_signature=[tf.TensorSpec([2], tf.float64)])
    ticks = np.linspace(-lim, lim, grid)
    theta, psi = np.meshgrid(ticks, ticks)
    vectors = np.array([field(tf.constant([t, p], tf.float64)).numpy()
                        for t, p in zip(theta.ravel(), psi.ravel())]).reshape(grid, grid, 2)
    fig, axes = plt.subplots(1, len(paths), figsize=(5 * len(paths), 5))
    for ax, (mode, points) in zip(axes, paths.items()):
        ax.quiver(theta, psi, vectors[..., 0], vectors[..., 1], color="0.6", width=0.003)
        ax.plot(points[:, 0], points[:, 1], color="tab:blue", lw=1)
        ax.plot(*points[0], "o", color="tab:green", label="start")
        ax.plot(*points[-1], "s", color="tab:red",
                label=f"after {len(points) - 1} steps: |p| = {np.linalg.norm(points[-1]):.3g}")
        ax.plot(0, 0, "k*", ms=10, label="equilibrium")
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_xlabel("theta (generator)")
        ax.set_ylabel("psi (critic)")
        ax.set_title(f"{mode} gradient steps", fontsize=10)
        ax.legend(loc="lower left", fontsize=7)
    spectrum = (", ".join(f"{z.real + 0.0:.4g}{z.imag:+.4g}i" for z in eigenvalues)
                or "none (no fixed point)")
    fig.suptitle(f"Dirac-GAN: {describe(game)}; eigenvalues {spectrum}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


@gin.configurable
def dirac_gan_experiment(output_dir, loss=gan.saturating_loss, penalties=(),
                         penalty_weights: tuple[harness.NonNegative, ...] = (),
                         start: tuple[float, float] = (1.0, 1.0),
                         step: harness.Positive = 0.1, steps: harness.Count = 1000):
    """Play the Dirac-GAN; return its eigenvalues and the distances after `steps` steps.

    loss: a `hogrod.gan` loss by reference (`@saturating_loss`, the paper's unregularized
    game). penalties, penalty_weights: critic penalties by reference and one weight each
    (R1 with the paper's gamma: `[@r1_penalty]`, `[gamma / 2]`).
    """
    started = time.perf_counter()
    game = gan.dirac_gan(loss, penalties, penalty_weights)
    fixed_point = gan.dirac_fixed_point(game)
    eigenvalues = gan.dirac_eigenvalues(game)
    jacobian = gan.dirac_jacobian(game).numpy()
    paths = {mode: gan.dirac_trajectory(game, start, step, steps, mode)
             for mode in gan.DIRAC_MODES}
    harness.started(output_dir)
    plot(os.path.join(output_dir, "trajectories.png"), game, paths, eigenvalues)
    metrics = dict(game=describe(game),
                   eigenvalues=[[float(z.real) + 0.0, float(z.imag) + 0.0] for z in eigenvalues],
                   jacobian=jacobian.tolist(), fixed_point=fixed_point,
                   start=list(start), step=step, steps=steps,
                   seconds=time.perf_counter() - started)
    for mode, points in paths.items():
        metrics[f"distance_{mode}"] = float(np.linalg.norm(points[-1]))
    return metrics


def main():
    """The console command `hogrod-dirac-gan` (see the module docstring)."""
    harness.main(dirac_gan_experiment)


if __name__ == "__main__":
    main()
