"""The per-layer algebra of the K-FAC optimizer (`kfac.py`): a batch's Kronecker factors
from the captured rows, their running average, the pi-corrected factored damping and its
inverses, the preconditioned gradient, and the exact Gauss-Newton quadratic model of a few
directions.

A factored layer (Dense, Conv2D) with kernel [.., d_out] and bias has curvature block
A (x) G, A = E[a a^T] over its inputs a (a ones entry last for the bias), G = E[g g^T] over
the output cotangents g of its pre-activations (`hogrod.curvature.kfac_capture`). Its
gradient, written V [d_in, d_out] (the kernel's rows, then the bias row), is preconditioned
by Martens and Grosse's (2015, section 6.3) factored Tikhonov damping:

    (A + pi sqrt(d) I)^-1 V (G + sqrt(d) / pi I)^-1,  pi = sqrt((tr A / d_in) / (tr G / d_out)),

d the damping (kfac-jax's `pi_adjusted_kronecker_inverse`; where a factor's trace is 0,
both are sqrt(d) I, as kfac-jax's).
"""

from typing import List, Sequence

import keras
import tensorflow as tf

from hogrod.curvature.data import batch_loss
from hogrod.functional import functional_call
from hogrod.types import Loss, Tensor

__all__ = ["batch_factors", "running_average", "damped_inverses", "as_matrix", "from_matrix",
           "precondition", "quadratic_form"]


def batch_factors(block, rows, dtype: tf.DType):
    """A batch's factors (A, G) of one block from `layer_rows`' (a, g), at `dtype`.

    A averages a a^T over examples and locations; G sums the cotangents' g g^T (they carry
    the mean's 1/N, `output_cotangents`), over locations too (hogrod's "expand" K-FAC).

    Args:
      block: the layer's `Block`.
      rows: `(a [N, R, d_in], g [C, N, R, d_out])`.
      dtype: the factors' dtype (float32 at least).

    Returns:
      `(A [d_in, d_in], G [d_out, d_out])`.
    """
    a, g = rows
    a = tf.cast(tf.reshape(a, [-1, block.d_in]), dtype)
    g = tf.cast(tf.reshape(g, [-1, block.d_out]), dtype)
    count = tf.cast(tf.shape(a)[0], dtype)
    return tf.matmul(a, a, transpose_a=True) / count, tf.matmul(g, g, transpose_a=True)


def running_average(old: Tensor, new: Tensor, weight: Tensor) -> tf.Tensor:
    """kfac-jax's weighted moving average: `(1 - 1/w) old + new / w`, w the running weight
    after this step (`decay * w_before + 1`, w_before = 0 first: the first average is the
    first batch's, no prior and no bias toward zero).

    Args:
      old: the average so far.
      new: this step's value.
      weight: the running weight after this step (>= 1).

    Returns:
      The new average.
    """
    eta = 1 / tf.cast(weight, old.dtype)
    return (1 - eta) * old + eta * new


def damped_inverses(a: Tensor, g: Tensor, damping: Tensor):
    """The inverses of the pi-corrected damped factors (module docstring).

    Args:
      a: A [d_in, d_in].
      g: G [d_out, d_out].
      damping: the damping d (the step's damping plus `l2_reg`), a scalar of their dtype.

    Returns:
      `((A + pi sqrt(d) I)^-1, (G + sqrt(d) / pi I)^-1)`.
    """
    norm_a = tf.linalg.trace(a) / a.shape[0]
    norm_g = tf.linalg.trace(g) / g.shape[0]
    one = tf.ones([], a.dtype)
    regular = tf.logical_and(norm_a > 0, norm_g > 0)
    pi = tf.where(regular, tf.sqrt(norm_a / tf.where(regular, norm_g, one)), one)
    root = tf.sqrt(damping)
    eye_a, eye_g = tf.eye(a.shape[0], dtype=a.dtype), tf.eye(g.shape[0], dtype=g.dtype)
    a = tf.where(regular, a, tf.zeros_like(a)) + pi * root * eye_a
    g = tf.where(regular, g, tf.zeros_like(g)) + root / pi * eye_g
    return _psd_inverse(a), _psd_inverse(g)


def _psd_inverse(m):
    """M^-1 of a symmetric positive definite M by its Cholesky factor (as kfac-jax's
    `psd_inv`), symmetrized against rounding."""
    inv = tf.linalg.cholesky_solve(tf.linalg.cholesky(m), tf.eye(m.shape[0], dtype=m.dtype))
    return 0.5 * (inv + tf.transpose(inv))


