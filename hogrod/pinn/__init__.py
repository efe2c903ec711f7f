"""Physics-informed networks.

- `partials`, `laplacian`, `divergence` (`operators.py`);
- `PDE`, `residual`, and `burgers`, `poisson`, `heat`, `wave`, `allen_cahn`, `helmholtz`,
  `advection` (`pdes.py`);
- `Box`, `Disk`, `union`, `difference`, `intersection` (CSG), `sample` (uniform, LHS, Sobol,
  Hammersley; rejection for non-boxes), `hammersley`, `refine` (`geometry.py`);
- `burgers_cole_hopf` and closed forms (`reference.py`);
- `Problem` (keywords), inverse problems (`Unknown`, `Observations`, `bind_unknowns`,
  `unknowns_report`) and gin factories `burgers_problem`, `burgers_inverse_problem`,
  `poisson_problem`, `heat_problem`, `wave_problem`, `helmholtz_problem`,
  `allen_cahn_problem`, `advection_problem` (`problems.py`);
- `pinn_loss`, `term_names`, `solution_fn`, `lbfgs` (scipy L-BFGS-B), `relative_l2`,
  `predict_on_grid`, `Clock` (training seconds without evaluations), `seconds_to_error`
  (`training.py`);
- loss weighting schemes, chosen in gin by reference (`weighting.py`): `grad_norm_weights`
  (learning-rate annealing; `annealing_weights`), `ntk_weights`, `causal_weights`,
  `self_adaptive_weights`, all returning a `Weighting`; gPINN terms: `pinn_loss(gpinn=...)`.
- `FourierFeatures`, `PeriodicEmbedding`, `FactorizedDense` layers and the gin factories
  `fourier_features`, `periodic_embedding`, `mlp_network`, `modified_mlp` (`networks.py`);
- `stochastic_laplacian`, `laplacian_probes`: randomized Laplacians (`stochastic.py`);
  `exact_laplacian`, `randomized_laplacian` (gin factories of a `LaplacianOperator`, a
  PDE's Laplacian chosen by reference) and `poisson_nd_problem` (high-dimensional Poisson);
- `EmbeddingChain`/`embedding_chain`, `combined_weights`, `allen_cahn_spectral` (jaxpi's
  Allen-Cahn);
- `Condition`, `condition_misfit`: conditions on an operator of u (a component, a normal
  derivative) (`problems.py`);
- the PINNacle benchmark's ten cases `pinnacle_*`, `read_reference`, `l2re` (`pinnacle.py`).
"""

from hogrod.pinn.geometry import (Box, Disk, difference, hammersley, intersection, refine, sample,
                                  union)
from hogrod.pinn.operators import divergence, laplacian, partials
from hogrod.pinn.pdes import (PDE, advection, allen_cahn, burgers, heat, helmholtz, poisson,
                              residual, wave)
from hogrod.pinn.problems import (Observations, Problem, Unknown, advection_problem,
                                  allen_cahn_problem, bind_unknowns, burgers_inverse_problem,
                                  burgers_problem, heat_problem, helmholtz_problem,
                                  poisson_problem, unknowns_report, wave_problem)
from hogrod.pinn.training import (Clock, lbfgs, pinn_loss, pointwise_terms, predict_on_grid,
                                  relative_l2, seconds_to_error, solution_fn, term_names)
from hogrod.pinn.weighting import (Weighting, annealing_weights, causal_chunk_weights,
                                   causal_weights, grad_norm_weights, ntk_trace, ntk_weights,
                                   self_adaptive_weights)
from hogrod.pinn.networks import (FactorizedDense, FourierFeatures, PeriodicEmbedding,
                                  fourier_features, mlp_network, modified_mlp, periodic_embedding)
from hogrod.pinn.stochastic import laplacian_probes, stochastic_laplacian
from hogrod.pinn.pdes import LaplacianOperator, exact_laplacian, randomized_laplacian
from hogrod.pinn.problems import poisson_nd_problem, two_body_laplacian, two_body_solution
from hogrod.pinn.problems import Condition, condition_misfit
from hogrod.pinn import pinnacle
from hogrod.pinn.pinnacle import l2re, read_reference
from hogrod.pinn.networks import EmbeddingChain, embedding_chain
from hogrod.pinn.weighting import combined_weights
from hogrod.pinn.weighting import (annealed_causal_weights, balance_grad_norms,
                                   grad_norm_balance_weights)
from hogrod.pinn.reference import allen_cahn_spectral
from hogrod.pinn.reference import (burgers_cole_hopf, heat_sine, helmholtz_sine, poisson_sine,
                                   wave_sine)

__all__ = ["partials", "laplacian", "divergence", "PDE", "residual", "burgers", "poisson",
           "heat", "wave", "allen_cahn", "helmholtz", "advection", "Box", "sample", "refine",
           "burgers_cole_hopf", "poisson_sine", "heat_sine", "wave_sine", "helmholtz_sine",
           "Problem", "Unknown", "Observations", "bind_unknowns", "unknowns_report",
           "burgers_problem", "burgers_inverse_problem", "poisson_problem", "heat_problem",
           "wave_problem", "helmholtz_problem", "allen_cahn_problem", "advection_problem",
           "pinn_loss", "term_names", "solution_fn", "lbfgs", "relative_l2", "predict_on_grid",
           "Clock", "seconds_to_error", "annealing_weights",
           "pointwise_terms", "Weighting", "grad_norm_weights", "ntk_trace", "ntk_weights",
           "causal_chunk_weights", "causal_weights", "self_adaptive_weights"]
__all__ += ["FourierFeatures", "PeriodicEmbedding", "FactorizedDense", "fourier_features",
            "periodic_embedding", "mlp_network", "modified_mlp", "stochastic_laplacian",
            "laplacian_probes", "Disk", "union", "difference", "intersection", "hammersley"]
__all__ += ["EmbeddingChain", "embedding_chain", "combined_weights", "allen_cahn_spectral"]
__all__ += ["LaplacianOperator", "exact_laplacian", "randomized_laplacian",
            "poisson_nd_problem", "two_body_solution", "two_body_laplacian"]
__all__ += ["balance_grad_norms", "grad_norm_balance_weights", "annealed_causal_weights"]
__all__ += ["Condition", "condition_misfit", "pinnacle", "l2re", "read_reference"]
