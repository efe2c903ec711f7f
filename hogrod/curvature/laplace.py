"""Laplace approximations of a Keras model's posterior, in laplace-torch's shape
(Daxberger et al. 2021): `Laplace(model, likelihood, subset, hessian, ...)` makes the
posterior of one structure (`posteriors.py`: FullLaplace, DiagLaplace, KronLaplace), then
`fit(data)`, `log_marginal_likelihood`, `optimize_prior_precision`, `predictive`.

The model's current weights theta* are taken as the MAP of the summed log-likelihood plus a
Gaussian prior N(prior_mean, diag(1 / prior_precision)). `fit(data)` computes the
Gauss-Newton matrix H (= the type-2 Fisher) of the SUMMED negative log-likelihood over the
data set, without the noise scale, exactly as laplace-torch does, from the curvature
operators (`FisherOperator`, `gauss_newton_diagonal`, `KFACOperator`):

- "regression": the Gaussian likelihood N(y; f(x), sigma_noise^2 I); H = sum_i J_i^T J_i
  and the posterior precision is P = H / sigma_noise^2 + diag(prior_precision);
- "classification": the categorical likelihood of softmax(f(x)) (the model outputs LOGITS);
  H = sum_i J_i^T (diag(p_i) - p_i p_i^T) J_i, P = H + diag(prior_precision).

hessian: "full" (dense H), "diag" (its exact diagonal) or "kron" (K-FAC: one Kronecker
factor pair per Dense / Conv2D layer, `kron_bias` "joint" or "separate", the exact diagonal
for other layers). subset: "all" (every trainable variable) or "last_layer" (the variables
of the model's last layer, which must produce the model's output; the layers before it give
fixed features). prior_precision: a number, or a vector of one value per variable of the
subset (laplace-torch's layer-wise prior) or per parameter (its diagonal prior).

`log_marginal_likelihood(prior_precision, sigma_noise)` is laplace-torch's
    log p(y | theta*) - 0.5 * (log det P - log det P_0 + (theta* - mu_0)^T P_0 (theta* - mu_0)),
in float64, differentiable in both hyperparameters (tf tensors or variables included); the
values given are stored, as laplace-torch does. For a model linear in its weights with the
regression likelihood, theta* the exact MAP and hessian="full" it is the exact log evidence
log N(y; 0, sigma^2 I + X X^T / delta) (tests/test_curvature_laplace.py).

`optimize_prior_precision` tunes the prior precision (scalar, layer-wise or diagonal, and
the noise) by the evidence (Adam on the logs as laplace-torch, or L-BFGS), or a scalar by a
grid search on a validation set's NLL.

`predictive(x)` is the linearized (GLM) predictive: f ~ N(f(x; theta*), J(x) P^-1 J(x)^T).
Regression returns (mean [N, C], variance [N, C, C]) of f, WITHOUT the observation noise
(as laplace-torch; `observation_noise=True` adds sigma_noise^2 I). Classification returns
class probabilities [N, C]: the probit approximation softmax(mu / sqrt(1 + pi/8 var)) or
the Monte Carlo mean of softmax over samples of f.

`strategy=` (a tf.distribute.Strategy) splits each batch of `fit`'s data (a Dataset) over
the replicas for hessian "full" and "kron" (`FisherOperator` / `KFACOperator` with the
strategy); the summed log-likelihood, the checks, the last layer's features and "diag"'s
diagonal are computed on the host device. The result equals one device's.

Differences from laplace-torch:
- hessian="kron" factors a layer's kernel and bias JOINTLY by default (kron_bias="joint":
  the ones-column K-FAC, which keeps the kernel-bias cross terms and is exact for one Dense
  layer with one output); laplace-torch factors each bias separately (kron_bias="separate"
  here); the evidences differ (e.g. by 0.08% on a 3-10-2 tanh MLP at its initial weights,
  64 Gaussian examples; the terms dropped are G (x) E[a], larger where a layer's inputs
  have a large mean).
- hessian="kron" keeps one prior precision per Kronecker block: a per-parameter ("diag")
  prior is refused, and a layer-wise one needs kron_bias="separate" for layers with a bias
  (laplace-torch's kron takes scalar or layer-wise priors too).
- the names are "kron" (not "kfac"), `steps` (Adam's count) and `maxiter` (L-BFGS's limit)
  where laplace-torch has `n_steps`; optimizer="lbfgs" is an addition; method="gridsearch"
  tunes a scalar prior and warns when its optimum is an end of the grid.
- values given to `log_marginal_likelihood` are stored as laplace-torch does, but only when
  it is called eagerly: inside tf.function, passing them is refused (the evidence is then
  taken at the stored values).
- subset "all" and "last_layer" only (no "subnetwork"), hessian "full", "diag", "kron" only
  (no "lowrank", "gp"); `temperature` is not supported; likelihoods "regression" and
  "classification" (the model outputs logits; a softmax output layer is refused).
- the regression predictive's variance is [N, C, C] as laplace-torch's; the classification
  predictive's "mc" draws are stateless (`seed`), "bridge" is not offered.
"""

