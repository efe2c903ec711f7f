"""Laplace posteriors, one class per structure of the curvature H (laplace-torch's
FullLaplace, DiagLaplace, KronLaplace); `hogrod.curvature.Laplace` chooses one. Each takes H
from the curvature operators: the type-2 Fisher (the Gauss-Newton matrix for these
likelihoods) of the SUMMED Keras loss, `FisherOperator` (dense) or `gauss_newton_diagonal`,
or the factors of `KFACOperator`, times `gauss_newton_scale`.
"""

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.fisher import FisherOperator, gauss_newton_diagonal
from hogrod.curvature.kfac import KFACOperator
from hogrod.curvature.laplace_base import BaseLaplace

__all__ = ["FullLaplace", "DiagLaplace", "KronLaplace", "KRON_BIASES"]

KRON_BIASES = ("joint", "separate")


class FullLaplace(BaseLaplace):
    """The Laplace posterior with the dense curvature H (n x n).

    H is kept with its eigendecomposition: the evidence and predictive at a scalar prior
    precision cost no factorization; a vector one takes a Cholesky factor.

    Made by `hogrod.curvature.Laplace` (hessian="full"); `fit(data)`, `log_likelihood`,
    `log_marginal_likelihood`, `optimize_prior_precision`, `predictive` (also the call),
    `output_jacobian`, `functional_variance` and the hyperparameters' properties are the
    shared `BaseLaplace`'s.

    Its constructor takes `hogrod.curvature.Laplace`'s arguments but `hessian` (`model`,
    `likelihood`, `subset`, `prior_precision`, `sigma_noise`, `prior_mean`, `strategy`),
    with the same meanings and checks.
    """

    hessian = "full"

    def _fit_curvature(self, data):
        op = FisherOperator(self._head, self._loss("sum"), data, fisher="type2",
                            strategy=self.strategy)
        gram = tf.cast(op.to_dense(), tf.float64) * self.gauss_newton_scale
        gram = 0.5 * (gram + tf.transpose(gram))
        evals, basis = tf.linalg.eigh(gram)
        # H is positive semi-definite: a negative eigenvalue is round-off
        self._evals, self._basis, self._gram = tf.maximum(evals, 0.0), basis, gram
        self.H = gram.numpy()

    @property
    def eigenvalues(self):
        """H's eigenvalues, float64 [n] (ascending)."""
        self._require_fit("eigenvalues")
        return self._evals

    def _cholesky(self, delta, factor):
        return tf.linalg.cholesky(factor * self._gram + tf.linalg.diag(delta))

    def _log_det(self, delta, factor):
        if delta.shape.rank == 0:
            return tf.reduce_sum(tf.math.log(factor * self._evals + delta))
        chol = self._cholesky(delta, factor)
        return 2 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol)))

    def _variance(self, jac, delta, factor):
        if delta.shape.rank == 0:
            rotated = tf.einsum("ncp,pq->ncq", jac, self._basis)
            return tf.einsum("ncq,q,nkq->nck", rotated, 1 / (factor * self._evals + delta),
                             rotated)
        rows = tf.transpose(tf.reshape(jac, [-1, self.n_params]))
        solved = tf.linalg.cholesky_solve(self._cholesky(delta, factor), rows)
        return tf.einsum("ncp,nkp->nck", jac, tf.reshape(tf.transpose(solved), tf.shape(jac)))

    def _precision(self, delta, factor):
        return (factor * self._gram + tf.linalg.diag(delta * tf.ones([self.n_params],
                                                                     tf.float64))).numpy()

    @property
    def posterior_covariance(self):
        """P^-1, dense [n, n] float64 numpy."""
        self._require_fit("posterior_covariance")
        return np.linalg.inv(self.posterior_precision)


class DiagLaplace(BaseLaplace):
    """The Laplace posterior with the exact diagonal of H (`gauss_newton_diagonal`).

    Made by `hogrod.curvature.Laplace` (hessian="diag"); `fit(data)`, `log_likelihood`,
    `log_marginal_likelihood`, `optimize_prior_precision`, `predictive` (also the call),
    `output_jacobian`, `functional_variance` and the hyperparameters' properties are the
    shared `BaseLaplace`'s.

    Its constructor takes `hogrod.curvature.Laplace`'s arguments but `hessian` (`model`,
    `likelihood`, `subset`, `prior_precision`, `sigma_noise`, `prior_mean`, `strategy`),
    with the same meanings and checks.
    """

    hessian = "diag"

    def _fit_curvature(self, data):
        # one vectorized Jacobian per batch on the host device (the result equals a
        # strategy's: a sum over examples)
        diag = gauss_newton_diagonal(self._head, self._loss("sum"), data)
        self.H = diag * self.gauss_newton_scale
        self._diag = tf.constant(self.H, tf.float64)

    @property
    def eigenvalues(self):
        """H's diagonal, float64 [n]."""
        self._require_fit("eigenvalues")
        return self._diag

    def _log_det(self, delta, factor):
        return tf.reduce_sum(tf.math.log(factor * self._diag + delta))

    def _variance(self, jac, delta, factor):
        return tf.einsum("ncp,p,nkp->nck", jac, 1 / (factor * self._diag + delta), jac)

    def _precision(self, delta, factor):
        return (factor * self._diag + delta).numpy()

    @property
    def posterior_covariance(self):
        """The diagonal of P^-1, [n] float64 numpy."""
        self._require_fit("posterior_covariance")
        return 1 / self.posterior_precision


