"""The PINNacle cases against closed forms, hand-derived residuals and numpy; the reference
reader on synthetic files (the real files are never needed)."""

import copy
import dataclasses
import json
import math

import gin
import numpy as np
import pytest
import tensorflow as tf

from hogrod import pinn
from hogrod.pinn import pinnacle as P
from hogrod.pinn import pinnacle_data

F64 = tf.float64


def _f64(x):
    return tf.constant(np.asarray(x, np.float64), F64)


def _points(problem, n=48):
    return _f64(pinn.sample(problem.domain, n, "uniform", 1, dtype=np.float64))


# ---------------------------------------------------------------- closed forms (tf, float64),
# written here from PINNacle's src/pde/ formulas, independently of the module's numpy ones

def heat_ms_exact(x, a=20 * math.pi, b=math.pi, c1=1 / (500 * math.pi) ** 2, c2=1 / math.pi ** 2):
    return tf.sin(a * x[:, 0:1]) * tf.sin(b * x[:, 1:2]) * tf.exp(
        -(c1 * a ** 2 + c2 * b ** 2) * x[:, 2:3])


def wave_exact(x):
    return (tf.sin(math.pi * x[:, 0:1]) * tf.cos(2 * math.pi * x[:, 1:2])
            + 0.5 * tf.sin(4 * math.pi * x[:, 0:1]) * tf.cos(8 * math.pi * x[:, 1:2]))


def poisson_nd_exact(x):
    return tf.reduce_sum(tf.sin(math.pi / 2 * x), axis=1, keepdims=True)


def heat_nd_exact(x):
    return tf.exp(tf.reduce_sum(x[:, :-1] ** 2, axis=1, keepdims=True) / 2 + x[:, -1:])


ANALYTIC = {"heat2d_ms": (P.pinnacle_heat2d_multiscale, heat_ms_exact),
            "wave1d": (P.pinnacle_wave1d, wave_exact),
            "poisson_nd": (P.pinnacle_poisson_nd, poisson_nd_exact),
            "heat_nd": (P.pinnacle_heat_nd, heat_nd_exact)}


@pytest.mark.parametrize("case", sorted(ANALYTIC))
def test_the_closed_form_solves_the_pde_and_its_conditions(case):
    factory, exact = ANALYTIC[case]
    problem = factory()
    x = _points(problem)
    u_scale = float(tf.reduce_max(tf.abs(exact(x))))
    r = pinn.residual(problem.pde, exact, x)
    np.testing.assert_allclose(r, 0.0, atol=1e-9 * max(u_scale, 1.0) * 100)
    for condition in problem.conditions:
        xc = _f64(condition[1](64, 3))  # float32 points: on the boundary to ~1e-7
        misfit = pinn.condition_misfit(condition, exact, xc)
        np.testing.assert_allclose(misfit, 0.0, atol=1e-5 * max(u_scale, 1.0),
                                   err_msg=f"{case}: condition {condition[0]}")
    # the module's numpy reference is the same closed form
    np.testing.assert_allclose(problem.reference(problem.grid[:500]),
                               exact(_f64(problem.grid[:500])), rtol=1e-12, atol=1e-12)


def test_a_wrong_solution_leaves_a_residual_and_condition_misfits():
    """The oracle above can fail: perturbed solutions violate the PDE and the conditions."""
    problem = P.pinnacle_heat_nd()
    wrong = lambda x: heat_nd_exact(x) * (1 + 0.01 * x[:, -1:] ** 2)  # noqa: E731
    assert np.abs(pinn.residual(problem.pde, wrong, _points(problem))).max() > 1e-3
    wave = P.pinnacle_wave1d()
    moving = lambda x: wave_exact(x) + 0.01 * x[:, 1:2]  # noqa: E731  u_t(x, 0) = 0.01
    velocity = wave.conditions[0]
    assert velocity[0] == "initial_velocity"
    np.testing.assert_allclose(
        pinn.condition_misfit(velocity, moving, _f64(velocity[1](16, 0))), 0.01, rtol=1e-9)


