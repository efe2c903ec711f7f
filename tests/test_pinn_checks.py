"""What `pinn_loss`, the PINNacle reader and `pinn_experiment` refuse, and what they say:
points outside the domain, a numpy target in the compiled step, point sets of another
dtype than the network's, a truncated reference file, a reference with NaN rows, and
counts of zero."""

import dataclasses
import logging
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import pinn, train
from hogrod.pinn import problems


def _net(dtype="float64", dim=2):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((dim,), dtype=dtype),
                             keras.layers.Dense(4, activation="tanh", dtype=dtype),
                             keras.layers.Dense(1, dtype=dtype)])


def _l_shape_problem():
    """-Laplacian u = 0 on the L-shape [0, 2]^2 minus [1, 2]^2, u = 0 on its boundary."""
    domain = pinn.difference(pinn.Box((0.0, 0.0), (2.0, 2.0)), pinn.Box((1.0, 1.0), (2.0, 2.0)))
    zero = lambda x: tf.zeros_like(x[:, :1])  # noqa: E731
    return pinn.Problem(name="l_shape", pde=pinn.PDE([(0, 0), (1, 1)],
                                                     lambda x, d: pinn.laplacian(d, (0, 1))),
                        domain=domain, conditions=[("boundary", lambda n, s: None, zero)])


def test_points_outside_the_domain_are_named_unless_asked_for():
    problem = _l_shape_problem()
    net = _net()
    inside = pinn.sample(problem.domain, 50, "uniform", 0, dtype=np.float64)
    edge = np.array([[0.0, 0.5], [1.0, 1.5], [1.5, 1.0], [2.0, 0.3]])  # on the boundary
    pinn.pinn_loss(problem, net, inside, [edge])  # accepted
    corner = np.concatenate([inside, [[1.5, 1.5]]])  # in the square the L leaves out
    with pytest.raises(ValueError, match=r"collocation points: 1 of 51 lie outside the domain "
                                         r"of problem 'l_shape'.*\[1\.5, 1\.5\].*check_domain"):
        pinn.pinn_loss(problem, net, corner, [edge])
    far = np.concatenate([edge, [[5.0, 5.0], [5.0, 5.0]]])
    with pytest.raises(ValueError, match=r"'boundary' condition's points: 2 of 6 lie outside.*"
                                         r"\[5\.0, 5\.0\]"):
        pinn.pinn_loss(problem, net, inside, [far])
    terms = pinn.pinn_loss(problem, net, corner, [far], check_domain=False)()  # on purpose
    assert set(terms) == {"residual", "boundary"}


def test_float32_points_on_a_curved_boundary_are_inside():
    """A float32 point of a circle is off it by rounding: not a point outside the domain."""
    disk = pinn.Disk((0.3, -0.3), 0.7)
    problem = pinn.Problem(name="disk", domain=disk,
                           pde=pinn.PDE([(0, 0), (1, 1)], lambda x, d: pinn.laplacian(d, (0, 1))),
                           conditions=[("rim", lambda n, s: None, lambda x: 0.0 * x[:, :1])])
    rim = disk.boundary(4000, 0).astype(np.float32)
    points = pinn.sample(disk, 1000, "sobol", 0, dtype=np.float32)
    pinn.pinn_loss(problem, _net("float32"), points, [rim])


def test_a_numpy_target_in_the_compiled_step_names_its_condition():
    heat = problems.heat_problem(grid_shape=(3, 3))
    numpy_ic = ("initial", heat.conditions[0][1], lambda x: np.sin(math.pi * x[:, :1]))
    problem = dataclasses.replace(heat, conditions=(numpy_ic, heat.conditions[1]))
    net = _net("float32")
    points = pinn.sample(problem.domain, 16, "sobol", 0)
    conds = [fn(8, i) for i, (_, fn, _) in enumerate(problem.conditions)]
    objective = pinn.pinn_loss(problem, net, points, conds)
    step = train.make_train_step(objective, keras.optimizers.Adam(1e-3), net.trainable_variables)
    with pytest.raises(TypeError, match=r"condition 'initial': its target_fn .* TensorFlow ops "
                                        r"\(tf.sin, not np.sin\)"):
        step(None)


