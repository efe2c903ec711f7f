"""Training-data attribution beyond the exact Hessian, and its evaluation.

- `ekfac_influence`: influence functions with the EK-FAC approximation of the Gauss-Newton
  matrix (kronfluence's approach, Grosse et al. 2023): the test gradients are preconditioned
  with `(EK-FAC + damping I)^{-1}` (one batched solve through the eigenbases) and dotted with
  the per-example training gradients. Same sign as `influence` (I_up,loss).
- `tracin`: TracIn (Pruthi et al. 2020), `sum_k lr_k <grad L(test; theta_k),
  grad L(train_i; theta_k)>` over saved checkpoints; positive = proponent (training on the
  example lowered the test loss), the OPPOSITE sign of I_up,loss.
- `self_influence`: each training example with itself, for `influence`, `ekfac_influence`
  or `tracin`: `g^T (H + damping I)^{-1} g` or `sum_k lr_k ||g_k||^2`, large = unusual
  (mislabeled examples rank high); `mislabel_detection_rate` scores such a ranking.
- `linear_datamodeling_score` (LDS, Park et al. 2023) with `subset_retraining`: the
  Spearman correlation between the group effect an attribution predicts for random training
  subsets and the test loss measured after retraining on them.

Per-example gradients are `per_example.py`'s (one vectorized Jacobian per batch), over the
flat vector of `model.trainable_variables` (the operators' order).
"""


from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import keras
import numpy as np
import scipy.stats
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import split_arrays
from hogrod.curvature.influence import influence
from hogrod.curvature.kfac import EKFACOperator, KFACOperator
from hogrod.curvature.likelihood import per_example_loss
from hogrod.curvature.operators import HessianOperator
from hogrod.curvature.per_example import gradient_rows
from hogrod.types import Batch, Loss, TensorLike

__all__ = ["ekfac_influence", "tracin", "self_influence", "linear_datamodeling_score",
           "subset_retraining", "mislabel_detection_rate"]


def _pair(data, arg, where):
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"{where}: {arg} must be an (x, y) pair of arrays or tensors, got "
                         f"{type(data).__name__}")
    x, y = data
    if x is None or y is None:
        raise ValueError(f"{where}: {arg} holds None; pass (x, y) arrays")
    return x, y


def _gradients(grads, data, batch_size, where):
    """[n, num_params] float64 numpy from a compiled per-example-gradient function."""
    x, y = data
    return np.concatenate([grads(xb, yb).numpy()
                           for xb, yb in split_arrays(x, y, batch_size, where)]).astype(np.float64)


# ------------------------------------------------------------------------------ EK-FAC

def _ekfac(model, loss, data, damping, operator, fisher, approx, where):
    if operator is not None:
        if not isinstance(operator, (EKFACOperator, KFACOperator)):
            raise TypeError(f"{where}: operator must be an EKFACOperator or KFACOperator of "
                            f"this model, got {type(operator).__name__}")
        return operator.with_damping(damping)
    return EKFACOperator(model, _as_mean(loss), data, fisher=fisher, approx=approx,
                         damping=damping)


def _as_mean(loss):
    """The influence is of the MEAN training loss (the per-example gradients do not depend
    on the reduction): a Keras loss with reduction "sum" is rebuilt as its batch mean, so
    the factors are not N times larger."""
    if isinstance(loss, keras.losses.Loss) and loss.reduction == "sum":
        return type(loss).from_config({**loss.get_config(), "dtype": loss.dtype,
                                       "reduction": "sum_over_batch_size"})
    return loss


def _check_operator_size(op, n, where):
    if int(op.shape[-1]) != n:
        raise ValueError(f"{where}: the operator acts on {int(op.shape[-1])} parameters but "
                         f"the gradients have {n}: build it on this model's trainable "
                         "variables")


def _precondition(op, g, batch_size):
    """(op + damping)^{-1} applied to the rows of g, a batch of rows at a time."""
    out = [tf.transpose(op.solve(tf.transpose(tf.constant(g[s:s + batch_size], op.dtype))))
           .numpy() for s in range(0, len(g), batch_size)]
    return np.concatenate(out).astype(np.float64) if out else np.zeros_like(g)


