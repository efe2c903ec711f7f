"""Benchmark: MAML meta-training steps/s, hogrod against JAX and torch.func, two problems.

`problem='sinusoid'`: Finn et al.'s regression protocol, the 1-40-40-1 ReLU net, 25 tasks
of K = 10 support and 10 query points, one inner step at 0.01, mean squared error.
`problem='omniglot'`: MAML's Omniglot 5-way 1-shot meta-step, `hogrod.models.conv4` (4 x
[3x3 convolution of stride 2, 'same' padding, BatchNorm on the batch's statistics, ReLU],
flatten, Dense 5) on random 28x28 images (speed only: a few meta-batches drawn once,
cycled), 15 queries per class, 32 tasks, one inner step at 0.4, cross-entropy, the tasks in
`tf.map_fn` (`task_map='sequential'`) as the Omniglot configs bind it. Second-order MAML
with Adam 1e-3 on every side, each written as its users write it:
- hogrod: `meta.maml`, `train.make_train_step` and `train.train_loop` over a tf.data
  stream (the sinusoid's fresh each step), as `hogrod-maml` runs them: their defaults,
  `bench_maml.steps_per_execution` given to `train_loop` when bound (the binary's
  `maml_experiment.steps_per_execution`), `make_train_step.jit_compile = False` where the
  Omniglot configs bind it (maml_omniglot.gin).
- JAX (the `bench` extra: jax, optax), as its documentation teaches: the whole meta-step
  (`jax.grad` inner step, `jax.vmap` over tasks, `optax.adam`'s update) under one
  `jax.jit`, a fresh numpy meta-batch each step, one block on the result per round
  (asynchronous dispatch overlaps drawing the next batch with the step, as for its
  users). Conv4: `lax.conv_general_dilated`, NHWC/HWIO, 'SAME' (TensorFlow's) padding.
- PyTorch (the `bench` extra), the torch.func MAML tutorial's recipe: `torch.func.grad`,
  `vmap` over tasks, `functional_call`. Its conv4 pads as TensorFlow's 'same' does (on an
  even side nothing before, one after), flattens in NHWC order and writes BatchNorm out
  (`F.batch_norm`'s double backward under `vmap` is wrong).

    python -m experiments.bench.maml --gin_file=experiments/bench/configs/maml.gin
    python -m experiments.bench.maml --gin_file=experiments/bench/configs/maml_omniglot.gin

Agreement before speed: from the same weights, on one meta-batch of `check_tasks` tasks,
every side's meta-gradient in float32 and in float64 against a float64 reference (hogrod's
float64 one on the float32 weights and batch), within float32's (float64's) rounding of
that computation (`experiments.bench.peers.Reference`); the binary stops on a
disagreement. A peer not installed is skipped (logged; its metrics None). Then every side
takes `steps_per_round` steps per round, interleaved (`timing.interleaved_rates`), `runs`
times; reported: steps/s, `ratio_hogrod_over_<peer>` (the peer's step time over hogrod's)
and the peers' versions. On a loaded machine torch's threads wait on descheduled ones at
every barrier: `torch_threads = 1` avoids it.
"""

import itertools

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.peers import (Reference, keras_layout, to_torch, torch_layout,
                                     torch_maml_net, versions)
from experiments.bench.timing import interleaved_rates
from hogrod.models import conv4, cross_entropy, mlp, mse
import hogrod
from hogrod import checks, distribute, harness, meta, train
from hogrod.taskmap import check_task_map

PROBLEMS = ("sinusoid", "omniglot")
PEERS = ("jax", "torch_func")
IMAGE_SIZE = 28
BN_EPSILON = 1e-3  # Keras's BatchNormalization default, conv4's


