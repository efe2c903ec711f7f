"""Kronecker algebra of K-FAC: the factors `A (x) G` per layer (computed over data, kept
as rows where fewer than their width), their eigendecompositions and EK-FAC's corrected
eigenvalues (`KroneckerFactors`), and the products with them chosen by flop count
(`kron_plan`, `KRON_PRODUCTS`, `rotate`). The operators are in `kfac.py`.
"""

from typing import Callable, Tuple

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import (MEAN_REDUCTIONS, accumulate, check_loss_dtype,
                                   compile_closure, data_batches, fold_replica, replica_sums)
from hogrod.curvature.kfac_capture import (layer_blocks, layer_statistics, output_cotangents,
                                           param_blocks, without_rows)
from hogrod.curvature.likelihood import likelihood_of

__all__ = ["FISHERS", "APPROXES", "OTHER_LAYERS", "KroneckerFactors", "kron_plan",
           "KRON_PRODUCTS", "row_count", "rotate"]

FISHERS = ("type2", "mc", "empirical")
APPROXES = ("expand", "reduce")
OTHER_LAYERS = ("raise", "diagonal")


def kron_plan(d_in, d_out, m_a, m_g):
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


def row_count(rows):
    return None if rows is None else int(rows.shape[0])


def _damped(product, v, damping):
    return product if damping is None else product + damping * v


# `A V G (+ damping V)` by plan (`kron_plan`), factors as (A or a rows, G or g rows)
KRON_PRODUCTS = {
    "dense": lambda f, v, damping: _damped(tf.matmul(f[0], v) @ f[1], v, damping),
    "a": lambda f, v, damping: _damped(
        tf.matmul(f[0], tf.matmul(f[0], v) @ f[1], transpose_a=True), v, damping),
    "g": lambda f, v, damping: _damped(
        tf.matmul(f[0] @ tf.matmul(v, f[1], transpose_b=True), f[1]), v, damping),
    "ag": lambda f, v, damping: _damped(tf.matmul(
        f[0], tf.matmul(tf.matmul(f[0] @ v, f[1], transpose_b=True), f[1]), transpose_a=True),
        v, damping),
}


class KroneckerFactors:
    """Everything shared between operators that differ only in damping."""

    def __init__(self, model, loss, data, fisher, approx, mc_samples, seed, other_layers,
                 eigen_corrected, where, strategy=None, params=None):
        if not isinstance(model, keras.Model) or not model.built:
            raise ValueError(f"{where}: model must be a built keras.Model, got {model!r}")
        if not callable(loss):
            raise TypeError(f"{where}: loss must be callable as loss(y_true, y_pred), got "
                            f"{type(loss).__name__}")
        for value, name, allowed in ((fisher, "fisher", FISHERS), (approx, "approx", APPROXES),
                                     (other_layers, "other_layers", OTHER_LAYERS)):
            checks.choice(value, allowed, name, where)
        mc_samples = checks.integer(mc_samples, "mc_samples", where, least=1)
        seed = checks.seed(seed, "seed", where)
        batches = data_batches(data, where, strategy, pair=True)  # before work on the model
        variables = (model.trainable_variables if params is None
                     else checks.params(params, where))
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
        self.blocks = (layer_blocks(model, other_layers, where) if params is None
                       else param_blocks(model, variables, where))
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
        seed = fold_replica(tf.stack([tf.cast(self._seed, tf.int64), tf.cast(index, tf.int64)]))
        out, z = layer_statistics(
            lambda: self._model(x, training=False), self.blocks,
            lambda z: output_cotangents(self._loss, self._fisher, self._likelihood,
                                        self._mc_samples, seed, y, z))
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
            self._stats = (compile_closure(stats) if self._strategy is None
                           else replica_sums(lambda *a: without_rows(stats(*a)),
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
        totals, count = accumulate(self._correction_stats, self._batches, self.where, self.eigen)
        self.corrected = {name: t / count for name, t in totals.items()}


def rotate(block: Tuple[tf.Tensor, tf.Tensor, tf.Tensor], v: tf.Tensor,
           fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]) -> tf.Tensor:
    """Q fn(Q^T v, values) for Q = Q_A (x) Q_G, on a row-major [d_in, d_out] matrix v.

    Args:
      block: (Q_A [d_in, r_a], Q_G [d_out, r_g], values [r_a, r_g]); r < d where only the
        top eigenvectors are kept.
      v: a [..., d_in, d_out] tensor.
      fn: `fn(w, values)` applied in the eigenbasis.

    Returns:
      A tensor shaped like v.
    """
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