def ekfac_influence(model: keras.Model, loss: Loss, train: Tuple[TensorLike, TensorLike],
                    test: Tuple[TensorLike, TensorLike], damping: float,
                    data: Optional[Batch] = None, fisher: str = "type2", approx: str = "expand",
                    operator: Optional[Union[EKFACOperator, KFACOperator]] = None,
                    batch_size: int = 256) -> np.ndarray:
    """Influence functions with EK-FAC for the Hessian.

    The [n_test, n_train] matrix -grad L(test)^T (EK-FAC + damping I)^{-1} grad L(train_i):
    the I_up,loss of `influence` with the Hessian replaced by EK-FAC (George et al. 2018)
    of the Gauss-Newton matrix / Fisher of the mean training loss (kronfluence's scores).

    Args:
      model: a trained Keras 3 model of Dense / Conv2D layers (others per `EKFACOperator`:
        pass an `operator` built with other_layers="diagonal" for them).
      loss: a Keras loss object or per-example `loss(y_true, y_pred) -> [batch]`. A
        regularizer inside it enters the gradients but not the Gauss-Newton factors (it does
        not depend on the outputs): add its curvature (l2 for ``0.5 * l2 * ||w||^2``) to
        `damping`. Either reduction of a Keras loss gives the scores of the mean training
        loss.
      train: the training examples, an `(x, y)` pair of arrays or tensors.
      test: the test examples, an `(x, y)` pair of arrays or tensors.
      damping: > 0, added to EK-FAC before inverting (kronfluence's heuristic, when its
        damping_factor is None, is 0.1 x the mean corrected eigenvalue of each layer).
      data: the batch or tf.data set the factors are fitted on (default None: `train`).
      fisher: "type2", "mc" or "empirical", as for `EKFACOperator`.
      approx: "expand" or "reduce" for weight-sharing layers, as for `EKFACOperator`.
      operator: a fitted `EKFACOperator` (or `KFACOperator`) of this model to reuse; its
        factors are used with this `damping` (`data`, `fisher`, `approx` unused).
      batch_size: examples per vectorized gradient pass and per batched solve (>= 1).

    Returns:
      numpy float64 [n_test, n_train], positive = up-weighting the example raises the test
      loss.

    Raises:
      ArgumentError: `damping` not positive, `batch_size` below 1.
      ValueError: `train` or `test` not an `(x, y)` pair, or `operator` of another size.
      TypeError: `operator` neither an EKFACOperator nor a KFACOperator.
    """
    where = "ekfac_influence"
    train, test = _pair(train, "train", where), _pair(test, "test", where)
    damping = checks.positive(damping, "damping", where)
    grads = gradient_rows(model, loss, None, where)
    g_train = _gradients(grads, train, batch_size, where)
    g_test = _gradients(grads, test, batch_size, where)
    op = _ekfac(model, loss, train if data is None else data, damping, operator, fisher, approx,
                where)
    _check_operator_size(op, g_train.shape[1], where)
    return -_precondition(op, g_test, batch_size) @ g_train.T


# ------------------------------------------------------------------------------ TracIn

def _checkpoint_weights(model, checkpoint, k, where):
    """The list of arrays `model.set_weights` takes, from one checkpoint."""
    if isinstance(checkpoint, keras.Model):
        return checkpoint.get_weights()
    if isinstance(checkpoint, str):
        if not checkpoint.endswith(".weights.h5"):
            raise ValueError(f"{where}: checkpoints[{k}] is the path {checkpoint!r}; a saved "
                             "checkpoint must be a Keras weights file (*.weights.h5, from "
                             "model.save_weights)")
        current = model.get_weights()
        try:
            model.load_weights(checkpoint)
            return model.get_weights()
        finally:
            model.set_weights(current)
    if not isinstance(checkpoint, (list, tuple)):
        raise TypeError(f"{where}: checkpoints[{k}] must be a list of weight arrays "
                        "(model.get_weights()), a *.weights.h5 path or a Keras model, got "
                        f"{type(checkpoint).__name__}")
    expected = [tuple(w.shape) for w in model.weights]
    got = [tuple(np.shape(w)) for w in checkpoint]
    if got != expected:
        raise ValueError(f"{where}: checkpoints[{k}] holds weights of shapes {got} but the "
                         f"model's weights have shapes {expected} (model.get_weights() order)")
    return list(checkpoint)


