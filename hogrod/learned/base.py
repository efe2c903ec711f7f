"""A learned optimizer: meta-parameters theta and the `hogrod.optim` optimizer they define.

`LearnedOptimizer` is what `mlp_optimizer(...)` and `learned_schedule(...)` return:

- ``theta = learned.init(seed)``: the meta-parameters, a nest of tensors (what an outer
  loop perturbs or differentiates; the caller may hold them as `tf.Variable`s);
- ``opt = learned.optimizer(theta)``: a `hogrod.optim.Optimizer` ``(init, update)`` whose
  ``update(grads, state, params) -> (params, state)`` is differentiable in theta, so
  `hogrod.meta.adapt(optimizer=opt)`, `hogrod.hypergrad.unrolled(opt, ...)` and
  `hogrod.train.make_train_step(objective, opt, variables)` take it. Variables in theta are
  read at each `update` (a changed variable does not retrace a `tf.function`);
- ``learned.init_state(params)``: the optimizer's starting state, the same for every theta
  (an inner problem starts particles before it knows their theta);
- ``learned.save(theta, path)`` / ``theta = learned.load(path)``: a checkpoint (numpy's
  ``.npz``: the leaves in full precision and the factory's configuration as JSON); loading
  into an optimizer built with another configuration is refused, naming the setting.
"""

import json
import os
from typing import Any, Callable, Dict, List

import numpy as np
import tensorflow as tf

from hogrod import checks, implicit, optim
from hogrod.types import DType, Params, Seed, Tree

__all__ = ["LearnedOptimizer", "FLOAT_DTYPES", "float_dtype"]

_CONFIG = "config"
#: The dtypes theta and a task may have, by name.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def float_dtype(dtype: DType, where: str) -> tf.DType:
    """A floating dtype given as a `tf.DType`, a numpy dtype or its name.

    Args:
        dtype: the value given as `dtype`.
        where: the public function checked, first in the message.

    Returns:
        The `tf.DType`.

    Raises:
        ArgumentError: `dtype` is none of `FLOAT_DTYPES` (a number too: `tf.as_dtype`
            would read 1 as float32).
    """
    return tf.as_dtype(checks.choice(getattr(dtype, "name", dtype), FLOAT_DTYPES, "dtype",
                                     where))


def _leaf_key(i: int) -> str:
    return f"theta_{i}"


