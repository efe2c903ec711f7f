"""Benchmark: the Burgers residual and its parameter gradient on 10,000 points.

One evaluation = u, u_x, u_t, u_xx of a tanh MLP (Raissi's 8 x 20) at every point, the
mean squared residual, and its gradient with respect to the weights. Candidates, in the
same run on the same weights and points, interleaved:
- hogrod: `pinn.residual` and its gradient as `pinn_experiment`'s default training step
  computes them: the whole step one XLA computation (`train.compiled(..., "auto")`, the
  default `jit_compile` of `make_train_step` and the binary), its default derivative path
  the operator jet (`pinn.residual`'s `use_jet`: u, u_x and Burgers' declared linear part
  u_t - nu u_xx as one channel, `PDE.linear`); `hogrod_plain`: the step as a plain
  `tf.function` (`pinn_experiment.jit_compile = False`), the jet alone in an inner
  XLA-compiled function; `hogrod_unfolded`: the generic jet of the wanted partials (u, u_x,
  u_t, u_xx: nu a callable, so nothing is folded); the plain step without the inner XLA is
  `hogrod_jet` below (`residual(..., jit_compile=False)`, `pinn_experiment.jet_jit_compile
  = False`);
- hogrod_partials: the nested-tape `hogrod.pinn.partials` (the default before the jet, and
  the fallback for any other network or PDE: `residual(..., use_jet=False)`), and the same
  under XLA (`hogrod_partials_xla`);
- DeepXDE's TensorFlow backend: `dde.grad.jacobian` / `dde.grad.hessian` (its own
  derivative code) in a `tf.function` (the `bench` extra; DDE_BACKEND=tensorflow);
- JAX: `vmap` of nested `jax.grad` per point, `jit` (the `bench` extra);
- two forward-mode candidates, measured to choose the operators' mode: TF's nested
  `ForwardAccumulator`s, and a hand-written Taylor-mode jet that pushes (u, u_x, u_t, u_xx)
  through the Dense layers together (the "forward Laplacian" idea), also with a
  hand-written backward per tanh layer (`taylor_mode_fused`);
- the operator jet `hogrod.pinn.jet.tanh_mlp_jet` called directly: 3 channels (u, u_x,
  u_t - nu u_xx), the linear part of the residual carried as one channel, with a hand-written backward per tanh
  layer and the activations carried as [width, points] (`hogrod_jet`), the same under XLA
  (`hogrod_jet_xla`), with the tape's backward (`hogrod_jet_tape`: what the hand-written
  backward buys) and under XLA in the [points, width] layout (`hogrod_jet_rows_xla`: what
  the layout buys).

    python -m experiments.bench.pinn --gin_file=experiments/bench/configs/pinn.gin

Agreement before speed: every candidate's gradient against the float64 gradient on the same
float32 weights and points, within float32's rounding of that computation
(`experiments.bench.peers.Reference`; TF's nested forward accumulators only reported).
Reported: evaluations/s (median of the rounds, and the best round: `best_*`, what a loaded
machine disturbs least), each gradient's error against the float64 one, the ratios
(`ratio_hogrod_over_deepxde_tf`: DeepXDE's time over hogrod's) and the peers' versions.
The time to 1e-2 and 1e-3 against DeepXDE's Burgers example is `experiments.bench.pinn_convergence`.

The matmul floor says how far any TensorFlow evaluation could go. Per hidden-to-hidden
layer an evaluation needs 12 [points, width] x [width, width] products in either mode: 4
to carry u, its first partials and u_xx forward (one forward and one backward pass, and
two more for the second derivative; or the jet's four channels), and 2 for each of those
in the reverse pass for the weights (weights and inputs). The binary times 12 x (depth -
1) such products alone (`timing.matmul_floor`) and reports each candidate's time over
that floor: the highest ratio over it a step doing nothing but those products would reach.
"""

import math
import os

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

import hogrod
from experiments.bench.peers import Reference, relative_error, versions
from experiments.bench.timing import floor_metrics, interleaved_samples, matmul_floor
from hogrod.models import dense_net
from hogrod import harness, pinn, train
from hogrod.pinn.jet import tanh_mlp_jet

NU = 0.01 / math.pi


def make_net(width, depth):
    keras.utils.set_random_seed(0)
    return dense_net((2,) + (width,) * depth + (1,), "tanh")


