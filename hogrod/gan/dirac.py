"""The Dirac-GAN (Mescheder et al. 2018): a two-parameter GAN whose convergence is exact.

The data are a point mass at 0; the generator a point mass at ``theta`` (``G(z) = theta``);
the critic linear, ``D(x) = -psi x`` (the paper's critic ``psi x`` scores the generated data
high, hogrod's critics the real data: the sign keeps the paper's coordinates, so its figures
and its start (1, 1) read the same). The unique equilibrium is ``(theta, psi) = (0, 0)``.
The game here is played with hogrod's own losses and penalties, unchanged: the critic is a
callable of a ``[1, 1]`` batch, the real batch is ``[[0]]``, the generated one
``[[theta]]``, and the players' gradients are taken by autodiff through `GanLosses` and every
penalty's inner tape. Its vector field is

    v(theta, psi) = (-d L_generator / d theta, -d L_critic / d psi),

gradient descent of each player on its own loss; `dirac_trajectory` follows it by
simultaneous steps ``p <- p + h v(p)`` or alternating ones (the generator's step, then the
critic's at the generator's new theta, as the paper's notebook). `dirac_jacobian` is the
Jacobian of v at the equilibrium by `hogrod.jacobian`, `dirac_eigenvalues` its eigenvalues.

Closed forms (float64 agrees to 1e-10; `tests/test_dirac_gan.py`): with ``f'(0) = 1/2`` for
the saturating, non-saturating and relativistic losses (1 for WGAN), the Jacobian at the
equilibrium is ``[[0, -f'(0)], [f'(0), -c]]`` with ``c`` the penalty's curvature in psi:
unregularized ``c = 0``, eigenvalues ``+-f'(0) i`` (simultaneous steps spiral out, alternating
ones circle); R1 (or R2) with weight ``gamma / 2``: ``c = gamma``, eigenvalues ``-gamma/2 +-
sqrt(gamma^2/4 - f'(0)^2)`` (both converge for small steps); R1 + R2 (R3GAN) ``c = 2 gamma``;
bCR with the shift ``T(x) = x + s`` and weight ``lambda``: ``c = 4 lambda s^2`` (it acts as
R1 here). WGAN-GP's penalty ``(|psi| - g0)^2`` does not vanish at the equilibrium and its
gradient jumps there (``-+2 lambda g0`` either side of psi = 0): the equilibrium is not a
fixed point of the field, `dirac_fixed_point` says so and `dirac_eigenvalues` is empty.

The paper's notebook (LMescheder/GAN_stability, notebooks/diracgan), whose trajectories
`tests/test_dirac_gan.py` reproduces to 1e-9: its ``GAN_GradPenalty(reg)`` is R1 with weight
``reg / 2``, its ``WGAN_GP(reg, target)`` `gradient_penalty` with weight ``reg / 2`` and that
target; its figure takes steps of 0.2 (this module any). Generator penalties (path length,
zCR) are constant for a generator that ignores its latent code, and spectral normalization
leaves psi no gradient (``D(x) = -x sign(psi)``): the Dirac-GAN takes the losses and the
critic penalties.
"""

from typing import Callable, NamedTuple, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hogrod import autodiff, checks
from hogrod.gan import losses
from hogrod.types import TensorLike

__all__ = ["DiracGAN", "dirac_gan", "dirac_vector_field", "dirac_jacobian",
           "dirac_fixed_point", "dirac_eigenvalues", "dirac_trajectory", "DIRAC_MODES"]

DIRAC_MODES = ("simultaneous", "alternating")
_F64 = tf.float64
def _noise():
    """The penalties' random numbers, fixed: in the Dirac-GAN the critic's input gradient is
    psi everywhere, so where a penalty evaluates it does not matter."""
    return {"interpolation": tf.constant([0.5], _F64), "perturbation": tf.zeros([1, 1], _F64)}


