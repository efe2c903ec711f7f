"""Benchmark: MAML meta-training steps/s, hogrod against torch.func, on two problems.

`problem='sinusoid'` (the default): Finn et al.'s regression protocol, the 1-40-40-1 ReLU
net, 25 tasks of K = 10 support and 10 query points, one inner step at 0.01, mean squared
error. `problem='omniglot'`: MAML's Omniglot 5-way 1-shot meta-step, `hogrod.models.conv4`
(4 x [3x3 convolution of stride 2, 'same' padding, BatchNorm, ReLU], flatten, Dense 5) on
28x28 images, 15 queries per class, 32 tasks, one inner step at 0.4, cross-entropy;
BatchNorm on each batch's statistics (MAML's transductive setting), the tasks mapped with
`tf.map_fn` (`task_map='sequential'`) as the Omniglot configs bind it. Its images are random
(the benchmark measures speed; no data set is read): a few meta-batches drawn once, cycled.

Both are second-order MAML with Adam 1e-3. hogrod: `hogrod.meta.maml` +
`hogrod.train.make_train_step` (one compiled step, the tasks mapped as `task_map` says, the
loss and its gradient compiled by XLA with `jit_compile`). PyTorch (the `bench` extra):
`torch.func.grad` for the inner step, `torch.func.vmap` over tasks, `functional_call` for
the forward pass, the recipe of the torch.func MAML tutorial. Its conv4 is NCHW, pads as
TensorFlow's 'same' does (a stride-2 3x3 window on an even side: nothing before, one row or
column after; torch's padding=1 would shift every window), flattens in Keras's NHWC order
and normalizes on the batch's statistics with a small BatchNorm of its own, differentiated
exactly to second order as hogrod differentiates Keras's (`hogrod/functional.py`;
`F.batch_norm` under `vmap` gives a wrong double backward). Both timed in the same run,
interleaved in rounds:

    python -m experiments.bench.maml --gin_file=experiments/bench/configs/maml.gin
    python -m experiments.bench.maml --gin_file=experiments/bench/configs/maml_omniglot.gin

Before timing, both start from the same weights and take the meta-gradient of the same
meta-batch; the binary reports their relative difference and stops if it exceeds
`TOLERANCES` (float32: 1e-4 on the sinusoid, 1e-3 on Omniglot, whose second-order terms
through BatchNorm amplify rounding; with `check_float64`, 1e-9 in float64 on a few tasks), so
the two steps compared are the same computation. Without torch the PyTorch side is skipped
(logged) and its metrics are None. On a machine other jobs load, torch's default threads
wait on descheduled ones at every op's barrier (the conv4 step several times slower):
`torch_threads = 1` avoids it.

Targets: hogrod >= 2x PyTorch's steps/s on the sinusoid, >= 1.5x on Omniglot's conv4.
"""

import itertools

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.peers import relative_error
from experiments.bench.timing import interleaved_rates
from hogrod.models import conv4, cross_entropy, mlp, mse
import hogrod
from hogrod import checks, harness, meta, train
from hogrod.taskmap import check_task_map

PROBLEMS = ("sinusoid", "omniglot")
# The largest relative difference of the meta-gradients accepted: in float32 by problem,
# the two frameworks' kernels summing in different orders. On Omniglot the second-order
# terms through four BatchNorms on batch statistics (5 support images, 2x2 maps at the
# last) amplify rounding: over 32 tasks each side's float32 meta-gradient is 0.6-1.2e-4
# from the float64 one. A wrong layout, padding or term is off by 1e-3 to 1.
TOLERANCES = {"sinusoid": 1e-4, "omniglot": 1e-3, "float64": 1e-9}
IMAGE_SIZE = 28


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


def hogrod_step(model, loss, batches, inner_lr, inner_steps, task_map, jit_compile):
    """(run one timed step on the next of `batches`, meta-gradient of a batch as numpy
    arrays in model order)."""
    algo = meta.maml(model, loss, inner_lr=inner_lr, inner_steps=inner_steps,
                     first_order=False, task_map=task_map)
    step = train.make_train_step(algo.meta_loss, keras.optimizers.Adam(1e-3),
                                 model.trainable_variables, jit_compile=jit_compile)

    def run():
        return float(step(next(batches))["loss"])

    def meta_grad(batch):
        return [g.numpy() for g in hogrod.grad(lambda: algo.meta_loss(batch)["loss"],
                                               model.trainable_variables)]
    return run, meta_grad