class LearnedOptimizer:
    """Meta-parameters and the optimizer they define (see the module docstring).

    Built by a factory (`mlp_optimizer`, `learned_schedule`), not by hand.

    Args:
        name: the factory's name, e.g. "mlp_optimizer" (recorded in checkpoints).
        config: the factory's settings, JSON-serializable (numbers, strings, lists),
            recorded in checkpoints and compared when one is loaded.
        spec: theta's structure, a nest of `tf.TensorSpec` (shape and dtype per leaf).
        init: ``init(seed) -> theta``, `seed` a ``[2]`` int64 stateless seed.
        build: ``build(theta) -> hogrod.optim.Optimizer``, theta already checked.
        init_state: ``init_state(params) -> state``, the optimizer's starting state.
    """

    def __init__(self, name: str, config: Dict[str, Any], spec: Tree,
                 init: Callable[[tf.Tensor], Tree], build: Callable[[Tree], optim.Optimizer],
                 init_state: Callable[[Params], Any]) -> None:
        self.name = name
        self.config = json.loads(json.dumps(config))  # tuples as lists, as a file holds them
        self.spec = spec
        self._init, self._build, self._init_state = init, build, init_state
        self._where = f"hogrod.learned.{name}"

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{self.name}({settings})"

    def init(self, seed: Seed) -> Tree:
        """The starting meta-parameters, a function of `seed` only.

        Args:
            seed: an int >= 0 or a ``[2]`` integer stateless seed.

        Returns:
            theta, a nest of tensors of `spec`'s structure, shapes and dtypes.

        Raises:
            ArgumentError: `seed` is neither.
        """
        return self._init(checks.stateless_seed(seed, "seed", f"{self._where}.init"))

    def check_theta(self, theta: Tree, arg: str = "theta") -> List[tf.Tensor]:
        """theta's leaves as tensors, after checking its structure, shapes and dtypes.

        Args:
            theta: a nest of tensors or variables.
            arg: its name in the messages; default "theta".

        Returns:
            The leaves (variables read), in `tf.nest.flatten` order.

        Raises:
            ArgumentError: the structure, a leaf's shape or a leaf's dtype differs from
                `spec` (the message names the leaf).
        """
        where = f"{self._where}.optimizer"
        try:
            tf.nest.assert_same_structure(theta, self.spec, check_types=False)
        except (ValueError, TypeError):
            raise checks.ArgumentError(
                f"{where}: {arg} must have the structure of {self.name}'s init(seed), "
                f"{checks.describe(self.spec)}, got {checks.describe(theta)}") from None
        leaves = []
        paths = implicit.leaf_paths(self.spec, arg)
        for path, leaf, spec in zip(paths, tf.nest.flatten(theta), tf.nest.flatten(self.spec)):
            t = tf.convert_to_tensor(leaf)
            if t.dtype != spec.dtype or not t.shape.is_compatible_with(spec.shape):
                raise checks.ArgumentError(
                    f"{where}: {path} must be {spec.dtype.name}{spec.shape.as_list()}, got "
                    f"{t.dtype.name}{t.shape.as_list()} (init(seed) draws theta at the dtype "
                    f"given to {self.name}(dtype=...))")
            leaves.append(t)
        return leaves

    def optimizer(self, theta: Tree) -> optim.Optimizer:
        """The optimizer theta defines, differentiable in theta.

        Args:
            theta: meta-parameters of `spec`'s structure (tensors, or variables read at
                every update).

        Returns:
            A `hogrod.optim.Optimizer` ``(init, update, name, None)``.

        Raises:
            ArgumentError: theta does not match `spec`.
        """
        self.check_theta(theta)
        return self._build(theta)

    def init_state(self, params: Params) -> Any:
        """The optimizer's starting state for `params` (the same for every theta).

        Args:
            params: a nest of float tensors or variables.

        Returns:
            The state ``optimizer(theta).init(params)`` returns.
        """
        return self._init_state(params)

    def save(self, theta: Tree, path: str) -> None:
        """Writes theta and this optimizer's configuration to `path` (an ``.npz`` file).

        Written to a temporary file first and renamed, so a kill leaves the old file whole.

        Args:
            theta: meta-parameters of `spec`'s structure.
            path: the file to write (its folder must exist).

        Raises:
            ArgumentError: theta does not match `spec`.
        """
        leaves = self.check_theta(theta)
        arrays = {_leaf_key(i): np.asarray(t.numpy()) for i, t in enumerate(leaves)}
        arrays[_CONFIG] = np.asarray(json.dumps({"optimizer": self.name, **self.config}))
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    def load(self, path: str) -> Tree:
        """theta from a file `save` wrote with the same configuration.

        Args:
            path: the file.

        Returns:
            theta, a nest of tensors of `spec`'s structure.

        Raises:
            FileNotFoundError: no file at `path`.
            ValueError: the file is not a learned optimizer's checkpoint, or it was saved
                with another configuration (the message names the first setting that
                differs and the binding that would match it).
        """
        where = f"{self._where}.load"
        with np.load(path, allow_pickle=False) as data:
            if _CONFIG not in data.files:
                raise ValueError(f"{where}: {path} is not a learned optimizer's checkpoint "
                                 f"(no {_CONFIG!r} entry; it holds {sorted(data.files)})")
            saved = json.loads(str(data[_CONFIG]))
            arrays = {k: data[k] for k in data.files if k != _CONFIG}
        if saved.get("optimizer") != self.name:
            raise ValueError(f"{where}: {path} holds the theta of a {saved.get('optimizer')}, "
                             f"not of a {self.name}")
        mine = {"optimizer": self.name, **self.config}
        for key in list(mine) + [k for k in saved if k not in mine]:
            if saved.get(key, "<absent>") != mine.get(key, "<absent>"):
                raise ValueError(
                    f"{where}: {path} was saved with {key}={saved.get(key, '<absent>')!r}, "
                    f"but this optimizer has {key}={mine.get(key, '<absent>')!r}; build it "
                    f"with the checkpoint's setting ({self.name}.{key} in gin)")
        specs = tf.nest.flatten(self.spec)
        if len(arrays) != len(specs):
            raise ValueError(f"{where}: {path} holds {len(arrays)} tensors, {self.name} has "
                             f"{len(specs)}")
        leaves = []
        for i, spec in enumerate(specs):
            a = arrays[_leaf_key(i)]
            if a.shape != tuple(spec.shape) or a.dtype != spec.dtype.as_numpy_dtype:
                raise ValueError(f"{where}: {path}'s tensor {i} is {a.dtype}{list(a.shape)}, "
                                 f"{self.name} expects {spec.dtype.name}{spec.shape.as_list()}")
            leaves.append(tf.constant(a, spec.dtype))
        return tf.nest.pack_sequence_as(self.spec, leaves)
