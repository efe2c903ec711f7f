"""Boxes (space or space-time) and collocation sampling: uniform, Latin hypercube, Sobol
(`scipy.stats.qmc`), and residual-based adaptive refinement."""

import warnings

import numpy as np
import scipy.stats.qmc

__all__ = ["Box", "sample", "refine"]


class Box:
    """An axis-aligned box [low_i, high_i]; for space-time put time last."""

    def __init__(self, low, high):
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if self.low.shape != self.high.shape or np.any(self.high <= self.low):
            raise ValueError(f"Box needs low < high of one shape, got {low} and {high}")

    @property
    def dim(self):
        return len(self.low)


def sample(box, n, method="sobol", seed=0):
    """n points in the box, float32 [n, dim]; method "uniform", "lhs" or "sobol"."""
    rng = np.random.default_rng(seed)
    if method == "uniform":
        unit = rng.random((n, box.dim))
    elif method == "lhs":
        unit = scipy.stats.qmc.LatinHypercube(d=box.dim, seed=rng).random(n)
    elif method == "sobol":
        with warnings.catch_warnings():  # n need not be a power of 2: the points asked for
            warnings.filterwarnings("ignore", "The balance properties of Sobol")
            unit = scipy.stats.qmc.Sobol(d=box.dim, scramble=True, seed=rng).random(n)
    else:
        raise ValueError(f"sampling method must be 'uniform', 'lhs' or 'sobol', got {method!r}")
    return (box.low + unit * (box.high - box.low)).astype(np.float32)


def refine(points, residual_fn, box, candidates=10000, add=1000, seed=0):
    """Residual-based adaptive refinement: add the `add` candidates (of `candidates` fresh
    Sobol points) with the largest |residual| to `points`."""
    cand = sample(box, candidates, "sobol", seed)
    r = np.abs(np.asarray(residual_fn(cand))).reshape(len(cand), -1).sum(axis=1)
    return np.concatenate([points, cand[np.argsort(r)[::-1][:add]]], axis=0)