from typing import Optional, Union

import keras
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.laplace_base import LIKELIHOODS, SUBSETS
from hogrod.curvature.posteriors import KRON_BIASES, DiagLaplace, FullLaplace, KronLaplace
from hogrod.types import TensorLike

__all__ = ["Laplace", "FullLaplace", "DiagLaplace", "KronLaplace", "HESSIANS", "LIKELIHOODS",
           "SUBSETS", "KRON_BIASES"]

HESSIANS = ("full", "diag", "kron")
_POSTERIORS = {"full": FullLaplace, "diag": DiagLaplace, "kron": KronLaplace}


def Laplace(model: keras.Model, likelihood: str = "regression", subset: str = "all",
            hessian: str = "full", *, prior_precision: TensorLike = 1.0,
            sigma_noise: float = 1.0, prior_mean: TensorLike = 0.0, kron_bias: str = "joint",
            strategy: Optional[tf.distribute.Strategy] = None
            ) -> Union[FullLaplace, DiagLaplace, KronLaplace]:
    """The Laplace approximation of `model` at its current weights; call `fit(data)` next.

    The model's weights theta* are taken as the MAP of the summed log-likelihood plus a
    Gaussian prior N(prior_mean, diag(1 / prior_precision)); `fit(data)` computes the
    Gauss-Newton matrix H of the summed negative log-likelihood (as laplace-torch), and the
    posterior precision is P = H / sigma_noise^2 + diag(prior_precision) (regression) or
    H + diag(prior_precision) (classification). `hogrod.curvature.laplace` documents the
    formulas and the differences from laplace-torch.

    Args:
      model: a built Keras 3 model; `model(x, training=False)` is [batch, C]: regression
        outputs, or class logits (C >= 2) for classification.
      likelihood: "regression" (Gaussian, noise `sigma_noise`) or "classification"
        (categorical on softmax of the logits).
      subset: "all" (every trainable variable) or "last_layer" (the variables of the model's
        last layer, which must produce the model's output, on fixed features).
      hessian: "full" (dense H, `FullLaplace`), "diag" (its exact diagonal, `DiagLaplace`)
        or "kron" (K-FAC blocks, `KronLaplace`).
      prior_precision: delta > 0: a number, or a vector of one value per variable of the
        subset or per parameter.
      sigma_noise: the regression noise's standard deviation (> 0); must stay 1.0 for
        classification.
      prior_mean: mu_0, a number (every parameter) or a flat vector of the subset's size.
      kron_bias: hessian="kron": "joint" (kernel and bias in one Kronecker block) or
        "separate" (laplace-torch's: the bias its own block).
      strategy: a tf.distribute.Strategy: `fit`'s operators split each batch of its data (a
        Dataset) over the replicas; the result equals one device's. Default None.

    Returns:
      A FullLaplace, DiagLaplace or KronLaplace, not yet fitted.

    Raises:
      ArgumentError: an argument out of its choices or range, `kron_bias` given with
        another hessian than "kron", or a model the subset or likelihood cannot take.
    """
    where = "Laplace"
    checks.choice(hessian, HESSIANS, "hessian", where)
    kwargs = dict(prior_precision=prior_precision, sigma_noise=sigma_noise,
                  prior_mean=prior_mean, strategy=strategy)
    if hessian == "kron":
        kwargs["kron_bias"] = kron_bias
    elif kron_bias != "joint":
        raise checks.ArgumentError(f"{where}: kron_bias is for hessian='kron', got hessian="
                                   f"{hessian!r} with kron_bias={kron_bias!r}")
    return _POSTERIORS[hessian](model, likelihood, subset, **kwargs)
