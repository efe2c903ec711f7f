"""Curvature of a loss: operators, eigenvalues, trace, spectral density, inverse products,
influence functions. Tested against dense oracles (`hogrod.hessian`, numpy). The iterations
are `hogrod.linalg`'s, compiled with products on the host (`eigen.host_solver`).

Operators (`tf.linalg.LinearOperator` objects on the flat parameter vector), all built as
`Operator(model, loss, data, *, params=None, strategy=None, ...)` from a Keras model, a
Keras loss `loss(y_true, y_pred)` and one `(x, y)` batch or a tf.data set of them:

- `HessianOperator`, `GaussNewtonOperator` (`operators.py`; an arbitrary objective through
  `HessianOperator.from_objective(objective, params, data)` and
  `GaussNewtonOperator.from_output_loss(outputs, output_loss, params, data)`), per layer
  with `layer_params`;
- `FisherOperator` (type-2, MC, empirical; `fisher.py`), `KFACOperator`, `EKFACOperator`
  (Dense and Conv2D, expand/reduce; `solve`, `logdet`, `with_damping`; `kfac.py` on
  `kfac_capture.py` and `kronecker.py`).

The empirical risk over data (batches, strategies, normalization) is `data.py`, the
likelihood of a Keras loss `likelihood.py`.

Estimators on any operator or dense matrix: `top_eigenvalues` (Lanczos or power
iteration), `hutchinson`, `hutchpp`, `spectral_density` (SLQ), `conjugate_gradient`,
`lissa`, `gauss_newton_diagonal`, `mc_fisher_diagonal`, `hutchinson_diagonal`;
`per_example_gradients`, `per_example_gradient_norms`; influence: `influence`,
`ekfac_influence`, `tracin`, `self_influence`, `linear_datamodeling_score`,
`subset_retraining`, `mislabel_detection_rate`; `Laplace` (`laplace.py`: a factory over
`FullLaplace`, `DiagLaplace`, `KronLaplace` in `posteriors.py`).
"""

from hogrod.curvature.density import spectral_density
from hogrod.curvature.eigen import top_eigenvalues
from hogrod.curvature.fisher import (FisherOperator, gauss_newton_diagonal, hutchinson_diagonal,
                                     mc_fisher_diagonal)
from hogrod.curvature.influence import influence
from hogrod.curvature.influence_scale import (ekfac_influence, linear_datamodeling_score,
                                              mislabel_detection_rate, self_influence,
                                              subset_retraining, tracin)
from hogrod.curvature.inverse import conjugate_gradient, lissa
from hogrod.curvature.kfac import EKFACOperator, KFACOperator
from hogrod.curvature.laplace import DiagLaplace, FullLaplace, KronLaplace, Laplace
from hogrod.curvature.operators import GaussNewtonOperator, HessianOperator, layer_params
from hogrod.curvature.per_example import per_example_gradient_norms, per_example_gradients
from hogrod.curvature.trace import hutchinson, hutchpp

__all__ = ["HessianOperator", "GaussNewtonOperator", "FisherOperator", "KFACOperator",
           "EKFACOperator", "layer_params", "top_eigenvalues", "hutchinson", "hutchpp",
           "spectral_density", "conjugate_gradient", "lissa", "gauss_newton_diagonal",
           "mc_fisher_diagonal", "hutchinson_diagonal", "per_example_gradients",
           "per_example_gradient_norms", "influence", "ekfac_influence", "tracin",
           "self_influence", "linear_datamodeling_score", "subset_retraining",
           "mislabel_detection_rate", "Laplace", "FullLaplace", "DiagLaplace", "KronLaplace"]