def as_matrix(block, values: Sequence[Tensor]) -> tf.Tensor:
    """A factored layer's [kernel, bias] tensors as one V [d_in, d_out] (the kernel's rows
    in `layer_rows`' order, then the bias row).

    Args:
      block: the layer's `Block`.
      values: its kernel-shaped and (with a bias) bias-shaped tensors.

    Returns:
      V.
    """
    v = tf.reshape(values[0], [block.d_in_kernel, block.d_out])
    if block.has_bias:
        v = tf.concat([v, tf.reshape(values[1], [1, block.d_out])], axis=0)
    return v


def from_matrix(block, v: Tensor) -> List[tf.Tensor]:
    """`as_matrix`'s inverse.

    Args:
      block: the layer's `Block`.
      v: V [d_in, d_out].

    Returns:
      The kernel-shaped and (with a bias) bias-shaped tensors.
    """
    out = [tf.reshape(v[:block.d_in_kernel], block.shapes[0])]
    if block.has_bias:
        out.append(tf.reshape(v[block.d_in_kernel], block.shapes[1]))
    return out


def precondition(blocks, grads: Sequence[Tensor], inverses: dict, dtype: tf.DType) -> list:
    """The preconditioned gradient, block by block.

    Args:
      blocks: the `Block`s; their indices are positions in `grads`.
      grads: the gradient, one tensor per variable.
      inverses: {name: (A^-1, G^-1)} of a factored block, {name: [1 / (diag + d)]} of a
        diagonal one.
      dtype: the factors' dtype (the gradient is cast to it and back).

    Returns:
      One tensor per variable, of the gradient's dtypes.
    """
    out = list(grads)
    for b in blocks:
        if b.kind == "diag":
            for i, inv in zip(b.indices, inverses[b.name]):
                out[i] = tf.cast(tf.cast(grads[i], dtype) * inv, grads[i].dtype)
            continue
        a_inv, g_inv = inverses[b.name]
        v = as_matrix(b, [tf.cast(grads[i], dtype) for i in b.indices])
        u = tf.matmul(a_inv, v) @ g_inv
        for i, t in zip(b.indices, from_matrix(b, u)):
            out[i] = tf.cast(t, grads[i].dtype)
    return out


def quadratic_form(model: keras.Model, loss: Loss, x, y, params: Sequence[Tensor],
                   vectors: Sequence[Sequence[Tensor]], dtype: tf.DType) -> tf.Tensor:
    """The Gauss-Newton matrix of the loss on this batch in the span of `vectors`:
    M_ij = v_i^T J^T H J v_j, J the model output's Jacobian and H the loss's Hessian in
    the output, from one forward-mode pass per vector (J v_i) and the output-space Hessian
    (kfac-jax's exact quadratic model). The model runs functionally (`functional_call`,
    `training=True`): its state is neither read for the weights nor written.

    Args:
      model: the model.
      loss: its Keras loss, at `dtype`.
      x: this replica's inputs.
      y: its labels.
      params: the model's trainable values, in `model.trainable_variables` order.
      vectors: directions, each one tensor per parameter.
      dtype: the dtype of the output-space algebra and of the result (float32 at least).

    Returns:
      M [k, k] on this replica's batch (the caller averages over replicas).
    """
    outputs = []
    for v in vectors:
        with tf.autodiff.ForwardAccumulator(params, list(v)) as acc:
            z = functional_call(model, params, x, training=True)
        outputs.append(tf.cast(acc.jvp(z, unconnected_gradients=tf.UnconnectedGradients.ZERO),
                               dtype))
    z = tf.cast(tf.stop_gradient(z), dtype)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch(z)
        with tf.GradientTape() as inner:
            inner.watch(z)
            value = batch_loss(loss, y, z)
        gz = inner.gradient(value, z)
        projections = [tf.reduce_sum(gz * u) for u in outputs]
    hu = [outer.gradient(p, z) for p in projections]  # H J v_j
    del outer
    k = len(vectors)
    rows = [[tf.reduce_sum(outputs[i] * hu[j]) for j in range(k)]
            for i in range(k)]
    m = tf.stack([tf.stack(r) for r in rows])
    return 0.5 * (m + tf.transpose(m))