class KronLaplace(BaseLaplace):
    """The Laplace posterior with K-FAC blocks for H (`KFACOperator`, type-2, expand).

    Per Dense / Conv2D layer a Kronecker-factored block A (x) G; other layers with weights
    get the exact diagonal. Made by `hogrod.curvature.Laplace` (hessian="kron"); its
    methods are the shared `BaseLaplace`'s, as for `FullLaplace`.

    kron_bias="joint" factors a layer's kernel and bias together (the inputs with a ones
    column appended: A over [a, 1], so the block holds the kernel-bias cross terms, exact for
    one Dense layer with one output); "separate" (laplace-torch's) gives the kernel
    A' (x) G with A' = E[a a^T] and the bias its own block G, no cross terms. A prior
    precision may vary between blocks, not inside one: "layerwise" needs "separate" for a
    layer with a bias; "diag" is refused unless the other layers are all diagonal.
    """

    hessian = "kron"

    def __init__(self, model: keras.Model, likelihood: str = "regression", subset: str = "all",
                 *, kron_bias: str = "joint", **kwargs: Any) -> None:
        """The K-FAC Laplace approximation of `model` at its current weights.

        Args:
          model: a built Keras 3 model, as for `hogrod.curvature.Laplace`.
          likelihood: "regression" or "classification".
          subset: "all" or "last_layer".
          kron_bias: "joint" (kernel and bias in one Kronecker block) or "separate"
            (laplace-torch's: the bias its own block).
          **kwargs: `prior_precision`, `sigma_noise`, `prior_mean`, `strategy`, as for
            `hogrod.curvature.Laplace`; a prior precision must be constant on each
            Kronecker block.

        Raises:
          ArgumentError: an argument out of its choices or range, or a prior precision
            that varies inside a Kronecker block.
        """
        self.kron_bias = checks.choice(kron_bias, KRON_BIASES, "kron_bias", "Laplace")
        self._blocks = None
        super().__init__(model, likelihood, subset, **kwargs)
        self._spans = self._block_spans()
        if not isinstance(self.prior_precision, float):
            self.prior_precision = self.prior_precision

    def _block_spans(self):
        """[(offset, size, kind)] in parameter order: the spans a prior precision must be
        constant on ("kron") or may vary on ("diag"), before fit (from the layers)."""
        offsets = np.cumsum([0] + self.sizes)
        index = {id(p): i for i, p in enumerate(self.params)}
        spans = []
        for layer in _leaf_layers(self._head):
            vs = [v for v in layer.trainable_variables if id(v) in index]
            if not vs:
                continue
            kernel, bias = getattr(layer, "kernel", None), getattr(layer, "bias", None)
            factored = type(layer) in (keras.layers.Dense, keras.layers.Conv2D)
            if not factored:
                spans += [(offsets[index[id(v)]], self.sizes[index[id(v)]], "diag") for v in vs]
                continue
            k = index[id(kernel)]
            if bias is None or self.kron_bias == "separate":
                spans += [(offsets[index[id(v)]], self.sizes[index[id(v)]], "kron") for v in vs]
            else:
                b = index[id(bias)]
                if offsets[b] != offsets[k] + self.sizes[k]:
                    raise checks.ArgumentError(
                        f"Laplace: layer '{layer.name}': its bias does not follow its kernel "
                        "in the trainable variables; use kron_bias='separate'")
                spans.append((offsets[k], self.sizes[k] + self.sizes[b], "kron"))
        return sorted(spans)

    def _check_prior_structure(self, delta, arg, where):
        if not hasattr(self, "_spans"):  # the constructor's value: checked in __init__
            return
        for offset, size, kind in self._spans:
            part = delta[offset:offset + size]
            if kind == "kron" and np.ptp(part) > 0:
                raise checks.ArgumentError(
                    f"{where}: {arg}: hessian='kron' keeps one prior precision per Kronecker "
                    f"block (parameters {offset}..{offset + size - 1} differ); give one value per "
                    "variable ('layerwise') and, for a layer with a bias, kron_bias='separate'")

    def _fit_curvature(self, data):
        op = KFACOperator(self._head, self._loss("sum_over_batch_size"), data, fisher="type2",
                          approx="expand", other_layers="diagonal", strategy=self.strategy)
        # K-FAC of the mean per-example loss: H = N * gauss_newton_scale * K
        scale = self.n_data * self.gauss_newton_scale
        factors, diagonals = op.factors, op.diagonals
        offsets = np.cumsum([0] + self.sizes)
        index = {id(p): i for i, p in enumerate(self.params)}
        blocks = []
        for layer in _leaf_layers(self._head):
            if layer.name in factors:
                a, g = (tf.cast(f, tf.float64) for f in factors[layer.name])
                k = index[id(layer.kernel)]
                if layer.bias is not None and self.kron_bias == "separate":
                    blocks.append(_kron_block(offsets[k], a[:-1, :-1], g, scale))
                    blocks.append(_kron_block(offsets[index[id(layer.bias)]], a[-1:, -1:], g,
                                              scale))
                else:
                    blocks.append(_kron_block(offsets[k], a, g, scale))
            elif layer.name in diagonals:
                for v, d in zip(layer.trainable_variables, diagonals[layer.name]):
                    h = tf.reshape(tf.cast(d, tf.float64), [-1]) * scale
                    blocks.append({"offset": int(offsets[index[id(v)]]), "size": int(h.shape[0]),
                                   "diag": h})
        blocks.sort(key=lambda b: b["offset"])
        if sum(b["size"] for b in blocks) != self.n_params:
            raise AssertionError(f"K-FAC blocks cover {sum(b['size'] for b in blocks)} of "
                                 f"{self.n_params} parameters")
        self._blocks = blocks

    @property
    def eigenvalues(self):
        """H's eigenvalues block by block (each Kronecker block's in its eigenbasis), [n]."""
        self._require_fit("eigenvalues")
        return tf.concat([tf.reshape(b["values"], [-1]) if "values" in b else b["diag"]
                          for b in self._blocks], 0)

    def _block_delta(self, delta, b):
        if delta.shape.rank == 0:
            return delta
        if "diag" in b:
            return delta[b["offset"]:b["offset"] + b["size"]]
        return delta[b["offset"]]

    def _log_det(self, delta, factor):
        total = tf.zeros([], tf.float64)
        for b in self._blocks:
            values = b.get("values", b.get("diag"))
            total += tf.reduce_sum(tf.math.log(factor * values + self._block_delta(delta, b)))
        return total

    def _variance(self, jac, delta, factor):
        total = 0.0
        for b in self._blocks:
            rows = jac[:, :, b["offset"]:b["offset"] + b["size"]]
            d = self._block_delta(delta, b)
            if "diag" in b:
                total += tf.einsum("ncp,p,nkp->nck", rows, 1 / (factor * b["diag"] + d), rows)
                continue
            rows = tf.reshape(rows, tf.concat([tf.shape(rows)[:2], b["values"].shape], 0))
            rotated = tf.einsum("ncij,ia,jb->ncab", rows, b["qa"], b["qg"])
            total += tf.einsum("ncab,ab,nkab->nck", rotated, 1 / (factor * b["values"] + d),
                               rotated)
        return total

    def _precision(self, delta, factor):
        ops = []
        for b in self._blocks:
            d = self._block_delta(delta, b)
            if "diag" in b:
                ops.append(tf.linalg.LinearOperatorDiag(factor * b["diag"] + d))
                continue
            q = tf.linalg.LinearOperatorKronecker([tf.linalg.LinearOperatorFullMatrix(b["qa"]),
                                                   tf.linalg.LinearOperatorFullMatrix(b["qg"])])
            values = tf.linalg.LinearOperatorDiag(tf.reshape(factor * b["values"] + d, [-1]))
            ops.append(tf.linalg.LinearOperatorComposition([q, values, q.adjoint()],
                                                           is_self_adjoint=True,
                                                           is_positive_definite=True))
        return tf.linalg.LinearOperatorBlockDiag(ops, is_self_adjoint=True,
                                                 is_positive_definite=True, is_square=True)


def _kron_block(offset, a, g, scale):
    """One Kronecker block over row-major [d_in, d_out] parameters: the factors'
    eigenbases and the eigenvalues scale * evals_A (x) evals_G (clipped at 0: round-off)."""
    ea, qa = tf.linalg.eigh(a)
    eg, qg = tf.linalg.eigh(g)
    values = scale * tf.maximum(ea, 0.0)[:, None] * tf.maximum(eg, 0.0)[None, :]
    return {"offset": int(offset), "size": int(a.shape[0] * g.shape[0]), "values": values,
            "qa": qa, "qg": qg}


def _leaf_layers(layer):
    """The layers without sublayers, in order (nested models walked)."""
    out = []
    for sub in getattr(layer, "layers", []):
        out.extend(_leaf_layers(sub) if getattr(sub, "layers", None) is not None else [sub])
    return out