def keras_net(problem, n_way, dtype="float32"):
    """The seeded Keras model, in `dtype` (Keras's floatx and policy while it is built).

    Every argument is given: a gin binding of the MAML configs' `mlp` or `conv4` cannot
    change it.
    """
    keras.utils.set_random_seed(0)
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(dtype)  # the inputs' dtype
    keras.config.set_dtype_policy(dtype)  # the layers' (Keras caches it on first use)
    try:
        if problem == "sinusoid":
            return mlp(input_dim=1, widths=(40, 40), outputs=1, activation="relu",
                       init_stddev=None)
        return conv4(image_size=IMAGE_SIZE, channels=1, filters=64, n_way=n_way)
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def omniglot_batches(seed, count, meta_batch, n_way, k, queries, dtype="float32"):
    """`count` meta-batches (x_s, y_s, x_q, y_q) of random images, numpy.

    Images uniform in [0, 1), [meta_batch, n_way * k (or * queries), 28, 28, 1]; labels
    int32 0..n_way-1, class after class, as episodes are laid out.
    """
    rng = np.random.default_rng(seed)
    ys, yq = (np.tile(np.repeat(np.arange(n_way, dtype=np.int32), n), (meta_batch, 1))
              for n in (k, queries))
    return [(rng.random((meta_batch, n_way * k, IMAGE_SIZE, IMAGE_SIZE, 1)).astype(dtype), ys,
             rng.random((meta_batch, n_way * queries, IMAGE_SIZE, IMAGE_SIZE, 1)).astype(dtype),
             yq) for _ in range(count)]


def sinusoid_batches(seed, meta_batch, k, queries, dtype="float32"):
    """`next_batch()`: a fresh sinusoid meta-batch (x_s, y_s, x_q, y_q) from numpy each call
    (amplitude in [0.1, 5], phase in [0, pi], x in [-5, 5]), [meta_batch, k or queries, 1]."""
    rng = np.random.default_rng(seed)

    def next_batch():
        amp = rng.uniform(0.1, 5, (meta_batch, 1, 1))
        ph = rng.uniform(0, np.pi, (meta_batch, 1, 1))
        xs = rng.uniform(-5, 5, (meta_batch, k, 1))
        xq = rng.uniform(-5, 5, (meta_batch, queries, 1))
        return tuple(a.astype(dtype) for a in
                     (xs, amp * np.sin(xs - ph), xq, amp * np.sin(xq - ph)))
    return next_batch


def hogrod_meta_grad(model, loss, inner_lr, inner_steps, task_map):
    """`meta_grad(batch)`: hogrod's meta-gradient of a numpy meta-batch, numpy arrays in
    `model.trainable_variables`' order."""
    algo = meta.maml(model, loss, inner_lr=inner_lr, inner_steps=inner_steps,
                     first_order=False, task_map=task_map)
    compiled = tf.function(lambda batch: hogrod.grad(lambda: algo.meta_loss(batch)["loss"],
                                                     model.trainable_variables))

    def meta_grad(batch):  # traced once for the reference's several calls
        return [g.numpy() for g in compiled(tuple(tf.constant(a) for a in batch))]
    return meta_grad


def hogrod_run(model, loss, dataset, inner_lr, inner_steps, task_map, steps,
               steps_per_execution=None):
    """`run()`: `steps` meta-training steps as a hogrod user takes them, `train_loop` over
    `make_train_step` (their defaults) on an iterator of `dataset`."""
    algo = meta.maml(model, loss, inner_lr=inner_lr, inner_steps=inner_steps,
                     first_order=False, task_map=task_map)
    step = train.make_train_step(algo.meta_loss, keras.optimizers.Adam(1e-3),
                                 model.trainable_variables)
    iterator = iter(distribute.distribute_dataset(tf.distribute.get_strategy(), dataset))
    extra = {} if steps_per_execution is None else {"steps_per_execution": steps_per_execution}

    def run():
        return train.train_loop(step, iterator, steps, log_every=None, **extra)["loss"]
    return run


