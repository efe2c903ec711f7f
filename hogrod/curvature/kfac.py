"""Kronecker-factored curvature: K-FAC and EK-FAC as `tf.linalg.LinearOperator`s.

Both act on the flat vector of `model.trainable_variables` (the order of `hogrod.hessian`
and of the other operators here) and approximate the Gauss-Newton matrix / Fisher of the
objective `L = mean(loss(y, model(x)))` (a Keras loss `loss(y_true, y_pred)`), averaged
over a data set like the other operators (each batch weighted by its size).

Blocks, one per layer (the approximation is block-diagonal over layers):

- `keras.layers.Dense` and `keras.layers.Conv2D` (exactly these classes; a subclass may
  change `call`, so it is treated like any other layer): the kernel AND the bias are
  factored JOINTLY, `A (x) G` over the layer's variables `[kernel, bias]` with a ones
  column appended to the layer inputs (so the block also holds the kernel-bias cross
  terms). `A = E[a a^T]` over the layer inputs (Conv2D: the patches of
  `tf.image.extract_patches`, ordered like the kernel `(kh, kw, c_in)`), `G` the sum of
  `g g^T` over the backpropagated output gradients `g` (pre-activation):
    * fisher="type2": the columns of a square root of each example's loss Hessian with
      respect to the model output (computed numerically, `L` must be separable over
      examples and convex in the outputs): the Gauss-Newton matrix's K-FAC, equal to the
      type-2 Fisher for MSE and softmax cross-entropy;
    * fisher="mc": gradients at labels sampled from the model's likelihood (`mc_samples`
      of them; MSE -> Gaussian, (Sparse)CategoricalCrossentropy(from_logits=True) ->
      categorical);
    * fisher="empirical": gradients at the true labels.
  Weight sharing (Conv2D locations, a Dense applied to `[N, R, d]`) follows Eschenhagen
  et al. 2023: approx="expand" treats each of the R locations as an extra example
  (`A = mean over N*R of a a^T`, `G = sum over N, R`), approx="reduce" averages the
  inputs and sums the output gradients over the locations first. Without weight sharing
  (a Dense on `[N, d]`) both are the same.
- any other layer with trainable weights (BatchNormalization, LayerNormalization,
  Embedding, ...): `other_layers="raise"` (the default) refuses it, naming the layer;
  `other_layers="diagonal"` gives its variables the EXACT diagonal of the same
  Gauss-Newton/Fisher (per-example gradients, one vectorized Jacobian per batch).

The model runs in inference mode (`training=False`: BatchNorm uses its moving statistics,
Dropout is off). Layer inputs and pre-activations are captured by swapping the layer's
`call` and `activation` for recording wrappers during the forward pass (restored after it,
the weights are never touched); a layer called twice in one forward pass is an error.

`matvec`/`matmul` give `(approximation + damping * I) v`; `solve` the damped inverse (from
the factors' eigendecompositions, `damping > 0` required); `logdet()` its log-determinant;
`eigendecompositions` per layer `(evals_A, Q_A, evals_G, Q_G)`; `with_damping(d)` the same
factors with another damping (nothing recomputed). EK-FAC (George et al. 2018) keeps the
K-FAC eigenbasis `Q_A (x) Q_G` and replaces the eigenvalues `evals_A (x) evals_G` by the
exact diagonal of `(Q_A (x) Q_G)^T F (Q_A (x) Q_G)` for the same F (`corrected_eigenvalues`).
Eigenvalues of the factors below zero (round-off) are clipped to zero.

Evaluation (the same products, fewer flops): a factor built from fewer rows than its width
(A = a^T a over m < d_in layer inputs, G = g^T g likewise) is kept as those rows too, and
each layer's K-FAC matvec takes the cheapest of `(A V) G`, `a^T ((a V) G)`, `(A (V g^T)) g`
and through both, chosen by flop count. EK-FAC's matvec uses only the top min(m, d) eigenvectors
of each factor: the others span directions no example's gradient has (their corrected
eigenvalue is 0 in exact arithmetic), so they add just `damping * V` (not so for
approx="reduce" over shared locations, which keeps them all). `solve`, `logdet` and the
eigendecompositions use the full factors.

With `strategy=` (a `tf.distribute.Strategy`; `data` must then be a Dataset) each batch is
split over the replicas (`data.distribute_batches`): every replica computes the sums of
its shard (the factors' and diagonals' sums, the row and example counts, EK-FAC's correction
in the basis of the already reduced factors), the sums are all-reduced (`replica_sums`) and
divided by the global counts, so the factors equal one device's (the
rows are not gathered across replicas: products go through the dense factors and every
eigenvector); a shard may be uneven or
empty. fisher="mc" folds the replica id into the sampling key (as `FisherOperator`): the
sampled labels, hence the factors, differ from one device's draw, with the same expectation.
"""