def _manufactured(x):
    """u = sin(0.7 x + 1.3 y + 0.2 t) (t where there is one), for hand-derived residuals."""
    t = x[:, 2:3] if x.shape[-1] > 2 else 0.0
    return tf.sin(0.7 * x[:, 0:1] + 1.3 * x[:, 1:2] + 0.2 * t)


def test_file_cases_residuals_against_hand_derivations(tmp_path):
    x = _f64(np.random.default_rng(0).random((40, 3)) * [1.0, 1.0, 100.0])
    xs, ys, t = (x[:, i:i + 1].numpy() for i in range(3))
    s = np.sin(0.7 * xs + 1.3 * ys + 0.2 * t)
    c = np.cos(0.7 * xs + 1.3 * ys + 0.2 * t)
    lap = -(0.7 ** 2 + 1.3 ** 2) * s
    # Heat 2d-LT: u_t - 0.001 Lap u - 5 sin(u^2) (1 + 2 sin(pi t / 4)) sin(4 pi x) sin(2 pi y)
    heat = P.pinnacle_heat2d_longtime(path=_heat_file(tmp_path))
    expect = (0.2 * c - 0.001 * lap - 5 * np.sin(s ** 2) * (1 + 2 * np.sin(np.pi * t / 4))
              * np.sin(4 * np.pi * xs) * np.sin(2 * np.pi * ys))
    np.testing.assert_allclose(pinn.residual(heat.pde, _manufactured, x), expect, atol=1e-10)
    # Poisson-Boltzmann: -Lap u + 64 u - 10 (1 + x^2 + 16 + y^2) sin(pi x) sin(4 pi y)
    x2 = x[:, :2]
    s2 = np.sin(0.7 * xs + 1.3 * ys)
    boltzmann = P.pinnacle_poisson_boltzmann2d(path=_steady_file(tmp_path, 1))
    expect = ((0.7 ** 2 + 1.3 ** 2) * s2 + 64 * s2 - 10 * (1 + xs ** 2 + 16 + ys ** 2)
              * np.sin(np.pi * xs) * np.sin(4 * np.pi * ys))
    np.testing.assert_allclose(pinn.residual(boltzmann.pde, _manufactured, x2), expect,
                               atol=1e-9)
    classic = P.pinnacle_poisson2d_classic(path=_steady_file(tmp_path, 1))
    np.testing.assert_allclose(pinn.residual(classic.pde, _manufactured, x2),
                               -(0.7 ** 2 + 1.3 ** 2) * s2, atol=1e-10)


def kovasznay(x, nu=1 / 40):
    """Kovasznay's exact steady Navier-Stokes flow (u, v, p) for viscosity nu."""
    lam = 1 / (2 * nu) - math.sqrt(1 / (4 * nu ** 2) + 4 * math.pi ** 2)
    e = tf.exp(lam * x[:, 0:1])
    y = 2 * math.pi * x[:, 1:2]
    return tf.concat([1 - e * tf.cos(y), lam / (2 * math.pi) * e * tf.sin(y),
                      (1 - e ** 2) / 2], axis=1)


def test_navier_stokes_residual_vanishes_on_kovasznay_flow_and_needs_three_outputs():
    pde = P.navier_stokes(1 / 40, "test")
    x = _f64(np.random.default_rng(2).random((40, 2)) * [1.5, 2.0] - [0.5, 0.5])
    np.testing.assert_allclose(pinn.residual(pde, kovasznay, x), 0.0, atol=1e-10)
    assert np.abs(pinn.residual(P.navier_stokes(1 / 20, "test"), kovasznay, x)).max() > 0.1
    with pytest.raises(ValueError, match="mlp_network.outputs = 3"):
        pinn.residual(pde, lambda z: kovasznay(z)[:, :1], x)


