"""Benchmark: meta-training steps/s of the sinusoid protocol, hogrod against torch.func.

The same net (1-40-40-1 ReLU), meta-batch (25 tasks, K = 10), one inner step at 0.01,
second-order MAML, Adam 1e-3. hogrod: `hogrod.meta.maml` + `hogrod.train.make_train_step`
(one compiled step, tasks vectorized). PyTorch (the `bench` extra): `torch.func.grad` for the
inner step, `torch.func.vmap` over tasks, `functional_call` for the forward pass, the
recipe of the torch.func MAML tutorial. Both timed in the same run, interleaved in rounds:

    python -m experiments.bench.maml --gin_file=experiments/bench/configs/maml.gin

Before timing, both start from the same weights and take the meta-gradient of the same
meta-batch; the binary reports their relative difference and stops if it exceeds 1e-4, so
the two steps compared are the same computation.

Target: hogrod >= 2x PyTorch's steps/s.
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.timing import interleaved_rates
from hogrod.models import mlp, mse
import hogrod
from hogrod import harness, meta, train


def keras_net():
    keras.utils.set_random_seed(0)
    # every argument given: a gin binding of the MAML configs' `mlp` cannot change it
    return mlp(input_dim=1, widths=(40, 40), outputs=1, activation="relu", init_stddev=None)


def hogrod_step(model, meta_batch, k, inner_lr, inner_steps):
    """(run one timed step, meta-gradient of a batch as numpy arrays in model order)."""
    algo = meta.maml(model, mse, inner_lr=inner_lr, inner_steps=inner_steps)
    step = train.make_train_step(algo.meta_loss, keras.optimizers.Adam(1e-3),
                                 model.trainable_variables)
    it = iter(meta.sinusoid_meta_batches(0, meta_batch, k, k))

    def run():
        return float(step(next(it))["loss"])

    def meta_grad(batch):
        return [g.numpy() for g in hogrod.grad(lambda: algo.meta_loss(batch)["loss"],
                                               model.trainable_variables)]
    return run, meta_grad


def torch_step(model, meta_batch, k, inner_lr, inner_steps):
    try:
        import torch
        from torch.func import functional_call, grad, vmap
    except ImportError:
        logging.warning("torch not installed (pip install -e '.[bench]'): no PyTorch baseline")
        return None
    net = torch.nn.Sequential(torch.nn.Linear(1, 40), torch.nn.ReLU(), torch.nn.Linear(40, 40),
                              torch.nn.ReLU(), torch.nn.Linear(40, 1))
    params = dict(net.named_parameters())
    with torch.no_grad():  # the Keras model's weights (kernels are [in, out], torch's [out, in])
        for p, w in zip(params.values(), model.get_weights()):
            p.copy_(torch.tensor(w.T if w.ndim == 2 else w))
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    rng = np.random.default_rng(0)

    def loss(p, x, y):
        return torch.mean((functional_call(net, p, (x,)) - y) ** 2)

    def task_loss(p, xs, ys, xq, yq):
        fast = p
        for _ in range(inner_steps):
            g = grad(loss)(fast, xs, ys)
            fast = {n: fast[n] - inner_lr * g[n] for n in fast}
        return loss(fast, xq, yq)

    def run():
        amp = rng.uniform(0.1, 5, (meta_batch, 1, 1))
        ph = rng.uniform(0, np.pi, (meta_batch, 1, 1))
        xs = rng.uniform(-5, 5, (meta_batch, k, 1))
        xq = rng.uniform(-5, 5, (meta_batch, k, 1))
        t = [torch.tensor(a, dtype=torch.float32) for a in
             (xs, amp * np.sin(xs - ph), xq, amp * np.sin(xq - ph))]
        opt.zero_grad()
        losses = vmap(task_loss, in_dims=(None, 0, 0, 0, 0))(params, *t)
        total = losses.mean()
        total.backward()
        opt.step()
        return float(total.detach())

    def meta_grad(batch):
        t = [torch.tensor(np.asarray(a)) for a in batch]
        g = grad(lambda p: vmap(task_loss, in_dims=(None, 0, 0, 0, 0))(p, *t).mean())(params)
        return [v.detach().numpy().T if v.ndim == 2 else v.detach().numpy() for v in g.values()]
    return run, meta_grad


@gin.configurable
def bench_maml(output_dir, meta_batch=25, k=10, inner_lr=0.01, inner_steps=1, rounds=20,
               steps_per_round=25, warmup=20):
    """Steps/s of both, medians over interleaved rounds; returns the ratio."""
    model = keras_net()
    hogrod_run, hogrod_grad = hogrod_step(model, meta_batch, k, inner_lr, inner_steps)
    runs, metrics = {"hogrod": hogrod_run}, {}
    t = torch_step(model, meta_batch, k, inner_lr, inner_steps)
    if t is not None:  # agreement before speed, from the same weights
        batch = next(iter(meta.sinusoid_meta_batches(1, meta_batch, k, k)))
        ref = np.concatenate([g.ravel() for g in hogrod_grad(batch)])
        got = np.concatenate([g.ravel() for g in t[1](batch)])
        err = metrics["grad_rel_err_torch_func"] = float(
            np.linalg.norm(got - ref) / np.linalg.norm(ref))
        if err > 1e-4:
            raise AssertionError(f"torch.func's meta-gradient disagrees with hogrod's: rel err "
                                 f"{err:.2e}")
        runs["torch_func"] = t[0]
    rates = interleaved_rates(runs, rounds, steps_per_round, warmup)
    metrics.update({f"steps_per_s_{n}": r for n, r in rates.items()})
    if "torch_func" in runs:
        metrics["ratio_hogrod_over_torch_func"] = (metrics["steps_per_s_hogrod"]
                                                   / metrics["steps_per_s_torch_func"])
        import torch
        metrics["torch"] = torch.__version__
    metrics.update(tensorflow=tf.__version__, meta_batch=meta_batch, k=k,
                   inner_steps=inner_steps)
    for name, value in sorted(metrics.items()):
        print(f"{name:35s} {value}")
    return metrics


def main():
    """`python -m experiments.bench.maml` (see the module docstring)."""
    harness.main(bench_maml)


if __name__ == "__main__":
    main()
