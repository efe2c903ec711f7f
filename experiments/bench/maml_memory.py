"""Benchmark: peak memory of one second-order MAML step, with and without recomputation.

MAML's backward pass through k inner steps keeps every inner step's activations; with
`task_map='recomputed'` each task's inner loop is recomputed in the backward pass
(`tf.recompute_grad`) instead. For 1, 5 and 10 inner steps this measures the allocator's
peak (`tf.config.experimental.get_memory_info`) over one compiled meta-step on MAML's
Omniglot network (5-way 1-shot, 15 queries, random images), tasks run sequentially in
both cases so only recomputation differs; the vectorized default is reported too.

    python -m experiments.bench.maml_memory --gin_file=experiments/bench/configs/maml_memory.gin
"""

import gin
import keras
import numpy as np
import tensorflow as tf

from hogrod.models import conv4, cross_entropy
from hogrod import harness, meta, train


def peak_mb(inner_steps, mode, tasks, filters, device):
    keras.utils.set_random_seed(0)
    model = conv4(filters=filters)
    algo = meta.maml(model, cross_entropy, inner_lr=0.4, inner_steps=inner_steps,
                     task_map={"recompute": "recomputed"}.get(mode, mode))
    step = train.make_train_step(algo.meta_loss, keras.optimizers.Adam(1e-3),
                                 model.trainable_variables)
    step(tasks)  # trace and build outside the measurement
    tf.config.experimental.reset_memory_stats(device)
    step(tasks)
    return tf.config.experimental.get_memory_info(device)["peak"] / 2**20


@gin.configurable
def bench_maml_memory(output_dir, inner_steps=(1, 5, 10), meta_batch=4, filters=64,
                      modes=("sequential", "recompute", "vectorized")):
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    rng = np.random.default_rng(0)
    tasks = (tf.constant(rng.random((meta_batch, 5, 28, 28, 1)), tf.float32),
             tf.constant(np.tile(np.arange(5), (meta_batch, 1)), tf.int32),
             tf.constant(rng.random((meta_batch, 75, 28, 28, 1)), tf.float32),
             tf.constant(np.tile(np.repeat(np.arange(5), 15), (meta_batch, 1)), tf.int32))
    metrics = {"device": device}
    for k in inner_steps:
        for mode in modes:
            metrics[f"peak_mb_{mode}_{k}_steps"] = peak_mb(k, mode, tasks, filters, device)
            print(f"inner steps {k:2d}  {mode:10s}  peak {metrics[f'peak_mb_{mode}_{k}_steps']:.1f} MB")
    return metrics


def main():
    """`python -m experiments.bench.maml_memory` (see the module docstring)."""
    harness.main(bench_maml_memory)


if __name__ == "__main__":
    main()