def test_condition_points_lie_on_their_pieces_and_targets_follow_pinnacle(tmp_path):
    lid = P.pinnacle_ns2d_liddriven(path=_steady_file(tmp_path, 3))
    pieces = {c[0]: c[1](1 if c[0] == "pressure_point" else 200, 0) for c in lid.conditions}
    assert np.allclose(pieces["lid_u"][:, 1], 1.0) and np.allclose(pieces["lid_v"][:, 1], 1.0)
    walls = pieces["wall_u"]
    assert np.all(np.isclose(walls, 0.0).any(1) | np.isclose(walls[:, 0], 1.0))
    assert not np.isclose(walls[:, 1], 1.0).any()
    flow = lambda x: tf.concat([4 * x[:, 0:1] * (1 - x[:, 0:1]) * x[:, 1:2] ** 9,  # noqa
                                0 * x[:, :1], 0 * x[:, :1]], axis=1)
    for c in lid.conditions:  # u = 4 x (1 - x) y^9: meets every lid-driven condition
        np.testing.assert_allclose(pinn.condition_misfit(c, flow, _f64(pieces[c[0]])), 0.0,
                                   atol=1e-5, err_msg=c[0])
    step = P.pinnacle_ns2d_backstep(path=_steady_file(tmp_path, 3))
    got = {c[0]: c[1](300, 0).astype(np.float64) for c in step.conditions}
    assert np.allclose(got["inlet_u"][:, 0], 0.0) and got["inlet_u"][:, 1].max() <= 1.0
    assert np.allclose(got["outlet_p"][:, 0], 4.0)
    assert step.domain.on_boundary(got["wall_u"], tol=1e-5).all()
    assert not np.isclose(got["wall_u"][:, 0], 0.0).any()
    assert not np.isclose(got["wall_u"][:, 0], 4.0).any()
    classic = P.pinnacle_poisson2d_classic(path=_steady_file(tmp_path, 1))
    circles = classic.conditions[1][1](400, 0).astype(np.float64)
    centres = np.array([[sx * 0.3, sy * 0.3] for sx in (1, -1) for sy in (1, -1)])
    dist = np.linalg.norm(circles[:, None] - centres[None], axis=2).min(1)
    np.testing.assert_allclose(dist, 0.1, atol=1e-6)
    square = classic.conditions[0][1](400, 0)
    assert np.isclose(np.abs(square), 0.5).any(1).all()


# ---------------------------------------------------------------- the reader

def _steady_file(tmp_path, outputs, rows=5, name=None):
    path = tmp_path / (name or f"steady{outputs}.dat")
    data = np.random.default_rng(outputs).random((rows, 2 + outputs))
    np.savetxt(path, data, header="Model: synthetic\nx y u", comments="% ")
    return str(path)


def _heat_file(tmp_path):
    """x, y, then u at t = 0, 0.2, ..., 100 (heat_longtime.dat's layout), 3 rows."""
    times = np.linspace(0, 100, 501)
    data = np.random.default_rng(0).random((3, 2 + 501))
    header = "X Y " + " ".join(f"u (K) @ t={t:g}" for t in times)
    path = tmp_path / "heat.dat"
    np.savetxt(path, data, header=header, comments="% ")
    return str(path)


def test_reader_lays_time_snapshots_out_as_rows_with_time_last(tmp_path):
    path = tmp_path / "burgers.dat"
    data = np.array([[-1.0, 10.0, 11.0, 12.0], [0.5, 20.0, 21.0, 22.0]])
    header = "X  u (1) @ t=0  u (1) @ t=0.5  u (1) @ t=1"
    np.savetxt(path, data, header=header, comments="% ")
    points, values = pinn.read_reference(str(path), ("x",), ("u",), times=[0.0, 0.5, 1.0])
    np.testing.assert_array_equal(points, [[-1, 0], [-1, 0.5], [-1, 1], [0.5, 0], [0.5, 0.5],
                                           [0.5, 1]])
    np.testing.assert_array_equal(values, [[10], [11], [12], [20], [21], [22]])
    # two outputs per time, interleaved as PINNacle's files hold them (u, v at t0, u, v at t1)
    two = tmp_path / "two.dat"
    np.savetxt(two, [[0.1, 1.0, 2.0, 3.0, 4.0]], comments="% ")
    points, values = pinn.read_reference(str(two), ("x",), ("u", "v"), times=[0.0, 1.0])
    np.testing.assert_array_equal(points, [[0.1, 0.0], [0.1, 1.0]])
    np.testing.assert_array_equal(values, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="header's times"):
        pinn.read_reference(str(path), ("x",), ("u",), times=[0.0, 0.4, 1.0])


