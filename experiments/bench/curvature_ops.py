"""Benchmark: curvature operators on curvlinops' benchmark MLP, each matvec and setup as a
multiple of one gradient evaluation measured in the same interleaved rounds.

curvlinops' benchmark (784-1024-512-256-128-64-10 ReLU MLP, batch 512, float32, random
data, cross-entropy) publishes (GPU, eager): Hessian 5.3x, GGN 4.1x, empirical Fisher 4.4x,
MC Fisher 5.7x, K-FAC matvec 1.07x, K-FAC factors 2.3x, EK-FAC matvec 2.0x. Setups time the
recomputation of factors at fixed weights with the compiled code already traced
(`refresh()`); EK-FAC's setup includes the eigendecompositions and the eigenvalue correction.

    python -m experiments.bench.curvature_ops --gin_file=configs/bench/curvature_ops.gin
"""

import gin
import keras
import numpy as np
import tensorflow as tf

from experiments.bench.timing import interleaved_rates
from experiments.models import cross_entropy, dense_net
from hogrod import curvature, harness

PUBLISHED = {"hessian_matvec": 5.3, "ggn_matvec": 4.1, "empirical_fisher_matvec": 4.4,
             "mc_fisher_matvec": 5.7, "kfac_matvec": 1.07, "kfac_factors": 2.3,
             "ekfac_matvec": 2.0}


@gin.configurable
def bench_curvature_ops(output_dir, widths=(784, 1024, 512, 256, 128, 64, 10), batch=512,
                        activation="relu", rounds=10, seed=0):
    keras.utils.set_random_seed(seed)
    model = dense_net(widths, activation, dtype="float32")
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, widths[0])), tf.float32)
    y = tf.constant(rng.integers(0, widths[-1], size=batch), tf.int32)
    data = (x, y)
    params = model.trainable_variables
    keras_ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            value = cross_entropy(y, model(x))
        return tape.gradient(value, params)

    hessian = curvature.HessianOperator.from_objective(
        lambda b: cross_entropy(b[1], model(b[0])), params, data)
    ggn = curvature.GaussNewtonOperator.from_output_loss(
        lambda b: model(b[0]), lambda z, b: cross_entropy(b[1], z), params, data)
    kfac = {f: curvature.KFACOperator(model, keras_ce, data, fisher=f)
            for f in ("type2", "mc", "empirical")}
    ekfac = curvature.EKFACOperator(model, keras_ce, data)
    fisher = {f: curvature.FisherOperator(model, keras_ce, data, fisher=f)
              for f in ("empirical", "mc")}
    v = tf.random.stateless_normal([hessian.shape[0]], [seed, 1])

    check_products(model, x, y, v, hessian, kfac["type2"], ekfac)

    def matvec(op):
        return lambda: op.matvec_flat(v).numpy()

    candidates = {
        "gradient": lambda: gradient()[0].numpy(),
        "hessian_matvec": matvec(hessian),
        "ggn_matvec": matvec(ggn),
        "empirical_fisher_matvec": matvec(fisher["empirical"]),
        "mc_fisher_matvec": matvec(fisher["mc"]),
        "kfac_factors": lambda: kfac["type2"].refresh(),
        "kfac_factors_mc": lambda: kfac["mc"].refresh(),
        "kfac_factors_empirical": lambda: kfac["empirical"].refresh(),
        "kfac_matvec": matvec(kfac["type2"]),
        "ekfac_setup": lambda: ekfac.refresh(),
        "ekfac_matvec": matvec(ekfac),
    }
    rates = interleaved_rates(candidates, rounds, warmup=2)
    results = {"n_params": int(hessian.shape[0]), "batch": batch,
               "gradient_ms": 1e3 / rates["gradient"]}
    for name, rate in rates.items():
        if name != "gradient":
            results[f"{name}_over_gradient"] = rates["gradient"] / rate
            if name in PUBLISHED:
                results[f"{name}_curvlinops"] = PUBLISHED[name]
    for key, value in sorted(results.items()):
        print(f"{key:40s} {value}")
    return results


def _layer_blocks(model, v):
    """(layer name, its [kernel rows + bias row, units] block of the flat vector `v`) per Dense
    layer, in the order of `model.trainable_variables`."""
    out, start = [], 0
    for layer in model.layers:
        kernel, bias = layer.kernel, layer.bias
        k, b = int(np.prod(kernel.shape)), int(np.prod(bias.shape))
        block = tf.concat([tf.reshape(v[start:start + k], kernel.shape),
                           v[None, start + k:start + k + b]], 0)
        out.append((layer.name, block))
        start += k + b
    return out


def check_products(model, x, y, v, hessian, kfac, ekfac, rtol=1e-4):
    """Before timing: each timed product equals a reference computed another way (float32,
    so to `rtol` relative to the largest entry): the Hessian's against back-over-back
    autodiff, K-FAC's against `A V G` with its dense factors, EK-FAC's against its full
    eigenbasis `Q_A (S * (Q_A^T V Q_G)) Q_G^T`. Raises ValueError naming the operator."""
    params = model.trainable_variables
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            value = cross_entropy(y, model(x))
        grads = inner.gradient(value, params)
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
        dot = tf.reduce_sum(flat * tf.stop_gradient(v))
    hvp = tf.concat([tf.reshape(h, [-1]) for h in outer.gradient(dot, params)], 0)
    factors, eigen = kfac.factors, ekfac.eigendecompositions
    kron, rotated = [], []
    for name, block in _layer_blocks(model, v):
        a, g = factors[name]
        kron.append(tf.reshape(a @ block @ g, [-1, g.shape[0]]))
        _, qa, _, qg = eigen[name]
        w = ekfac.corrected_eigenvalues[name] * (tf.transpose(qa) @ block @ qg)
        rotated.append(qa @ w @ tf.transpose(qg))

    def flatten(blocks):  # [kernel; bias] blocks back to the flat order
        return tf.concat([tf.concat([tf.reshape(b[:-1], [-1]), b[-1]], 0) for b in blocks], 0)

    for name, op, reference in (("hessian_matvec", hessian, hvp),
                                ("kfac_matvec", kfac, flatten(kron)),
                                ("ekfac_matvec", ekfac, flatten(rotated))):
        got, want = op.matvec_flat(v).numpy(), reference.numpy()
        error = np.abs(got - want).max() / np.abs(want).max()
        if not error <= rtol:
            raise ValueError(f"bench_curvature_ops: {name} differs from its reference by "
                             f"{error:.2e} of the largest entry (> {rtol}); the operator "
                             "computes a wrong product")


def main():
    """The console command `hogrod-bench-curvature-ops` (see the module docstring)."""
    harness.main(bench_curvature_ops)


if __name__ == "__main__":
    main()
