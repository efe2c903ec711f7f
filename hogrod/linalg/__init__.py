"""Iterative solvers on a symmetric linear operator given as a product `matvec(v)`.

Conjugate gradient, the Neumann series, power iteration and Lanczos, written once for
every family; and `simplex_qp`, a batched interior-point solver for the quadratic programs
with rows on simplices that the few-shot SVM head solves (dense tensors, not products).

`matvec` maps a tree of tensors (see `hogrod.tree`) to a tree of the same structure, shapes
and dtypes: an HVP `lambda v: hogrod.hvp(loss, params, v)`, a Gauss-Newton product, a
dense matrix's `lambda v: A @ v`. Each solver runs eagerly (its loop is a Python loop
then, so `matvec` may call numpy), inside `tf.function` (one `tf.while_loop`, so the
graph does not grow with the iteration count), and inside `tf.vectorized_map` (one solve
per task, each stopping at its own iteration). Small dense work on the host (the
tridiagonal eigenproblem) is left to `scipy.linalg.eigh_tridiagonal`.
"""

from hogrod.linalg.qp import SimplexQP, simplex_kkt_solve, simplex_qp
from hogrod.linalg.solvers import CGInfo, CGIterates, NeumannInfo, cg, neumann
from hogrod.linalg.spectral import LanczosResult, lanczos, power_iteration

__all__ = ["cg", "CGInfo", "CGIterates", "neumann", "NeumannInfo", "power_iteration", "lanczos",
           "LanczosResult", "simplex_qp", "SimplexQP",
           "simplex_kkt_solve"]
