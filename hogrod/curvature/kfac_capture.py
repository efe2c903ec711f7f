"""K-FAC's layer capture: which layers are factored (blocks), their inputs and
pre-activations recorded during one forward pass, and the output cotangents whose outer
products give each example's curvature (type-2, Monte Carlo or empirical Fisher).

The layers K-FAC does not factor get a diagonal (other_layers="diagonal"). A normalization
layer (`SCALE_SHIFT`: y = scale * x_hat + offset per feature) gets kfac-jax's
scale-and-shift diagonal: its output y is captured like a factored layer's pre-activation,
the same backward pass gives dy, and an example's gradient of the scale is the sum over the
non-feature axes of dy * x_hat, of the offset the sum of dy. Any other layer gets the
per-example Jacobian of the outputs' projections (N backward passes, vectorized).

Used by `kronecker.KroneckerFactors`; see `kfac.py` for the approximation.
"""

import contextlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import batch_loss
from hogrod.types import Tensor

__all__ = ["Block", "leaf_layers", "factorable", "layer_blocks", "param_blocks", "capture",
           "SCALE_SHIFT", "scale_shift_axes", "scale_shift_diagonal", "trailing",
           "layer_rows", "without_rows", "output_cotangents", "backward", "layer_statistics"]


def leaf_layers(layer):
    """Leaf layers in order (nested models are walked)."""
    out = []
    for sub in getattr(layer, "layers", []):
        out.extend(leaf_layers(sub) if getattr(sub, "layers", None) is not None else [sub])
    return out


def factorable(layer):
    """Why K-FAC cannot factor `layer` (a string), or None if it can."""
    if type(layer) not in (keras.layers.Dense, keras.layers.Conv2D):
        return "only keras.layers.Dense and keras.layers.Conv2D are factored"
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return "LoRA / quantized layers are not factored"
    if isinstance(layer, keras.layers.Conv2D):
        if layer.groups != 1:
            return "grouped convolutions (groups != 1) are not factored"
        if layer.data_format != "channels_last":
            return "only data_format='channels_last' is factored"
    wanted = [layer.kernel] + ([layer.bias] if layer.bias is not None else [])
    if [id(v) for v in layer.trainable_variables] != [id(v) for v in wanted]:
        return "its trainable variables are not exactly [kernel, bias]"
    return None


class Block:
    def __init__(self, kind, layer, indices, shapes):
        self.kind, self.layer, self.name = kind, layer, layer.name
        self.indices, self.shapes = indices, shapes
        if kind == "kfac":
            kernel = shapes[0]
            self.d_out = int(kernel[-1])
            self.d_in_kernel = int(np.prod(kernel[:-1]))
            self.has_bias = len(indices) == 2
            self.d_in = self.d_in_kernel + int(self.has_bias)


def layer_blocks(model, other_layers, where):
    variables = list(model.trainable_variables)
    index = {id(v): i for i, v in enumerate(variables)}
    blocks, seen = [], set()
    for layer in leaf_layers(model):
        vs = layer.trainable_variables
        if not vs:
            continue
        missing = [v.path for v in vs if id(v) not in index]
        if missing:
            raise ValueError(f"{where}: variables {missing} of layer '{layer.name}' are not in "
                             "model.trainable_variables")
        why = factorable(layer)
        if why is not None and other_layers == "raise":
            raise ValueError(
                f"{where}: layer '{layer.name}' ({type(layer).__name__}) has trainable weights "
                f"K-FAC cannot factor ({why}); pass other_layers='diagonal' to give its "
                "variables the exact diagonal of the curvature, or freeze the layer")
        idx = [index[id(v)] for v in vs]
        if seen.intersection(idx):
            raise ValueError(f"{where}: layer '{layer.name}' shares variables with an earlier "
                             "layer; shared weights are not supported")
        seen.update(idx)
        blocks.append(Block("kfac" if why is None else "diag", layer, idx,
                             [tuple(v.shape) for v in vs]))
    rest = [variables[i].path for i in range(len(variables)) if i not in seen]
    if rest:
        raise ValueError(f"{where}: trainable variables {rest} belong to no leaf layer "
                         "(weights added to the model itself); K-FAC has no block for them")
    return blocks