class DiracGAN(NamedTuple):
    """A Dirac-GAN game: a loss and weighted critic penalties (see `dirac_gan`).

    Attributes:
      loss: a GAN loss ``loss(real_scores, fake_scores) -> GanLosses``.
      penalties: pairs ``(penalty, weight)``, each penalty ``penalty(critic, real, fake, *,
        noise)``, added to the critic's loss with its weight.
    """
    loss: Callable[..., losses.GanLosses]
    penalties: Tuple[Tuple[Callable[..., tf.Tensor], float], ...]


def dirac_gan(loss: Callable[..., losses.GanLosses] = losses.saturating_loss,
              penalties: Sequence[Callable[..., tf.Tensor]] = (),
              penalty_weights: Sequence[float] = ()) -> DiracGAN:
    """The Dirac-GAN played with `loss` and the critic penalties, each with its weight.

    Args:
      loss: a `hogrod.gan` loss (`saturating_loss`, the paper's unregularized game;
        `nonsaturating_loss`, `wasserstein_loss`, `relativistic_loss`) or your own.
      penalties: critic penalties in the one signature (`r1_penalty`, `r2_penalty`,
        `gradient_penalty`, `consistency_penalty`, ...).
      penalty_weights: one weight >= 0 per penalty (R1 with the paper's gamma: gamma / 2).

    Returns:
      The game, a `DiracGAN`.

    Raises:
      ArgumentError: `loss` or a penalty is not callable, or the weights do not match the
        penalties one to one or are negative.
    """
    where = "dirac_gan"
    checks.function(loss, "loss", where, "loss(real_scores, fake_scores) -> GanLosses")
    penalties, weights = list(penalties), list(penalty_weights)
    if len(penalties) != len(weights):
        raise checks.ArgumentError(f"{where}: penalty_weights must give one weight per "
                                   f"penalty: {len(penalties)} penalties, {len(weights)} "
                                   "weights")
    for i, penalty in enumerate(penalties):
        checks.function(penalty, f"penalties[{i}]", where, "penalty(critic, real, fake, *, noise)")
    weights = [checks.nonnegative(w, f"penalty_weights[{i}]", where) for i, w in enumerate(weights)]
    return DiracGAN(loss, tuple(zip(penalties, weights)))


def _params(params: TensorLike, where: str) -> tf.Tensor:
    p = tf.convert_to_tensor(params, _F64) if not tf.is_tensor(params) else params
    if p.dtype != _F64 or not p.shape.is_compatible_with([2]):
        raise checks.ArgumentError(f"{where}: params must be (theta, psi), float64 of shape "
                                   f"[2], got {p.dtype.name} {p.shape}")
    return p