def hogrod_candidate(net, x, jit_compile="auto", use_jet=True, fold=True):
    """`pinn.residual` and its gradient compiled as `make_train_step` compiles a step
    (`train.compiled`): with the defaults, what `pinn_experiment`'s default training step
    does (one XLA computation; the operator jet, Burgers' u_t - nu u_xx one channel);
    jit_compile=False: a plain `tf.function` (the jet in its inner XLA function);
    use_jet=False: the nested-tape `partials`; fold=False: nu as a callable, so u_t and
    u_xx are two channels (the generic jet of any PDE's wanted partials)."""
    pde = pinn.pdes.burgers(NU if fold else (lambda: NU))

    def step():
        return hogrod.grad(lambda: tf.reduce_mean(tf.square(pinn.residual(
            pde, net, x, use_jet=use_jet))), net.trainable_variables)
    run = train.compiled(step, jit_compile, "bench_pinn")
    return lambda: [g.numpy() for g in run()]


def forward_mode_candidate(net, x):
    """u_x, u_xx by nested `tf.autodiff.ForwardAccumulator` (forward-over-forward), u_t by
    one more, then the parameter gradient by a tape around them: the forward-mode candidate
    measured beside the reverse-mode operators. (Eagerly, TF 2.21's tape fails on this nesting with an
    InternalError; inside tf.function it runs, see the agreement line it reports.)"""
    nu = NU

    @tf.function
    def run():
        ones, zeros = tf.ones_like(x[:, :1]), tf.zeros_like(x[:, :1])
        e_x, e_t = tf.concat([ones, zeros], 1), tf.concat([zeros, ones], 1)
        with tf.GradientTape() as tape:
            with tf.autodiff.ForwardAccumulator(x, e_x) as outer:
                with tf.autodiff.ForwardAccumulator(x, e_x) as inner:
                    u = net(x)
                u_x = inner.jvp(u)
            u_xx = outer.jvp(u_x)
            with tf.autodiff.ForwardAccumulator(x, e_t) as acc_t:
                u_t = acc_t.jvp(net(x))
            loss = tf.reduce_mean(tf.square(u_t + u * u_x - nu * u_xx))
        return tape.gradient(loss, net.trainable_variables)
    return lambda: [g.numpy() for g in run()]


def taylor_mode_candidate(net, x):
    """Forward Taylor propagation through the Dense chain: every layer maps the value h and
    its partials (h_x, h_t, h_xx) to the next layer's, z_* = h_* W, then for a = tanh(z):
    a_x = s1 z_x, a_t = s1 z_t, a_xx = s2 z_x^2 + s1 z_xx (s1, s2: tanh's first and second
    derivatives at z). One forward pass of four channels replaces the nested backward
    passes; the parameter gradient is one reverse pass over it."""
    @tf.function
    def run():
        with tf.GradientTape() as tape:
            h, hx, ht, hxx = x, None, None, None
            for layer in net.layers:
                w = layer.kernel
                z = tf.matmul(h, w) + layer.bias
                zx = w[0:1] if hx is None else tf.matmul(hx, w)  # the input's own partials
                zt = w[1:2] if ht is None else tf.matmul(ht, w)
                zxx = None if hxx is None else tf.matmul(hxx, w)
                if layer.activation is keras.activations.linear:
                    h, hx, ht, hxx = z, zx, zt, zxx
                    continue
                h = tf.tanh(z)
                s1 = 1.0 - h * h
                s2 = -2.0 * h * s1
                hx, ht = s1 * zx, s1 * zt
                hxx = s2 * zx * zx + (0.0 if zxx is None else s1 * zxx)
            loss = tf.reduce_mean(tf.square(ht + h * hx - NU * hxx))
        return tape.gradient(loss, net.trainable_variables)
    return lambda: [g.numpy() for g in run()]


@tf.custom_gradient
def _taylor_tanh(z, zx, zt, zxx):
    """(u, u_x, u_t, u_xx) through tanh with a hand-written backward reusing t and s."""
    t = tf.tanh(z)
    s = 1.0 - t * t
    q = zx * zx
    r = zxx - 2.0 * t * q

    def grad(g_t, g_x, g_tt, g_xx):
        g_zxx = s * g_xx
        g_s = g_x * zx + g_tt * zt + g_xx * r
        g_zx = s * g_x - 4.0 * (t * zx) * g_zxx
        g_z = s * (g_t - 2.0 * t * g_s - 2.0 * q * g_zxx)
        return g_z, g_zx, s * g_tt, g_zxx
    return (t, s * zx, s * zt, s * r), grad