import contextlib
import functools
import itertools
import math
import numbers

import keras
import numpy as np
import tensorflow as tf

from hogrod.curvature.data import (MEAN_REDUCTIONS, batch_loss, check_loss_dtype,
                                   data_batches, fold_replica, replica_sums)
from hogrod.curvature.likelihood import likelihood_of

__all__ = ["KFACOperator", "EKFACOperator"]

FISHERS = ("type2", "mc", "empirical")
APPROXES = ("expand", "reduce")
OTHER_LAYERS = ("raise", "diagonal")


# ----------------------------------------------------------------------------- blocks

def _leaf_layers(layer):
    """Leaf layers in order (nested models are walked)."""
    out = []
    for sub in getattr(layer, "layers", []):
        out.extend(_leaf_layers(sub) if getattr(sub, "layers", None) is not None else [sub])
    return out


def _factorable(layer):
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


class _Block:
    def __init__(self, kind, layer, indices, shapes):
        self.kind, self.layer, self.name = kind, layer, layer.name
        self.indices, self.shapes = indices, shapes
        if kind == "kfac":
            kernel = shapes[0]
            self.d_out = int(kernel[-1])
            self.d_in_kernel = int(np.prod(kernel[:-1]))
            self.has_bias = len(indices) == 2
            self.d_in = self.d_in_kernel + int(self.has_bias)


def _blocks(model, other_layers, where):
    variables = list(model.trainable_variables)
    index = {id(v): i for i, v in enumerate(variables)}
    blocks, seen = [], set()
    for layer in _leaf_layers(model):
        vs = layer.trainable_variables
        if not vs:
            continue
        missing = [v.path for v in vs if id(v) not in index]
        if missing:
            raise ValueError(f"{where}: variables {missing} of layer '{layer.name}' are not in "
                             "model.trainable_variables")
        why = _factorable(layer)
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
        blocks.append(_Block("kfac" if why is None else "diag", layer, idx,
                             [tuple(v.shape) for v in vs]))
    rest = [variables[i].path for i in range(len(variables)) if i not in seen]
    if rest:
        raise ValueError(f"{where}: trainable variables {rest} belong to no leaf layer "
                         "(weights added to the model itself); K-FAC has no block for them")
    return blocks


# ---------------------------------------------------------------------------- capture

@contextlib.contextmanager
def _capture(layers, record):
    """Record each layer's call input ('a') and pre-activation ('s') in `record`."""
    patched = []

    def wrap(layer):
        call, activation = layer.call, layer.activation

        def call_(inputs, *args, **kwargs):
            if layer.name in record:
                raise ValueError(f"KFACOperator: layer '{layer.name}' is called more than once "
                                 "in one forward pass; K-FAC factors one call per layer")
            record[layer.name] = {"a": inputs}
            return call(inputs, *args, **kwargs)

        def activation_(x):
            x = tf.identity(x)  # a tensor of its own, to differentiate the output with respect to
            record[layer.name]["s"] = x
            return activation(x)
        # object.__setattr__: Keras's attribute tracking has nothing to track here
        object.__setattr__(layer, "call", call_)
        object.__setattr__(layer, "activation", activation_)
        patched.append((layer, activation))

    try:
        for layer in layers:
            wrap(layer)
        yield record
    finally:
        for layer, activation in patched:
            del layer.__dict__["call"]
            object.__setattr__(layer, "activation", activation)


def _trailing(t, start):
    """The product of t's dimensions from `start` on, static where known (later code reads
    static shapes): reshapes spell it out, since -1 cannot be inferred for an empty batch (a
    replica's empty shard)."""
    dims = t.shape[start:]
    if dims.is_fully_defined():
        return int(np.prod(dims))
    return tf.reduce_prod(tf.shape(t)[start:])