def jax_peer(problem, weights, inner_lr, inner_steps, dtype="float32"):
    """JAX's MAML on `weights` (Keras layout and order), or None without jax and optax.

    Returns:
      `(make_run(next_batch, steps), meta_grad(batch))`: `make_run` gives a function
      taking `steps` jitted meta-steps (Adam under the same `jax.jit`) on `next_batch()`'s
      numpy meta-batches; `meta_grad` the meta-gradient as numpy arrays in Keras's order.
      In float64 the caller enables JAX's 64-bit mode (`jax_float64`).
    """
    try:
        import jax
        import jax.numpy as jnp
        import optax
    except ImportError:
        logging.warning("jax or optax not installed (pip install -e '.[bench]'): no JAX peer")
        return None

    def forward(p, x):
        if problem == "sinusoid":
            h = jax.nn.relu(x @ p[0] + p[1])
            h = jax.nn.relu(h @ p[2] + p[3])
            return h @ p[4] + p[5]
        h = x
        for i in range(4):  # conv (kernel, bias), BatchNorm (gamma, beta) in Keras's order
            kernel, bias, gamma, beta = p[4 * i:4 * i + 4]
            h = jax.lax.conv_general_dilated(h, kernel, (2, 2), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias
            mean = jnp.mean(h, (0, 1, 2))
            variance = jnp.mean(jnp.square(h - mean), (0, 1, 2))
            h = jax.nn.relu((h - mean) * jax.lax.rsqrt(variance + BN_EPSILON) * gamma + beta)
        return h.reshape(h.shape[0], -1) @ p[16] + p[17]

    def loss(p, x, y):
        out = forward(p, x)
        if problem == "sinusoid":
            return jnp.mean(jnp.square(out - y))
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, y))

    def task_loss(p, xs, ys, xq, yq):
        for _ in range(inner_steps):
            g = jax.grad(loss)(p, xs, ys)
            p = jax.tree_util.tree_map(lambda w, d: w - inner_lr * d, p, g)
        return loss(p, xq, yq)

    def meta_loss(p, xs, ys, xq, yq):
        return jnp.mean(jax.vmap(task_loss, in_axes=(None, 0, 0, 0, 0))(p, xs, ys, xq, yq))

    optimizer = optax.adam(1e-3)

    @jax.jit
    def step(p, state, xs, ys, xq, yq):
        value, grads = jax.value_and_grad(meta_loss)(p, xs, ys, xq, yq)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    grad_fn = jax.jit(jax.grad(meta_loss))

    def make_run(next_batch, steps):
        box = {"p": [jnp.asarray(w, dtype) for w in weights]}
        box["state"] = optimizer.init(box["p"])

        def run():
            for _ in range(steps):
                box["p"], box["state"], value = step(box["p"], box["state"], *next_batch())
            return float(value)  # blocks once per round
        return run

    def meta_grad(batch):
        p = [jnp.asarray(w, dtype) for w in weights]
        return [np.asarray(g) for g in grad_fn(p, *batch)]
    return make_run, meta_grad


def jax_float64(on):
    """Switch JAX's 64-bit mode (a process-wide flag) on or off; False when jax is absent."""
    try:
        import jax
    except ImportError:
        return False
    jax.config.update("jax_enable_x64", on)
    return True


def torch_peer(problem, weights, n_way, inner_lr, inner_steps, dtype="float32"):
    """torch.func's MAML on `weights` (Keras layout and order), or None without torch.

    Returns:
      `(make_run(next_batch, steps), meta_grad(batch))` as `jax_peer`'s; `next_batch()`
      gives numpy meta-batches (converted by `to_torch`, NHWC images to NCHW).
    """
    try:
        import torch
        from torch.func import functional_call, grad, vmap
    except ImportError:
        logging.warning("torch not installed (pip install -e '.[bench]'): no PyTorch peer")
        return None
    net, loss_fn = torch_maml_net(problem, n_way, IMAGE_SIZE)
    net = net.to(getattr(torch, dtype))
    params = dict(net.named_parameters())
    layouts = [torch_layout(w) for w in weights]
    if [tuple(p.shape) for p in params.values()] != [w.shape for w in layouts]:
        raise AssertionError("the torch net's parameters do not match the Keras model's: "
                             f"{[tuple(p.shape) for p in params.values()]} against "
                             f"{[w.shape for w in layouts]}")
    with torch.no_grad():  # the Keras model's weights
        for p, w in zip(params.values(), layouts):
            p.copy_(torch.from_numpy(np.ascontiguousarray(w)))

    def loss(p, x, y):
        return loss_fn(functional_call(net, p, (x,)), y)

    def task_loss(p, xs, ys, xq, yq):
        fast = p
        for _ in range(inner_steps):
            g = grad(loss)(fast, xs, ys)
            fast = {n: fast[n] - inner_lr * g[n] for n in fast}
        return loss(fast, xq, yq)

    def meta_loss(p, batch):
        return vmap(task_loss, in_dims=(None, 0, 0, 0, 0))(p, *batch).mean()

    def make_run(next_batch, steps):
        opt = torch.optim.Adam(net.parameters(), 1e-3)

        def run():
            for _ in range(steps):
                opt.zero_grad()
                total = meta_loss(params, to_torch(next_batch()))
                total.backward()
                opt.step()
            return float(total.detach())
        return run

    def meta_grad(batch):
        g = grad(meta_loss)(params, to_torch(batch))
        return [keras_layout(v.detach().numpy()) for v in g.values()]
    return make_run, meta_grad