def test_a_point_set_of_another_dtype_than_the_network_is_named():
    problem = problems.heat_problem(grid_shape=(3, 3))
    net = _net("float32")
    points = pinn.sample(problem.domain, 16, "sobol", 0)
    conds = [fn(8, i) for i, (_, fn, _) in enumerate(problem.conditions)]
    with pytest.raises(TypeError, match=r"the collocation points of problem 'heat' are float64 "
                                        r"but the network computes in float32"):
        pinn.pinn_loss(problem, net, points.astype(np.float64), conds)
    with pytest.raises(TypeError, match=r"the 'boundary' condition's points of problem 'heat' "
                                        r"are float64"):
        pinn.pinn_loss(problem, net, points, [conds[0], conds[1].astype(np.float64)])
    with pytest.raises(TypeError, match=r"u_fn fails on the collocation points \(dtype "
                                        r"float64\).*network's dtype"):
        transform = lambda x: tf.sin(x[:, :1]) + net(x)  # noqa: E731  float64 + float32
        pinn.pinn_loss(problem, transform, points.astype(np.float64), conds)


def test_a_truncated_reference_row_names_the_file_and_line(tmp_path):
    path = tmp_path / "short.dat"
    path.write_text("% Model: synthetic\n% x y u\n0.1 0.2 0.3\n0.4 0.5 0.6\n0.7 0.8\n")
    with pytest.raises(ValueError, match=r"short\.dat, line 5 \(2 columns, 3 above\)"):
        pinn.read_reference(str(path), ("x", "y"), ("u",))
    path.write_text("% x y u\n0.1 0.2 0.3\n0.4 abc 0.6\n")
    with pytest.raises(ValueError, match=r"short\.dat, line 3:"):
        pinn.read_reference(str(path), ("x", "y"), ("u",))


def _heat_with_nan_rows():
    heat = problems.heat_problem(grid_shape=(5, 4))

    def reference(x):
        ref = np.array(heat.reference(x))
        ref[[0, 7, 11]] = np.nan  # three grid points without a reference value
        return ref
    return dataclasses.replace(heat, reference=reference)


def test_nan_rows_of_the_reference_are_left_out_counted_and_logged(tmp_path, caplog):
    from experiments import pinn as exp
    caplog.set_level(logging.WARNING)
    m = exp.pinn_experiment(str(tmp_path), problem=_heat_with_nan_rows, width=4, depth=1,
                            n_collocation=16, n_condition=8, adam_steps=1, lbfgs_maxiter=0)
    assert m["reference_rows_dropped"] == 3
    assert math.isfinite(m["relative_l2"])
    assert m["relative_l2"] == pytest.approx(m["l2re"], rel=1e-12)
    assert "NaN at 3 of its 20 grid points" in caplog.text


@pytest.mark.parametrize("kwargs,match", [
    ({"n_collocation": 0}, r"pinn_experiment.n_collocation must be an integer >= 1, got 0"),
    ({"n_condition": 0}, r"pinn_experiment.n_condition \(condition 'initial'\) must be an "
                         r"integer >= 1"),
    ({"n_condition": {"initial": 4, "boundary": 0}},
     r"pinn_experiment.n_condition \(condition 'boundary'\)"),
])
def test_zero_counts_name_the_binding(tmp_path, kwargs, match):
    from experiments import pinn as exp
    with pytest.raises(ValueError, match=match):
        exp.pinn_experiment(str(tmp_path), problem=lambda: problems.heat_problem(
            grid_shape=(3, 3)), width=4, depth=1, adam_steps=1, lbfgs_maxiter=0,
            **{"n_collocation": 8, "n_condition": 4, **kwargs})
