"""PINNacle's metric and reference files: `l2re`, `read_reference`, `pinnacle_data_dir`.

Reference files are COMSOL exports (`%` comment lines, then one row per point: the space
columns and the solution's columns, once per snapshot time for a time-dependent case) from
the folder ref/ of github.com/i207M/PINNacle; `pinnacle.py` builds its cases on them.
"""

import os
import re
from typing import Optional, Sequence, Tuple

import gin
import numpy as np

from hogrod import data as hogrod_data
from hogrod.types import TensorLike

__all__ = ["l2re", "read_reference", "pinnacle_data_dir", "TabulatedReference"]



# ---------------------------------------------------------------------------- the metric

def l2re(y_true: TensorLike, y_pred: TensorLike) -> float:
    """PINNacle's relative L2 error, ``sqrt(mean((pred - ref)^2)) / sqrt(mean(ref^2))``.

    Taken over the rows of `y_true` without NaN (points where the reference has no
    solution), all m outputs pooled, in float64.

    Args:
      y_true: the reference, [n, m]; rows holding a NaN are left out.
      y_pred: the prediction, [n, m].
    Returns:
      The relative error, a float >= 0.
    Raises:
      ValueError: shapes other than one [n, m], a reference NaN in every row, or a
        prediction NaN where the reference is defined.
    """
    ref, pred = np.asarray(y_true, np.float64), np.asarray(y_pred, np.float64)
    if ref.ndim != 2 or pred.shape != ref.shape:
        raise ValueError(f"l2re: y_true and y_pred must both be [n, m], got shapes {ref.shape} "
                         f"and {pred.shape}")
    keep = ~np.isnan(ref).any(axis=1)
    if not keep.any():
        raise ValueError("l2re: every row of the reference holds a NaN: nothing to compare")
    ref, pred = ref[keep], pred[keep]
    if np.isnan(pred).any():
        raise ValueError("l2re: the prediction holds NaN where the reference is defined")
    return float(np.sqrt(np.mean((pred - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))


# ---------------------------------------------------------------------------- reference files

@gin.configurable
def pinnacle_data_dir(directory: Optional[str] = None) -> str:
    """The folder of PINNacle's reference files.

    Args:
      directory: the folder; None: `$HOGROD_DATA/pinnacle` (see `hogrod.data`).
    Returns:
      The folder's path, normalized.
    Raises:
      ValueError: `directory` is None and HOGROD_DATA is unset; the message names the
        binding `pinnacle_data_dir.directory` and HOGROD_DATA.
    """
    return hogrod_data.data_dir(
        "pinnacle", "pinnacle_data_dir.directory (or the case's `path`)", directory)


def _header_times(path):
    """The snapshot times of a COMSOL header (`... @ t=0.1 ...`), or None without them."""
    with open(path) as f:
        for line in f:
            if not line.startswith("%"):
                return None
            if "@" in line and "t=" in line:
                return np.array([float(m) for m in re.findall(r"t=([-+0-9.eE]+)", line)])
    return None


def _layout(space, outputs, times):
    cols = ", ".join(space)
    if times is None:
        return f"{cols}, {', '.join(outputs)} ({len(space) + len(outputs)} columns)"
    n = len(space) + len(times) * len(outputs)
    return (f"{cols}, then ({', '.join(outputs)}) at each of the {len(times)} times t = "
            f"{times[0]:g}, {times[1]:g}, ..., {times[-1]:g} ({n} columns)")


def _bad_line(path):
    """", line N" for the first data line whose number of columns differs from the first
    data line's or that does not parse as numbers, "" if none does."""
    width = None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("%", 1)[0].split()
            if not fields:
                continue
            try:
                [float(v) for v in fields]
            except ValueError:
                return f", line {number}"
            if width is None:
                width = len(fields)
            elif len(fields) != width:
                return f", line {number} ({len(fields)} columns, {width} above)"
    return ""


def read_reference(path: str, space: Sequence[str], outputs: Sequence[str],
                   times: Optional[Sequence[float]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The points and values of a PINNacle (COMSOL) reference file.

    A steady file has the columns space..., outputs...; a time-dependent one has the space
    columns, then for each snapshot time its outputs, and becomes one row per (point,
    time), (space..., t) with t last, the times of a point together. Rows holding NaN (a
    point where the export has no solution) are kept: `l2re` leaves them out and
    `pinn_experiment` reports how many.

    Args:
      path: the file.
      space: the names of the spatial columns ("x", "y").
      outputs: the names of the solution components ("u", "v", "p").
      times: the snapshot times of a time-dependent file (its header's times, when it has
        them, must be these), or None for a steady one.
    Returns:
      (points [rows, dim], values [rows, m]), numpy float64.
    Raises:
      FileNotFoundError: no file at `path` (the message says where to get it).
      ValueError: a row that does not parse or has another number of columns (the message
        names the file and line), or columns or header times other than the case reads.
    """
    space, outputs = tuple(space), tuple(outputs)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"PINNacle reference file {path} not found: copy {os.path.basename(path)} from "
            f"the folder ref/ of github.com/i207M/PINNacle to {os.path.dirname(path)}, or bind "
            "pinnacle_data_dir.directory (or the case's `path`) to where it is, or set "
            f"{hogrod_data.ENV} to the folder holding pinnacle/")
    try:
        data = np.loadtxt(path, comments="%", ndmin=2)
    except ValueError as e:  # numpy names the data row, not the file or its line
        raise ValueError(f"{path}{_bad_line(path)}: {e}") from e
    expected = len(space) + (1 if times is None else len(times)) * len(outputs)
    if data.shape[1] != expected:
        raise ValueError(f"{path}: {data.shape[1]} columns, but this case reads "
                         f"{_layout(space, outputs, times)}")
    if times is None:
        return data[:, :len(space)], data[:, len(space):]
    times = np.asarray(times, np.float64)
    found = _header_times(path)
    if found is not None and (len(found) != len(times) * len(outputs) or not np.allclose(
            found[::len(outputs)], times, rtol=1e-6, atol=1e-9)):
        raise ValueError(f"{path}: its header's times {found[:4]}... ({len(found)} columns) "
                         f"are not this case's {_layout(space, outputs, times)}")
    n, nt = len(data), len(times)
    points = np.concatenate([np.repeat(data[:, :len(space)], nt, axis=0),
                             np.tile(times, n)[:, None]], axis=1)
    values = data[:, len(space):].reshape(n * nt, len(outputs))
    return points, values


class TabulatedReference:
    """A reference known at a file's points only (the problem's grid): `reference(x)` is
    the file's values when x is the file's points (within 1e-6), else a ValueError."""

    def __init__(self, path, points, values):
        self.path, self.points, self.values = path, points, values

    def __call__(self, x):
        x = np.asarray(x)
        if x.shape != self.points.shape or not np.allclose(x, self.points, rtol=0, atol=1e-6):
            raise ValueError(f"the reference from {self.path} is known at its {len(self.points)}"
                             f" points only (problem.grid), not at points of shape {x.shape}")
        return self.values
