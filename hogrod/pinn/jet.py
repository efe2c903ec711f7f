"""A forward jet of a Dense tanh MLP that carries linear differential operators as channels.

A PDE residual often needs some partials nonlinearly (u_x in Burgers' u u_x) and the rest
only inside one linear combination (u_t - nu u_xx). The jet pushes through the layers the
value h, one channel h_i = D_{v_i} h per direction v_i, and one channel per linear operator

    L h = a . grad h + sum_ij b_ij D_{v_i} D_{v_j} h,

so Burgers needs 3 channels (u, u_x, u_t - nu u_xx) where a Taylor jet of every partial
needs 4. Through z = h W + c the channels map linearly (z_i = h_i W, z_L = (L h) W), and
through t = tanh(z), with s = 1 - t^2 and tanh'' = -2 t s:

    D_i t = s z_i,    L t = s (z_L - 2 t q_L),    q_L = sum_ij b_ij z_i z_j.

At the input x, D_i x = v_i and L x = a (its second derivatives vanish).

`fused=True` gives each tanh layer a hand-written backward (`tf.custom_gradient`) that
reuses t and s, so the parameter gradient does not go through the tape of every small
elementwise product:

    g_zL = s g_L,   g_s = sum_i g_i z_i + sum_L g_L (z_L - 2 t q_L),
    g_zi = s g_i - 2 t sum_L g_zL sum_j (b_ij + b_ji) z_j,
    g_z  = s (g_t - 2 t g_s - 2 sum_L q_L g_zL)

(g_*: the loss's gradient in each quantity).
"""

import keras
import numpy as np
import tensorflow as tf

__all__ = ["tanh_mlp_jet"]


def _layers(net):
    layers = list(net.layers)
    if not layers or not all(isinstance(l, keras.layers.Dense) for l in layers):
        raise ValueError("tanh_mlp_jet needs `net` made only of keras.layers.Dense layers, got "
                         f"{[type(l).__name__ for l in layers]}")
    for l in layers[:-1]:
        if l.activation is not keras.activations.tanh:
            raise ValueError(f"tanh_mlp_jet: hidden layer {l.name} must use activation 'tanh'")
    if layers[-1].activation is not keras.activations.linear:
        raise ValueError(f"tanh_mlp_jet: the output layer {layers[-1].name} must be linear")
    return layers


def _check(x, directions, operators):
    if x.shape.rank != 2 or x.shape[1] is None:
        raise ValueError(f"tanh_mlp_jet: x must be [batch, d], got shape {x.shape}")
    d = x.shape[1]
    dirs = [np.asarray(v, dtype=np.float64) for v in directions]
    if any(v.shape != (d,) for v in dirs):
        raise ValueError(f"tanh_mlp_jet: every direction must have length d = {d}")
    ops = []
    for k, op in enumerate(operators):
        if len(op) != 2:
            raise ValueError(f"tanh_mlp_jet: operators[{k}] must be a pair (a, b)")
        a, b = np.asarray(op[0], dtype=np.float64), np.asarray(op[1], dtype=np.float64)
        if a.shape != (d,) or b.shape != (len(dirs), len(dirs)):
            raise ValueError(f"tanh_mlp_jet: operators[{k}] needs a of length {d} and b of "
                             f"shape [{len(dirs)}, {len(dirs)}] (one row per direction), got "
                             f"{a.shape} and {b.shape}")
        ops.append((a, b))
    return dirs, ops


def _quadratic(b, zs):
    """-2 sum_ij b_ij z_i z_j (tanh'' = -2 t s folded in), Python-float coefficients applied
    at the tensors' dtype; None when b is zero."""
    q = None
    for i in range(len(zs)):
        for j in range(len(zs)):
            if b[i, j] != 0.0:
                term = (-2.0 * float(b[i, j])) * (zs[i] * zs[j]) if i != j else \
                    (-2.0 * float(b[i, j])) * tf.square(zs[i])
                q = term if q is None else q + term
    return q


def _quadratic_row(b, i, zs):
    """The derivative of `_quadratic` in z_i: -2 sum_j (b_ij + b_ji) z_j."""
    out = None
    for j in range(len(zs)):
        c = -2.0 * float(b[i, j] + b[j, i])
        if c != 0.0:
            out = c * zs[j] if out is None else out + c * zs[j]
    return out