def check_agreement(problem, n_way, inner_lr, inner_steps, task_map, loss, model, batch,
                    peers):
    """Every side's meta-gradient against hogrod's float64 one, float32 and float64.

    `model` holds the float32 weights every side starts from, `batch` the float32 numpy
    meta-batch. Returns {"grad_rel_err_<side>_<dtype>": relative difference} and the
    reference's measured condition; raises AssertionError on a disagreement."""
    weights = [v.numpy() for v in model.trainable_variables]
    model64 = keras_net(problem, n_way, "float64")
    grad64 = hogrod_meta_grad(model64, loss, inner_lr, inner_steps, task_map)
    n = len(weights)

    def fn64(inputs):  # hogrod's float64 meta-gradient at these weights and batch
        for v, w in zip(model64.trainable_variables, inputs[:n]):
            v.assign(w)
        return grad64(tuple(inputs[n:]))

    ref = Reference(fn64, weights + list(batch))
    out = {"grad_condition": ref.condition}
    grad32 = hogrod_meta_grad(model, loss, inner_lr, inner_steps, task_map)
    sides = {"hogrod": grad32(batch)}
    for name in peers:
        side = make_peer(name, problem, weights, n_way, inner_lr, inner_steps, "float32")
        if side is not None:
            sides[name] = side[1](batch)
    out.update({f"grad_rel_err_{k}_float32": v for k, v in
                ref.check(sides, "float32", "meta-gradient").items()})
    batch64 = tuple(a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a
                    for a in batch)
    weights64 = [w.astype(np.float64) for w in weights]
    sides = {}
    for name in peers:
        if name == "jax" and not jax_float64(True):
            continue
        try:
            side = make_peer(name, problem, weights64, n_way, inner_lr, inner_steps,
                             "float64")
            if side is not None:
                sides[name] = side[1](batch64)
        finally:
            if name == "jax":
                jax_float64(False)
    out.update({f"grad_rel_err_{k}_float64": v for k, v in
                ref.check(sides, "float64", "meta-gradient").items()})
    return out


def make_peer(name, problem, weights, n_way, inner_lr, inner_steps, dtype):
    """`jax_peer` or `torch_peer` by name."""
    if name == "jax":
        return jax_peer(problem, weights, inner_lr, inner_steps, dtype)
    return torch_peer(problem, weights, n_way, inner_lr, inner_steps, dtype)