def test_reader_steady_layout_and_its_errors(tmp_path):
    path = _steady_file(tmp_path, 3)
    points, values = pinn.read_reference(path, ("x", "y"), ("u", "v", "p"))
    data = np.loadtxt(path, comments="%")
    np.testing.assert_array_equal(points, data[:, :2])
    np.testing.assert_array_equal(values, data[:, 2:])
    with pytest.raises(ValueError, match=r"steady3\.dat.*5 columns.*x, y, u \(3 columns\)"):
        pinn.read_reference(path, ("x", "y"), ("u",))
    with pytest.raises(ValueError, match="heat.dat.*503 columns.*502 columns"):
        pinn.read_reference(_heat_file(tmp_path), ("x", "y"), ("u",),
                            times=np.linspace(0, 100, 500))
    missing = str(tmp_path / "nowhere" / "lid_driven_a4.dat")
    with pytest.raises(FileNotFoundError, match=r"nowhere.*lid_driven_a4\.dat.*i207M/PINNacle"):
        P.pinnacle_ns2d_liddriven(path=missing)


def test_the_default_data_dir_is_hogrod_data_and_a_binding_moves_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOGROD_DATA", str(tmp_path / "data"))
    assert pinnacle_data.pinnacle_data_dir() == str(tmp_path / "data" / "pinnacle")
    monkeypatch.delenv("HOGROD_DATA")
    with pytest.raises(ValueError, match=r"pinnacle_data_dir\.directory.*HOGROD_DATA"):
        P.pinnacle_ns2d_liddriven()
    _steady_file(tmp_path, 3, name="lid_driven_a4.dat")
    gin.bind_parameter("pinnacle_data_dir.directory", str(tmp_path))
    assert P.pinnacle_ns2d_liddriven().grid.shape == (5, 2)


def test_tabulated_reference_is_known_at_the_file_points_only(tmp_path):
    problem = P.pinnacle_poisson2d_classic(path=_steady_file(tmp_path, 1))
    assert problem.reference(problem.grid).shape == (5, 1)
    with pytest.raises(ValueError, match="known at its 5 points only"):
        problem.reference(problem.grid[:3])


# ---------------------------------------------------------------- the metric

def test_l2re_is_pinnacles_pooled_relative_error_without_nan_rows():
    rng = np.random.default_rng(0)
    ref, pred = rng.normal(size=(50, 3)), rng.normal(size=(50, 3))
    ref[[3, 17], 1] = np.nan
    keep = np.ones(50, bool)
    keep[[3, 17]] = False
    diff = (pred - ref)[keep]
    expect = np.sqrt((diff ** 2).mean()) / np.sqrt((ref[keep] ** 2).mean())
    assert pinnacle_data.l2re(ref, pred) == pytest.approx(expect, rel=1e-12)
    assert pinnacle_data.l2re(ref[keep], pred[keep]) == pytest.approx(
        np.linalg.norm(diff) / np.linalg.norm(ref[keep]), rel=1e-12)
    with pytest.raises(ValueError, match="shapes"):
        pinnacle_data.l2re(ref, pred[:, :2])
    with pytest.raises(ValueError, match="every row"):
        pinnacle_data.l2re(np.full((2, 1), np.nan), np.zeros((2, 1)))


# ---------------------------------------------------------------- conditions and the binary

def test_an_operator_condition_refuses_a_plain_misfit_and_survives_copies():
    velocity = P.pinnacle_wave1d().conditions[0]
    with pytest.raises(ValueError, match="condition_misfit"):
        velocity[2](tf.zeros([2, 2]))
    for c in (copy.deepcopy(velocity), copy.copy(velocity)):
        assert isinstance(c, pinn.Condition) and c.operator is velocity.operator
    wave = P.pinnacle_wave1d()
    assert dataclasses.replace(wave, name="w").conditions[0].operator is not None


