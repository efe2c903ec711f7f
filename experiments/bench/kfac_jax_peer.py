"""kfac-jax's K-FAC step on the deep autoencoder, the peer of `experiments/bench/kfac.py`.

Runs in kfac-jax's own environment (kfac-jax 0.0.8 needs jax 0.9.0, hogrod's bench extra
has a newer jax): `experiments/bench/kfac.py` writes the weights and the batch to an npz,
calls this script with that environment's python, and reads back what it writes:

    python kfac_jax_peer.py IN.npz OUT_DIR --lr 0.1 --damping 0.01 --agree_lr 1e-4 \
        --agree_damping 1e-5 --code 3 --rounds 20

OUT_DIR/update.npz: the weights after one step (`fisher_empirical`, fixed damping
`agree_damping` and rate `agree_lr`, no momentum, adaptive rate/momentum/damping off, as
the hogrod step it is checked against); OUT_DIR/times.json: the seconds of each timed step with one Monte Carlo label
(`fisher_gradients`) with the inverses updated every step and never after the first.
Imports jax and kfac_jax only (never hogrod or TensorFlow).
"""

import argparse
import json
import os
import time

import numpy as np


def forward(params, x, code):
    """tanh after every layer but the code layer `code` and the output layer."""
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i not in (code, len(params) - 1):
            h = jnp.tanh(h)
    return h


def make_loss(code, width):
    def loss(params, batch):
        logits = forward(params, batch, code)
        # Keras's BinaryCrossentropy(from_logits=True): the mean over outputs and examples
        kfac_jax.register_sigmoid_cross_entropy_loss(logits, batch, weight=1.0 / width)
        per_output = jax.nn.softplus(logits) - batch * logits
        return jnp.mean(jnp.sum(per_output, axis=1)) / width
    return loss


def optimizer(loss, mode, period, ema):
    return kfac_jax.Optimizer(
        value_and_grad_func=jax.value_and_grad(loss), l2_reg=0.0,
        use_adaptive_learning_rate=False, use_adaptive_momentum=False,
        use_adaptive_damping=False, estimation_mode=mode, curvature_ema=ema,
        inverse_update_period=period, num_burnin_steps=0, multi_device=False)


def run(params, opt, x, rng, steps, lr, damping, first=0):
    params = jax.tree_util.tree_map(lambda t: jnp.array(t, copy=True), params)  # donated
    state = opt.init(params, rng, x)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        params, state, _ = opt.step(params, state, rng, batch=x, learning_rate=jnp.asarray(lr),
                                    momentum=jnp.asarray(0.0), damping=jnp.asarray(damping),
                                    global_step_int=first + i)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
    return params, times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("inputs")
    parser.add_argument("out_dir")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--damping", type=float, required=True)
    parser.add_argument("--agree_lr", type=float, required=True)
    parser.add_argument("--agree_damping", type=float, required=True)
    parser.add_argument("--decay", type=float, default=0.95)
    parser.add_argument("--code", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    data = np.load(args.inputs)
    n = len([k for k in data.files if k.startswith("w")])
    params = [(jnp.asarray(data[f"w{i}"]), jnp.asarray(data[f"b{i}"])) for i in range(n)]
    x = jnp.asarray(data["x"])
    loss = make_loss(args.code, x.shape[1])
    rng = jax.random.PRNGKey(0)
    new, _ = run(params, optimizer(loss, "fisher_empirical", 1, args.decay), x, rng, 1,
                 args.agree_lr, args.agree_damping)
    np.savez(os.path.join(args.out_dir, "update.npz"),
             **{f"{k}{i}": np.asarray(t) for i, p in enumerate(new) for k, t in zip("wb", p)})
    times = {}
    if args.rounds:
        for name, period in (("with_inverse", 1), ("without_inverse", 10 ** 9)):
            opt = optimizer(loss, "fisher_gradients", period, args.decay)
            _, t = run(params, opt, x, rng, args.warmup + args.rounds, args.lr, args.damping)
            times[name] = t[args.warmup:]
    with open(os.path.join(args.out_dir, "times.json"), "w") as f:
        json.dump({"seconds": times, "jax": jax.__version__,
                   "kfac_jax": getattr(kfac_jax, "__version__", "?")}, f)


if __name__ == "__main__":
    # imported only when run, in kfac-jax's own environment: the suite imports every
    # experiments module to register its gin configurables, where jax is absent
    import jax
    import jax.numpy as jnp
    import kfac_jax
    main()
