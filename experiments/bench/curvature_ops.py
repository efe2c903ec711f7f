"""Benchmark: curvature operators on curvlinops' benchmark MLP, each matvec and setup as a
multiple of one gradient evaluation measured in the same interleaved rounds.

curvlinops' benchmark (784-1024-512-256-128-64-10 ReLU MLP, batch 512, float32, random
data, cross-entropy) publishes (GPU, eager): Hessian 5.3x, GGN 4.1x, empirical Fisher 4.4x,
MC Fisher 5.7x, K-FAC matvec 1.07x, K-FAC factors 2.3x, EK-FAC matvec 2.0x. Setups time the
recomputation of factors at fixed weights with the compiled code already traced
(`refresh()`); EK-FAC's setup includes the eigendecompositions and the eigenvalue correction.

    python -m experiments.bench.curvature_ops --gin_file=experiments/bench/configs/curvature_ops.gin
"""

import gin
import keras
import numpy as np
import tensorflow as tf

from experiments.bench.peers import Reference
from experiments.bench.timing import interleaved_rates
from hogrod.models import cross_entropy, dense_net
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

    agreement = check_products(model, x, y, v, hessian, kfac["type2"], ekfac)

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
               "gradient_ms": 1e3 / rates["gradient"],
               **{f"{k}_rel_err": e for k, e in agreement.items()}}
    for name, rate in rates.items():
        if name != "gradient":
            results[f"{name}_over_gradient"] = rates["gradient"] / rate
            if name in PUBLISHED:
                results[f"{name}_curvlinops"] = PUBLISHED[name]
    for key, value in sorted(results.items()):
        print(f"{key:40s} {value}")
    return results


def _blocks(model, v):
    """Each Dense layer's [kernel rows + bias row, units] block of the flat numpy vector `v`,
    in the order of `model.trainable_variables`; `_flat` is the inverse."""
    out, start = [], 0
    for layer in model.layers:
        (n_in, n_out), b = layer.kernel.shape, layer.bias.shape[0]
        out.append(np.concatenate([v[start:start + n_in * n_out].reshape(n_in, n_out),
                                   v[None, start + n_in * n_out:start + n_in * n_out + b]]))
        start += n_in * n_out + b
    return out


def _flat(blocks):
    return np.concatenate([np.concatenate([b[:-1].ravel(), b[-1]]) for b in blocks])


def check_products(model, x, y, v, hessian, kfac, ekfac):
    """Before timing: each timed product (float32) against its float64 reference on the same
    inputs, within float32's rounding of that product (`peers.Reference`): the Hessian's
    against back-over-back autodiff in float64 at the same weights, batch and vector;
    K-FAC's against `A V G` from its own factors, EK-FAC's against its full eigenbasis
    `Q_A (S * (Q_A^T V Q_G)) Q_G^T`, both in float64. Returns {product: relative difference};
    raises AssertionError naming the product."""
    params = model.trainable_variables
    model64 = dense_net([model.input_shape[-1]] + [layer.units for layer in model.layers],
                        model.layers[0].activation, dtype="float64")

    def hvp64(inputs):
        n = len(params)
        for var, w in zip(model64.trainable_variables, inputs[:n]):
            var.assign(w)
        xs, ys, vec = inputs[n], inputs[n + 1], tf.constant(inputs[n + 2])
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                value = cross_entropy(ys, model64(xs))
            grads = inner.gradient(value, model64.trainable_variables)
            dot = tf.reduce_sum(tf.concat([tf.reshape(g, [-1]) for g in grads], 0) * vec)
        return [tf.concat([tf.reshape(h, [-1]) for h in outer.gradient(
            dot, model64.trainable_variables)], 0).numpy()]

    names = [layer.name for layer in model.layers]
    factors = [t.numpy() for name in names for t in kfac.factors[name]]  # A, G per layer
    eigen = [t.numpy() for name in names for t in (ekfac.eigendecompositions[name][1],
                                                   ekfac.eigendecompositions[name][3],
                                                   ekfac.corrected_eigenvalues[name])]

    def kron64(inputs):  # A_l V_l G_l per layer
        return [_flat([a @ b @ g for a, g, b in zip(inputs[:-1:2], inputs[1:-1:2],
                                                    _blocks(model, inputs[-1]))])]

    def rotated64(inputs):  # Q_A (S * (Q_A^T V Q_G)) Q_G^T per layer
        return [_flat([qa @ (s * (qa.T @ b @ qg)) @ qg.T for qa, qg, s, b in zip(
            inputs[:-1:3], inputs[1:-1:3], inputs[2:-1:3], _blocks(model, inputs[-1]))])]

    vector = v.numpy()
    out = {}
    for name, op, fn64, inputs in (
            ("hessian_matvec", hessian, hvp64,
             [p.numpy() for p in params] + [x.numpy(), y.numpy(), vector]),
            ("kfac_matvec", kfac, kron64, factors + [vector]),
            ("ekfac_matvec", ekfac, rotated64, eigen + [vector])):
        ref = Reference(fn64, inputs)
        out.update(ref.check({name: [op.matvec_flat(v).numpy()]}, "float32",
                             "bench_curvature_ops: the operator's product"))
    return out


def main():
    """`python -m experiments.bench.curvature_ops` (see the module docstring)."""
    harness.main(bench_curvature_ops)


if __name__ == "__main__":
    main()
