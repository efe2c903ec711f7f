"""Steps/s and examples/s of every family's step for 1, 2 and 4 replicas.

    python -m experiments.bench.scaling --gin_file=experiments/bench/configs/scaling.gin

Each replica count runs in its own process (TensorFlow fixes the logical devices at start):
MirroredStrategy over that many devices (GPUs when the machine has enough, else logical
CPU devices), plus one two-process MultiWorkerMirroredStrategy run on loopback (1 device
per worker). Every count runs the same global batch, so the ratio to 1 replica is the
speed-up of the real code path (on a 2-core CPU machine, splitting the CPU into more
devices cannot add compute: expect ratios near or below 1 there; the point is that the
path is the one that scales on GPUs). Steps per round are timed in interleaved rounds.

Workloads (global batch): MAML sinusoid meta-batch of 32 tasks, second order, 1 inner step;
WGAN-GP critic step, 512 samples, width 256; PINN Burgers residual + conditions, 8,192
collocation points; a Hessian-vector product of an MLP over a batch of 1,024.
"""

import json
import os
import subprocess
import sys
import time

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod.models import cross_entropy, dense_net, mse
from hogrod import curvature, distribute, gan, harness, meta, pinn, train
from hogrod.pinn import training as pinn_training

FAMILIES = ("meta", "gan", "pinn", "curvature")


def _mlp(inputs, outputs, width, depth, activation="tanh"):
    return dense_net((inputs,) + (width,) * depth + (outputs,), activation)


def build(family, strategy):
    """(a zero-argument function running one step, examples per step)."""
    keras.utils.set_random_seed(0)
    if family == "meta":
        tasks = meta.sample_sinusoids(tf.constant([0, 0], tf.int64), 32, 10, 10)[:4]
        with strategy.scope():
            model = _mlp(1, 1, 40, 2, "relu")
            opt = keras.optimizers.Adam(1e-3)
            algo = meta.maml(model, mse, 0.01, 1)
        step = train.make_train_step(algo.meta_loss, opt, model.trainable_variables,
                                     strategy=strategy)
        data = tf.data.Dataset.from_tensors(tasks).unbatch().batch(32).repeat()
        it = iter(distribute.distribute_dataset(strategy, data))
        return lambda: step(next(it)), 32
    if family == "gan":
        with strategy.scope():
            generator, critic = _mlp(2, 2, 256, 3, "relu"), _mlp(2, 1, 256, 3, "relu")
            opts = [keras.optimizers.Adam(1e-4, beta_1=0.5, beta_2=0.9) for _ in range(2)]
        step = gan.make_gan_step(generator, critic, *opts, latent_dim=2, n_critic=1,
                                 strategy=strategy)
        data = gan.with_noise(gan.toy_batches("eight_gaussians", 512, 0), 2)
        it = iter(distribute.distribute_dataset(strategy, data))
        return lambda: step.critic_step(next(it)), 512
    if family == "pinn":
        problem = pinn.problems.burgers_problem(hard_constraints=False)
        points = tf.constant(pinn.sample(problem.domain, 8192, "sobol", 0), tf.float32)
        conds = [tf.constant(fn(512, 1 + i), tf.float32)
                 for i, (_, fn, _) in enumerate(problem.conditions)]
        with strategy.scope():
            net = _mlp(2, 1, 20, 8)
            opt = keras.optimizers.Adam(1e-3)
        objective = pinn_training.pinn_loss(problem, net, points, conds)
        step = train.make_train_step(objective, opt, net.trainable_variables, strategy=strategy)
        batch = distribute.shard(strategy, (points, conds))
        return lambda: step(batch), 8192
    if family == "curvature":
        rng = np.random.default_rng(0)
        x = rng.normal(size=(1024, 32)).astype("float32")
        y = rng.integers(0, 10, size=1024).astype("int32")
        with strategy.scope():
            model = _mlp(32, 10, 128, 2)
        op = curvature.HessianOperator.from_objective(
            lambda b: cross_entropy(b[1], model(b[0])), model.trainable_variables,
            tf.data.Dataset.from_tensor_slices((x, y)).batch(1024), strategy=strategy)
        v = tf.constant(rng.normal(size=op.shape[0]), tf.float32)
        return lambda: op.matvec_flat(v), 1024
    raise ValueError(f"bench_scaling.families: unknown family {family!r}; one of {FAMILIES}")


