"""The PINNacle benchmark's cases (Hao et al., NeurIPS 2024) as `Problem`s.

Ten cases, each a gin-configurable factory with PINNacle's PDE, domain, conditions and
coefficients (its repository i207M/PINNacle, `src/pde/`):

| factory | PINNacle | reference |
| --- | --- | --- |
| `pinnacle_burgers1d` | Burgers 1d-C (Burgers1D) | burgers1d.dat |
| `pinnacle_poisson2d_classic` | Poisson 2d-C (Poisson2D_Classic) | poisson1_cg_data.dat |
| `pinnacle_poisson_boltzmann2d` | Poisson 2d-CG (PoissonBoltzmann2D) | poisson_boltzmann2d.dat |
| `pinnacle_heat2d_longtime` | Heat 2d-LT (Heat2D_LongTime) | heat_longtime.dat |
| `pinnacle_ns2d_liddriven` | NS 2d-C (NS2D_LidDriven, a = 4) | lid_driven_a4.dat |
| `pinnacle_ns2d_backstep` | NS 2d-CG (NS2D_BackStep) | ns_0_obstacle.dat |
| `pinnacle_heat2d_multiscale` | Heat 2d-MS (Heat2D_Multiscale) | closed form |
| `pinnacle_wave1d` | Wave 1d-C (Wave1D) | closed form |
| `pinnacle_poisson_nd` | Poisson Nd (PoissonND, d = 5) | closed form |
| `pinnacle_heat_nd` | Heat Nd (HeatND, d = 5) | closed form |

Conditions are soft, one loss term per PINNacle boundary/initial condition and output
component (DeepXDE's terms, each a mean over its points). Where PINNacle constrains one
component of (u, v, p) or a normal derivative, the condition is a `Condition` (its misfit
is operator(u_fn, x) - target(x)). The point counts per condition (PINNacle's 2,048
boundary points shared by the pieces of the boundary in proportion to their length) are in
the configs, `configs/pinn/pinnacle/`.

Reference files are COMSOL exports read by `pinnacle_data.read_reference` from
`pinnacle_data_dir()` (`$HOGROD_DATA/pinnacle` unless `pinnacle_data_dir.directory` is
bound; each factory's `path` binding overrides both); the evaluation points are the file's points (PINNacle's test set).
The closed-form cases are evaluated, as PINNacle does, on 2,500 grid points in 2-D and
20,000 interior points otherwise (Hammersley here). `pinnacle_data.l2re` is PINNacle's
metric.
"""

import math
import os

import gin
import numpy as np
import tensorflow as tf

from hogrod.pinn import pdes
from hogrod.pinn.csg import _dtype
from hogrod.pinn.geometry import Box, Disk, Geometry, difference, sample, union
from hogrod.pinn.operators import laplacian, partials
from hogrod.pinn.pinnacle_data import TabulatedReference, pinnacle_data_dir, read_reference
from hogrod.pinn.problem import Condition, Problem

__all__ = ["pinnacle_burgers1d", "pinnacle_poisson2d_classic", "pinnacle_poisson_boltzmann2d",
           "pinnacle_heat2d_longtime", "pinnacle_ns2d_liddriven", "pinnacle_ns2d_backstep",
           "pinnacle_heat2d_multiscale", "pinnacle_wave1d", "pinnacle_poisson_nd",
           "pinnacle_heat_nd", "navier_stokes", "heat_multiscale_solution", "wave1d_solution",
           "poisson_nd_solution", "heat_nd_solution"]