def _check_schedule(checkpoints, learning_rates, where):
    if isinstance(checkpoints, (str, keras.Model)) or not isinstance(checkpoints,
                                                                     (list, tuple)):
        raise TypeError(f"{where}: checkpoints must be a list (one entry per checkpoint), got "
                        f"{type(checkpoints).__name__}")
    if not isinstance(learning_rates, (list, tuple, np.ndarray)):
        raise TypeError(f"{where}: learning_rates must be a list with one learning rate per "
                        f"checkpoint, got {type(learning_rates).__name__}")
    if len(checkpoints) == 0:
        raise ValueError(f"{where}: checkpoints is empty; pass at least one")
    if len(checkpoints) != len(learning_rates):
        raise ValueError(f"{where}: {len(checkpoints)} checkpoints but {len(learning_rates)} "
                         "learning_rates; pass one learning rate per checkpoint")
    return [checks.positive(lr, f"learning_rates[{k}]", where)
            for k, lr in enumerate(learning_rates)]


def _over_checkpoints(model, checkpoints, learning_rates, fn, where):
    """sum_k lr_k fn() with the model holding checkpoint k; the model's weights restored."""
    lrs = _check_schedule(checkpoints, learning_rates, where)
    weights = [_checkpoint_weights(model, c, k, where) for k, c in enumerate(checkpoints)]
    current = model.get_weights()
    total = 0.0
    try:
        for lr, w in zip(lrs, weights):
            model.set_weights(w)
            total = total + lr * fn()
    finally:
        model.set_weights(current)
    return total


def tracin(model: keras.Model, loss: Loss, train: Tuple[TensorLike, TensorLike],
           test: Tuple[TensorLike, TensorLike],
           checkpoints: Sequence[Union[Sequence[np.ndarray], str, keras.Model]],
           learning_rates: Sequence[float], batch_size: int = 256) -> np.ndarray:
    """TracIn-CP (Pruthi et al. 2020): gradient dot products summed over checkpoints.

    The [n_test, n_train] matrix of sum_k lr_k <grad L(test_t; theta_k), grad L(train_i;
    theta_k)>.

    Args:
      model: the Keras 3 model the checkpoints are of (its weights are restored after).
      loss: a Keras loss object or per-example `loss(y_true, y_pred) -> [batch]`.
      train: the training examples, an `(x, y)` pair of arrays or tensors.
      test: the test examples, an `(x, y)` pair of arrays or tensors.
      checkpoints: a list, each entry the weights of one checkpoint as `model.get_weights()`
        gives them, a `*.weights.h5` file (`model.save_weights`) or a Keras model of the same
        architecture.
      learning_rates: one positive learning rate per checkpoint (the step size in effect
        between checkpoints).
      batch_size: examples per vectorized gradient pass (>= 1).

    Returns:
      numpy float64 [n_test, n_train]; positive = proponent (training on the example lowered
      the test loss): the opposite sign of `influence`'s I_up,loss.

    Raises:
      TypeError: `checkpoints` or `learning_rates` not lists, or an entry of an unknown kind.
      ValueError: `train` or `test` not an `(x, y)` pair, no checkpoint, lengths that differ,
        or a checkpoint of other shapes than the model's weights.
      ArgumentError: a learning rate not positive, `batch_size` below 1.
    """
    where = "tracin"
    train, test = _pair(train, "train", where), _pair(test, "test", where)
    grads = gradient_rows(model, loss, None, where)  # reads the variables: one trace for all
    return _over_checkpoints(model, checkpoints, learning_rates, lambda: (
        _gradients(grads, test, batch_size, where)
        @ _gradients(grads, train, batch_size, where).T), where)


# ---------------------------------------------------------------------- self-influence