def taylor_mode_fused_candidate(net, x):
    """The Taylor-mode jet with `_taylor_tanh`'s backward in place of the tape's."""
    @tf.function
    def run():
        with tf.GradientTape() as tape:
            h = None
            for layer in net.layers:
                w = layer.kernel
                z = tf.matmul(x if h is None else h, w) + layer.bias
                if h is None:
                    shape = tf.shape(z)
                    zx, zt = tf.broadcast_to(w[0:1], shape), tf.broadcast_to(w[1:2], shape)
                    zxx = tf.zeros_like(z)
                else:
                    zx, zt, zxx = tf.matmul(hx, w), tf.matmul(ht, w), tf.matmul(hxx, w)
                if layer.activation is keras.activations.linear:
                    h, hx, ht, hxx = z, zx, zt, zxx
                    continue
                h, hx, ht, hxx = _taylor_tanh(z, zx, zt, zxx)
            loss = tf.reduce_mean(tf.square(ht + h * hx - NU * hxx))
        return tape.gradient(loss, net.trainable_variables)
    return lambda: [g.numpy() for g in run()]


def jet_candidate(net, x, fused=True, jit_compile=False, points_last=True):
    """`hogrod.pinn.jet.tanh_mlp_jet`: u, u_x and L u = u_t - nu u_xx in one forward pass."""
    @tf.function(jit_compile=jit_compile)
    def run():
        with tf.GradientTape() as tape:
            u, (u_x,), (lu,) = tanh_mlp_jet(net, x, [[1.0, 0.0]], [([0.0, 1.0], [[-NU]])],
                                            fused=fused, points_last=points_last)
            loss = tf.reduce_mean(tf.square(lu + u * u_x))
        return tape.gradient(loss, net.trainable_variables)
    return lambda: [g.numpy() for g in run()]


def deepxde_candidate(net, x):
    os.environ.setdefault("DDE_BACKEND", "tensorflow")
    try:
        import deepxde as dde
    except Exception as e:  # not installed, or another backend configured
        logging.warning("deepxde unavailable (%s): no DeepXDE baseline", e)
        return None

    @tf.function
    def run():
        with tf.GradientTape() as tape:
            y = net(x)
            u_x = dde.grad.jacobian(y, x, i=0, j=0)
            u_t = dde.grad.jacobian(y, x, i=0, j=1)
            u_xx = dde.grad.hessian(y, x, i=0, j=0)
            loss = tf.reduce_mean(tf.square(u_t + y * u_x - NU * u_xx))
        return tape.gradient(loss, net.trainable_variables)
    try:
        run()
    except Exception as e:
        logging.warning("deepxde's derivatives failed on this model (%s): no baseline", e)
        return None
    return lambda: [g.numpy() for g in run()]


def jax_candidate(net, x):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        logging.warning("jax not installed: no JAX baseline")
        return None
    params = [jnp.asarray(v.numpy()) for v in net.trainable_variables]
    pts = jnp.asarray(x.numpy())

    def u(ps, xt):
        h = xt
        for i in range(0, len(ps) - 2, 2):
            h = jnp.tanh(h @ ps[i] + ps[i + 1])
        return (h @ ps[-2] + ps[-1])[0]

    def residual(ps, xt):
        g = jax.grad(u, 1)(ps, xt)
        u_xx = jax.grad(lambda z: jax.grad(u, 1)(ps, z)[0])(xt)[0]
        return g[1] + u(ps, xt) * g[0] - NU * u_xx

    loss = lambda ps: jnp.mean(jax.vmap(residual, (None, 0))(ps, pts) ** 2)  # noqa: E731
    grad = jax.jit(jax.grad(loss))
    return lambda: [np.asarray(a) for a in jax.block_until_ready(grad(params))]


def float64_gradient(width, depth):
    """`fn64(inputs)`: the mean squared Burgers residual's gradient in float64 by the
    nested-tape `partials` at inputs = weights (model order), points."""
    net64 = dense_net((2,) + (width,) * depth + (1,), "tanh", dtype="float64")
    pde = pinn.pdes.burgers(NU)

    def fn64(inputs):
        for v, w in zip(net64.trainable_variables, inputs[:-1]):
            v.assign(w)
        x = tf.constant(inputs[-1])
        return [g.numpy() for g in hogrod.grad(lambda: tf.reduce_mean(tf.square(
            pinn.residual(pde, net64, x, use_jet=False))), net64.trainable_variables)]
    return fn64


