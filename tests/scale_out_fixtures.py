"""One step of each family under a given strategy, for the scale-out equivalence tests.

Each function builds the same small, seeded problem under `strategy.scope()`, runs one
step (two for WGAN-GP: a critic and a generator update) with the data split over the
replicas, and returns the change of the weights (or the product) as one flat float64
array; the initial weights are the same under every strategy (same seed). The
single-device result is the oracle: under MirroredStrategy and a two-process
MultiWorkerMirroredStrategy the arrays must agree to 1e-5. Every step is a plain
`tf.function` (`jit_compile=False`): under a multi-replica strategy "auto" takes the plain
step anyway, and the single device's XLA attempt (about 15 CPU-s over the families) is
not what these tests compare. Used in-process by
tests/test_scale_out.py and by tests/workers/families.py (the two-process run).
"""

import keras
import numpy as np
import tensorflow as tf

from hogrod import curvature, distribute, gan, meta, pinn, train
from hogrod.pinn import training as pinn_training
from train_fixtures import GLOBAL_BATCH, make_problem


def flat(variables):
    return np.concatenate([np.ravel(v.numpy()).astype(np.float64) for v in variables])


def mlp(inputs, outputs, width=16, depth=2, activation="tanh", dtype="float32"):
    return keras.Sequential([keras.Input((inputs,), dtype=dtype)] +
                            [keras.layers.Dense(width, activation=activation, dtype=dtype)
                             for _ in range(depth)] + [keras.layers.Dense(outputs, dtype=dtype)])


def meta_step(strategy):
    """Second-order MAML, one inner step; the meta-batch of 8 sinusoid tasks is sharded."""
    tasks = meta.sample_sinusoids(tf.constant([3, 0], tf.int64), 8, 5, 5)[:4]
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = mlp(1, 1, width=20, activation="relu")
        opt = keras.optimizers.Adam(1e-2)
        algo = meta.maml(model, lambda y, p: tf.reduce_mean((y - p) ** 2), inner_lr=0.05,
                         inner_steps=1)
    step = train.make_train_step(algo.meta_loss, opt, model.trainable_variables,
                                 strategy=strategy, jit_compile=False)
    data = tf.data.Dataset.from_tensors(tasks).unbatch().batch(8)
    before = flat(model.trainable_variables)
    step(next(iter(distribute.distribute_dataset(strategy, data))))
    return flat(model.trainable_variables) - before


def _adam():
    return keras.optimizers.Adam(1e-3, beta_1=0.0, beta_2=0.9)


def gan_step(strategy, penalty=gan.gradient_penalty, optimizer=_adam):
    """WGAN-GP, n_critic 2: the real batch, latent codes and the penalty's noise (GP
    weights; DRAGAN's perturbation and weights) all sharded. (Adam's first steps are
    nearly lr * sign(gradient): pass `optimizer=` SGD to see small gradient changes.)"""
    with strategy.scope():
        keras.utils.set_random_seed(0)
        generator, critic = mlp(2, 2), mlp(2, 1)
        opt_c, opt_g = optimizer(), optimizer()
    step = gan.make_gan_step(generator, critic, opt_c, opt_g, latent_dim=2, n_critic=2,
                             critic_penalties=[(penalty, 10.0, 1)] if penalty else [],
                             strategy=strategy, jit_compile=False)
    data = gan.with_noise(gan.toy_batches("eight_gaussians", 32, seed=0), latent_dim=2)
    batches = iter(distribute.distribute_dataset(strategy, data))
    before = flat(critic.trainable_variables + generator.trainable_variables)
    step(next(gan.grouped(batches, 2)))
    return flat(critic.trainable_variables + generator.trainable_variables) - before


def pinn_step(strategy):
    """Burgers: one Adam step, then 3 L-BFGS iterations, collocation points sharded."""
    problem = pinn.problems.burgers_problem(hard_constraints=False)  # so the conditions are terms
    points = tf.constant(pinn.sample(problem.domain, 256, "sobol", 0), tf.float64)
    conds = [tf.constant(fn(32, 1 + i), tf.float64) for i, (_, fn, _) in
             enumerate(problem.conditions)]
    with strategy.scope():
        keras.utils.set_random_seed(0)
        net = mlp(2, 1, dtype="float64")
        opt = keras.optimizers.Adam(1e-2)
    objective = pinn_training.pinn_loss(problem, pinn_training.solution_fn(problem, net), points,
                                      conds)
    batch = distribute.shard(strategy, (points, conds))
    before = flat(net.trainable_variables)
    train.make_train_step(objective, opt, net.trainable_variables, strategy=strategy,
                          jit_compile=False)(batch)
    pinn_training.lbfgs(objective, net.trainable_variables, 3, strategy=strategy, batch=batch)
    return flat(net.trainable_variables) - before


def curvature_product(strategy):
    """A Hessian-vector product of an MLP's MSE over a 2-batch data set, batches sharded."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = mlp(3, 1)
    op = curvature.HessianOperator.from_objective(
        lambda b: tf.reduce_mean((model(b[0]) - b[1]) ** 2), model.trainable_variables,
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16), strategy=strategy)
    v = tf.constant(rng.normal(size=op.shape[0]), tf.float32)
    return op.matvec_flat(v).numpy().astype(np.float64)


def train_step(strategy):
    """The plain train step: a tanh MLP, SGD, two named terms; the global batch sharded."""
    with strategy.scope():
        model, opt, objective, data = make_problem()
    step = train.make_train_step(objective, opt, model.trainable_variables, strategy=strategy,
                                 jit_compile=False)
    before = flat(model.trainable_variables)
    step(next(iter(distribute.distribute_dataset(strategy, data.batch(GLOBAL_BATCH)))))
    return flat(model.trainable_variables) - before


FAMILIES = {"train": train_step, "meta": meta_step, "gan": gan_step, "pinn": pinn_step,
            "curvature": curvature_product}