def _burgers_file(tmp_path):
    """A synthetic burgers1d.dat: 3 points x 11 times, u = x + t."""
    times = np.linspace(0, 1, 11)
    xs = np.array([-0.5, 0.0, 0.5])
    data = np.concatenate([xs[:, None], xs[:, None] + times[None]], axis=1)
    path = tmp_path / "burgers1d.dat"
    np.savetxt(path, data, header="X " + " ".join(f"u (1) @ t={t:g}" for t in times),
               comments="% ")
    return str(path)


def test_a_pinnacle_config_runs_and_writes_l2re_and_prediction(tmp_path):
    from experiments import pinn as exp
    from hogrod import harness
    out = tmp_path / "run"
    params = [f"pinnacle_burgers1d.path = '{_burgers_file(tmp_path)}'",
              "pinn_experiment.width = 8", "pinn_experiment.depth = 1",
              "pinn_experiment.n_collocation = 64",
              "pinn_experiment.n_condition = {'initial': 16, 'boundary': 16}",
              "pinn_experiment.adam_steps = 3", "pinn_experiment.checkpoint_every = 100"]
    _, metrics = harness.run(exp.pinn_experiment, ["configs/pinn/pinnacle/burgers1d_c.gin"],
                             params, str(out))
    saved = np.load(out / "prediction.npz")
    points, pred = saved["points"], saved["prediction"]
    assert points.shape == (33, 2) and pred.shape == (33, 1)
    np.testing.assert_allclose(points[:11, 1], np.linspace(0, 1, 11))  # time last
    ref = points[:, :1] + points[:, 1:]  # the file's u = x + t
    expect = np.sqrt(((pred - ref) ** 2).mean()) / np.sqrt((ref ** 2).mean())
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["l2re"] == pytest.approx(expect, rel=1e-5) == metrics["l2re"]
    with pytest.raises(ValueError, match=r"n_condition.*\['initial', 'boundary'\]"):
        harness.run(exp.pinn_experiment, ["configs/pinn/pinnacle/burgers1d_c.gin"],
                    params + ["pinn_experiment.n_condition = {'initial': 16}"],
                    str(tmp_path / "bad"))


def test_a_fixed_point_condition_needs_its_own_count(tmp_path):
    lid = P.pinnacle_ns2d_liddriven(path=_steady_file(tmp_path, 3))
    point = lid.conditions[-1]
    assert point[0] == "pressure_point" and point[1](1, 0).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="'pressure_point': 1"):
        point[1](2048, 0)


def test_pinn_loss_fits_an_operator_condition_through_its_operator():
    wave = P.pinnacle_wave1d()
    conds = [_f64(c[1](32, i)) for i, c in enumerate(wave.conditions)]
    x = _points(wave, 16)
    exact = pinn.pinn_loss(wave, wave_exact, x, conds)()
    assert max(float(v) for v in exact.values()) < 1e-10
    moving = lambda z: wave_exact(z) + 0.01 * z[:, 1:2]  # noqa: E731  u_t(x, 0) = 0.01
    terms = pinn.pinn_loss(wave, moving, x, conds)()
    assert float(terms["initial_velocity"]) == pytest.approx(1e-4, rel=1e-9)
    assert float(terms["initial"]) < 1e-20


def test_burgers1d_initial_and_boundary_targets_are_the_cole_hopf_solutions(tmp_path):
    """Burgers 1d-C is Raissi's problem: its conditions agree with the Cole-Hopf solution."""
    burgers = P.pinnacle_burgers1d(path=_burgers_file(tmp_path))
    assert burgers.time_dependent and P.pinnacle_heat_nd().time_dependent
    assert not P.pinnacle_poisson_nd().time_dependent
    for name, points_fn, target in burgers.conditions:
        x = points_fn(64, 0).astype(np.float64)
        exact = pinn.burgers_cole_hopf(x[:, 0], x[:, 1])[:, None]
        np.testing.assert_allclose(target(_f64(x)), exact, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(burgers.conditions[1][1](64, 0)[:, 0] ** 2, 1.0)
