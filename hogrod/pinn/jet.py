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

(g_*: the loss's gradient in each quantity). The backward is made of differentiable ops on
tensors the forward computed on the tape, so it can be differentiated again (gPINN's
d residual / dx, then the weights).

`jet_partials` is `pdes.residual`'s default derivative path: the `partials` dict of a PDE's
wanted keys (and its `PDE.linear` combinations) from one jet pass, for every network that
`applies` accepts.
"""

import numbers
import weakref

import keras
import numpy as np
import tensorflow as tf
from keras.src.models.functional import Functional

from hogrod.pinn.operators import check_wanted

__all__ = ["tanh_mlp_jet", "applies", "jet_partials", "check_linear", "jet_plan"]


def _chain(net):
    """(Dense layers, output scale or None, None) when `net` is a plain chain that the jet
    evaluates exactly as `net(x)` does, else (None, None, the reason)."""
    from hogrod.pinn.networks import OutputScale  # networks imports keras layers only
    if type(net) not in (keras.Sequential, Functional):  # a subclass may override call
        return None, None, f"`net` must be a keras Sequential or functional Model, got " \
                           f"{type(net).__name__}"
    layers = list(net.layers)
    if layers and isinstance(layers[0], keras.layers.InputLayer):
        layers = layers[1:]
    scale = None
    if layers and type(layers[-1]) is OutputScale:
        scale, layers = layers[-1].scale, layers[:-1]
    names = [type(l).__name__ for l in net.layers]
    if not layers or not all(type(l) is keras.layers.Dense for l in layers):
        return None, None, f"`net` must be made only of keras.layers.Dense layers (and a " \
                           f"final OutputScale), got {names}"
    if any(l.lora_enabled or l.quantization_mode is not None for l in layers):
        return None, None, "`net` has a LoRA or quantized Dense layer"
    try:
        inputs, outputs = net.inputs, net.outputs
    except (AttributeError, ValueError):  # a Sequential never built on an Input
        inputs = outputs = None
    if not inputs or len(inputs) != 1 or len(outputs) != 1:
        return None, None, "`net` must have one input and one output"
    chain = [l for l in net.layers if not isinstance(l, keras.layers.InputLayer)]
    if any(len(l._inbound_nodes) != 1 for l in chain) or \
            chain[0].input is not inputs[0] or chain[-1].output is not outputs[0] or \
            any(b.input is not a.output for a, b in zip(chain, chain[1:])):
        return None, None, "`net`'s layers must form one chain, each layer applied once"
    for l in layers[:-1]:
        if l.activation is not keras.activations.tanh:
            return None, None, f"hidden layer {l.name} must use activation 'tanh'"
    if layers[-1].activation is not keras.activations.linear:
        return None, None, f"the output layer {layers[-1].name} must be linear"
    return layers, scale, None


def _dtypes_match(net, dtype):
    return all(l.compute_dtype == dtype.name and l.variable_dtype == dtype.name
               for l in net.layers if not isinstance(l, keras.layers.InputLayer)) and \
        net.inputs[0].dtype == dtype.name


def applies(net, dtype):
    """Whether `tanh_mlp_jet` evaluates `net` exactly as net(x) for points x of `dtype`: a
    keras Sequential or functional chain of Dense layers, tanh hidden and a linear output
    (optionally followed by one `networks.OutputScale`), whose inputs, weights and
    computations are all of `dtype` (a net of another dtype casts x: `partials` handles it)."""
    layers, _, _ = _chain(net)
    return layers is not None and _dtypes_match(net, tf.as_dtype(dtype))


def _layers(net):
    layers, scale, reason = _chain(net)
    if layers is None:
        raise ValueError(f"tanh_mlp_jet: {reason}")
    return layers, scale


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

    Every hidden layer must be Dense with tanh, the last Dense and linear, optionally followed
    by one `networks.OutputScale` (ValueError otherwise; `applies` says it without raising)."""
    layers, scale = _layers(net)
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
                z, zs, zl = tf.transpose(z), [tf.transpose(c) for c in zs], \
                    [tf.transpose(c) for c in zl]
            if scale is not None:  # a constant factor: the same on every channel
                z, zs, zl = z * scale, [c * scale for c in zs], [c * scale for c in zl]
            return z, zs, zl
        h, hs, hl = act(z, zs, zl)


def check_linear(x, linear):
    """ValueError unless `linear` is None or {name: {key: coefficient}}: string names, keys of
    order 1 or 2 within x's dimension, Python-number coefficients (a callable or tensor
    coefficient cannot be one constant operator: read it in the residual instead)."""
    if linear is None:
        return
    if not isinstance(linear, dict) or not all(isinstance(n, str) and isinstance(c, dict) and c
                                               for n, c in linear.items()):
        raise ValueError(f"PDE.linear must be a dict {{name: {{partial key: coefficient}}}} "
                         f"with string names and non-empty combinations, got {linear!r}")
    for name, combo in linear.items():
        keys = check_wanted(x, combo)
        if any(len(k) not in (1, 2) for k in keys.values()):
            raise ValueError(f"PDE.linear[{name!r}]: keys must be first or second partials, "
                             f"got {list(combo)}")
        bad = [c for c in combo.values()
               if not isinstance(c, numbers.Real) or isinstance(c, bool)]
        if bad:
            raise ValueError(f"PDE.linear[{name!r}]: coefficients must be Python numbers, got "
                             f"{bad[0]!r}")


def jet_plan(wanted, linear=None):
    """(coordinates, operators) the jet carries for the `partials` keys `wanted` and the
    linear combinations `linear` ({name: {key: coefficient}}, keys of order 1 or 2): one
    direction channel per coordinate in a wanted key or a second-order key of `linear`, one
    operator channel per wanted second partial (a sorted index pair) and one per name of
    `linear` (its sorted {key: coefficient} items); None when a wanted key has order > 2
    (the jet carries two orders)."""
    keys = [tuple(sorted(k)) for k in wanted]
    if any(len(k) > 2 for k in keys):
        return None
    combos = [tuple(sorted((tuple(sorted(k)), float(c)) for k, c in combo.items()))
              for combo in (linear or {}).values()]
    coords = {i for k in keys for i in k} | {i for c in combos for k, _ in c if len(k) == 2
                                             for i in k}
    seconds = sorted({k for k in keys if len(k) == 2})
    return tuple(sorted(coords)), tuple(((k, 1.0),) for k in seconds) + tuple(combos)


def _operators(coords, operators, dim):
    """Unit directions e_i (i in coords) and, per operator (its (key, coefficient) items),
    a[i] = the coefficient of (i,), b[i][j] = that of (i, j) (the backward adds b's
    transpose, so one entry of a mixed pair suffices)."""
    directions = [np.eye(dim)[i] for i in coords]
    ops = []
    for items in operators:
        a, b = np.zeros(dim), np.zeros((len(coords), len(coords)))
        for k, c in items:
            if len(k) == 1:
                a[k[0]] += c
            else:
                b[coords.index(k[0]), coords.index(k[1])] += c
        ops.append((a, b))
    return directions, ops


_COMPILED = {}  # (id(net), plan, dim) -> (weakref to net, XLA-compiled jet)


def _jet_fn(net, coords, operators, dim, jit_compile):
    directions, ops = _operators(coords, operators, dim)

    def fn(x):
        return tanh_mlp_jet(net, x, directions, ops)
    if not jit_compile:
        return fn
    # one compiled function per network and plan, so every trace of an enclosing step reuses
    # it; it holds the network weakly (a deleted network's entry is dropped, and its id may
    # be reused by a new network).
    key = (id(net), coords, operators, dim)
    ref, compiled = _COMPILED.get(key, (None, None))
    if ref is None or ref() is not net:
        for k in [k for k, (r, _) in _COMPILED.items() if r() is None]:
            del _COMPILED[k]
        ref = weakref.ref(net)
        compiled = tf.function(lambda x: tanh_mlp_jet(ref(), x, directions, ops),
                               jit_compile=True, autograph=False)
        _COMPILED[key] = (ref, compiled)
    return compiled


def jet_partials(net, x, wanted, linear=None, jit_compile=False):
    """`operators.partials(net, x, wanted)` from one `tanh_mlp_jet` pass: the same dict
    {key: [batch, outputs]} (keys as given, mixed partials symmetric), every value exact (the
    same derivatives, other rounding), and for each name of `linear` ({name: {key:
    coefficient}}, Python-number coefficients, keys of order 1 or 2) the combination
    sum_k coefficient * partial_k as one channel. Needs `applies(net, x.dtype)` and wanted
    keys of order <= 2 (ValueError otherwise).

    jit_compile: evaluate the jet in an inner XLA-compiled `tf.function` (its backward is
    compiled too)."""
    x = tf.convert_to_tensor(x)
    keys = check_wanted(x, wanted)
    check_linear(x, linear)
    plan = jet_plan(keys.values(), linear)
    if plan is None:
        raise ValueError("jet_partials: every wanted derivative must have order <= 2, got "
                         f"{list(keys)}")
    if not applies(net, x.dtype):
        _layers(net)  # raises with the reason when the architecture is the problem
        raise ValueError(f"jet_partials: `net` must compute in x's dtype {x.dtype.name}")
    coords, operators = plan
    u, firsts, ops = _jet_fn(net, coords, operators, x.shape[1], jit_compile)(x)
    seconds = [items[0][0] for items in operators[:len(operators) - len(linear or {})]]
    channels = {(): u, **dict(zip(((i,) for i in coords), firsts)), **dict(zip(seconds, ops))}
    d = {k: channels[v] for k, v in keys.items()}
    d.update(zip(linear or {}, ops[len(seconds):]))
    return d