@gin.configurable
def bench_pinn(output_dir, points=10000, width=20, depth=8, rounds=10, calls_per_round=3,
               warmup=3):
    net = make_net(width, depth)
    x = tf.constant(pinn.sample(pinn.Box((-1.0, 0.0), (1.0, 1.0)), points, "sobol", 0))
    candidates = {"hogrod": hogrod_candidate(net, x),
                  "hogrod_plain": hogrod_candidate(net, x, jit_compile=False),
                  "hogrod_partials": hogrod_candidate(net, x, jit_compile=False,
                                                      use_jet=False),
                  "hogrod_partials_xla": hogrod_candidate(net, x, jit_compile=True,
                                                          use_jet=False),
                  "hogrod_unfolded": hogrod_candidate(net, x, jit_compile=False, fold=False),
                  "tf_forward_mode": forward_mode_candidate(net, x),
                  "taylor_mode": taylor_mode_candidate(net, x),
                  "taylor_mode_fused": taylor_mode_fused_candidate(net, x),
                  "hogrod_jet": jet_candidate(net, x),
                  "hogrod_jet_xla": jet_candidate(net, x, jit_compile=True),
                  "hogrod_jet_tape": jet_candidate(net, x, fused=False),
                  "hogrod_jet_rows_xla": jet_candidate(net, x, jit_compile=True,
                                                       points_last=False)}
    for name, make in (("deepxde_tf", deepxde_candidate), ("jax", jax_candidate)):
        c = make(net, x)
        if c is not None:
            candidates[name] = c
    # agreement before speed: every gradient against the float64 one on the same weights
    # and points; TF's nested forward accumulators are measured, not trusted
    ref = Reference(float64_gradient(width, depth), [v.numpy() for v in
                                                     net.trainable_variables] + [x.numpy()])
    sides = {name: fn() for name, fn in candidates.items()}
    untrusted = sides.pop("tf_forward_mode")
    m = {f"grad_rel_err_{k}": v for k, v in ref.check(sides, "float32", "the Burgers "
                                                      "residual's gradient").items()}
    m["grad_rel_err_tf_forward_mode"] = relative_error(ref.value, untrusted, np.inf,
                                                       "tf_forward_mode")
    m["grad_condition"] = ref.condition
    products, floor_of = matmul_floor(points, width, 12 * (depth - 1))
    samples = interleaved_samples(dict(candidates, **products), rounds, calls_per_round, warmup)
    rates = {k: float(np.median(r)) for k, r in samples.items()}
    floor = floor_of(rates)
    rates = {k: rates[k] for k in candidates}
    # the best round of each: on a loaded machine the medians' ratios swing with the load
    best = {k: float(np.max(samples[k])) for k in candidates}
    m.update({f"best_evals_per_s_{k}": v for k, v in best.items()})
    if "deepxde_tf" in best:
        m.update({f"best_ratio_{k}_over_deepxde_tf": best[k] / best["deepxde_tf"]
                  for k in candidates if k != "deepxde_tf"})
    m.update({f"evals_per_s_{k}": v for k, v in rates.items()})
    for k in rates:
        if k in ("deepxde_tf", "jax"):
            m[f"ratio_hogrod_over_{k}"] = rates["hogrod"] / rates[k]
            for j in ("hogrod_plain", "hogrod_partials", "hogrod_partials_xla", "hogrod_unfolded",
                      "hogrod_jet", "hogrod_jet_xla", "hogrod_jet_tape",
                      "hogrod_jet_rows_xla", "taylor_mode_fused"):
                m[f"ratio_{j}_over_{k}"] = rates[j] / rates[k]
    for k in ("tf_forward_mode", "taylor_mode", "hogrod_partials"):
        m[f"ratio_hogrod_over_{k}"] = rates["hogrod"] / rates[k]
    m.update(floor_metrics(floor, rates))  # depth 1: no hidden-to-hidden products, no floor
    for k, v in sorted(m.items()):
        print(f"{k:35s} {v:.4g}")
    return dict(m, points=points, width=width, depth=depth, **versions("deepxde", "jax"))


def main():
    """`python -m experiments.bench.pinn` (see the module docstring)."""
    harness.main(bench_pinn)


if __name__ == "__main__":
    main()
