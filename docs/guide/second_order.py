"""Training with curvature: K-FAC, Hessian-free, AdaHessian and Sophia on your own model.

    python docs/guide/second_order.py [--quick]

Each optimizer is a `hogrod.train.StepOptimizer` that `make_train_step` hands every step's
gradient, objective and batch. K-FAC and Hessian-free take your model and its Keras loss
when you build them (they capture the layers' inputs and the outputs' curvature);
AdaHessian takes neither (it differentiates the step's objective twice); Sophia takes them
only for its Gauss-Newton-Bartlett estimator. The batch is a Keras pair `(x, y)`.

Checks (float64):
1. One linear layer under MSE is linear least squares, where K-FAC's factors and the
   Gauss-Newton matrix are exact: one K-FAC step (rate 1, no momentum, damping ~0) and one
   Hessian-free step (damping 0, CG to convergence) land on `numpy.linalg.lstsq`'s solution.
2. Your own MLP trained by each optimizer for a few steps: each lowers the training loss
   (by 30% at least); each reports what it used (its damping, ...) in the step's logs.
3. Under MirroredStrategy on two logical CPUs, K-FAC takes the steps it takes on one device.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hogrod import distribute, second_order, train  # noqa: E402
from hogrod.curvature import data as curvature_data  # noqa: E402

MSE = keras.losses.MeanSquaredError(dtype="float64")


def regression(n, inputs, outputs, seed, nonlinear=False):
    """float64 inputs and targets: a noisy linear map, or a smooth nonlinear one."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs))
    w = rng.normal(size=(inputs, outputs))
    y = np.sin(2 * x @ w) if nonlinear else x @ w + 0.1 * rng.normal(size=(n, outputs))
    return x, y


def network(widths, strategy=None, seed=0):
    """A float64 tanh MLP (one Dense layer for widths (inputs, outputs)), seeded."""
    with (strategy or tf.distribute.get_strategy()).scope():
        keras.utils.set_random_seed(seed)
        layers = [keras.Input((widths[0],), dtype="float64")]
        layers += [keras.layers.Dense(w, activation="tanh", dtype="float64")
                   for w in widths[1:-1]]
        layers += [keras.layers.Dense(widths[-1], dtype="float64")]
        return keras.Sequential(layers)


def objective_of(model, loss):
    """The train step's objective on a batch (x, y): the batch mean of the Keras loss.
    `batch_loss` undoes Keras's division by the replicas under a strategy."""
    def objective(batch):
        x, y = batch
        return curvature_data.batch_loss(loss, y, model(x, training=True))
    return objective


def optimizer(name, model, loss):
    """Each optimizer as you would build it for your own model."""
    if name == "kfac":  # the model's Dense/Conv2D layers and its loss; kfac-jax's adaptive
        return second_order.kfac(model, loss, damping=0.1, adaptive=True)  # rate and momentum
    if name == "hessian_free":  # Gauss-Newton products of the model's outputs under the loss
        return second_order.hessian_free(model, loss, damping=1e-2, cg_maxiter=10)
    if name == "adahessian":  # nothing: Hessian diagonals of the step's objective
        return second_order.adahessian(learning_rate=0.1)
    # Sophia-G: sampled labels from the loss's likelihood (Sophia-H needs neither). Its rate
    # is the step of every clipped coordinate (most of them, at rho 0.04): at 0.1 it
    # oscillates on this problem after a few tens of steps
    return second_order.sophia(learning_rate=0.03, b1=0.9, estimator="gauss_newton_bartlett",
                               model=model, loss=loss)


def exact_on_least_squares(quick):
    """Check 1: one step of K-FAC or Hessian-free solves linear least squares."""
    x, y = regression(64 if quick else 512, 3, 2, seed=0)
    design = np.hstack([x, np.ones((len(x), 1))])
    solution = np.linalg.lstsq(design, y, rcond=None)[0]
    builders = {
        "kfac": lambda m: second_order.kfac(m, MSE, learning_rate=1.0, damping=1e-16,
                                            momentum=0.0),
        # 8 unknowns (a 3x2 kernel and 2 biases): CG is exact in at most 8 iterations
        "hessian_free": lambda m: second_order.hessian_free(m, MSE, damping=0.0,
                                                            cg_maxiter=8, cg_tol=1e-14),
    }
    for name, build in builders.items():
        model = network((3, 2))
        step = train.make_train_step(objective_of(model, MSE), build(model),
                                     model.trainable_variables)
        step((x, y))
        kernel, bias = (v.numpy() for v in model.trainable_variables)
        error = np.abs(np.vstack([kernel, bias[None]]) - solution).max()
        print(f"{name}: one step, max |w - lstsq| = {error:.2e}")
        assert error < 1e-6, (name, error)


def train_each(quick):
    """Check 2: every optimizer trains your own MLP; the logs say what it used."""
    x, y = regression(128, 2, 1, seed=1, nonlinear=True)
    steps = 10 if quick else 100
    for name in ("kfac", "hessian_free", "adahessian", "sophia"):
        model = network((2, 16, 1), seed=2)
        step = train.make_train_step(objective_of(model, MSE), optimizer(name, model, MSE),
                                     model.trainable_variables)
        first = float(step((x, y))["loss"])
        for _ in range(steps - 1):
            logs = step((x, y))
        last = float(MSE(y, model(x)))
        used = {k: round(float(v), 4) for k, v in logs.items() if k not in ("loss", "applied")}
        print(f"{name}: loss {first:.4f} -> {last:.4f} in {steps} steps; logs {used}")
        assert last < 0.7 * first, (name, first, last)
        assert "lr" in logs and (name not in ("kfac", "hessian_free") or "damping" in logs)


def distributed_equals_one_device(quick):
    """Check 3: K-FAC under MirroredStrategy (two logical CPUs) steps as on one device."""
    x, y = regression(32, 2, 1, seed=3, nonlinear=True)
    weights = []
    for strategy in (tf.distribute.get_strategy(), distribute.make_strategy("mirrored")):
        model = network((2, 8, 1), strategy, seed=4)
        with strategy.scope():
            opt = optimizer("kfac", model, MSE)
        step = train.make_train_step(objective_of(model, MSE), opt, model.trainable_variables,
                                     strategy=strategy)
        data = distribute.distribute_dataset(
            strategy, tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat())
        batches = iter(data)
        for _ in range(2 if quick else 5):
            step(next(batches))
        weights.append([v.numpy() for v in model.trainable_variables])
    gap = max(np.abs(a - b).max() for a, b in zip(*weights))
    print(f"kfac on two replicas against one device: max weight difference {gap:.1e}")
    assert gap < 1e-10, gap


def main(quick=False):
    """Run the three checks (`quick`: smaller data and fewer steps)."""
    exact_on_least_squares(quick)
    train_each(quick)
    distributed_equals_one_device(quick)


if __name__ == "__main__":
    distribute.make_strategy("mirrored", logical_cpus=2)  # before any other TensorFlow work
    main(quick="--quick" in sys.argv or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
