"""Your own PDE, conditions and geometry as a PINN: -Laplacian(u) + u^3 = f on the unit disk.

    python docs/guide/pinn_own_pde.py            # 2,000 Adam steps + L-BFGS to convergence
    python docs/guide/pinn_own_pde.py --quick    # 200 Adam steps + 150 L-BFGS iterations

The exact solution u*(x, y) = exp(x) sin(y) is harmonic, so f = u*^3; it gives the
Dirichlet data on the circle and the reference the error is measured against.
"""

import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
from hogrod import pinn  # noqa: E402


def exact(x):  # numpy or tf, [n, 2] -> [n, 1]
    lib = tf if tf.is_tensor(x) else np
    return lib.exp(x[:, :1]) * lib.sin(x[:, 1:2])


# The PDE: which partial derivatives the residual reads, and the residual of the `partials`
# dict d (keys: () for u, (0, 0) for u_xx, (1, 1) for u_yy), shape [batch, 1].
OWN_PDE = pinn.PDE(
    wanted=[(), (0, 0), (1, 1)],
    residual=lambda x, d: -pinn.laplacian(d, [0, 1]) + d[()] ** 3 - exact(x) ** 3)


class Disk:
    """Your own geometry: anything with `dim` serves as a Problem's domain; its points
    are yours to sample."""
    dim = 2

    def __init__(self, radius=1.0):
        self.radius = radius

    def interior(self, n, seed):
        rng = np.random.default_rng(seed)
        r = self.radius * np.sqrt(rng.random(n))           # uniform over the area
        a = 2 * math.pi * rng.random(n)
        return np.stack([r * np.cos(a), r * np.sin(a)], 1).astype(np.float32)

    def boundary(self, n, seed):
        a = 2 * math.pi * np.random.default_rng(seed).random(n)
        return self.radius * np.stack([np.cos(a), np.sin(a)], 1).astype(np.float32)


def make_problem():
    disk = Disk()
    grid = disk.interior(4000, seed=99).astype(np.float64)          # evaluation points
    dirichlet = ("boundary", disk.boundary, lambda x: exact(x))     # (name, points_fn, target_fn)
    return pinn.Problem(name="cubic_disk", pde=OWN_PDE, domain=disk, conditions=[dirichlet],
                        transform=None, reference=exact, grid=grid, grid_shape=None)


def main(quick=False):
    keras.utils.set_random_seed(0)
    adam_steps, lbfgs_maxiter, n_points, n_boundary = (
        (200, 150, 128, 32) if quick else (2000, 10000, 2000, 256))

    # the PDE is right if the exact solution leaves no residual (float64 points)
    x64 = tf.constant(Disk().interior(100, seed=5), tf.float64)
    assert np.abs(pinn.residual(OWN_PDE, exact, x64).numpy()).max() < 1e-10

    problem = make_problem()
    net = keras.Sequential([keras.Input((2,))] + [
        keras.layers.Dense(32, activation="tanh") for _ in range(3)] + [keras.layers.Dense(1)])
    u = pinn.solution_fn(problem, net)      # the net, through problem.transform if there is one
    points = problem.domain.interior(n_points, seed=0)
    condition_points = [points_fn(n_boundary, seed=1) for _, points_fn, _ in problem.conditions]
    objective = pinn.pinn_loss(problem, u, points, condition_points, weights={"boundary": 10.0})
    # objective() -> {"residual": scalar, "boundary": scalar}, the weights already applied

    step = hogrod.train.make_train_step(objective, keras.optimizers.Adam(1e-3),
                                        net.trainable_variables)
    step(None)  # make_train_step's step takes a batch; pinn_loss ignores None (all points)
    for _ in range(adam_steps - 1):
        logs = step(None)
    after_adam = pinn.relative_l2(problem, u)
    final_loss, iterations, seconds = pinn.lbfgs(objective, net.trainable_variables,
                                                 maxiter=lbfgs_maxiter)
    error = pinn.relative_l2(problem, u)                # a float (None without a reference)
    pred = pinn.predict_on_grid(problem, u)             # numpy [n, 1] on problem.grid
    assert pred.shape == (len(problem.grid), 1)

    print(f"pinn_own_pde: relative L2 {after_adam:.2e} after Adam (loss {float(logs['loss']):.2e})"
          f", {error:.2e} after {iterations} L-BFGS iterations ({seconds:.1f} s, loss "
          f"{final_loss:.2e})")
    assert error < (1e-2 if quick else 1e-3), error
    return {"relative_l2": error}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