def torch_net(problem, n_way):
    """(torch module, loss(outputs, targets)): the Keras model's computation, its
    parameters in `model.trainable_variables`' order."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    if problem == "sinusoid":
        return (nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(),
                              nn.Linear(40, 1)),
                lambda out, y: torch.mean((out - y) ** 2))

    class SamePad(nn.Module):
        """TensorFlow's 'same' padding of a 3x3 window of stride 2: the total padding
        (2 (ceil(n / 2) - 1) + 3 - n) split with the smaller half before."""

        def forward(self, x):
            pads = []
            for n in (x.shape[-1], x.shape[-2]):  # F.pad: (left, right, top, bottom)
                total = max(2 * ((n + 1) // 2 - 1) + 3 - n, 0)
                pads += [total // 2, total - total // 2]
            return F.pad(x, pads)

    class BatchNorm(nn.Module):
        """Keras's BatchNormalization in training mode: the batch's mean and (biased)
        variance, epsilon 1e-3, differentiated exactly to every order (`F.batch_norm`'s
        double backward under `vmap` is wrong)."""

        def __init__(self, channels):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(channels))
            self.bias = nn.Parameter(torch.zeros(channels))

        def forward(self, x):
            mean = x.mean((0, 2, 3), keepdim=True)
            variance = ((x - mean) ** 2).mean((0, 2, 3), keepdim=True)
            scale = torch.rsqrt(variance + 1e-3) * self.weight[:, None, None]
            return (x - mean) * scale + self.bias[:, None, None]

    class FlattenNHWC(nn.Module):
        """Keras's Flatten of an NHWC tensor: rows, then columns, then channels."""

        def forward(self, x):
            return x.permute(0, 2, 3, 1).flatten(1)

    layers, channels, side = [], 1, IMAGE_SIZE
    for _ in range(4):
        layers += [SamePad(), nn.Conv2d(channels, 64, 3, stride=2), BatchNorm(64), nn.ReLU()]
        channels, side = 64, (side + 1) // 2
    layers += [FlattenNHWC(), nn.Linear(64 * side * side, n_way)]
    return nn.Sequential(*layers), F.cross_entropy


def torch_layout(w):
    """A Keras weight as torch holds it: kernels [in, out] -> [out, in], [h, w, in, out]
    -> [out, in, h, w]."""
    return w.T if w.ndim == 2 else w.transpose(3, 2, 0, 1) if w.ndim == 4 else w


def keras_layout(w):
    """`torch_layout`'s inverse."""
    return w.T if w.ndim == 2 else w.transpose(2, 3, 1, 0) if w.ndim == 4 else w


def to_torch(batch):
    """A numpy or TensorFlow meta-batch as torch tensors: images NHWC -> NCHW, integer
    labels int64 (torch's cross-entropy takes no other)."""
    import torch
    out = []
    for a in batch:
        a = np.asarray(a)
        if a.ndim == 5:  # [tasks, examples, h, w, c]
            a = a.transpose(0, 1, 4, 2, 3)
        if np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int64)
        out.append(torch.from_numpy(np.ascontiguousarray(a)))
    return out


def torch_step(problem, model, n_way, next_batch, inner_lr, inner_steps, dtype="float32"):
    """(run one timed step, meta-gradient of a batch in Keras layout), or None without
    torch. `next_batch()` gives the timed step's meta-batch as torch tensors."""
    try:
        import torch
        from torch.func import functional_call, grad, vmap
    except ImportError:
        logging.warning("torch not installed (pip install -e '.[bench]'): no PyTorch baseline")
        return None
    net, loss_fn = torch_net(problem, n_way)
    net = net.to(getattr(torch, dtype))
    params = dict(net.named_parameters())
    weights = [torch_layout(v.numpy()) for v in model.trainable_variables]
    if [tuple(p.shape) for p in params.values()] != [w.shape for w in weights]:
        raise AssertionError("the torch net's parameters do not match the Keras model's: "
                             f"{[tuple(p.shape) for p in params.values()]} against "
                             f"{[w.shape for w in weights]}")
    with torch.no_grad():  # the Keras model's weights
        for p, w in zip(params.values(), weights):
            p.copy_(torch.from_numpy(np.ascontiguousarray(w)))
    opt = torch.optim.Adam(net.parameters(), 1e-3)

    def loss(p, x, y):
        return loss_fn(functional_call(net, p, (x,)), y)

    def task_loss(p, xs, ys, xq, yq):
        fast = p
        for _ in range(inner_steps):
            g = grad(loss)(fast, xs, ys)
            fast = {n: fast[n] - inner_lr * g[n] for n in fast}
        return loss(fast, xq, yq)

    def run():
        opt.zero_grad()
        losses = vmap(task_loss, in_dims=(None, 0, 0, 0, 0))(params, *next_batch())
        total = losses.mean()
        total.backward()
        opt.step()
        return float(total.detach())

    def meta_grad(batch):
        t = to_torch(batch)
        g = grad(lambda p: vmap(task_loss, in_dims=(None, 0, 0, 0, 0))(p, *t).mean())(params)
        return [keras_layout(v.detach().numpy()) for v in g.values()]
    return run, meta_grad


