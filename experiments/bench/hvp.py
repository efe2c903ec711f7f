"""Benchmark: gradient vs Hessian-vector products (each mode), and JAX's HVP, same weights.

The reference problem: an MLP 64-256-256-10 with tanh, softmax
cross-entropy, batch 256, float32. Every candidate is compiled (tf.function, optionally
with XLA; jax.jit), warmed up, then timed in interleaved rounds (one call of each per
round, so machine noise hits all alike); the medians and their ratios are reported:

    python -m experiments.bench.hvp --gin_file=experiments/bench/configs/hvp.gin

Candidates: the gradient; `hogrod.hvp` in each mode, called through its tf.function and
through the traced concrete function (`_concrete`: no per-call signature matching); and
`hvp_default`, `hogrod.hvp` as a user calls it (its default mode) in a tf.function. Targets:
hogrod's HVP <= 2.0x its own gradient, and <= 1.0x JAX's `jit(jvp(grad))` HVP
(`ratio_jax_hvp_over_hvp_default`: JAX's time over hogrod's default; JAX comes with the
`bench` extra; without it the JAX rows are left out).

Agreement before speed: every HVP (each mode, with and without XLA, JAX's) against the
float64 HVP on the same float32 weights, batch and vector, within float32's rounding of
that computation (`experiments.bench.peers.Reference`).
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

import hogrod
from experiments.bench.peers import Reference, versions
from experiments.bench.timing import interleaved_rates
from hogrod.models import cross_entropy, dense_net
from hogrod import harness


def reference_problem(widths, batch, seed):
    keras.utils.set_random_seed(seed)
    model = dense_net(widths, "tanh")
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, widths[0])), tf.float32)
    y = tf.constant(rng.integers(0, widths[-1], size=batch), tf.int32)
    vector = [tf.constant(rng.normal(size=v.shape), tf.float32) for v in model.trainable_variables]
    return model, x, y, vector


def tf_candidates(model, x, y, vector, jit_compile):
    params = model.trainable_variables

    def loss():
        return cross_entropy(y, model(x))

    def hvp_fn(mode):
        return tf.function(lambda v: hogrod.hvp(loss, params, v, mode=mode),
                           jit_compile=jit_compile)

    grad = tf.function(lambda: hogrod.grad(loss, params), jit_compile=jit_compile)
    default = tf.function(lambda v: hogrod.hvp(loss, params, v), jit_compile=jit_compile)
    out = {"grad": lambda: grad(), "hvp_default": lambda: default(vector)}  # a user's call
    # many products of one function: `hvp_operator`, traced once, called directly
    operator = hogrod.hvp_operator(loss, params, jit_compile=jit_compile)
    out["hvp_operator"] = lambda: operator(vector)
    for mode in hogrod.autodiff.HVP_MODES:
        fn = hvp_fn(mode)
        out[f"hvp_{mode}"] = lambda fn=fn: fn(vector)
        # The traced graph called directly: no per-call signature matching of the 6-tensor
        # argument, which a polymorphic tf.function pays on every call (timed separately so
        # that cost shows; experiments/RESULTS.md, "Primitives").
        concrete = fn.get_concrete_function(vector)
        out[f"hvp_{mode}_concrete"] = lambda c=concrete: c(vector)
    suffix = "_xla" if jit_compile else ""
    return {k + suffix: (lambda f=f: [t.numpy() for t in tf.nest.flatten(f())]) for k, f in
            out.items()}


def jax_candidates(model, x, y, vector):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        logging.warning("jax not installed (pip install -e '.[bench]'): skipping the JAX baseline")
        return {}
    params = [jnp.asarray(v.numpy()) for v in model.trainable_variables]
    xs, ys = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    vec = [jnp.asarray(v.numpy()) for v in vector]

    def loss(ps):
        h = xs
        for i in range(0, len(ps) - 2, 2):
            h = jnp.tanh(h @ ps[i] + ps[i + 1])
        logits = h @ ps[-2] + ps[-1]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, ys[:, None], axis=1))

    grad = jax.jit(jax.grad(loss))
    hvp = jax.jit(lambda ps, v: jax.jvp(jax.grad(loss), (ps,), (v,))[1])
    block = lambda t: [np.asarray(a) for a in jax.block_until_ready(t)]  # noqa: E731
    return {"jax_grad": lambda: block(grad(params)), "jax_hvp": lambda: block(hvp(params, vec))}


def float64_hvp(widths):
    """`fn64(inputs)`: the reference problem's HVP in float64 (`hogrod.hvp`'s default mode)
    at inputs = weights (model order), x, y, vector; numpy arrays in the weights' order."""
    model = dense_net(widths, "tanh", dtype="float64")

    def fn64(inputs):
        n = len(model.trainable_variables)
        for v, w in zip(model.trainable_variables, inputs[:n]):
            v.assign(w)
        x, y = inputs[n], inputs[n + 1]
        vector = [tf.constant(a) for a in inputs[n + 2:]]
        return [h.numpy() for h in hogrod.hvp(lambda: cross_entropy(y, model(x)),
                                              model.trainable_variables, vector)]
    return fn64


