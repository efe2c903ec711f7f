"""Kronecker-factored curvature: K-FAC and EK-FAC as `tf.linalg.LinearOperator`s.

Both act on the flat vector of `model.trainable_variables` (the order of `hogrod.hessian`
and of the other operators here), or of `params=` (kernels and biases of the factored
layers: a layer is factored when its kernel is among them), and approximate the
Gauss-Newton matrix / Fisher of the objective `L = mean(loss(y, model(x)))` (a Keras loss
`loss(y_true, y_pred)`), averaged over a data set like the other operators (each batch
weighted by its size).

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
  Gauss-Newton/Fisher, sum over examples of their gradients' squares: a normalization
  layer's (BatchNormalization, LayerNormalization, GroupNormalization: a per-feature scale
  and offset) from the backward pass that gives G (kfac-jax's scale-and-shift diagonal,
  `kfac_capture.py`), any other layer's from one vectorized per-example Jacobian per batch.
  In inference mode no layer couples the examples, so both are exact.

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
divided by the global counts, so the factors equal one device's (the rows are not gathered
across replicas: products go through the dense factors and every eigenvector); a shard may
be uneven or empty. fisher="mc" folds the replica id into the sampling key (as
`FisherOperator`): the sampled labels, hence the factors, differ from one device's draw,
with the same expectation.
"""

import functools
import itertools
from typing import Dict, List, Optional, Tuple

import keras

import tensorflow as tf

from hogrod import checks
from hogrod.types import Batch, Loss, Params, TensorLike
from hogrod.curvature.kronecker import (KRON_PRODUCTS, KroneckerFactors, kron_plan, rotate,
                                        row_count)

__all__ = ["KFACOperator", "EKFACOperator"]


class _Kronecker(tf.linalg.LinearOperator):
    """The shared operator of `KFACOperator` and `EKFACOperator` on `KroneckerFactors`
    (`kronecker.py`, whose layer capture is `kfac_capture.py`)."""

    _eigen_corrected = False

    def __init__(self, model: keras.Model, loss: Loss, data: Batch, fisher: str = "type2",
                 approx: str = "expand", damping: float = 0.0, *, mc_samples: int = 1,
                 seed: int = 0, other_layers: str = "raise",
                 strategy: Optional[tf.distribute.Strategy] = None,
                 params: Optional[Params] = None) -> None:
        where = type(self).__name__
        damping = checks.nonnegative(damping, "damping", where)
        factors = KroneckerFactors(model, loss, data, fisher, approx, mc_samples, seed,
                                   other_layers, self._eigen_corrected, where, strategy,
                                   params)
        self._setup(factors, damping)

    def _setup(self, factors, damping):
        self._f = factors
        self.damping = damping
        self._damping_t = tf.constant(damping, factors.dtype)
        self._apply = factors.compiled
        super().__init__(dtype=factors.dtype, is_self_adjoint=True, is_square=True,
                         is_positive_definite=True if damping > 0 else None,
                         name=type(self).__name__)

    def with_damping(self, damping: float) -> "_Kronecker":
        """The same factors (nothing recomputed) with another damping.

        Args:
          damping: the new damping (>= 0).

        Returns:
          An operator of this class sharing this one's factors (a `refresh` of either
          updates both).
        """
        op = object.__new__(type(self))
        op._setup(self._f, checks.nonnegative(damping, "damping", type(self).__name__))
        return op

    @property
    def eigendecompositions(self) -> Dict[str, Tuple[tf.Tensor, ...]]:
        """{layer name: (evals_A, Q_A, evals_G, Q_G)} for the factored layers; A = Q_A
        diag(evals_A) Q_A^T over [kernel rows..., bias] inputs, G over output units."""
        return dict(self._f.eigen)

    @property
    def factors(self) -> Dict[str, Tuple[tf.Tensor, tf.Tensor]]:
        """{layer name: (A, G)} for the factored layers."""
        return {name: (self._f.A[name], self._f.G[name]) for name in self._f.A}

    @property
    def diagonals(self) -> Dict[str, List[tf.Tensor]]:
        """{layer name: [exact diagonal per variable]} for other_layers='diagonal' layers."""
        return dict(self._f.diag)

    def refresh(self) -> "_Kronecker":
        """Recomputes the factors (and eigenbases, corrections) at the model's current weights.

        Every operator sharing them (`with_damping`) sees the new ones; the compiled products
        are reused (no retrace).

        Returns:
          self.
        """
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
                    how = kron_plan(b.d_in, b.d_out, row_count(a_rows), row_count(g_rows))
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

    def matvec_flat(self, vector: TensorLike) -> tf.Tensor:
        """The product with one flat vector, `(approximation + damping I) v`.

        Args:
          vector: a vector of length n (converted to this operator's dtype).

        Returns:
          A tensor of length n at this operator's dtype.
        """
        return self.matvec(tf.convert_to_tensor(vector, self.dtype))

    def logdet(self) -> tf.Tensor:
        """The log-determinant log det(approximation + damping I).

        Returns:
          A scalar tensor at this operator's dtype.

        Raises:
          ValueError: damping is 0 (the factors are singular in general).
        """
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

    def _solve_rows(self, rows, d, state, plan):
        return self._blockwise(rows, state, itertools.repeat(lambda blk, v: rotate(
            blk, v, lambda w, values: w / (values + d))), lambda v, diag: v / (diag + d))


