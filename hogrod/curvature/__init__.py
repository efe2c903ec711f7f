"""Curvature of a loss: operators, eigenvalues, trace, spectral density, inverse-HVPs,
influence functions. Tested against dense oracles (`hogrod.hessian`, numpy). The iterations
are `hogrod.linalg`'s, compiled with products on the host (`eigen.host_solver`).

- `HessianOperator`, `GaussNewtonOperator` (`tf.linalg.LinearOperator`s over one batch or a
  tf.data set; per-layer with `layer_params`), `flatten`, `unflatten` (`operators.py`);
- `lanczos` (full reorthogonalization), `power_iteration` (deflation) (`eigen.py`);
- `hutchinson`, `hutchpp` (`trace.py`); `spectral_density` (SLQ, `density.py`);
- `conjugate_gradient` (damped), `lissa` (`inverse.py`); `influence`,
  `per_example_gradients` (`influence.py`).
- `FisherOperator` (type-2, MC, empirical), `gauss_newton_diagonal`, `mc_fisher_diagonal`,
  `hutchinson_diagonal` (`fisher.py`, likelihoods of Keras losses in `likelihood.py`);
  `per_example_gradients`, `per_example_gradient_norms` (`per_example.py`).
- `KFACOperator`, `EKFACOperator` (Dense and Conv2D, expand/reduce; `solve`, `logdet`,
  `with_damping`, `eigendecompositions`) (`kfac.py`).
- `Laplace` (a factory over `FullLaplace`, `DiagLaplace`, `KronLaplace`; all weights or the
  last layer; evidence, prior tuning, linearized predictive)
  (`laplace.py`, `posteriors.py`).
- `ekfac_influence`, `tracin`, `self_influence`, `linear_datamodeling_score`,
  `subset_retraining`, `mislabel_detection_rate` (`influence_scale.py`).
"""

from hogrod.curvature.density import spectral_density
from hogrod.curvature.fisher import (FisherOperator, gauss_newton_diagonal, hutchinson_diagonal,
                                     mc_fisher_diagonal)
from hogrod.curvature.per_example import per_example_gradient_norms
from hogrod.curvature.eigen import lanczos, power_iteration
from hogrod.curvature.influence import influence, per_example_gradients
from hogrod.curvature.influence_scale import (ekfac_influence, linear_datamodeling_score,
                                              mislabel_detection_rate, self_influence,
                                              subset_retraining, tracin)
from hogrod.curvature.inverse import conjugate_gradient, lissa
from hogrod.curvature.kfac import EKFACOperator, KFACOperator
from hogrod.curvature.laplace import DiagLaplace, FullLaplace, KronLaplace, Laplace
from hogrod.curvature.operators import (GaussNewtonOperator, HessianOperator, flatten,
                                        layer_params, unflatten)
from hogrod.curvature.trace import hutchinson, hutchpp

__all__ = ["HessianOperator", "GaussNewtonOperator", "flatten", "unflatten", "layer_params",
           "lanczos", "power_iteration", "hutchinson", "hutchpp", "spectral_density",
           "conjugate_gradient", "lissa", "influence", "per_example_gradients"]
__all__ += ["FisherOperator", "gauss_newton_diagonal", "mc_fisher_diagonal",
            "hutchinson_diagonal", "per_example_gradient_norms"]
__all__ += ["KFACOperator", "EKFACOperator", "Laplace", "FullLaplace", "DiagLaplace",
            "KronLaplace", "ekfac_influence", "tracin",
            "self_influence", "linear_datamodeling_score", "subset_retraining",
            "mislabel_detection_rate"]