def param_blocks(model: keras.Model, params: List[Tensor], where: str) -> List[Block]:
    """The blocks of a subset of the supported layers' variables: the principal submatrix of
    the K-FAC of every trainable variable on them.

    A layer is factored when its kernel is in `params`, jointly with its bias when that is
    in `params` too (the ones column), else over its kernel alone (A's kernel rows and
    columns: the same submatrix). The blocks' indices are positions in `params`.

    Args:
      model: the model the operator is of.
      params: the flat list of the variables given (`checks.params`).
      where: the public operator, first in the messages.

    Returns:
      The `Block`s, in the model's layer order.

    Raises:
      ArgumentError: naming `params`: an entry that is not the kernel or bias of a Dense /
        Conv2D layer of the model that K-FAC factors, a repeated one, or a bias without its
        layer's kernel.
    """
    owners = {}  # id(variable) -> (layer, "kernel" | "bias")
    for layer in leaf_layers(model):
        for role in ("kernel", "bias"):
            v = getattr(layer, role, None) if type(layer) in (keras.layers.Dense,
                                                              keras.layers.Conv2D) else None
            if v is not None:
                owners[id(v)] = (layer, role)
    position, chosen = {}, {}
    for i, p in enumerate(params):
        name = getattr(p, "path", None) or getattr(p, "name", type(p).__name__)
        if id(p) in position:
            raise checks.ArgumentError(f"{where}: params[{i}] ({name}) repeats params"
                                       f"[{position[id(p)]}]; pass each variable once")
        if id(p) not in owners:
            raise checks.ArgumentError(
                f"{where}: params[{i}] ({name}) is not the kernel or bias of a "
                "keras.layers.Dense or keras.layers.Conv2D layer of the model; K-FAC factors "
                "only those (e.g. params=layer_params(model, name))")
        layer, role = owners[id(p)]
        why = factorable(layer)
        if why is not None:
            raise checks.ArgumentError(
                f"{where}: params[{i}] ({name}) belongs to layer '{layer.name}', which K-FAC "
                f"cannot factor ({why}); leave it out of params")
        position[id(p)] = i
        chosen.setdefault(layer.name, {})[role] = i
    blocks = []
    for layer in leaf_layers(model):
        roles = chosen.get(layer.name)
        if roles is None:
            continue
        if "kernel" not in roles:
            raise checks.ArgumentError(
                f"{where}: params[{roles['bias']}] is the bias of layer '{layer.name}' without "
                "its kernel; K-FAC factors a layer by its kernel: add the kernel to params")
        indices = [roles["kernel"]] + ([roles["bias"]] if "bias" in roles else [])
        blocks.append(Block("kfac", layer, indices, [tuple(params[i].shape) for i in indices]))
    return blocks


# ---------------------------------------------------------------------------- capture

@contextlib.contextmanager
def capture(layers, record, scale_shift=()):
    """Record each of `layers`' call input ('a') and pre-activation ('s'), and each of the
    `scale_shift` layers' output ('y') and its derivatives in its variables ('t'), in
    `record`."""
    patched = []

    def once(layer):
        if layer.name in record:
            raise ValueError(f"KFACOperator: layer '{layer.name}' is called more than once "
                             "in one forward pass; K-FAC factors one call per layer")

    def wrap(layer):
        call, activation = layer.call, layer.activation

        def call_(inputs, *args, **kwargs):
            once(layer)
            record[layer.name] = {"a": inputs}
            return call(inputs, *args, **kwargs)

        def activation_(x):
            x = tf.identity(x)  # a tensor of its own, to differentiate the output with respect to
            record[layer.name]["s"] = x
            return activation(x)
        # object.__setattr__: Keras's attribute tracking has nothing to track here
        object.__setattr__(layer, "call", call_)
        object.__setattr__(layer, "activation", activation_)
        patched.append((layer, "activation", activation))

    def wrap_scale_shift(layer):
        call = layer.call

        def call_(*args, **kwargs):
            once(layer)
            # x_hat is the derivative of the layer's own output in its scale, taken forward
            # (a unit tangent per variable) during the layer's one call: whatever the layer
            # does (batch or moving statistics, masks, renorm's r and d, rms_scaling, its
            # epsilon and compute dtype), this is exactly what it multiplies the scale by,
            # where a normalization recomputed here could silently disagree with Keras's.
            # The values read are the ones the call uses (a functional call's substitutes).
            values = [v.value for v in layer.trainable_variables]
            with contextlib.ExitStack() as stack:
                accumulators = [stack.enter_context(tf.autodiff.ForwardAccumulator(
                    v, tf.ones_like(v))) for v in values]
                y = call(*args, **kwargs)
            tangents = [acc.jvp(y) for acc in accumulators]
            if any(t is None for t in tangents):
                raise ValueError(f"KFACOperator: the output of layer '{layer.name}' does not "
                                 "depend on each of its trainable variables; its "
                                 "scale-and-shift diagonal cannot be formed")
            y = tf.identity(y)  # a tensor of its own, to differentiate the output with respect to
            record[layer.name] = {"y": y, "t": [tf.stop_gradient(t) for t in tangents]}
            return y
        object.__setattr__(layer, "call", call_)

    try:
        for layer in layers:
            wrap(layer)
        for layer in scale_shift:
            wrap_scale_shift(layer)
            patched.append((layer, None, None))
        yield record
    finally:
        for layer, name, value in patched:
            del layer.__dict__["call"]
            if name is not None:
                object.__setattr__(layer, name, value)