@gin.configurable
def bench_hvp(output_dir, widths: tuple[harness.PositiveInt, ...] = (64, 256, 256, 10),
              batch: harness.PositiveInt = 256, repeats: harness.PositiveInt = 100,
              warmup: harness.Count = 10, xla: bool = True, seed: harness.Count = 0):
    """Time gradient and HVPs; return medians (ms) and the target ratios."""
    model, x, y, vector = reference_problem(tuple(widths), batch, seed)
    candidates = tf_candidates(model, x, y, vector, jit_compile=False)
    if xla:
        candidates.update(tf_candidates(model, x, y, vector, jit_compile=True))
    candidates.update(jax_candidates(model, x, y, vector))
    # Agreement before speed: every HVP against the float64 one on the same inputs.
    ref = Reference(float64_hvp(tuple(widths)), [v.numpy() for v in model.trainable_variables]
                    + [x.numpy(), y.numpy()] + [v.numpy() for v in vector])
    errors = ref.check({k: fn() for k, fn in candidates.items() if "hvp" in k}, "float32",
                       "HVP")
    med = {k: 1.0 / r for k, r in interleaved_rates(candidates, repeats, 1, warmup).items()}
    metrics = {f"ms_{k}": 1e3 * v for k, v in med.items()}
    metrics.update({f"rel_err_{k}": v for k, v in errors.items()}, condition=ref.condition)
    for suffix in ("", "_xla") if xla else ("",):
        for mode in [m + c for m in hogrod.autodiff.HVP_MODES for c in ("", "_concrete")]:
            hv = med[f"hvp_{mode}{suffix}"]
            metrics[f"ratio_hvp_{mode}{suffix}_over_grad{suffix}"] = hv / med[f"grad{suffix}"]
            if "jax_hvp" in med:
                metrics[f"ratio_hvp_{mode}{suffix}_over_jax_hvp"] = hv / med["jax_hvp"]
    for suffix in ("", "_xla") if xla else ("",):
        if "jax_hvp" in med:  # peer time over hogrod's: how many times faster hogrod is
            metrics[f"ratio_jax_hvp_over_hvp_default{suffix}"] = (
                med["jax_hvp"] / med[f"hvp_default{suffix}"])
    metrics.update(versions("jax"), device=tf.config.list_logical_devices()[-1].device_type,
                   widths=list(widths), batch=batch, repeats=repeats)
    for k in sorted(metrics):
        logging.info("%-55s %s", k, metrics[k])
        print(f"{k:55s} {metrics[k]:.4g}" if isinstance(metrics[k], float) else
              f"{k:55s} {metrics[k]}")
    return metrics


def main():
    """`python -m experiments.bench.hvp` (see the module docstring)."""
    harness.main(bench_hvp)


if __name__ == "__main__":
    main()
