"""A small deterministic problem shared by the training-loop tests and their worker scripts."""

import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16


def make_problem(lr=0.1):
    """A tanh MLP, SGD, an MSE + L2 loss (two named terms) and a 64-example data set."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(lr)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = rng.normal(size=(64, 2)).astype("float32")

    def loss_fn(batch):
        xb, yb = batch
        return {"mse": tf.reduce_mean((model(xb) - yb) ** 2),
                "l2": tf.add_n([tf.reduce_sum(w ** 2) for w in model.trainable_variables[::2]])}

    return model, opt, loss_fn, tf.data.Dataset.from_tensor_slices((x, y))


def weights(model):
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