def sinusoid_torch_batches(meta_batch, k, queries):
    """`next_batch()` for the torch step: a fresh sinusoid meta-batch from numpy."""
    import torch
    rng = np.random.default_rng(0)

    def next_batch():
        amp = rng.uniform(0.1, 5, (meta_batch, 1, 1))
        ph = rng.uniform(0, np.pi, (meta_batch, 1, 1))
        xs = rng.uniform(-5, 5, (meta_batch, k, 1))
        xq = rng.uniform(-5, 5, (meta_batch, queries, 1))
        return [torch.tensor(a, dtype=torch.float32) for a in
                (xs, amp * np.sin(xs - ph), xq, amp * np.sin(xq - ph))]
    return next_batch


@gin.configurable
def bench_maml(output_dir, problem="sinusoid", meta_batch=25, k=10, queries=None, n_way=5,
               inner_lr=0.01, inner_steps=1, task_map="vectorized", jit_compile=False,
               rounds=20, steps_per_round=25, warmup=20, torch_threads=None,
               check_float64=False, float64_tasks=2):
    """Steps/s of both, medians over interleaved rounds; returns the metrics.

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
      jit_compile: `make_train_step`'s (XLA for the loss and its gradient).
      rounds: interleaved timing rounds.
      steps_per_round: steps per candidate per round.
      warmup: untimed steps of each first.
      torch_threads: torch's intra-op threads (`torch.set_num_threads`); None: torch's
        default.
      check_float64: also compare the meta-gradients in float64 first (with torch), on
        `float64_tasks` tasks.
      float64_tasks: the float64 comparison's tasks.

    Returns:
      The metrics: rates, the ratio and the agreement's relative errors (None without
      torch), the settings.
    """
    del output_dir
    where = "bench_maml"
    checks.choice(problem, PROBLEMS, "problem", where)
    check_task_map(task_map, where)
    queries = k if queries is None else queries
    metrics = {"grad_rel_err_torch_func": None, "grad_rel_err_torch_func_float64": None,
               "steps_per_s_torch_func": None, "ratio_hogrod_over_torch_func": None,
               "torch": None, "torch_threads": None}
    loss = mse if problem == "sinusoid" else cross_entropy
    try:
        import torch
    except ImportError:
        torch = None  # torch_step logs it
    if torch is not None and torch_threads is not None:
        torch.set_num_threads(torch_threads)

    def sample(seed, tasks, dtype):  # one numpy meta-batch
        if problem == "omniglot":
            return omniglot_batches(seed, 1, tasks, n_way, k, queries, dtype)[0]
        batch = next(iter(meta.sinusoid_meta_batches(seed, tasks, k, queries)))
        return tuple(np.asarray(a, dtype) for a in batch)

    # float64 on a few tasks: TensorFlow's float64 convolutions are slow
    if check_float64 and torch is not None:
        model = keras_net(problem, n_way, "float64")
        _, ref = hogrod_step(model, loss, None, inner_lr, inner_steps, task_map, False)
        peer = torch_step(problem, model, n_way, None, inner_lr, inner_steps, "float64")
        if peer is not None:
            batch = sample(1, float64_tasks, "float64")
            metrics["grad_rel_err_torch_func_float64"] = relative_error(
                ref(batch), peer[1](batch), TOLERANCES["float64"], "meta-gradient (float64)")

    model = keras_net(problem, n_way)
    if problem == "sinusoid":
        batches = iter(meta.sinusoid_meta_batches(0, meta_batch, k, queries))
        torch_batches = None if torch is None else sinusoid_torch_batches(meta_batch, k,
                                                                          queries)
    else:  # the same few meta-batches for both, converted once
        drawn = omniglot_batches(0, 4, meta_batch, n_way, k, queries)
        batches = itertools.cycle([tuple(tf.constant(a) for a in b) for b in drawn])
        torch_drawn = None if torch is None else itertools.cycle([to_torch(b) for b in drawn])
        torch_batches = lambda: next(torch_drawn)  # noqa: E731
    hogrod_run, hogrod_grad = hogrod_step(model, loss, batches, inner_lr, inner_steps,
                                          task_map, jit_compile)
    runs = {"hogrod": hogrod_run}
    t = torch_step(problem, model, n_way, torch_batches, inner_lr, inner_steps)
    if t is not None:  # agreement before speed, from the same weights
        batch = sample(1, meta_batch, "float32")
        metrics["grad_rel_err_torch_func"] = relative_error(
            hogrod_grad(batch), t[1](batch), TOLERANCES[problem], "meta-gradient")
        runs["torch_func"] = t[0]
    rates = interleaved_rates(runs, rounds, steps_per_round, warmup)
    metrics.update({f"steps_per_s_{n}": r for n, r in rates.items()})
    if t is not None:
        metrics.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                       ratio_hogrod_over_torch_func=rates["hogrod"] / rates["torch_func"])
    metrics.update(tensorflow=tf.__version__, problem=problem, task_map=task_map,
                   jit_compile=jit_compile, meta_batch=meta_batch, k=k, queries=queries,
                   inner_steps=inner_steps)
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