class KFACOperator(_Kronecker):
    """K-FAC: ``A (x) G`` per Dense / Conv2D layer, plus ``damping * I``.

    A `tf.linalg.LinearOperator` on the flat vector of `model.trainable_variables` (or of
    `params`):
    `matvec`/`matmul` (and `matvec_flat`) give ``(approximation + damping I) v``, `solve`
    the damped inverse, `logdet()` its log-determinant, `with_damping(d)` the same factors
    with another damping, `refresh()` the factors at the current weights;
    `eigendecompositions`, `factors` and `diagonals` expose the blocks.
    `hogrod.curvature.kfac` documents the blocks and the approximations.

    Args:
      model: a built Keras 3 model, called as `model(x, training=False)`.
      loss: a Keras loss `loss(y_true, y_pred)`; the objective is `mean(loss(y, model(x)))`
        (fisher="mc" samples labels from its likelihood: one of the Keras losses
        `FisherOperator` takes; "mc" and "empirical" need a batch-mean reduction).
      data: one `(x, y)` batch or a `tf.data.Dataset` of them (a Dataset under a strategy).
      fisher: "type2" (default), "mc" or "empirical": the curvature approximated.
      approx: "expand" (default) or "reduce" for weight-sharing layers (Eschenhagen et al.
        2023); the same without weight sharing.
      damping: added to the diagonal (>= 0, default 0; `solve`/`logdet` need > 0).
      mc_samples: labels sampled per example for fisher="mc" (an int >= 1).
      seed: the stateless sampling key of fisher="mc" (an int >= 0).
      other_layers: "raise" (default: refuse a layer with weights K-FAC does not factor,
        naming it) or "diagonal" (its variables get the exact diagonal: a normalization
        layer's from the factors' backward pass, another's from per-example Jacobians).
      strategy: a tf.distribute.Strategy to split each batch of `data` (a Dataset) over;
        `refresh` recomputes under it too. Default None, one device.
      params: the variables the operator acts on, in their order (default None: every
        trainable variable): kernels and biases of Dense / Conv2D layers the operator
        factors (e.g. `layer_params(model, name)`); `other_layers` is then unused. A layer
        is factored when its kernel is in `params`: with its bias, its block is the one of
        the operator over every variable; with the kernel alone, the factors are over the
        kernel's inputs (for K-FAC the full block's kernel rows and columns).

    Raises:
      ArgumentError: an argument out of its choices or range; `params` holding a variable
        that is not the kernel or bias of a layer factored, or a bias without its kernel.
      ValueError: the model is not built or has no trainable variables, a layer K-FAC
        cannot factor with other_layers="raise", or a loss fisher="mc" cannot sample from
        or whose reduction the Fisher cannot take.
      TypeError: `loss` not callable, or variables that do not share one floating dtype.
    """

    def _eigenvalues(self, name):
        ea, _, eg, _ = self._f.eigen[name]
        return ea[:, None] * eg[None, :]

    def _matmul_rows(self, rows, d, state, plan):
        _, damped, *hows = plan
        kron = [functools.partial(KRON_PRODUCTS[how], damping=d if damped else None)
                for how in hows]
        return self._blockwise(rows, state, kron, lambda v, diag: (diag + d) * v)


class EKFACOperator(_Kronecker):
    """EK-FAC (George et al. 2018): K-FAC's eigenbasis with corrected eigenvalues.

    The eigenvalues ``evals_A (x) evals_G`` of `KFACOperator` are replaced by the exact
    diagonal of the same curvature in the eigenbasis ``Q_A (x) Q_G``
    (`corrected_eigenvalues`); the operator's methods are `KFACOperator`'s.

    Its constructor takes `KFACOperator`'s arguments, with the same meanings and checks
    (`model`, `loss`, `data`, `fisher`, `approx`, `damping`, `mc_samples`, `seed`,
    `other_layers`, `strategy`, `params`); with `params` holding a kernel without its bias,
    the correction is of that kernel's block alone.
    """

    _eigen_corrected = True

    @property
    def corrected_eigenvalues(self) -> Dict[str, tf.Tensor]:
        """{layer name: [d_in, d_out] eigenvalues for the basis vectors Q_A[:, i] (x) Q_G[:, j]}."""
        return dict(self._f.corrected)

    def _eigenvalues(self, name):
        return self._f.corrected[name]

    def _matmul_rows(self, rows, d, state, plan):
        # Q (S + d) Q^T v = Q S Q^T v + d v: the eigenvectors left out (their S is 0) add d v
        def block(blk, v):
            w = rotate(blk, v, lambda w, values: w * values)
            return w + d * v if plan[1] else w
        return self._blockwise(rows, state, itertools.repeat(block),
                               lambda v, diag: (diag + d) * v)
