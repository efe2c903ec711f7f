"""Physics-informed networks.

What a user calls is exported here:

- derivatives of a network in its inputs: `partials`, `laplacian`, `divergence`;
  `stochastic_laplacian` (Hutchinson or STDE probes);
- an equation: `PDE` (wanted derivatives and a residual) and `residual`;
- a domain: `Box`, `Disk`, `union`, `difference`, `intersection` (CSG), `sample` (uniform,
  LHS, Sobol, Hammersley), `refine` (residual-based refinement);
- a problem: `Problem` (keywords), `Condition` (a condition on an operator of u),
  `condition_misfit`, and for inverse problems `Unknown`, `Observations`, `bind_unknowns`,
  `unknowns_report`;
- training: `pinn_loss` (the objective of named terms), `term_names`, `solution_fn`,
  `lbfgs` (scipy L-BFGS-B), `relative_l2`, `predict_on_grid`, `seconds_to_error`;
- loss weighting: `Weighting` and the schemes `grad_norm_weights`, `ntk_weights`,
  `causal_weights`, `self_adaptive_weights`;
- networks: `mlp_network`, `modified_mlp`;
- the PINNacle metric and reference files: `l2re`, `read_reference`;
- a closed-form reference: `burgers_cole_hopf`.

The catalogues a config chooses from by gin reference are the modules: `pdes` (`burgers`,
`poisson`, `heat`, `wave`, `allen_cahn`, `helmholtz`, `advection`, `exact_laplacian`,
`randomized_laplacian`), `problems` (`burgers_problem`, `heat_problem`, ...,
`poisson_nd_problem`), `weighting` (every scheme, `annealing_weights`, ...), `networks`
(`FourierFeatures`, `PeriodicEmbedding`, `FactorizedDense`, the embedding factories),
`reference` (closed forms, `allen_cahn_spectral`) and `pinnacle` (the PINNacle benchmark's
ten cases `pinnacle_*`). Importing this package registers all of them with gin.
"""

from hogrod.pinn import (geometry, jet, networks, operators, pdes, pinnacle,  # noqa: F401
                         pinnacle_data, problem, problems, reference, stochastic, training,
                         weighting)
from hogrod.pinn.geometry import Box, Disk, difference, intersection, refine, sample, union
from hogrod.pinn.networks import mlp_network, modified_mlp
from hogrod.pinn.operators import divergence, laplacian, partials
from hogrod.pinn.pdes import PDE, residual
from hogrod.pinn.pinnacle_data import l2re, read_reference
from hogrod.pinn.problem import (Condition, Observations, Problem, Unknown, bind_unknowns,
                                 condition_misfit, unknowns_report)
from hogrod.pinn.reference import burgers_cole_hopf
from hogrod.pinn.stochastic import stochastic_laplacian
from hogrod.pinn.training import (lbfgs, pinn_loss, predict_on_grid, relative_l2,
                                  seconds_to_error, solution_fn, term_names)
from hogrod.pinn.weighting import (Weighting, causal_weights, grad_norm_weights, ntk_weights,
                                   self_adaptive_weights)

__all__ = ["partials", "laplacian", "divergence", "stochastic_laplacian", "PDE", "residual",
           "Box", "Disk", "union", "difference", "intersection", "sample", "refine",
           "Problem", "Condition", "condition_misfit", "Unknown", "Observations",
           "bind_unknowns", "unknowns_report", "pinn_loss", "term_names", "solution_fn",
           "lbfgs", "relative_l2", "predict_on_grid", "seconds_to_error", "Weighting",
           "grad_norm_weights", "ntk_weights", "causal_weights", "self_adaptive_weights",
           "mlp_network", "modified_mlp", "l2re", "read_reference", "burgers_cole_hopf"]
