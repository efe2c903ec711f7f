"""Condition points at the run's dtype: `points_fn(n, seed, dtype=None)`.

Every built-in points_fn (the problem factories', the PINNacle cases') draws in float64 and
casts once to `dtype` (Keras's floatx by default), so a float64 run fits float64 points that
float32 never rounded, and a float32 run the same points rounded once. The experiment
passes its dtype down. Oracles: the float64 draw itself (the float32 points are its rounding)
and float32's grid (float64 points off it).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from experiments import pinn as exp
from hogrod.pinn import pinnacle, problems


def _steady_file(tmp_path, outputs, rows=5):
    path = tmp_path / f"steady{outputs}.dat"
    data = np.random.default_rng(outputs).random((rows, 2 + outputs))
    np.savetxt(path, data, header="Model: synthetic\nx y u", comments="% ")
    return str(path)


def _problems(tmp_path):
    one, three = _steady_file(tmp_path, 1), _steady_file(tmp_path, 3)
    return [problems.burgers_problem(hard_constraints=False, grid_shape=(4, 3)),
            problems.heat_problem(grid_shape=(4, 3)), problems.poisson_problem(grid_points=4),
            problems.advection_problem(grid_shape=(4, 3)),
            problems.allen_cahn_problem(hard_constraints=False, grid_shape=(4, 3)),
            pinnacle.pinnacle_poisson2d_classic(path=one),
            pinnacle.pinnacle_poisson_boltzmann2d(path=one),
            pinnacle.pinnacle_ns2d_liddriven(path=three),
            pinnacle.pinnacle_ns2d_backstep(path=three),
            pinnacle.pinnacle_heat2d_multiscale(), pinnacle.pinnacle_wave1d(test_points=16),
            pinnacle.pinnacle_poisson_nd(test_points=16), pinnacle.pinnacle_heat_nd(test_points=16)]


def _count(name):
    return 1 if name == "pressure_point" else 24


def _off_float32(x):
    """Whether some coordinate is not a float32 number (it was not rounded through float32)."""
    return bool(np.any(x != x.astype(np.float32).astype(np.float64)))


def test_every_builtin_points_fn_draws_at_the_dtype_asked(tmp_path):
    floatx = np.dtype(keras.config.floatx())
    checked = 0
    for problem in _problems(tmp_path):
        for name, points_fn, _ in problem.conditions:
            n = _count(name)
            x64 = points_fn(n, 3, dtype=np.float64)
            assert x64.dtype == np.float64 and x64.shape == (n, problem.domain.dim), name
            assert problem.domain.inside(x64).all(), (problem.name, name)
            x32 = points_fn(n, 3)  # Keras's floatx
            assert x32.dtype == floatx, (problem.name, name)
            np.testing.assert_array_equal(x32, x64.astype(floatx))  # rounded once
            np.testing.assert_array_equal(points_fn(n, 3, dtype=tf.float64), x64)
            if name != "pressure_point":  # a fixed corner, a float32 number itself
                assert _off_float32(x64), (problem.name, name)
            checked += 1
    assert checked >= 25


def test_a_float64_experiment_fits_condition_points_float32_never_rounded():
    prob = problems.heat_problem(grid_shape=(4, 3))
    points, conds = exp.collocation(prob, 8, 16, "sobol", 0, tf.float64)
    assert [c.dtype for c in conds] == [tf.float64, tf.float64]
    for c in conds:
        assert _off_float32(c.numpy())
    # the float32 run: the same draw, rounded once
    _, conds32 = exp.collocation(prob, 8, 16, "sobol", 0, tf.float32)
    for c32, c64 in zip(conds32, conds):
        np.testing.assert_array_equal(c32.numpy(), c64.numpy().astype(np.float32))


def test_a_points_fn_rejects_a_dtype_that_is_not_floating():
    points_fn = problems.heat_problem(grid_shape=(4, 3)).conditions[0][1]
    with pytest.raises(ValueError, match="dtype must be a floating dtype"):
        points_fn(4, 0, dtype=np.int32)
