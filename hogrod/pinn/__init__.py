"""Physics-informed networks (work in progress: operators, residuals, geometry, references).

- `partials`, `laplacian`, `divergence` (`operators.py`);
- `PDE`, `residual`, and `burgers`, `poisson`, `heat`, `wave`, `allen_cahn`, `helmholtz`
  (`pdes.py`);
- `Box`, `sample` (uniform, LHS, Sobol), `refine` (`geometry.py`);
- `burgers_cole_hopf` and closed forms (`reference.py`).
Training (loss weighting, Adam then L-BFGS, inverse problems) and `experiments/pinn.py` are
not written yet.
"""

from hogrod.pinn.geometry import Box, refine, sample
from hogrod.pinn.operators import divergence, laplacian, partials
from hogrod.pinn.pdes import (PDE, allen_cahn, burgers, heat, helmholtz, poisson, residual,
                              wave)
from hogrod.pinn.reference import (burgers_cole_hopf, heat_sine, helmholtz_sine, poisson_sine,
                                   wave_sine)

__all__ = ["partials", "laplacian", "divergence", "PDE", "residual", "burgers", "poisson",
           "heat", "wave", "allen_cahn", "helmholtz", "Box", "sample", "refine",
           "burgers_cole_hopf", "poisson_sine", "heat_sine", "wave_sine", "helmholtz_sine"]
