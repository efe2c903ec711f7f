"""Physics-informed networks.

- `partials`, `laplacian`, `divergence` (`operators.py`);
- `PDE`, `residual`, and `burgers`, `poisson`, `heat`, `wave`, `allen_cahn`, `helmholtz`
  (`pdes.py`);
- `Box`, `sample` (uniform, LHS, Sobol), `refine` (`geometry.py`);
- `burgers_cole_hopf` and closed forms (`reference.py`);
- `Problem` and gin factories `burgers_problem`, `poisson_problem`, `heat_problem`,
  `wave_problem`, `helmholtz_problem`, `allen_cahn_problem` (`problems.py`);
- `pinn_loss`, `solution_fn`, `lbfgs` (scipy L-BFGS-B), `relative_l2`, `predict_on_grid`
  (`training.py`);
- `annealing_weights`: learning-rate-annealing loss weights (`weighting.py`).
"""

from hogrod.pinn.geometry import Box, refine, sample
from hogrod.pinn.operators import divergence, laplacian, partials
from hogrod.pinn.pdes import (PDE, allen_cahn, burgers, heat, helmholtz, poisson, residual,
                              wave)
from hogrod.pinn.problems import (Problem, allen_cahn_problem, burgers_problem, heat_problem,
                                  helmholtz_problem, poisson_problem, wave_problem)
from hogrod.pinn.training import lbfgs, pinn_loss, predict_on_grid, relative_l2, solution_fn
from hogrod.pinn.weighting import annealing_weights
from hogrod.pinn.reference import (burgers_cole_hopf, heat_sine, helmholtz_sine, poisson_sine,
                                   wave_sine)

__all__ = ["partials", "laplacian", "divergence", "PDE", "residual", "burgers", "poisson",
           "heat", "wave", "allen_cahn", "helmholtz", "Box", "sample", "refine",
           "burgers_cole_hopf", "poisson_sine", "heat_sine", "wave_sine", "helmholtz_sine",
           "Problem", "burgers_problem", "poisson_problem", "heat_problem", "wave_problem",
           "helmholtz_problem", "allen_cahn_problem", "pinn_loss", "solution_fn", "lbfgs",
           "relative_l2", "predict_on_grid", "annealing_weights"]
