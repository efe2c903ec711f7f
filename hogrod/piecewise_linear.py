"""Second derivatives through piecewise-linear ops without the exact zeros TensorFlow builds.

Differentiating a gradient (a gradient penalty, a Hessian-vector product) differentiates the backward ops of the forward pass. For ReLU, leaky ReLU, ReLU6
and max pooling, TensorFlow's gradient of the backward op returns ``zeros_like`` for the
forward values it reads (the activations that set ReLU's mask, the pooling window's
input and output). These are exact zeros, the ops being piecewise linear, but they are
tensors: the outer backward pass then carries them through the whole forward pass of the
network, two matrix products per layer of zeros, added to nothing. In a WGAN-GP critic
step that is 4 of its 26 large products.

`skip_zero_curvature()` is a context in which those gradients are None (no gradient)
instead, so the outer pass never reaches the forward ops through them. The gradients it
gives are the same numbers; only a variable whose sole path to the differentiated value
went through these zeros becomes unconnected (None from `tf.GradientTape.gradient`,
which hogrod's callers fill with zeros). Where TensorFlow's registry is not the one this
module knows, the context changes nothing.
"""

import contextlib
import threading
from typing import Iterator

from tensorflow.python.framework import ops as _ops  # the gradient registry: no public API

__all__ = ["ZERO_CURVATURE_INPUTS", "skip_zero_curvature"]

#: The backward ops whose own gradient is exactly zero for these inputs (their indices).
ZERO_CURVATURE_INPUTS = {"ReluGrad": (1,), "LeakyReluGrad": (1,), "Relu6Grad": (1,),
                         "MaxPoolGrad": (0, 1), "MaxPoolGradV2": (0, 1)}

_lock = threading.RLock()
_depth = 0
_saved = {}


def _entries():
    """{op type: the registry's entry} for the ops above, or None when the registry is not
    a dict of {"type": function} entries (another TensorFlow)."""
    registry = getattr(getattr(_ops, "_gradient_registry", None), "_registry", None)
    if not isinstance(registry, dict):
        return None
    entries = {name: registry.get(name) for name in ZERO_CURVATURE_INPUTS}
    if not all(isinstance(e, dict) and callable(e.get("type")) for e in entries.values()):
        return None
    return entries


def _skipping(gradient, indices):
    def without_zeros(op, *grads):
        out = list(gradient(op, *grads))
        for i in indices:
            out[i] = None
        return out
    return without_zeros


@contextlib.contextmanager
def skip_zero_curvature() -> Iterator[None]:
    """A context in which differentiating the gradients of ReLU, leaky ReLU, ReLU6 and max
    pooling skips their exactly-zero second derivatives (the module docstring says why).

    Its effect is on the gradients a `tf.GradientTape` builds inside it (in a
    `tf.function`, when it is traced); it may be nested, and it restores TensorFlow's
    gradients on exit, also on an error. It is process-wide while open: another thread
    differentiating at the same time gets the same numbers, with None in place of those
    zeros.

    Yields:
        None.
    """
    global _depth
    with _lock:
        entries = _entries()
        if entries is not None and _depth == 0:
            for name, entry in entries.items():
                _saved[name] = entry["type"]
                entry["type"] = _skipping(entry["type"], ZERO_CURVATURE_INPUTS[name])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved:
                for name, entry in (_entries() or {}).items():
                    entry["type"] = _saved.pop(name, entry["type"])
                _saved.clear()

