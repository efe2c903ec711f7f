"""A resumable training run for the kill-and-resume test.

usage: resumable.py OUTPUT_DIR STEPS RESULT.npy SLEEP_S
Trains a small dropout MLP on a shuffled tf.data stream with an RNG-driven noise term,
checkpointing every 5 steps; writes the final weights to RESULT.npy.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hogrod import train  # noqa: E402

output_dir, steps, result, sleep_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dropout(0.3, seed=1), keras.layers.Dense(1)])
rng = tf.random.Generator.from_seed(7)
x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
y = np.sin(x.sum(axis=1, keepdims=True)).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=3).repeat().batch(16)
iterator = iter(data)
opt = keras.optimizers.Adam(1e-2)


def loss_fn(batch):
    xb, yb = batch
    noise = rng.normal(tf.shape(yb)) * 0.01
    return {"mse": tf.reduce_mean((model(xb, training=True) - yb - noise) ** 2)}


step = train.make_train_step(loss_fn, opt, model.trainable_variables)
ckpt = train.Checkpointer(output_dir, model=model, optimizer=opt, rng=rng, data=iterator)


def slow(step_i, logs):
    time.sleep(sleep_s)
    print(f"STEP {step_i}", flush=True)


train.train_loop(step, iterator, steps, ckpt, checkpoint_every=5, callback=slow)
np.save(result, np.concatenate([v.numpy().ravel() for v in model.trainable_variables]))
print("DONE", flush=True)