# ---------------------------------------------------------- scale-and-shift diagonal

# Normalization layers (exactly these classes: a subclass may change `call`) whose every
# trainable variable scales or shifts the output feature by feature along `axis`,
# y = scale * x_hat + offset, broadcast over the other axes.
SCALE_SHIFT = (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
               keras.layers.GroupNormalization)


def scale_shift_axes(layer, shape, shapes):
    """The output axes (positive, ascending) along which the `SCALE_SHIFT` layer's
    variables (of `shapes`) act on its output (of `shape`), or None where they do not fit:
    the batch axis among them, or axes out of order (LayerNormalization(axis=[1, -1]) keeps
    them sorted as written, [-1, 1], and reshapes its weights onto the ascending axes),
    whose diagonal then takes per-example Jacobians."""
    rank = shape.rank
    if type(layer) not in SCALE_SHIFT or rank is None:
        return None
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    axes = [int(a) % rank if -rank <= int(a) < rank else None for a in axes]
    if None in axes or 0 in axes or axes != sorted(set(axes)):
        return None
    dims = tuple(shape[a] for a in axes)
    return axes if all(tuple(s) == dims for s in shapes) else None


def scale_shift_diagonal(axes, tangents, dy, dtypes):
    """kfac-jax's diagonal of a scale-and-shift layer's curvature.

    Args:
      axes: the output axes of its variables, ascending (`scale_shift_axes`).
      tangents: per variable, the output's derivative in it along a unit tangent, [N, ...]
        (x_hat for the scale, ones for the offset).
      dy: the output gradients of the cotangent columns, [C, N, ...].
      dtypes: the variables' dtypes.

    Returns:
      Per variable, sum over c and n of the square of example n's gradient for column c
      (the sum of dy * tangent over the output axes other than the variable's).
    """
    summed = [a + 1 for a in range(1, dy.shape.rank - 1) if a not in axes]
    out = []
    for t, dtype in zip(tangents, dtypes):
        grads = tf.reduce_sum(tf.cast(dy, dtype) * tf.cast(t, dtype)[None], axis=summed)
        out.append(tf.reduce_sum(tf.square(grads), axis=[0, 1]))
    return out


def trailing(t, start):
    """The product of t's dimensions from `start` on, static where known (later code reads
    static shapes): reshapes spell it out, since -1 cannot be inferred for an empty batch (a
    replica's empty shard)."""
    dims = t.shape[start:]
    if dims.is_fully_defined():
        return int(np.prod(dims))
    return tf.reduce_prod(tf.shape(t)[start:])