@gin.configurable
def bench_maml(output_dir, problem="sinusoid", meta_batch=25, k=10, queries=None, n_way=5,
               inner_lr=0.01, inner_steps=1, task_map="vectorized",
               peers: tuple[str, ...] = PEERS, rounds=20, steps_per_round=25, warmup=1,
               runs: harness.PositiveInt = 1, check_tasks=None, torch_threads=None,
               steps_per_execution=None):
    """Steps/s of hogrod and its peers, medians over interleaved rounds; the metrics.

    Args:
      output_dir: the run's directory (unused: nothing is saved but the metrics).
      problem: 'sinusoid' or 'omniglot' (see the module docstring).
      meta_batch: tasks per meta-batch.
      k: support examples per task (sinusoid) or per class (omniglot).
      queries: query examples per task (sinusoid) or per class (omniglot); None: k.
      n_way: omniglot's classes per task (the net's outputs).
      inner_lr: the inner step's rate.
      inner_steps: inner steps per task.
      task_map: hogrod's `maml` task_map: 'vectorized', 'sequential' or 'recomputed'.
      peers: the peers timed, of `PEERS` ('jax', 'torch_func'); one not installed is
        skipped.
      rounds: interleaved timing rounds per run.
      steps_per_round: steps per candidate per round.
      warmup: untimed rounds of steps of each first.
      runs: timing runs in a row (each `rounds` rounds); with more than one the metrics
        also hold each run's ratios (`*_runs`).
      check_tasks: the agreement check's tasks (its float64 reference, every side in
        float32 and float64); None: meta_batch.
      torch_threads: torch's intra-op threads (`torch.set_num_threads`); None: torch's
        default.
      steps_per_execution: given to `train.train_loop` when set; None: its default.

    Returns:
      The metrics: steps/s, ratios, agreement (relative differences from the float64
      reference and its condition), versions and settings; a skipped peer's are None.
    """
    del output_dir
    where = "bench_maml"
    checks.choice(problem, PROBLEMS, "problem", where)
    check_task_map(task_map, where)
    for name in peers:
        checks.choice(name, PEERS, "peers", where)
    queries = k if queries is None else queries
    check_tasks = meta_batch if check_tasks is None else check_tasks
    loss = mse if problem == "sinusoid" else cross_entropy
    if torch_threads is not None and "torch_func" in peers:
        try:
            import torch
            torch.set_num_threads(torch_threads)
        except ImportError:
            pass

    model = keras_net(problem, n_way)
    if problem == "sinusoid":
        check_batch = sinusoid_batches(1, check_tasks, k, queries)()
        next_batch = sinusoid_batches(0, meta_batch, k, queries)
        dataset = meta.sinusoid_meta_batches(0, meta_batch, k, queries)
    else:  # the same few meta-batches for every side
        check_batch = omniglot_batches(1, 1, check_tasks, n_way, k, queries)[0]
        drawn = omniglot_batches(0, 4, meta_batch, n_way, k, queries)
        next_batch = itertools.cycle(drawn).__next__
        dataset = tf.data.Dataset.from_tensor_slices(
            tuple(np.stack(field) for field in zip(*drawn))).repeat()
    metrics = {f"{kind}_{name}": None for name in peers for kind in (
        "steps_per_s", "ratio_hogrod_over", "grad_rel_err")}
    metrics.update(check_agreement(problem, n_way, inner_lr, inner_steps, task_map, loss,
                                   model, check_batch, peers))
    weights = [v.numpy() for v in model.trainable_variables]
    candidates = {"hogrod": hogrod_run(model, loss, dataset, inner_lr, inner_steps, task_map,
                                       steps_per_round, steps_per_execution)}
    for name in peers:
        side = make_peer(name, problem, weights, n_way, inner_lr, inner_steps, "float32")
        if side is not None:
            candidates[name] = side[0](next_batch, steps_per_round)
    per_run = []
    for _ in range(runs):
        rates = interleaved_rates(candidates, rounds, 1, warmup if not per_run else 0)
        per_run.append({n: r * steps_per_round for n, r in rates.items()})
    rates = {n: float(np.median([r[n] for r in per_run])) for n in candidates}
    metrics.update({f"steps_per_s_{n}": r for n, r in rates.items()})
    for name in candidates:
        if name != "hogrod":
            metrics[f"grad_rel_err_{name}"] = metrics[f"grad_rel_err_{name}_float32"]
            metrics[f"ratio_hogrod_over_{name}"] = rates["hogrod"] / rates[name]
            if runs > 1:
                metrics[f"ratio_hogrod_over_{name}_runs"] = [
                    r["hogrod"] / r[name] for r in per_run]
    if "torch_func" in candidates:
        import torch
        metrics["torch_threads"] = torch.get_num_threads()
    modules = {"jax": ("jax", "optax"), "torch_func": ("torch",)}
    metrics.update(versions(*[m for name in peers for m in modules[name]]), problem=problem,
                   task_map=task_map, meta_batch=meta_batch, k=k, queries=queries,
                   inner_steps=inner_steps, runs=runs, steps_per_execution=steps_per_execution)
    if problem == "omniglot":
        metrics["n_way"] = n_way
    for name, value in sorted(metrics.items()):
        print(f"{name:35s} {value}")
    return metrics


def main():
    """`python -m experiments.bench.maml` (see the module docstring)."""
    harness.main(bench_maml)


if __name__ == "__main__":
    main()