def dirac_vector_field(game: DiracGAN, params: TensorLike) -> tf.Tensor:
    """The game's vector field ``(-d L_G / d theta, -d L_D / d psi)`` at ``(theta, psi)``.

    Args:
      game: a `DiracGAN`.
      params: ``(theta, psi)``, float64, shape [2].

    Returns:
      The field, float64 [2].

    Raises:
      ArgumentError: `params` is not a float64 pair.
    """
    p = _params(params, "dirac_vector_field")
    real = tf.zeros([1, 1], _F64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(p)
        theta, psi = tf.unstack(p)

        def critic(x):  # D(x) = -psi x, one score per example
            return -psi * x[:, 0]

        fake = tf.reshape(theta, [1, 1])
        play = game.loss(critic(real), critic(fake))
        critic_loss = tf.cast(play.critic, _F64)
        for penalty, weight in game.penalties:
            value = penalty(critic, real, fake, noise=_noise())
            critic_loss += tf.constant(weight, _F64) * tf.cast(value, _F64)
    generator_grad = tape.gradient(play.generator, p,
                                   unconnected_gradients=tf.UnconnectedGradients.ZERO)
    critic_grad = tape.gradient(critic_loss, p, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    del tape
    return -tf.stack([tf.cast(generator_grad[0], _F64), tf.cast(critic_grad[1], _F64)])


def dirac_jacobian(game: DiracGAN) -> tf.Tensor:
    """The Jacobian of the vector field at the equilibrium (0, 0), by `hogrod.jacobian`.

    Args:
      game: a `DiracGAN`.

    Returns:
      A float64 [2, 2] tensor, ``J[i, j] = d v_i / d p_j``, p = (theta, psi).
    """
    return autodiff.jacobian(lambda p: dirac_vector_field(game, p), tf.zeros([2], _F64))


def dirac_fixed_point(game: DiracGAN, eps: float = 1e-8, tol: float = 1e-6) -> bool:
    """Whether the equilibrium (0, 0) is a fixed point of a field continuous there.

    The field must vanish at (0, 0) and be within `tol` of zero at the four points `eps`
    away on the axes (a penalty whose gradient jumps at psi = 0, WGAN-GP's, fails).

    Args:
      game: a `DiracGAN`.
      eps: the distance of the points checked, > 0.
      tol: the largest field norm allowed there, > 0.

    Returns:
      True if it is a fixed point.
    """
    eps = checks.positive(eps, "eps", "dirac_fixed_point")
    tol = checks.positive(tol, "tol", "dirac_fixed_point")
    points = [(0.0, 0.0), (eps, 0.0), (-eps, 0.0), (0.0, eps), (0.0, -eps)]
    norms = [float(tf.norm(dirac_vector_field(game, tf.constant(p, _F64)))) for p in points]
    return max(norms) <= tol


def dirac_eigenvalues(game: DiracGAN) -> np.ndarray:
    """The eigenvalues of the Jacobian at the equilibrium, sorted by imaginary part.

    Args:
      game: a `DiracGAN`.

    Returns:
      A complex numpy array [2]; empty ([0]) when the equilibrium is not a fixed point of
      the field (`dirac_fixed_point`), where no Jacobian describes the dynamics.
    """
    if not dirac_fixed_point(game):
        return np.zeros([0], complex)
    values = np.linalg.eigvals(dirac_jacobian(game).numpy())
    return values[np.lexsort((values.real, values.imag))]


def dirac_trajectory(game: DiracGAN, start: Sequence[float] = (1.0, 1.0), step: float = 0.1,
                     steps: int = 1000, mode: str = "simultaneous") -> np.ndarray:
    """Gradient descent of both players from `start`, simultaneous or alternating.

    ``simultaneous``: ``p <- p + step v(p)``. ``alternating``: ``theta <- theta + step
    v_theta(theta, psi)``, then ``psi <- psi + step v_psi(theta, psi)`` at the new theta (the
    generator first, as the paper's notebook). One compiled loop, float64.

    Args:
      game: a `DiracGAN`.
      start: ``(theta, psi)`` at the start.
      step: the step size h, > 0 (the same for both players).
      steps: the number of steps, >= 0.
      mode: "simultaneous" or "alternating".

    Returns:
      The points, a float64 numpy array [steps + 1, 2], `start` first; its last row's norm
      is the distance to the equilibrium.

    Raises:
      ArgumentError: `start` is not a pair of numbers, or `step`, `steps` or `mode` is out
        of range.
    """
    where = "dirac_trajectory"
    mode = checks.choice(mode, DIRAC_MODES, "mode", where)
    step = checks.positive(step, "step", where)
    steps = checks.integer(steps, "steps", where)
    if len(start) != 2:
        raise checks.ArgumentError(f"{where}: start must be (theta, psi), got {start!r}")
    start = [checks.number(x, f"start[{i}]", where) for i, x in enumerate(start)]
    h = tf.constant(step, _F64)

    def one_step(p):
        if mode == "simultaneous":
            return p + h * dirac_vector_field(game, p)
        theta = p[0] + h * dirac_vector_field(game, p)[0]
        moved = tf.stack([theta, p[1]])
        return tf.stack([theta, p[1] + h * dirac_vector_field(game, moved)[1]])

    def body(i, p, out):
        p = one_step(p)
        return i + 1, p, out.write(i + 1, p)

    @tf.function(autograph=False)
    def run(p0):
        points = tf.TensorArray(_F64, size=steps + 1).write(0, p0)
        _, _, points = tf.while_loop(lambda i, p, out: i < steps, body,
                                     (tf.constant(0), p0, points))
        return points.stack()

    return run(tf.constant(start, _F64)).numpy()
