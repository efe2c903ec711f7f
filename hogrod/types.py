"""The type aliases hogrod's signatures share, defined once.

They document what a function takes; none is checked at run time beyond what the function
checks itself. A `Tree` is any `tf.nest` structure (list, tuple, dict, namedtuple) whose
leaves are tensors, variables or arrays (`hogrod.tree`). The callable aliases name the kinds
of callables of WORKSPACE's conventions, one name per kind:

- `Loss`: a Keras loss `loss(y_true, y_pred) -> scalar`;
- `Objective`: `objective(batch) -> scalar or {name: scalar}`, minimized;
- `OutputLoss`: `output_loss(z)` or `output_loss(z, batch)`, a loss of a model's output;
- `MatVec`: a linear operator `matvec(v) -> tree` on trees of one structure.
"""

from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np
import tensorflow as tf

__all__ = ["Tensor", "TensorLike", "Tree", "Params", "Batch", "DType", "Seed", "Loss",
           "Objective", "OutputLoss", "MatVec", "Scalar"]

#: A TensorFlow tensor or variable.
Tensor = Union[tf.Tensor, tf.Variable]
#: Anything `tf.convert_to_tensor` takes: a tensor, a variable, a numpy array, a Python number.
TensorLike = Union[tf.Tensor, tf.Variable, np.ndarray, float, int]
#: A nested structure (list, tuple, dict, namedtuple) of tensors, variables or arrays.
Tree = Any
#: Parameters: a list of variables or a tree of tensors of the same structure.
Params = Union[Sequence[tf.Variable], Tree]
#: One batch of data: a tensor or a tuple such as `(x, y)`.
Batch = Any
#: A TensorFlow dtype or its name (`tf.float64`, `"float64"`).
DType = Union[tf.DType, str]
#: An integer seed, or a stateless seed: a `[2]` int tensor.
Seed = Union[int, tf.Tensor]
#: A scalar: a Python number or a 0-d tensor.
Scalar = Union[float, int, tf.Tensor]
#: A Keras loss `loss(y_true, y_pred) -> scalar`.
Loss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
#: `objective(batch) -> scalar or {name: scalar}`, minimized.
Objective = Callable[..., Union[tf.Tensor, Mapping[str, tf.Tensor]]]
#: A loss of a model's output, `output_loss(z)` or `output_loss(z, batch)`.
OutputLoss = Callable[..., tf.Tensor]
#: A linear operator on trees, `matvec(v) -> tree` of `v`'s structure.
MatVec = Callable[[Tree], Tree]