def _exact_self(model, loss, train, damping=0.0, params=None, batch_size=256):
    """g_i^T (H + damping I)^{-1} g_i from the dense Hessian of the mean training loss."""
    where = "self_influence(influence)"
    damping = checks.nonnegative(damping, "damping", where)
    params = list(params or model.trainable_variables)
    per_example = per_example_loss(loss, where)
    x, y = (tf.convert_to_tensor(t) for t in train)
    op = HessianOperator.from_objective(
        lambda b: tf.reduce_mean(per_example(b[1], model(b[0]))), params, (x, y),
        dtype=tf.float64)
    h = op.to_dense().numpy()
    h = 0.5 * (h + h.T) + float(damping) * np.eye(len(h))
    try:
        chol = np.linalg.cholesky(h)
    except np.linalg.LinAlgError:
        raise ValueError(f"{where}: the Hessian + damping is singular or indefinite (smallest "
                         f"eigenvalue {np.linalg.eigvalsh(h)[0]:.3g}); add damping") from None
    g = _gradients(gradient_rows(model, loss, params, where), train, batch_size, where)
    root = np.linalg.solve(chol, g.T)  # |L^{-1} g|^2 = g^T H^{-1} g
    return np.sum(root ** 2, axis=0)


def _ekfac_self(model, loss, train, damping, data=None, fisher="type2", approx="expand",
                operator=None, batch_size=256):
    where = "self_influence(ekfac_influence)"
    damping = checks.positive(damping, "damping", where)
    g = _gradients(gradient_rows(model, loss, None, where), train, batch_size, where)
    op = _ekfac(model, loss, train if data is None else data, damping, operator, fisher, approx,
                where)
    _check_operator_size(op, g.shape[1], where)
    return np.sum(_precondition(op, g, batch_size) * g, axis=1)


def _tracin_self(model, loss, train, checkpoints, learning_rates, batch_size=256):
    where = "self_influence(tracin)"
    grads = gradient_rows(model, loss, None, where)
    return _over_checkpoints(model, checkpoints, learning_rates, lambda: np.sum(
        _gradients(grads, train, batch_size, where) ** 2, axis=1), where)


_SELF = {influence: _exact_self, ekfac_influence: _ekfac_self, tracin: _tracin_self}


def self_influence(method: Callable[..., np.ndarray], model: keras.Model, loss: Loss,
                   train: Tuple[TensorLike, TensorLike], **kwargs: Any) -> np.ndarray:
    """Each training example scored with itself by an attribution method.

    All scores are >= 0 for a positive-definite curvature; large = the model finds the
    example hard to fit (mislabeled examples rank high; `mislabel_detection_rate`).

    Args:
      method: the function `influence` (g^T (H + damping I)^{-1} g, from the dense Hessian:
        small models), `ekfac_influence` (g^T (EK-FAC + damping I)^{-1} g) or `tracin`
        (``sum_k lr_k ||g_k||^2``).
      model: the trained Keras 3 model, as `method` takes it.
      loss: a Keras loss object or per-example `loss(y_true, y_pred) -> [batch]`.
      train: the training examples, an `(x, y)` pair of arrays or tensors.
      **kwargs: `method`'s other keyword arguments (damping=, params=, data=, operator=,
        checkpoints=, learning_rates=, batch_size=, ...; no `test`).

    Returns:
      float64 numpy [n_train].

    Raises:
      TypeError: `method` is not one of the three functions, or `kwargs` misses or adds an
        argument of it.
      ValueError: `train` is not an `(x, y)` pair; as `method` raises.
    """
    try:
        fn = _SELF[method]
    except (KeyError, TypeError):
        raise TypeError("self_influence: method must be one of the functions influence, "
                        f"ekfac_influence, tracin (hogrod.curvature), got {method!r}") from None
    train = _pair(train, "train", "self_influence")
    try:
        return np.asarray(fn(model, loss, train, **kwargs), np.float64)
    except TypeError as e:
        if "unexpected keyword" in str(e) or "missing" in str(e):
            detail = str(e).split("() ", 1)[-1]  # drop the private helper's name
            raise TypeError(f"self_influence({method.__name__}): {detail} (pass it as a "
                            f"keyword argument, as {method.__name__} takes it)") from None
        raise


# ----------------------------------------------------------------------- evaluation