def _rows(block, a, g):
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
    a = tf.reshape(a, [n, _trailing(a, 1) // block.d_in_kernel, block.d_in_kernel])
    if block.has_bias:
        a = tf.concat([a, tf.ones_like(a[..., :1])], axis=-1)
    g = tf.reshape(g, [tf.shape(g)[0], n, _trailing(g, 2) // block.d_out, block.d_out])
    return a, g


# --------------------------------------------------------------------- output gradients

def _without_rows(stats):
    """(sums, rows, count) -> (sums, count): what `replica_sums` can reduce."""
    sums, _, count = stats
    return sums, count


def _cotangents(loss, fisher, likelihood, mc_samples, seed, y, z):
    """[C, N, K] output cotangents (K = size of one example's output) whose outer products
    summed over C give each example's curvature of L (the 1/N of the mean included)."""
    n = tf.shape(z)[0]
    z = tf.stop_gradient(z)
    k = _trailing(z, 1)
    flat = tf.reshape(z, [n, k])
    root_n = tf.sqrt(tf.cast(n, z.dtype))

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


def _backward(tape, z, sources, cot):
    """[C, N, ...] gradients of `z` with respect to each source, for the C cotangents: one
    backward pass per column (a few), or one vectorized pass (pfor) for many columns, whose
    conversion costs more to trace than it saves for a few."""
    columns = cot.shape[0]
    if columns is not None and columns <= _LOOP_COLUMNS:
        grads = [tape.gradient(z, sources, output_gradients=tf.reshape(cot[c], tf.shape(z)))
                 for c in range(columns)]
        return [tf.stack([g[i] for g in grads]) for i in range(len(sources))]
    return tf.vectorized_map(lambda c: tape.gradient(
        z, sources, output_gradients=tf.reshape(c, tf.shape(z))), cot)


_LOOP_COLUMNS = 4


# ------------------------------------------------------------------------- statistics

def _check_number(value, name, where):
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating)):
        raise TypeError(f"{where}: {name} must be a Python number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {name} must be finite and >= 0, got {value}")
    return float(value)


def _kron_plan(d_in, d_out, m_a, m_g):
    """The cheapest evaluation of `A V G` (V [d_in, d_out]) in flops: "dense" `(A V) G`,
    "a" `a^T ((a V) G)` through A's m_a rows (A = a^T a), "g" `(A (V g^T)) g` through G's,
    "ag" through both; a side without rows (None) cannot use them."""
    costs = {"dense": 2 * d_in * d_out * (d_in + d_out)}
    if m_a is not None:
        costs["a"] = 2 * m_a * d_out * (2 * d_in + d_out)
    if m_g is not None:
        costs["g"] = 2 * m_g * d_in * (2 * d_out + d_in)
    if m_a is not None and m_g is not None:
        costs["ag"] = 4 * m_a * d_out * (d_in + m_g)
    return min(costs, key=costs.get)


def _count(rows):
    return None if rows is None else int(rows.shape[0])


def _damped(product, v, damping):
    return product if damping is None else product + damping * v


# `A V G (+ damping V)` by plan (`_kron_plan`), factors as (A or a rows, G or g rows)
_KRON = {
    "dense": lambda f, v, damping: _damped(tf.matmul(f[0], v) @ f[1], v, damping),
    "a": lambda f, v, damping: _damped(
        tf.matmul(f[0], tf.matmul(f[0], v) @ f[1], transpose_a=True), v, damping),
    "g": lambda f, v, damping: _damped(
        tf.matmul(f[0] @ tf.matmul(v, f[1], transpose_b=True), f[1]), v, damping),
    "ag": lambda f, v, damping: _damped(tf.matmul(
        f[0], tf.matmul(tf.matmul(f[0] @ v, f[1], transpose_b=True), f[1]), transpose_a=True),
        v, damping),
}


class _Factors:
    """Everything shared between operators that differ only in damping."""

    def __init__(self, model, loss, data, fisher, approx, mc_samples, seed, other_layers,
                 eigen_corrected, where, strategy=None):
        if not isinstance(model, keras.Model) or not model.built:
            raise ValueError(f"{where}: model must be a built keras.Model, got {model!r}")
        if not callable(loss):
            raise TypeError(f"{where}: loss must be callable as loss(y_true, y_pred), got "
                            f"{type(loss).__name__}")
        for value, name, allowed in ((fisher, "fisher", FISHERS), (approx, "approx", APPROXES),
                                     (other_layers, "other_layers", OTHER_LAYERS)):
            if value not in allowed:
                raise ValueError(f"{where}: {name} must be one of {allowed}, got {value!r}")
        if isinstance(mc_samples, bool) or not isinstance(mc_samples, int) or mc_samples < 1:
            raise ValueError(f"{where}: mc_samples must be an int >= 1, got {mc_samples!r}")
        batches = data_batches(data, where, strategy, pair=True)  # before work on the model
        variables = model.trainable_variables
        if not variables:
            raise ValueError(f"{where}: model '{model.name}' has no trainable variables")
        dtypes = {tf.as_dtype(v.dtype) for v in variables}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating:
            raise TypeError(f"{where}: the model's trainable variables must share one floating "
                            f"dtype, got {sorted(d.name for d in dtypes)}")
        self.dtype = next(iter(dtypes))
        check_loss_dtype(loss, self.dtype, where)
        likelihood = likelihood_of(loss, where)[0] if fisher == "mc" else None
        if fisher != "type2" and isinstance(loss, keras.losses.Loss) \
                and loss.reduction not in MEAN_REDUCTIONS:
            raise ValueError(f"{where}: fisher={fisher!r} needs a mean-reduced loss "
                             f"(reduction='sum_over_batch_size'), got {loss.reduction!r}")
        self.blocks = _blocks(model, other_layers, where)
        self.sizes = [int(np.prod(v.shape)) for v in variables]
        self.n = sum(self.sizes)
        self.approx, self.where = approx, where
        self._model, self._loss, self._fisher = model, loss, fisher
        self._likelihood, self._mc_samples, self._seed = likelihood, mc_samples, seed
        self._strategy = strategy
        self._batches = batches
        self._eigen_corrected = eigen_corrected
        self._stats = self._correction_stats = None
        self.compiled = {}  # the operators' products, shared by every damping
        self.refresh()

    def refresh(self):
        """Recompute everything at the model's current weights (compiled code reused)."""
        self._compute_factors()
        self._eigen = self._top = None
        self.corrected = None
        if self._eigen_corrected:
            self._correct()

    # one compiled pass per batch; the statistics are sums, divided once at the end
    def _forward(self, batch, index):
        x, y = batch
        kfac = [b for b in self.blocks if b.kind == "kfac"]
        diag = [b for b in self.blocks if b.kind == "diag"]
        with tf.GradientTape(persistent=True) as tape:
            with _capture([b.layer for b in kfac], {}) as record:
                z = self._model(x, training=False)
            seed = fold_replica(tf.stack([tf.cast(self._seed, tf.int64),
                                          tf.cast(index, tf.int64)]))
            cot = _cotangents(self._loss, self._fisher, self._likelihood, self._mc_samples,
                              seed, y, z)
            if diag:  # per-example, per-column output projections for the exact diagonal
                cot_ = tf.stop_gradient(cot)
                targets = tf.einsum("nk,cnk->cn", tf.reshape(z, [tf.shape(z)[0], _trailing(z, 1)]),
                                    cot_)
        s = [record[b.name]["s"] for b in kfac]
        grads = _backward(tape, z, s, cot) if kfac else []
        out = {}
        for i, b in enumerate(kfac):
            out[b.name] = _rows(b, record[b.name]["a"], grads[i])
        for b in diag:
            variables = b.layer.trainable_variables
            jac = tape.jacobian(targets, variables, experimental_use_pfor=True)
            out[b.name] = [tf.reduce_sum(tf.square(j), axis=[0, 1]) for j in jac]
        del tape
        return out, tf.cast(tf.shape(z)[0], self.dtype)

    def _compute_factors(self):
        expand = self.approx == "expand"

        def stats(batch, index):
            out, n = self._forward(batch, index)
            result, rows = {}, {}
            for b in self.blocks:
                if b.kind == "diag":
                    result[b.name] = [n * d for d in out[b.name]]
                    continue
                a, g = out[b.name]
                if expand:
                    a2 = tf.reshape(a, [-1, b.d_in])
                    g2 = tf.reshape(g, [-1, b.d_out])
                    count = tf.cast(tf.shape(a2)[0], self.dtype)
                else:
                    a2 = tf.reduce_mean(a, axis=1)
                    g2 = tf.reshape(tf.reduce_sum(g, axis=2), [-1, b.d_out])
                    count = n
                result[b.name] = [tf.matmul(a2, a2, transpose_a=True), count,
                                  n * tf.matmul(g2, g2, transpose_a=True)]
                rows[b.name] = (a2, g2, tf.shape(a)[1])
            return result, rows, n

        if self._stats is None:
            # the rows stay on their replica: under a strategy only the sums are reduced
            self._stats = (tf.function(stats, reduce_retracing=True) if self._strategy is None
                           else replica_sums(lambda *a: _without_rows(stats(*a)),
                                             self._strategy))
        totals, count = None, tf.zeros([], self.dtype)
        kept = {b.name: ([], []) for b in self.blocks if b.kind == "kfac"}
        shapes = {b.name: [0, 0, 1] for b in self.blocks if b.kind == "kfac"}  # rows, locations
        for index, batch in enumerate(self._batches):
            out = self._stats(batch, tf.constant(index, tf.int64))
            part, rows, n = out if self._strategy is None else (out[0], None, out[1])
            totals = part if totals is None else tf.nest.map_structure(tf.add, totals, part)
            count += n
            for b in self.blocks:
                if b.kind == "kfac" and rows is None:
                    shapes[b.name][:] = [b.d_in, b.d_out, 2]  # all eigenvectors, no rows
                elif b.kind == "kfac":
                    self._keep_rows(b, rows[b.name], n, kept[b.name], shapes[b.name])
        if totals is None:
            raise ValueError(f"{self.where}: data is an empty tf.data.Dataset")
        self.A, self.G, self.diag, self.rows, self.rank = {}, {}, {}, {}, {}
        for b in self.blocks:
            t = totals[b.name]
            if b.kind == "diag":
                self.diag[b.name] = [d / count for d in t]
                continue
            self.A[b.name], self.G[b.name] = t[0] / t[1], t[2] / count
            (a_rows, g_rows), (m_a, m_g, locations) = kept[b.name], shapes[b.name]
            # A = a^T a / t[1] and G = g^T g / count over the rows that built them: products
            # with the rows in place of a factor are cheaper where the rows are few
            self.rows[b.name] = (
                tf.concat(a_rows, 0) / tf.sqrt(t[1]) if a_rows else None,
                tf.concat(g_rows, 0) / tf.sqrt(count) if g_rows else None)
            # Eigenvectors of A outside the span of the rows that built it have eigenvalue 0,
            # and an example's gradient has no component along them either (its a_r lie in
            # that span) unless approx="reduce" averaged the a_r over shared locations: there
            # EK-FAC's corrected eigenvalue is 0 too, so only the top min(rows, d) of each
            # factor's eigenvectors carry the product (the same for G).
            exact = expand or locations == 1
            self.rank[b.name] = (min(m_a, b.d_in) if exact else b.d_in,
                                 min(m_g, b.d_out) if exact else b.d_out)

    @staticmethod
    def _keep_rows(block, rows, n, kept, shape):
        """Keep a batch's factor rows, scaled so that their products sum to the factor, while
        they are fewer than the factor's width (only then can a product through them be
        cheaper, and they take less memory than the factor)."""
        a2, g2, locations = rows
        shape[0] += int(a2.shape[0])
        shape[1] += int(g2.shape[0])
        shape[2] = max(shape[2], int(locations))
        for i, (x, scale, d) in enumerate(((a2, None, block.d_in), (g2, n, block.d_out))):
            if shape[i] < d:
                kept[i].append(x if scale is None else tf.sqrt(scale) * x)
            else:
                kept[i].clear()

    def _accumulate(self, fn, *args):
        totals, count = None, tf.zeros([], self.dtype)
        for index, batch in enumerate(self._batches):
            part, n = fn(batch, tf.constant(index, tf.int64), *args)
            totals = part if totals is None else tf.nest.map_structure(tf.add, totals, part)
            count += n
        if totals is None:
            raise ValueError(f"{self.where}: data is an empty tf.data.Dataset")
        return totals, count

    @property
    def eigen(self):
        if self._eigen is None:
            with tf.init_scope():  # eager even when first asked for inside a tf.function
                self._eigen = self._eigendecompose()
        return self._eigen

    @property
    def top(self):
        """{layer name: (Q_A, Q_G, corrected eigenvalues)} restricted to the eigenvectors the
        corrected eigenvalues can weigh (`rank`), sliced once per refresh, not per product."""
        if self._top is None:
            with tf.init_scope():
                self._top = {}
                for b in self.blocks:
                    if b.kind == "kfac":
                        _, qa, _, qg = self.eigen[b.name]
                        i, o = b.d_in - self.rank[b.name][0], b.d_out - self.rank[b.name][1]
                        self._top[b.name] = (qa[:, i:], qg[:, o:], self.corrected[b.name][i:, o:])
        return self._top

    def _eigendecompose(self):
        eigen = {}
        for b in self.blocks:
            if b.kind == "kfac":
                ea, qa = tf.linalg.eigh(self.A[b.name])
                eg, qg = tf.linalg.eigh(self.G[b.name])
                eigen[b.name] = (tf.maximum(ea, 0.0), qa, tf.maximum(eg, 0.0), qg)
        return eigen

    def _correct(self):
        """EK-FAC: the exact diagonal of the curvature in the K-FAC eigenbasis, from each
        example's (and output column's) gradient sum_r a_r g_r^T."""
        kfac = [b for b in self.blocks if b.kind == "kfac"]

        def stats(batch, index, eigen):
            out, n = self._forward(batch, index)
            result = {}
            for b in kfac:
                a, g = out[b.name]
                _, qa, _, qg = eigen[b.name]
                a = tf.einsum("nri,ij->nrj", a, qa)
                g = tf.einsum("cnro,op->cnrp", g, qg)
                if a.shape[1] == 1:  # no weight sharing: (a g^T)^2 = a^2 (g^2)^T
                    total = tf.matmul(tf.square(a[:, 0]),
                                      tf.reduce_sum(tf.square(g[:, :, 0]), axis=0),
                                      transpose_a=True)
                else:
                    total = tf.reduce_sum(tf.square(tf.einsum("nri,cnro->cnio", a, g)),
                                          axis=[0, 1])
                result[b.name] = n * total
            return result, n

        if self._correction_stats is None:
            self._correction_stats = replica_sums(stats, self._strategy)
        totals, count = self._accumulate(self._correction_stats, self.eigen)
        self.corrected = {name: t / count for name, t in totals.items()}


class _Kronecker(tf.linalg.LinearOperator):
    _eigen_corrected = False

    def __init__(self, model, loss, data, fisher="type2", approx="expand", damping=0.0, *,
                 mc_samples=1, seed=0, other_layers="raise", strategy=None):
        where = type(self).__name__
        damping = _check_number(damping, "damping", where)
        factors = _Factors(model, loss, data, fisher, approx, mc_samples, seed, other_layers,
                           self._eigen_corrected, where, strategy)
        self._setup(factors, damping)

    def _setup(self, factors, damping):
        self._f = factors
        self.damping = damping
        self._damping_t = tf.constant(damping, factors.dtype)
        self._apply = factors.compiled
        super().__init__(dtype=factors.dtype, is_self_adjoint=True, is_square=True,
                         is_positive_definite=True if damping > 0 else None,
                         name=type(self).__name__)

    def with_damping(self, damping):
        """The same factors (nothing recomputed) with another damping."""
        op = object.__new__(type(self))
        op._setup(self._f, _check_number(damping, "damping", type(self).__name__))
        return op

    @property
    def eigendecompositions(self):
        """{layer name: (evals_A, Q_A, evals_G, Q_G)} for the factored layers; A = Q_A
        diag(evals_A) Q_A^T over [kernel rows..., bias] inputs, G over output units."""
        return dict(self._f.eigen)

    @property
    def factors(self):
        """{layer name: (A, G)} for the factored layers."""
        return {name: (self._f.A[name], self._f.G[name]) for name in self._f.A}

    @property
    def diagonals(self):
        """{layer name: [exact diagonal per variable]} for other_layers='diagonal' layers."""
        return dict(self._f.diag)

    def refresh(self):
        """Recompute the factors (and eigenbases, corrections) at the model's current weights;
        every operator sharing them (`with_damping`) sees the new ones."""
        self._f.refresh()
        return self

    def _shape(self):
        return tf.TensorShape([self._f.n, self._f.n])

    def _shape_tensor(self):
        return tf.constant([self._f.n, self._f.n])

    # The compiled products take the factors as arguments, never as captured constants,
    # so `refresh` needs no retrace and cannot leave stale values in a graph. What the
    # trace depends on besides shapes (the plan: how each block's product is evaluated, and
    # whether a damping is added) keys the compiled function.
    def _state(self, kind):
        """(per-block factors, diagonals) for the compiled product, and its plan."""
        f = self._f
        if kind == "matmul" and not self._eigen_corrected:
            blocks, plan = {}, []
            for b in f.blocks:
                if b.kind == "kfac":
                    a_rows, g_rows = f.rows[b.name]
                    how = _kron_plan(b.d_in, b.d_out, _count(a_rows), _count(g_rows))
                    blocks[b.name] = (a_rows if "a" in how else f.A[b.name],
                                      g_rows if "g" in how else f.G[b.name])
                    plan.append(how)
        elif kind == "matmul":  # EK-FAC: only the eigenvectors its eigenvalues can weigh
            blocks, plan = f.top, ["top"]
        else:
            blocks, plan = {name: (qa, qg, self._eigenvalues(name))
                            for name, (_, qa, _, qg) in f.eigen.items()}, []
        return (blocks, f.diag), (kind, self.damping > 0) + tuple(plan)

    def _blockwise(self, rows, state, kfac_fns, diag_fn):
        """rows: [m, n] flat vectors -> [m, n], block by block (`kfac_fns` one per factored
        block, in order, taking (factors, v [..., d_in, d_out])). One vector (m == 1 when
        traced) runs plain matrix products, several a batch of them."""
        blocks, diags = state
        pieces = tf.split(rows, self._f.sizes, axis=1)
        m = tf.shape(rows)[0]
        lead = [] if rows.shape[0] == 1 else [m]
        out = list(pieces)
        kfac_fns = iter(kfac_fns)
        for b in self._f.blocks:
            if b.kind == "diag":
                for i, d in zip(b.indices, diags[b.name]):
                    out[i] = diag_fn(pieces[i], tf.reshape(d, [-1]))
                continue
            v = tf.reshape(pieces[b.indices[0]], lead + [b.d_in_kernel, b.d_out])
            if b.has_bias:
                v = tf.concat([v, tf.reshape(pieces[b.indices[1]], lead + [1, b.d_out])],
                              axis=-2)
            v = next(kfac_fns)(blocks[b.name], v)
            out[b.indices[0]] = tf.reshape(v[..., :b.d_in_kernel, :], [m, -1])
            if b.has_bias:
                out[b.indices[1]] = tf.reshape(v[..., b.d_in_kernel, :], [m, -1])
        return tf.concat(out, axis=1)

    def _compiled(self, plan):
        if plan not in self._apply:
            fn = {"matmul": self._matmul_rows, "solve": self._solve_rows}[plan[0]]
            self._apply[plan] = tf.function(functools.partial(fn, plan=plan),
                                            reduce_retracing=True)
        return self._apply[plan]

    def _columns(self, kind, x, adjoint_arg):
        x = tf.convert_to_tensor(x, self.dtype)
        x = tf.linalg.adjoint(x) if adjoint_arg else x
        state, plan = self._state(kind)
        fn = self._compiled(plan)
        if x.shape.rank != 2:  # batch dimensions: fold them
            shape = tf.shape(x)
            flat = tf.reshape(tf.linalg.matrix_transpose(x), [-1, self._f.n])
            out = fn(flat, self._damping_t, state)
            t = tf.reshape(out, tf.concat([shape[:-2], shape[-1:], shape[-2:-1]], 0))
            return tf.linalg.matrix_transpose(t)
        return tf.transpose(fn(tf.transpose(x), self._damping_t, state))

    def _matvec(self, x, adjoint=False):
        if x.shape.rank != 1:
            return super()._matvec(x, adjoint=adjoint)
        state, plan = self._state("matmul")  # one row: no transposes, one compiled call
        return tf.reshape(self._compiled(plan)(x[None], self._damping_t, state), [-1])

    def _matmul(self, x, adjoint=False, adjoint_arg=False):
        return self._columns("matmul", x, adjoint_arg)

    def _solve(self, rhs, adjoint=False, adjoint_arg=False):
        self._require_damping("solve")
        return self._columns("solve", rhs, adjoint_arg)

    def _require_damping(self, what):
        if not self.damping > 0:
            raise ValueError(f"{type(self).__name__}.{what}: needs damping > 0 (the factors are "
                             f"singular in general); got damping={self.damping}. Use "
                             "with_damping(d) for an operator with the same factors")

    def matvec_flat(self, vector):
        """The product with one flat vector of length n."""
        return self.matvec(tf.convert_to_tensor(vector, self.dtype))

    def logdet(self):
        """log det(approximation + damping I) (damping > 0)."""
        self._require_damping("logdet")
        d = self._damping_t
        total = tf.zeros([], self.dtype)
        for b in self._f.blocks:
            values = self._f.diag[b.name] if b.kind == "diag" else [self._eigenvalues(b.name)]
            for v in values:
                total += tf.reduce_sum(tf.math.log(v + d))
        return total

    def _log_abs_determinant(self):
        return self.logdet()

    def _to_dense(self):
        return self._matmul(tf.eye(self._f.n, dtype=self.dtype))

    @staticmethod
    def _rotate(block, v, fn):  # Q fn(Q^T v) for Q = Q_A (x) Q_G, on row-major [d_in, d_out]
        qa, qg, values = block  # [d_in, r_a], [d_out, r_g]: r < d where only the top are kept
        (i, ra), (o, rg) = qa.shape, qg.shape
        # each side's pair of products in the cheaper order (flops; shapes static when traced
        # once, else the left-first order); transpose flags, no transposed copies
        left_first = None in (i, ra, o, rg) or ra * i * o + ra * o * rg <= i * o * rg + ra * i * rg
        w = (tf.matmul(tf.matmul(qa, v, transpose_a=True), qg) if left_first else
             tf.matmul(qa, tf.matmul(v, qg), transpose_a=True))
        w = fn(w, values)
        left_first = None in (i, ra, o, rg) or i * ra * rg + i * rg * o <= ra * rg * o + i * ra * o
        return (tf.matmul(tf.matmul(qa, w), qg, transpose_b=True) if left_first else
                tf.matmul(qa, tf.matmul(w, qg, transpose_b=True)))

    def _solve_rows(self, rows, d, state, plan):
        return self._blockwise(rows, state, itertools.repeat(lambda blk, v: self._rotate(
            blk, v, lambda w, values: w / (values + d))), lambda v, diag: v / (diag + d))


class KFACOperator(_Kronecker):
    """K-FAC: `A (x) G` per Dense / Conv2D layer (+ damping * I); see the module docstring.

    Args:
      model: a built Keras 3 model.
      loss: a Keras loss `loss(y_true, y_pred)`; the objective is `mean(loss(y, model(x)))`.
      data: one `(x, y)` batch or a `tf.data.Dataset` of them.
      fisher: "type2" | "mc" | "empirical".
      approx: "expand" | "reduce" (weight-sharing layers, Eschenhagen et al. 2023).
      damping: added to the diagonal (>= 0; `solve`/`logdet` need > 0).
      mc_samples, seed: the sampled labels of fisher="mc".
      other_layers: "raise" | "diagonal" for layers with weights K-FAC does not factor.
      strategy: a tf.distribute.Strategy to split each batch of `data` (a Dataset) over;
        `refresh` recomputes under it too.
    """

    def _eigenvalues(self, name):
        ea, _, eg, _ = self._f.eigen[name]
        return ea[:, None] * eg[None, :]

    def _matmul_rows(self, rows, d, state, plan):
        _, damped, *hows = plan
        kron = [functools.partial(_KRON[how], damping=d if damped else None) for how in hows]
        return self._blockwise(rows, state, kron, lambda v, diag: (diag + d) * v)


class EKFACOperator(_Kronecker):
    """EK-FAC (George et al. 2018): K-FAC's eigenbasis with the eigenvalues replaced by the
    exact diagonal of the curvature in that basis (`corrected_eigenvalues`). Same arguments
    as `KFACOperator`."""

    _eigen_corrected = True

    @property
    def corrected_eigenvalues(self):
        """{layer name: [d_in, d_out] eigenvalues for the basis vectors Q_A[:, i] (x) Q_G[:, j]}."""
        return dict(self._f.corrected)

    def _eigenvalues(self, name):
        return self._f.corrected[name]

    def _matmul_rows(self, rows, d, state, plan):
        # Q (S + d) Q^T v = Q S Q^T v + d v: the eigenvectors left out (their S is 0) add d v
        def block(blk, v):
            w = self._rotate(blk, v, lambda w, values: w * values)
            return w + d * v if plan[1] else w
        return self._blockwise(rows, state, itertools.repeat(block),
                               lambda v, diag: (diag + d) * v)