def _tanh_plain(ops):
    def f(z, zs, zl):
        t = tf.tanh(z)
        s = 1.0 - t * t
        out = []
        for (_, b), z_l in zip(ops, zl):
            q = _quadratic(b, zs)
            out.append(s * (z_l if q is None else z_l + t * q))
        return t, [s * z_i for z_i in zs], out
    return f


def _tanh_fused(ops, n_dir):
    @tf.custom_gradient
    def layer(z, *rest):
        zs, zl = list(rest[:n_dir]), list(rest[n_dir:])
        t = tf.tanh(z)
        s = 1.0 - t * t
        qs = [_quadratic(b, zs) for _, b in ops]
        rs = [z_l if q is None else z_l + t * q for q, z_l in zip(qs, zl)]
        outs = [t] + [s * z_i for z_i in zs] + [s * r for r in rs]

        def grad(g_t, *g_rest):
            g_i, g_l = g_rest[:n_dir], g_rest[n_dir:]
            g_zl = [s * g for g in g_l]
            g_s = None
            for a, b in list(zip(g_i, zs)) + list(zip(g_l, rs)):
                g_s = a * b if g_s is None else g_s + a * b
            g_zs = [s * g for g in g_i]
            inner = g_t if g_s is None else g_t - 2.0 * t * g_s
            for (_, b), q, g in zip(ops, qs, g_zl):
                if q is None:
                    continue
                inner = inner + q * g
                tg = t * g
                for i in range(n_dir):
                    row = _quadratic_row(b, i, zs)
                    if row is not None:
                        g_zs[i] = g_zs[i] + tg * row
            return [s * inner] + g_zs + g_zl
        return outs, grad

    def f(z, zs, zl):
        outs = layer(z, *zs, *zl)
        return outs[0], list(outs[1:1 + n_dir]), list(outs[1 + n_dir:])
    return f


def tanh_mlp_jet(net, x, directions, operators=(), fused=True, points_last=True):
    """(u, [D_{v_i} u], [L_k u]) of the Dense tanh MLP `net` at points x, each [batch, out].

    directions: vectors v_i of length d = x.shape[1] (e.g. [1, 0] for d/dx on (x, t)).
    operators: pairs (a, b), L u = a . grad u + sum_ij b[i][j] D_{v_i} D_{v_j} u, b indexed
        by the directions (Burgers' u_t - nu u_xx on (x, t) with directions [[1, 0]]:
        ([0, 1], [[-nu]])).
    fused: hand-written backward per tanh layer (False: the tape of the elementwise ops,
        the reference the tests compare it with).
    points_last: carry the activations as [width, batch] (one transpose of x in, one of
        each output out): the products become W^T h with the long axis last, which
        TensorFlow's and XLA's CPU kernels run faster than h W with [batch, width].

    Every hidden layer must be Dense with tanh, the last Dense and linear (ValueError
    otherwise)."""
    layers = _layers(net)
    x = tf.convert_to_tensor(x)
    dirs, ops = _check(x, directions, operators)
    act = _tanh_fused(ops, len(dirs)) if fused else _tanh_plain(ops)
    if points_last:
        h = tf.transpose(x)
        hs = [tf.constant(v, x.dtype)[:, None] for v in dirs]
        hl = [tf.constant(a, x.dtype)[:, None] for a, _ in ops]
        prod = lambda v, w: tf.matmul(w, v, transpose_a=True)  # noqa: E731
        bias = lambda b: b[:, None]  # noqa: E731
    else:
        h = x
        hs = [tf.constant(v, x.dtype)[None] for v in dirs]
        hl = [tf.constant(a, x.dtype)[None] for a, _ in ops]
        prod, bias = tf.matmul, (lambda b: b)
    for k, layer in enumerate(layers):
        w = layer.kernel
        z = prod(h, w)
        if layer.use_bias:
            z = z + bias(layer.bias)
        shape = tf.shape(z)
        # the input's own partials are constants: broadcast them to a full channel
        zs = [tf.broadcast_to(prod(v, w), shape) if k == 0 else prod(v, w) for v in hs]
        zl = [tf.broadcast_to(prod(a, w), shape) if k == 0 else prod(a, w) for a in hl]
        if layer is layers[-1]:
            if points_last:
                return tf.transpose(z), [tf.transpose(c) for c in zs], \
                    [tf.transpose(c) for c in zl]
            return z, zs, zl
        h, hs, hl = act(z, zs, zl)