def _sync(out):
    """Block until a step's results exist (steps return tensors or dicts of them)."""
    for t in tf.nest.flatten(out):
        np.asarray(t)


def measure(families, steps, rounds, warmup):
    """{family: {"steps_per_sec", "examples_per_sec"}} under the strategy gin selects."""
    strategy = distribute.make_strategy()
    runs = {f: build(f, strategy) for f in families}
    for fn, _ in runs.values():
        for _ in range(warmup):
            _sync(fn())
    rates = {f: [] for f in families}
    for _ in range(rounds):
        for f, (fn, _) in runs.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                out = fn()
            _sync(out)
            rates[f].append(steps / (time.perf_counter() - t0))
    return {"replicas": strategy.num_replicas_in_sync,
            **{f: {"steps_per_sec": float(np.median(r)),
                   "examples_per_sec": float(np.median(r)) * runs[f][1]}
               for f, r in rates.items()}}


@gin.configurable
def bench_scaling(output_dir, families: tuple[str, ...] = FAMILIES,
                  replicas: tuple[harness.PositiveInt, ...] = (1, 2, 4), multi_worker: bool = True,
                  steps: harness.PositiveInt = 10, rounds: harness.PositiveInt = 5,
                  warmup: harness.Count = 3, measure_only: bool = False,
                  timeout_s: harness.Positive = 900):
    """Args:
      replicas: MirroredStrategy replica counts, each measured in a child process.
      multi_worker: also measure a two-process MultiWorkerMirroredStrategy on loopback.
      measure_only: (set for the children) measure under this process's strategy and stop.
    """
    if measure_only:
        result = measure(families, steps, rounds, warmup)
        if json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"] == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return result
    harness.started(output_dir)
    child = [sys.executable, "-m", "experiments.bench.scaling",
             "--gin_param=bench_scaling.measure_only = True",
             f"--gin_param=bench_scaling.families = {tuple(families)!r}",
             f"--gin_param=bench_scaling.steps = {steps}",
             f"--gin_param=bench_scaling.rounds = {rounds}",
             f"--gin_param=bench_scaling.warmup = {warmup}"]
    gpus = len(tf.config.list_physical_devices("GPU"))
    rows = {}

    def parse(stdout):
        return json.loads(next(line[7:] for line in stdout.splitlines()
                               if line.startswith("RESULT ")))

    for n in replicas:
        devices = [] if gpus >= n else [f"--gin_param=make_strategy.logical_cpus = {n}"]
        argv = child + ["--gin_param=make_strategy.kind = 'mirrored'", *devices,
                        f"--output_dir={os.path.join(output_dir, f'mirrored_{n}')}"]
        logging.info("measuring %d replica(s)", n)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode:
            raise RuntimeError(f"{n}-replica run failed:\n{out.stderr[-3000:]}")
        rows[f"mirrored_{n}"] = parse(out.stdout)
    if multi_worker:
        logging.info("measuring two workers on loopback")
        results = distribute.launch_local(
            child + ["--gin_param=make_strategy.kind = 'multi_worker'",
                     f"--output_dir={os.path.join(output_dir, 'multi_worker_2')}"], 2,
            timeout_s=timeout_s, env={"CUDA_VISIBLE_DEVICES": ""})
        rows["multi_worker_2"] = parse(results[0].stdout)
    base = rows[f"mirrored_{replicas[0]}"]
    for row in rows.values():
        for f in families:
            row[f]["speedup"] = row[f]["steps_per_sec"] / base[f]["steps_per_sec"]
    lines = ["| run | replicas | " + " | ".join(f"{f} steps/s (x)" for f in families) + " |",
             "|---|---|" + "---|" * len(families)]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['replicas']} | " + " | ".join(
            f"{row[f]['steps_per_sec']:.2f} ({row[f]['speedup']:.2f}x)" for f in families) + " |")
    table = "\n".join(lines)
    logging.info("scaling:\n%s", table)
    with open(os.path.join(output_dir, "scaling.md"), "w") as f:
        f.write(table + "\n")
    return {"runs": rows, "cpu_count": os.cpu_count(), "gpus": gpus, "table": table}


def main():
    """`python -m experiments.bench.scaling` (see the module docstring)."""
    harness.main(bench_scaling)


if __name__ == "__main__":
    main()