def _subset_masks(subsets, n_train, where):
    """[m, n_train] bool from a boolean mask array or a list of index arrays."""
    arr = np.asarray(subsets) if not isinstance(subsets, (list, tuple)) else None
    if arr is not None and arr.dtype == bool:
        if arr.ndim != 2 or arr.shape[1] != n_train:
            raise ValueError(f"{where}: subsets as a boolean mask must have shape [num_subsets, "
                             f"n_train={n_train}], got {arr.shape}")
        return arr
    masks = np.zeros((len(subsets), n_train), bool)
    for j, s in enumerate(subsets):
        idx = np.asarray(s)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"{where}: subsets[{j}] must be a 1-D array of training indices "
                             f"(or pass a [num_subsets, n_train] boolean mask), got {idx!r}")
        if idx.size and (idx.min() < 0 or idx.max() >= n_train):
            raise ValueError(f"{where}: subsets[{j}] has indices outside [0, {n_train})")
        if len(np.unique(idx)) != len(idx):
            raise ValueError(f"{where}: subsets[{j}] repeats an index")
        masks[j, idx] = True
    return masks


def linear_datamodeling_score(scores: TensorLike, subsets: Union[np.ndarray, Sequence[Any]],
                              subset_test_losses: TensorLike, per_test: bool = False
                              ) -> Union[float, Tuple[float, np.ndarray]]:
    """The linear datamodeling score (LDS, Park et al. 2023) of an attribution.

    For each test point t, the Spearman rank correlation over subsets S_j between the
    predicted group effect sum_{i in S_j} scores[t, i] and the test loss measured after
    retraining on S_j; the mean over test points.

    Args:
      scores: [n_test, n_train] attribution with positive = the example RAISES the test loss
        (`influence`'s and `ekfac_influence`'s I_up,loss; pass `-tracin(...)` for TracIn).
      subsets: [num_subsets, n_train] boolean mask, or a list of index arrays (>= 3 subsets).
      subset_test_losses: [num_subsets, n_test] test losses after retraining on each subset.
      per_test: also return the [n_test] correlations.

    Returns:
      The mean correlation (a float), or `(mean, [n_test] correlations)` if per_test.

    Raises:
      ValueError: shapes that do not match, fewer than 3 subsets, values that are not
        finite, or a test point whose prediction or loss is constant over the subsets.
    """
    where = "linear_datamodeling_score"
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2:
        raise ValueError(f"{where}: scores must be [n_test, n_train], got shape {scores.shape}")
    masks = _subset_masks(subsets, scores.shape[1], where)
    losses = np.asarray(subset_test_losses, np.float64)
    if losses.shape != (len(masks), scores.shape[0]):
        raise ValueError(f"{where}: subset_test_losses must have shape [num_subsets="
                         f"{len(masks)}, n_test={scores.shape[0]}], got {losses.shape}")
    if len(masks) < 3:
        raise ValueError(f"{where}: a rank correlation needs at least 3 subsets, got "
                         f"{len(masks)}")
    if not (np.all(np.isfinite(scores)) and np.all(np.isfinite(losses))):
        raise ValueError(f"{where}: scores and subset_test_losses must be finite")
    predicted = masks.astype(np.float64) @ scores.T  # [m, n_test]
    rhos = np.empty(scores.shape[0])
    for t in range(scores.shape[0]):
        if np.ptp(predicted[:, t]) == 0 or np.ptp(losses[:, t]) == 0:
            raise ValueError(f"{where}: test point {t} has a constant "
                             f"{'prediction' if np.ptp(predicted[:, t]) == 0 else 'loss'} "
                             "over the subsets; its rank correlation is undefined")
        rhos[t] = scipy.stats.spearmanr(predicted[:, t], losses[:, t]).statistic
    return (float(rhos.mean()), rhos) if per_test else float(rhos.mean())


