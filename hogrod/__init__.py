"""hogrod: meta-learning and higher-order gradients for TensorFlow 2 / Keras 3.

The primitives (nested-tape autodiff and functional model calls) live at the top
level; each family has its own subpackage, imported on first use:
`hogrod.train`, `hogrod.meta`, `hogrod.gan`, `hogrod.pinn`, `hogrod.curvature`. The numerical
core they share: `hogrod.tree` (arithmetic on nested structures of tensors) and
`hogrod.linalg` (conjugate gradient, power iteration, Lanczos on a `matvec`). For bilevel
optimization: `hogrod.optim` (differentiable optimizers as pure functions) and
`hogrod.implicit` (implicit differentiation of solvers: `custom_root`, `custom_fixed_point`)
and `hogrod.hypergrad` (hypergradients: unrolled, implicit, one-step).
"""

import importlib
from types import ModuleType

from hogrod import stderr_filter  # noqa: F401  (first, before TensorFlow: a binary's filter)
from hogrod.autodiff import (batch_jacobian, derivatives, gnvp, grad, hessian, hvp,
                             hvp_operator, jacobian, value_and_grad)
from hogrod.functional import functional_call, model_state, trainable_values
from hogrod.piecewise_linear import skip_zero_curvature

__version__ = "0.1.0"

_SUBPACKAGES = ("train", "meta", "gan", "pinn", "curvature", "harness", "distribute", "tree",
                "linalg", "optim", "implicit", "hypergrad", "rl", "taskmap", "second_order",
                "learned")


# lazy subpackages: `import hogrod; hogrod.meta.adapt(...)` works
def __getattr__(name: str) -> ModuleType:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hogrod.{name}")
    raise AttributeError(f"module 'hogrod' has no attribute {name!r}")


__all__ = ["value_and_grad", "grad", "hvp", "hvp_operator", "hessian", "jacobian", "batch_jacobian",
           "derivatives", "gnvp", "functional_call", "model_state", "trainable_values",
           "skip_zero_curvature"]