def layer_rows(block, a, g):
    """Layer inputs `a` -> [N, R, d_in] (ones appended for the bias) and output gradients
    `g` ([C, N, ...] over the cotangent columns C) -> [C, N, R, d_out]."""
    layer = block.layer
    if isinstance(layer, keras.layers.Conv2D):
        kh, kw = layer.kernel_size
        sh, sw = layer.strides
        dh, dw = layer.dilation_rate
        a = tf.image.extract_patches(a, [1, kh, kw, 1], [1, sh, sw, 1], [1, dh, dw, 1],
                                     layer.padding.upper())
    n = tf.shape(a)[0]
    a = tf.reshape(a, [n, trailing(a, 1) // block.d_in_kernel, block.d_in_kernel])
    if block.has_bias:
        a = tf.concat([a, tf.ones_like(a[..., :1])], axis=-1)
    g = tf.reshape(g, [tf.shape(g)[0], n, trailing(g, 2) // block.d_out, block.d_out])
    return a, g


# --------------------------------------------------------------------- output gradients

def without_rows(stats):
    """(sums, rows, count) -> (sums, count): what `replica_sums` can reduce."""
    sums, _, count = stats
    return sums, count


def output_cotangents(loss, fisher, likelihood, mc_samples, seed, y, z):
    """[C, N, K] output cotangents (K = size of one example's output) whose outer products
    summed over C give each example's curvature of L (the 1/N of the mean included)."""
    n = tf.shape(z)[0]
    z = tf.stop_gradient(z)
    k = trailing(z, 1)
    flat = tf.reshape(z, [n, k])

    def grads_at(labels, outputs, copies):  # [copies, N, K]: one example gradient per row
        rows = tf.reshape(outputs, [copies * n, k])
        with tf.GradientTape() as tape:
            tape.watch(rows)
            value = batch_loss(loss, labels, tf.reshape(rows, tf.shape(outputs)))
        # value is the mean over copies * N examples: sqrt(copies * N) * dvalue/drow is the
        # example's gradient over sqrt(copies * N), whose outer products sum to the mean
        scale = tf.sqrt(tf.cast(copies * n, z.dtype))
        return tf.reshape(scale * tape.gradient(value, rows), [copies, n, k])

    if fisher == "empirical":
        return grads_at(y, z, 1)
    if fisher == "mc":  # labels from the loss's likelihood (`likelihood.py`)
        m = mc_samples
        likelihood.check_output(z, "KFACOperator(fisher='mc')")
        tiled = tf.tile(z, tf.concat([[m], tf.ones_like(tf.shape(z)[1:])], 0))  # [m * N, ...]
        drawn = likelihood.sample(z, m, seed)  # [m, N, ...]
        labels = tf.reshape(drawn, tf.concat([[-1], tf.shape(drawn)[2:]], 0))
        # the loss is alpha times the negative log-likelihood: E[g g^T] = alpha^2 F, so the
        # gradients over sqrt(alpha) have the loss Hessian's expectation alpha F
        alpha = likelihood.alpha(z.shape[-1], z.dtype)
        return grads_at(labels, tiled, m) / tf.sqrt(alpha)
    with tf.GradientTape(persistent=True) as outer:  # type2: each example's loss Hessian's root
        outer.watch(flat)
        with tf.GradientTape() as inner:
            inner.watch(flat)
            value = batch_loss(loss, y, tf.reshape(flat, tf.shape(z)))
        gz = inner.gradient(value, flat)
    # [N, K, K], L separable over examples: row j of every example's Hessian is the gradient
    # of column j of gz (batch_jacobian's computation without its reshape to [N, -1], which
    # fails on an empty batch)
    hessians = tf.transpose(tf.vectorized_map(
        lambda e: outer.gradient(gz, flat, output_gradients=tf.broadcast_to(e, tf.shape(gz))),
        tf.eye(k, dtype=z.dtype)), [1, 0, 2])
    del outer
    hessians = 0.5 * (hessians + tf.linalg.matrix_transpose(hessians))
    evals, evecs = tf.linalg.eigh(hessians)
    flat_evals = tf.concat([tf.reshape(evals, [-1]), tf.zeros([1], z.dtype)], 0)  # 0: no rows
    scale = tf.reduce_max(tf.abs(flat_evals)) + tf.constant(1e-30, z.dtype)
    tf.debugging.assert_greater_equal(
        tf.reduce_min(flat_evals) / scale, tf.constant(-1e-4, z.dtype),
        message="KFACOperator: fisher='type2' needs a loss convex in the model outputs (its "
                "Hessian has a clearly negative eigenvalue); use MSE or cross-entropy on logits")
    roots = evecs * tf.sqrt(tf.maximum(evals, 0.0))[:, None, :]  # H_n = roots roots^T
    return tf.transpose(roots, [2, 0, 1])


def backward(tape, z, sources, cot):
    """[C, N, ...] gradients of `z` with respect to each source, for the C cotangents: one
    backward pass per column (a few), or one vectorized pass (pfor) for many columns, whose
    conversion costs more to trace than it saves for a few."""
    columns = cot.shape[0]
    if columns is not None and columns <= _LOOP_COLUMNS:
        grads = [tape.gradient(z, sources, output_gradients=_like(cot[c], z))
                 for c in range(columns)]
        return [tf.stack([g[i] for g in grads]) for i in range(len(sources))]
    return tf.vectorized_map(lambda c: tape.gradient(z, sources, output_gradients=_like(c, z)),
                             cot)


def _like(cot, z):
    """A cotangent column shaped and typed as z (cotangents of a half-precision output are
    computed in float32)."""
    return tf.cast(tf.reshape(cot, tf.shape(z)), z.dtype)


_LOOP_COLUMNS = 4


# ---------------------------------------------------------------- one pass, every block

def layer_statistics(call: Callable[[], tf.Tensor], blocks: List[Block],
                     cotangents: Callable[[tf.Tensor], tf.Tensor],
                     sources: Optional[Dict[str, List[Tensor]]] = None,
                     watch: Sequence[Tensor] = ()) -> Tuple[dict, tf.Tensor]:
    """One captured forward pass and the backward passes of its output cotangents: what the
    K-FAC factors and the diagonals of the other layers are built from.

    A "diag" block's diagonal is sum_c,n g_cn^2, g_cn example n's gradient of its variables
    for cotangent column c. A normalization layer's (`SCALE_SHIFT`) is kfac-jax's
    scale-and-shift diagonal: g_cn from example n's rows of the output gradients dy of the
    one backward pass (the examples' coupling through later layers' batch statistics
    ignored, as the Kronecker factors ignore it; without such coupling, as in inference
    mode, it is the exact diagonal). Any other layer's is the exact diagonal,
    g_cn = J_n^T cot_cn from per-example Jacobians.

    Args:
      call: `call() -> z`, the model's forward pass (its factored layers are captured).
      blocks: the `Block`s (`layer_blocks`).
      cotangents: `cotangents(z) -> [C, N, K]`, the output cotangents (`output_cotangents`).
      sources: {block name: tensors} to differentiate a "diag" block's curvature by (the
        values a functional call substitutes for its variables); default the layer's
        trainable variables. A normalization layer's are the values its call reads.
      watch: tensors to watch: the weights a functional call substitutes for the
        variables (a tape records only what depends on something watched).

    Returns:
      `(out, z)`: `out[name]` is `layer_rows`'s `(a [N, R, d_in], g [C, N, R, d_out])` for a
      factored block, and for a "diag" block the list (one per variable) of its diagonal
      of the curvature sum_c,n g_cn^2; `z` the model output.
    """
    kfac = [b for b in blocks if b.kind == "kfac"]
    diag = [b for b in blocks if b.kind == "diag"]
    sources = sources or {}
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(list(watch))
        with capture([b.layer for b in kfac], {},
                     [b.layer for b in diag if type(b.layer) in SCALE_SHIFT]) as record:
            z = call()
        axes = {b.name: scale_shift_axes(b.layer, record[b.name]["y"].shape, b.shapes)
                for b in diag if "y" in record.get(b.name, {})}
        scale_shift = [b for b in diag if axes.get(b.name) is not None]
        jacobian = [b for b in diag if axes.get(b.name) is None]
        cot = cotangents(z)
        if jacobian:  # per-example, per-column output projections for the exact diagonal
            targets = tf.einsum("nk,cnk->cn", tf.reshape(z, [tf.shape(z)[0], trailing(z, 1)]),
                                tf.stop_gradient(cot))
    s = ([record[b.name]["s"] for b in kfac] + [record[b.name]["y"] for b in scale_shift])
    grads = backward(tape, z, s, cot) if s else []
    out = {}
    for b, g in zip(kfac, grads):
        out[b.name] = layer_rows(b, record[b.name]["a"], g)
    for b, g in zip(scale_shift, grads[len(kfac):]):
        out[b.name] = scale_shift_diagonal(axes[b.name], record[b.name]["t"], g,
                                           [v.dtype for v in b.layer.trainable_variables])
    for b in jacobian:
        variables = sources.get(b.name) or b.layer.trainable_variables
        jac = tape.jacobian(targets, variables, experimental_use_pfor=True)
        out[b.name] = [tf.reduce_sum(tf.square(j), axis=[0, 1]) for j in jac]
    del tape
    return out, z