def subset_retraining(retrain: Callable[[np.ndarray], TensorLike], n_train: int,
                      num_subsets: int, fraction: float = 0.5,
                      seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Random training subsets and the test losses after retraining on each, for LDS.

    Args:
      retrain: `retrain(indices) -> [n_test]` test losses of a model retrained on the
        training examples `indices` (sorted int array).
      n_train: the number of training examples.
      num_subsets: how many subsets (>= 3), each of round(fraction * n_train) examples drawn
        without replacement.
      fraction: the share of the training set in each subset, in (0, 1); it must leave at
        least one example in and one out.
      seed: the numpy seed of the draws.

    Returns:
      `(subsets [num_subsets, n_train] bool, losses [num_subsets, n_test] float64)`.

    Raises:
      TypeError: `retrain` is not callable.
      ArgumentError: `n_train` below 2 or `num_subsets` below 3.
      ValueError: `fraction` out of range, or `retrain` returning other than one [n_test]
        vector of the same length each time.
    """
    where = "subset_retraining"
    if not callable(retrain):
        raise TypeError(f"{where}: retrain must be callable, got {type(retrain).__name__}")
    n_train = checks.integer(n_train, "n_train", where, least=2)
    num_subsets = checks.integer(num_subsets, "num_subsets", where, least=3)
    if not 0 < fraction < 1:
        raise ValueError(f"{where}: fraction must be in (0, 1), got {fraction!r}")
    size = int(round(fraction * n_train))
    if not 1 <= size < n_train:
        raise ValueError(f"{where}: fraction={fraction} of n_train={n_train} gives subsets of "
                         f"{size} examples; it must leave at least one in and one out")
    rng = np.random.default_rng(seed)
    masks = np.zeros((num_subsets, n_train), bool)
    losses = []
    for j in range(num_subsets):
        idx = np.sort(rng.choice(n_train, size, replace=False))
        masks[j, idx] = True
        out = np.asarray(retrain(idx), np.float64)
        if out.ndim != 1 or (losses and out.shape != losses[0].shape):
            raise ValueError(f"{where}: retrain must return one [n_test] vector of test losses "
                             f"(the same length each time), got shape {out.shape}")
        losses.append(out)
    return masks, np.stack(losses)


def mislabel_detection_rate(self_scores: TensorLike, flipped: TensorLike,
                            fractions: Sequence[float] = (0.1, 0.2)) -> Dict[float, float]:
    """The share of the mislabeled examples found among the top self-influence scores.

    Args:
      self_scores: [n_train] scores (e.g. `self_influence`), large = suspicious.
      flipped: [n_train] boolean mask or an array of indices of the mislabeled examples.
      fractions: fractions of the training set inspected, each in (0, 1].

    Returns:
      {fraction: the fraction of the flipped examples among the top `fraction` of the
      training set by `self_scores` (largest first)}.

    Raises:
      ValueError: `self_scores` not a finite vector, `flipped` neither a mask nor distinct
        indices or marking no example, a fraction out of (0, 1] or inspecting none.
    """
    where = "mislabel_detection_rate"
    s = np.asarray(self_scores, np.float64)
    if s.ndim != 1 or not np.all(np.isfinite(s)):
        raise ValueError(f"{where}: self_scores must be a finite [n_train] vector, got shape "
                         f"{s.shape}")
    n = len(s)
    f = np.asarray(flipped)
    if f.dtype == bool:
        if f.shape != (n,):
            raise ValueError(f"{where}: flipped as a mask must have shape [{n}], got {f.shape}")
        mask = f
    else:
        if f.ndim != 1 or (f.size and not np.issubdtype(f.dtype, np.integer)) or (
                f.size and (f.min() < 0 or f.max() >= n)) or len(np.unique(f)) != len(f):
            raise ValueError(f"{where}: flipped must be a [{n}] boolean mask or distinct "
                             f"indices in [0, {n}), got {flipped!r}")
        mask = np.zeros(n, bool)
        mask[f] = True
    if not mask.any():
        raise ValueError(f"{where}: flipped marks no example")
    order = np.argsort(-s, kind="stable")
    rates = {}
    for frac in fractions:
        if not 0 < frac <= 1:
            raise ValueError(f"{where}: each fraction must be in (0, 1], got {frac!r}")
        k = int(round(frac * n))
        if k < 1:
            raise ValueError(f"{where}: fraction {frac} of {n} examples inspects none")
        rates[frac] = float(mask[order[:k]].sum() / mask.sum())
    return rates