def _file_problem(name, path, default_file, space, outputs, times=None, mesh=False, **kw):
    """mesh: the file's points and times form a (space points, times) mesh to plot."""
    path = os.path.join(pinnacle_data_dir(), default_file) if path is None else path
    points, values = read_reference(path, space, outputs, times)
    shape = (len(points) // len(times), len(times)) if mesh else None
    return Problem(name=name, reference=TabulatedReference(path, points, values), grid=points,
                   grid_shape=shape, **kw)


# ---------------------------------------------------------------------------- point sets

# points_fn(n, seed, dtype=None): drawn in float64, cast once to dtype (None: floatx), so a
# float64 run's points are not rounded through float32

def _on_boundary(geometry, keep=None):
    """points_fn: n points uniform on the geometry's boundary, where `keep(x)` (a piece)."""
    def points(n, seed, dtype=None):
        dtype = _dtype(dtype, "points_fn")
        if keep is None:
            return geometry.boundary(n, seed, dtype=np.float64).astype(dtype)
        rng, got, drawn = np.random.default_rng(seed), [], 0
        while sum(map(len, got)) < n:
            x = geometry.boundary(max(2 * n, 1024), int(rng.integers(2 ** 31)),
                                  dtype=np.float64)
            got.append(x[keep(x)])
            drawn += len(x)
            if sum(map(len, got)) < 1e-3 * drawn and drawn >= 100000:
                raise ValueError(f"no points of the boundary of {geometry!r} lie on the "
                                 "piece asked for")
        return np.concatenate(got)[:n].astype(dtype)
    return points


def _lateral(space, t0, t1):
    """points_fn: n points on the spatial boundary of space x [t0, t1], t uniform."""
    def points(n, seed, dtype=None):
        dtype = _dtype(dtype, "points_fn")
        x = space.boundary(n, seed, dtype=np.float64)
        t = t0 + (t1 - t0) * np.random.default_rng(seed + 7919).random((n, 1))
        return np.concatenate([x, t], axis=1).astype(dtype)
    return points


def _initial(space, t0):
    """points_fn: n Hammersley points of the space at time t0."""
    def points(n, seed, dtype=None):
        dtype = _dtype(dtype, "points_fn")
        x = sample(space, n, "hammersley", seed, dtype=np.float64)
        return np.concatenate([x, np.full((n, 1), t0)], axis=1).astype(dtype)
    return points


def _fixed(points_array, name):
    """points_fn for a fixed point set: n must be its size."""
    pts = np.asarray(points_array, np.float64)

    def points(n, seed, dtype=None):
        dtype = _dtype(dtype, "points_fn")
        if n != len(pts):
            raise ValueError(f"condition {name!r} is at the {len(pts)} fixed point(s) "
                             f"{pts.tolist()}: give it n = {len(pts)} points (pinn_experiment."
                             f"n_condition = {{..., '{name}': {len(pts)}}}), got {n}")
        return pts.astype(dtype)
    return points


class _SpaceTime(Geometry):
    """space x [t0, t1] (time last), for interior sampling (no boundary sampling)."""

    def __init__(self, space, t0, t1):
        self.space, self.t0, self.t1 = space, float(t0), float(t1)

    @property
    def dim(self):
        return self.space.dim + 1

    @property
    def bbox(self):
        b = self.space.bbox
        return Box(np.append(b.low, self.t0), np.append(b.high, self.t1))

    def __repr__(self):
        return f"{self.space!r} x [{self.t0}, {self.t1}]"

    def _inside(self, x, tol):
        t = x[:, -1]
        return self.space._inside(x[:, :-1], tol) & (t >= self.t0 - tol) & (t <= self.t1 + tol)

    def _interior(self, x, tol):
        t = x[:, -1]
        return self.space._interior(x[:, :-1], tol) & (t > self.t0 + tol) & (t < self.t1 - tol)

    def _boundary(self, n, rng):
        raise ValueError(f"{self!r}: sample its boundary with the spatial boundary x time")


# ---------------------------------------------------------------------------- operators

def _outputs(u, m, case):
    """u [n, m], or an error naming the binding that sets the network's outputs."""
    if u.shape.rank != 2 or u.shape[-1] != m:
        raise ValueError(f"{case} has {m} output(s) but the network gives shape {u.shape}: "
                         f"bind mlp_network.outputs = {m}")
    return u


def _component(c, m, case):
    """operator: output component c of the m outputs."""
    return lambda u_fn, x: _outputs(u_fn(x), m, case)[:, c:c + 1]


def _constant(value):
    return lambda x: tf.fill([tf.shape(x)[0], 1], tf.constant(value, x.dtype))


def _dirichlet(name, points_fn, target, c, m, case):
    return Condition(name, points_fn, target, _component(c, m, case))


# ---------------------------------------------------------------------------- the cases

@gin.configurable
def pinnacle_burgers1d(path=None, nu=0.01 / math.pi):
    """Burgers 1d-C: u_t + u u_x = nu u_xx, x in [-1, 1], t in [0, 1], u(x, 0) = -sin(pi x),
    u(+-1, t) = 0."""
    space = Box((-1.0,), (1.0,))
    domain = Box((-1.0, 0.0), (1.0, 1.0))
    return _file_problem(
        "pinnacle_burgers1d", path, "burgers1d.dat", ("x",), ("u",),
        times=np.linspace(0.0, 1.0, 11), mesh=True, domain=domain, time_dependent=True,
        pde=pdes.burgers(nu), conditions=[
            ("initial", _initial(space, 0.0), lambda x: -tf.sin(math.pi * x[:, :1])),
            ("boundary", _lateral(space, 0.0, 1.0), _constant(0.0))])


def _square_minus_disks(low, high, disks):
    rect = Box(low, high)
    holes = [Disk(c, r) for c, r in disks]
    circles = holes[0]
    for d in holes[1:]:
        circles = union(circles, d)
    return rect, circles, difference(rect, circles)


@gin.configurable
def pinnacle_poisson2d_classic(path=None):
    """Poisson 2d-C: Laplacian u = 0 on [-0.5, 0.5]^2 minus the disks of radius 0.1 at
    (+-0.3, +-0.3); u = 1 on the square's sides, u = 0 on the circles."""
    rect, circles, domain = _square_minus_disks(
        (-0.5, -0.5), (0.5, 0.5), [((sx * 0.3, sy * 0.3), 0.1) for sx in (1, -1)
                                   for sy in (1, -1)])
    return _file_problem(
        "pinnacle_poisson2d_classic", path, "poisson1_cg_data.dat", ("x", "y"), ("u",),
        domain=domain, pde=pdes.PDE([(0, 0), (1, 1)], lambda x, d: laplacian(d, (0, 1))),
        conditions=[("rectangle", _on_boundary(rect), _constant(1.0)),
                    ("circles", _on_boundary(circles), _constant(0.0))])


def _boltzmann_source(x, a, mu):
    xs, ys = x[:, 0:1], x[:, 1:2]
    return a * (mu[0] ** 2 + xs ** 2 + mu[1] ** 2 + ys ** 2) * tf.sin(
        mu[0] * math.pi * xs) * tf.sin(mu[1] * math.pi * ys)


@gin.configurable
def pinnacle_poisson_boltzmann2d(path=None, k=8.0, mu=(1.0, 4.0), a=10.0):
    """Poisson 2d-CG: -Laplacian u + k^2 u = a (mu1^2 + x^2 + mu2^2 + y^2) sin(mu1 pi x)
    sin(mu2 pi y) on [-1, 1]^2 minus four disks; u = 0.2 on the square's sides, 1 on the
    circles."""
    rect, circles, domain = _square_minus_disks(
        (-1.0, -1.0), (1.0, 1.0), [((0.5, 0.5), 0.2), ((0.4, -0.4), 0.4),
                                   ((-0.2, -0.7), 0.1), ((-0.6, 0.5), 0.3)])
    pde = pdes.PDE([(), (0, 0), (1, 1)], lambda x, d: -laplacian(d, (0, 1)) + k ** 2 * d[()]
                   - _boltzmann_source(x, a, mu))
    return _file_problem(
        "pinnacle_poisson_boltzmann2d", path, "poisson_boltzmann2d.dat", ("x", "y"), ("u",),
        domain=domain, pde=pde,
        conditions=[("rectangle", _on_boundary(rect), _constant(0.2)),
                    ("circles", _on_boundary(circles), _constant(1.0))])


@gin.configurable
def pinnacle_heat2d_longtime(path=None, k=1.0, m1=4, m2=2):
    """Heat 2d-LT: u_t = 0.001 Laplacian u + 5 sin(k u^2) (1 + 2 sin(pi t / 4)) sin(m1 pi x)
    sin(m2 pi y) on [0, 1]^2 x [0, 100]; u(x, y, 0) = sin(4 pi x) sin(3 pi y), u = 0 on the
    sides."""
    space = Box((0.0, 0.0), (1.0, 1.0))

    def residual(x, d):
        u, xs, ys, t = d[()], x[:, 0:1], x[:, 1:2], x[:, 2:3]
        return (d[(2,)] - 0.001 * laplacian(d, (0, 1)) - 5.0 * tf.sin(k * u ** 2)
                * (1.0 + 2.0 * tf.sin(t * (math.pi / 4))) * tf.sin(m1 * math.pi * xs)
                * tf.sin(m2 * math.pi * ys))
    return _file_problem(
        "pinnacle_heat2d_longtime", path, "heat_longtime.dat", ("x", "y"), ("u",),
        times=np.linspace(0.0, 100.0, 501), domain=Box((0.0, 0.0, 0.0), (1.0, 1.0, 100.0)),
        time_dependent=True,
        pde=pdes.PDE([(), (2,), (0, 0), (1, 1)], residual), conditions=[
            ("initial", _initial(space, 0.0),
             lambda x: tf.sin(4 * math.pi * x[:, 0:1]) * tf.sin(3 * math.pi * x[:, 1:2])),
            ("boundary", _lateral(space, 0.0, 100.0), _constant(0.0))])


def navier_stokes(nu, case):
    """Steady incompressible Navier-Stokes in (x, y) for outputs (u, v, p): residuals
    (u u_x + v u_y + p_x - nu Lap u, u v_x + v v_y + p_y - nu Lap v, u_x + v_y)."""
    def residual(x, d):
        w = _outputs(d[()], 3, case)
        u, v = w[:, 0:1], w[:, 1:2]
        dx, dy, dxx, dyy = d[(0,)], d[(1,)], d[(0, 0)], d[(1, 1)]
        mx = u * dx[:, 0:1] + v * dy[:, 0:1] + dx[:, 2:3] - nu * (dxx[:, 0:1] + dyy[:, 0:1])
        my = u * dx[:, 1:2] + v * dy[:, 1:2] + dy[:, 2:3] - nu * (dxx[:, 1:2] + dyy[:, 1:2])
        return tf.concat([mx, my, dx[:, 0:1] + dy[:, 1:2]], axis=1)
    return pdes.PDE([(), (0,), (1,), (0, 0), (1, 1)], residual)


@gin.configurable
def pinnacle_ns2d_liddriven(path=None, a=4.0, nu=1 / 100):
    """NS 2d-C: steady Navier-Stokes (nu = 1/100) in the unit square, outputs (u, v, p); lid
    y = 1: u = a x (1 - x), v = 0; the other sides u = v = 0; p(0, 0) = 0."""
    case = "pinnacle_ns2d_liddriven"
    square = Box((0.0, 0.0), (1.0, 1.0))
    top = _on_boundary(square, lambda x: np.isclose(x[:, 1], 1.0))
    walls = _on_boundary(square, lambda x: ~np.isclose(x[:, 1], 1.0))
    zero = _constant(0.0)
    return _file_problem(
        case, path, "lid_driven_a4.dat", ("x", "y"), ("u", "v", "p"), domain=square,
        pde=navier_stokes(nu, case), conditions=[
            _dirichlet("lid_u", top, lambda x: a * x[:, 0:1] * (1.0 - x[:, 0:1]), 0, 3, case),
            _dirichlet("lid_v", top, zero, 1, 3, case),
            _dirichlet("wall_u", walls, zero, 0, 3, case),
            _dirichlet("wall_v", walls, zero, 1, 3, case),
            _dirichlet("pressure_point", _fixed([[0.0, 0.0]], "pressure_point"), zero, 2, 3,
                       case)])


@gin.configurable
def pinnacle_ns2d_backstep(path=None, nu=1 / 100):
    """NS 2d-CG: steady Navier-Stokes (nu = 1/100) in [0, 4] x [0, 2] minus [0, 2] x [1, 2]
    (a backward-facing step), outputs (u, v, p); inlet x = 0: u = 4 y (1 - y), v = 0; outlet
    x = 4: p = 0; the other walls u = v = 0."""
    case = "pinnacle_ns2d_backstep"
    eps = 1e-5  # PINNacle's: the step reaches past the left side
    domain = difference(Box((0.0, 0.0), (4.0, 2.0)), Box((-eps, 1.0), (2.0, 2.0 + eps)))
    inlet = _on_boundary(domain, lambda x: np.isclose(x[:, 0], 0.0))
    outlet = _on_boundary(domain, lambda x: np.isclose(x[:, 0], 4.0))
    walls = _on_boundary(domain, lambda x: ~(np.isclose(x[:, 0], 0.0)
                                             | np.isclose(x[:, 0], 4.0)))
    zero = _constant(0.0)
    return _file_problem(
        case, path, "ns_0_obstacle.dat", ("x", "y"), ("u", "v", "p"), domain=domain,
        pde=navier_stokes(nu, case), conditions=[
            _dirichlet("inlet_u", inlet, lambda x: 4.0 * x[:, 1:2] * (1.0 - x[:, 1:2]), 0, 3,
                       case),
            _dirichlet("inlet_v", inlet, zero, 1, 3, case),
            _dirichlet("outlet_p", outlet, zero, 2, 3, case),
            _dirichlet("wall_u", walls, zero, 0, 3, case),
            _dirichlet("wall_v", walls, zero, 1, 3, case)])


def _analytic_grid(domain, points):
    """PINNacle's test points for a closed form: a grid of about `points` in 2-D (its
    uniform_points), Hammersley points otherwise; (grid, grid_shape)."""
    if domain.dim == 2 and isinstance(domain, Box):
        side = int(round(math.sqrt(points)))
        axes = [np.linspace(lo, hi, side) for lo, hi in zip(domain.low, domain.high)]
        mesh = np.meshgrid(*axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1), (side, side)
    return sample(domain, points, "hammersley", 0, dtype=np.float64), None


def heat_multiscale_solution(x, pde_coef=(1 / (500 * math.pi) ** 2, 1 / math.pi ** 2),
                             init_coef=(20 * math.pi, math.pi)):
    """sin(a x) sin(b y) exp(-(c1 a^2 + c2 b^2) t), numpy [n, 1]."""
    x = np.asarray(x, np.float64)
    decay = pde_coef[0] * init_coef[0] ** 2 + pde_coef[1] * init_coef[1] ** 2
    return (np.sin(init_coef[0] * x[:, 0]) * np.sin(init_coef[1] * x[:, 1])
            * np.exp(-decay * x[:, 2]))[:, None]


@gin.configurable
def pinnacle_heat2d_multiscale(pde_coef=(1 / (500 * math.pi) ** 2, 1 / math.pi ** 2),
                               init_coef=(20 * math.pi, math.pi), test_points=20000):
    """Heat 2d-MS: u_t = c1 u_xx + c2 u_yy on [0, 1]^2 x [0, 5], u(x, y, 0) = sin(a x)
    sin(b y), u = 0 on the sides; solution sin(a x) sin(b y) exp(-(c1 a^2 + c2 b^2) t)."""
    c1, c2 = pde_coef
    space = Box((0.0, 0.0), (1.0, 1.0))
    domain = Box((0.0, 0.0, 0.0), (1.0, 1.0, 5.0))
    grid, shape = _analytic_grid(domain, test_points)
    return Problem(
        name="pinnacle_heat2d_multiscale", domain=domain, time_dependent=True,
        pde=pdes.PDE([(2,), (0, 0), (1, 1)],
                     lambda x, d: d[(2,)] - c1 * d[(0, 0)] - c2 * d[(1, 1)]),
        conditions=[("initial", _initial(space, 0.0),
                     lambda x: tf.sin(init_coef[0] * x[:, 0:1]) * tf.sin(init_coef[1] * x[:, 1:2])),
                    ("boundary", _lateral(space, 0.0, 5.0), _constant(0.0))],
        reference=lambda x: heat_multiscale_solution(x, pde_coef, init_coef), grid=grid,
        grid_shape=shape)


def wave1d_solution(x, a=4):
    """sin(pi x) cos(2 pi t) + sin(a pi x) cos(2 a pi t) / 2 on (x, t), numpy [n, 1]."""
    x = np.asarray(x, np.float64)
    xs, t = x[:, 0:1], x[:, 1:2]
    return (np.sin(np.pi * xs) * np.cos(2 * np.pi * t)
            + 0.5 * np.sin(a * np.pi * xs) * np.cos(2 * a * np.pi * t))


def _time_derivative(u_fn, x):
    return partials(u_fn, x, [(x.shape[-1] - 1,)])[(x.shape[-1] - 1,)]


@gin.configurable
def pinnacle_wave1d(c=2.0, a=4, test_points=2500):
    """Wave 1d-C: u_tt = c^2 u_xx on [0, 1] x [0, 1]; u(x, 0) = sin(pi x) + sin(a pi x) / 2,
    u_t(x, 0) = 0, u(0, t) = u(1, t) = 0; solution `wave1d_solution` (for c = 2)."""
    domain = Box((0.0, 0.0), (1.0, 1.0))
    space = Box((0.0,), (1.0,))
    grid, shape = _analytic_grid(domain, test_points)

    def solution(x):
        return (tf.sin(math.pi * x[:, 0:1]) * tf.cos(2 * math.pi * x[:, 1:2])
                + 0.5 * tf.sin(a * math.pi * x[:, 0:1]) * tf.cos(2 * a * math.pi * x[:, 1:2]))
    return Problem(
        name="pinnacle_wave1d", domain=domain, pde=pdes.wave(c), time_dependent=True,
        conditions=[Condition("initial_velocity", _initial(space, 0.0), _constant(0.0),
                              _time_derivative),
                    ("initial", _initial(space, 0.0), solution),
                    ("boundary", _lateral(space, 0.0, 1.0), solution)],
        reference=lambda x: wave1d_solution(x, a), grid=grid, grid_shape=shape)


def poisson_nd_solution(x):
    """sum_i sin(pi x_i / 2), numpy [n, 1]."""
    return np.sin(np.pi / 2 * np.asarray(x, np.float64)).sum(axis=1, keepdims=True)


@gin.configurable
def pinnacle_poisson_nd(dim=5, length=1.0, test_points=20000):
    """Poisson Nd: -Laplacian u = (pi^2 / 4) sum_i sin(pi x_i / 2) on [0, length]^dim, u =
    its solution sum_i sin(pi x_i / 2) on the boundary."""
    domain = Box([0.0] * dim, [length] * dim)
    grid, shape = _analytic_grid(domain, test_points)
    pde = pdes.PDE([(i, i) for i in range(dim)], lambda x, d: laplacian(d, range(dim)) + (
        math.pi ** 2 / 4) * tf.reduce_sum(tf.sin(math.pi / 2 * x), axis=1, keepdims=True))
    return Problem(
        name="pinnacle_poisson_nd", domain=domain, pde=pde,
        conditions=[("boundary", _on_boundary(domain), lambda x: tf.reduce_sum(
            tf.sin(math.pi / 2 * x), axis=1, keepdims=True))],
        reference=poisson_nd_solution, grid=grid, grid_shape=shape)


def heat_nd_solution(x):
    """exp(|x|^2 / 2 + t) on (x_1..x_d, t), numpy [n, 1]."""
    x = np.asarray(x, np.float64)
    return np.exp((x[:, :-1] ** 2).sum(axis=1, keepdims=True) / 2 + x[:, -1:])


def _normal_derivative_ball(u_fn, x):
    """x_s . grad_s u / |x_s| over the spatial coordinates (the outward normal of a ball
    centred at 0)."""
    dim = x.shape[-1] - 1
    d = partials(u_fn, x, [(i,) for i in range(dim)])
    xs = x[:, :dim]
    grad = tf.concat([d[(i,)] for i in range(dim)], axis=1)
    return tf.reduce_sum(xs * grad, axis=1, keepdims=True) / tf.norm(xs, axis=1, keepdims=True)


@gin.configurable
def pinnacle_heat_nd(dim=5, t_end=1.0, test_points=20000):
    """Heat Nd: u_t = Laplacian u / dim + f, f = -|x|^2 exp(|x|^2 / 2 + t) / dim, on the unit
    ball of R^dim x [0, t_end]; du/dn = exp(|x|^2 / 2 + t) on the sphere (PINNacle's Neumann
    condition), u(x, 0) = exp(|x|^2 / 2); solution exp(|x|^2 / 2 + t)."""
    ball = Disk([0.0] * dim, 1.0)
    domain = _SpaceTime(ball, 0.0, t_end)
    grid, shape = _analytic_grid(domain, test_points)

    def exact(x):
        return tf.exp(tf.reduce_sum(x[:, :-1] ** 2, axis=1, keepdims=True) / 2 + x[:, -1:])

    def residual(x, d):
        r2 = tf.reduce_sum(x[:, :-1] ** 2, axis=1, keepdims=True)
        f = -r2 * tf.exp(r2 / 2 + x[:, -1:]) / dim
        return laplacian(d, range(dim)) / dim + f - d[(dim,)]
    return Problem(
        name="pinnacle_heat_nd", domain=domain, time_dependent=True,
        pde=pdes.PDE([(dim,)] + [(i, i) for i in range(dim)], residual),
        conditions=[Condition("boundary", _lateral(ball, 0.0, t_end), exact,
                              _normal_derivative_ball),
                    ("initial", _initial(ball, 0.0), exact)],
        reference=heat_nd_solution, grid=grid, grid_shape=shape)
