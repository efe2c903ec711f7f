"""What the benchmarks compare hogrod with, beside the benchmarks (never installed):

- the agreement check a benchmark makes before timing two computations, `Reference`: each
  side against a float64 reference on the same inputs, with a tolerance derived from
  float32's rounding of that computation (`relative_error` its measure); `versions`, the
  peers' versions a ratio was measured against;
- the ridge hyperproblem of the hypergradient benchmarks, with its closed-form hypergradient;
- the DeepXDE peers of the PINN benchmarks (`deepxde_*_data`, `check_deepxde_peer`,
  `deepxde_glorot_normal`: DeepXDE's `"Glorot normal"` under Keras 3 gives every layer and
  seed the same weights);
- the MAML benchmark's torch network (`torch_maml_net`, the weight layouts `torch_layout`
  and `keras_layout`, `to_torch`).
"""

import math

import keras
import numpy as np
import tensorflow as tf


def ridge_hyperproblem(features, train, validation, condition, seed):
    """The hypergradient benchmarks' ridge problem, float64 numpy: inner
    0.5 ||A w - b||^2 + 0.5 sum_i exp(s_i) w_i^2, outer the validation MSE ||Av w - bv||^2 / n.
    A's singular values are log-spaced so that the inner Hessian's condition number is about
    `condition`. Returns (A, b, Av, bv, s), s below the smallest curvature."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(train, features)))
    v, _ = np.linalg.qr(rng.normal(size=(features, features)))
    sv = np.sqrt(np.logspace(0, -np.log10(condition), features))
    a = u @ np.diag(sv) @ v.T
    b = rng.normal(size=train)
    av = rng.normal(size=(validation, features)) / np.sqrt(validation)
    bv = rng.normal(size=validation)
    s = np.full(features, np.log(0.5 / condition))
    return a, b, av, bv, s


def ridge_exact_hypergradient(a, b, av, bv, s):
    """(d outer / ds at the inner minimizer, the inner Hessian H): -e^s * w* * H^-1 grad_w
    outer, by the implicit function theorem in closed form (numpy, float64)."""
    h = a.T @ a + np.diag(np.exp(s))
    w = np.linalg.solve(h, a.T @ b)
    return -np.exp(s) * w * np.linalg.solve(h, 2 * av.T @ (av @ w - bv) / len(bv)), h


def ridge_objectives(a, b, av, bv):
    """The ridge hyperproblem's (inner(w, s), outer(w, s)) as TF functions of float64 tensors."""
    a_, b_, av_, bv_ = (tf.constant(x) for x in (a, b, av, bv))

    def inner(w, s):
        r = tf.linalg.matvec(a_, w) - b_
        return 0.5 * tf.reduce_sum(r * r) + 0.5 * tf.reduce_sum(tf.exp(s) * w * w)

    def outer(w, s):
        r = tf.linalg.matvec(av_, w) - bv_
        return tf.reduce_mean(r * r)

    return inner, outer


def deepxde_burgers_data(dde, num_domain, num_boundary, num_initial, **kwargs):
    """DeepXDE's Burgers problem (u_t + u u_x = 0.01/pi u_xx on [-1, 1] x [0, 1], u(x, 0) =
    -sin(pi x), u(+-1, t) = 0) as its `TimePDE`, written as DeepXDE's example writes it: the
    peer both PINN benchmarks run. `dde` is the imported deepxde module (imported by the
    caller, so this module never needs it); `kwargs` go to `TimePDE`."""
    nu = 0.01 / np.pi
    geomtime = dde.geometry.GeometryXTime(dde.geometry.Interval(-1, 1),
                                          dde.geometry.TimeDomain(0, 1))

    def pde(x, y):
        u_x = dde.grad.jacobian(y, x, i=0, j=0)
        u_t = dde.grad.jacobian(y, x, i=0, j=1)
        u_xx = dde.grad.hessian(y, x, i=0, j=0)
        return u_t + y * u_x - nu * u_xx

    bc = dde.icbc.DirichletBC(geomtime, lambda x: 0, lambda _, on_boundary: on_boundary)
    ic = dde.icbc.IC(geomtime, lambda x: -np.sin(np.pi * x[:, 0:1]),
                     lambda _, on_initial: on_initial)
    return dde.data.TimePDE(geomtime, pde, [bc, ic], num_domain=num_domain,
                            num_boundary=num_boundary, num_initial=num_initial, **kwargs)


def deepxde_glorot_normal(seed):
    """Glorot normal weights for a DeepXDE network (`dde.nn.FNN(layers, activation,
    deepxde_glorot_normal(seed))`), drawn from a generator seeded with `seed`.

    DeepXDE 1.15's "Glorot normal" under Keras 3 is one unseeded Keras initializer object,
    which Keras 3 gives a fixed seed: every call returns the same values, so all same-shaped
    hidden layers start identical and every seed starts from the same weights. A
    SeedGenerator advances with each layer and differs by seed."""
    return keras.initializers.GlorotNormal(seed=keras.random.SeedGenerator(seed))


def deepxde_poisson2d_classic_data(dde, num_domain=8192, num_boundary=2048, **kwargs):
    """PINNacle's Poisson 2d-C (src/pde/poisson.py, Poisson2D_Classic) as PINNacle builds it:
    Laplacian u = 0 on [-0.5, 0.5]^2 minus the disks of radius 0.1 at (+-0.3, +-0.3) (nested
    `CSGDifference`s), u = 1 on the square's sides, u = 0 on the circles, `dde.data.PDE`.
    Its loss terms, in order: ("rectangle", "circles"). `kwargs` go to `PDE`."""
    geom = dde.geometry.Rectangle(xmin=[-0.5, -0.5], xmax=[0.5, 0.5])
    for c in np.array([[0.3, 0.3, 0.1], [-0.3, 0.3, 0.1], [0.3, -0.3, 0.1],
                       [-0.3, -0.3, 0.1]]):
        geom = dde.geometry.CSGDifference(geom, dde.geometry.Disk(c[0:2], c[2]))

    def pde(x, u):
        return [dde.grad.hessian(u, x, i=0, j=0) + dde.grad.hessian(u, x, i=1, j=1)]

    def rec_boundary(x, on_boundary):
        return on_boundary and (np.isclose(x[0], -0.5) or np.isclose(x[0], 0.5)
                                or np.isclose(x[1], -0.5) or np.isclose(x[1], 0.5))

    def circ_boundary(x, on_boundary):
        return on_boundary and not rec_boundary(x, on_boundary)

    bcs = [dde.icbc.DirichletBC(geom, lambda _: 1, rec_boundary),
           dde.icbc.DirichletBC(geom, lambda _: 0, circ_boundary)]
    return dde.data.PDE(geom, pde, bcs, num_domain=num_domain, num_boundary=num_boundary,
                        **kwargs)


def pinnacle_wave1d_ref_sol(x, a=4):
    """PINNacle's Wave1D ref_sol, as written there: sin(pi x) cos(2 pi t) + sin(a pi x)
    cos(2 a pi t) / 2 on (x, t) [n, 2]."""
    return (np.sin(np.pi * x[:, 0:1]) * np.cos(2 * np.pi * x[:, 1:2])
            + 0.5 * np.sin(a * np.pi * x[:, 0:1]) * np.cos(2 * a * np.pi * x[:, 1:2]))


def deepxde_wave1d_data(dde, num_domain=8192, num_boundary=2048, c=2.0, a=4, **kwargs):
    """PINNacle's Wave 1d-C (src/pde/wave.py, Wave1D) as PINNacle builds it: (x, t) in
    [0, 1]^2 treated as space (`Rectangle`, `dde.data.PDE`), u_tt = c^2 u_xx, a zero
    Neumann condition on t = 0 (outward normal -t: u_t = 0), u = ref_sol on t = 0 and on
    x = 0, 1. Its loss terms, in order: ("initial_velocity", "initial", "boundary").
    `kwargs` go to `PDE`."""
    geom = dde.geometry.Rectangle(xmin=[0, 0], xmax=[1, 1])

    def pde(x, u):
        return dde.grad.hessian(u, x, i=1, j=1) - c ** 2 * dde.grad.hessian(u, x, i=0, j=0)

    def boundary_x0(x, on_boundary):
        return on_boundary and (np.isclose(x[0], 0) or np.isclose(x[0], 1))

    def boundary_t0(x, on_boundary):
        return on_boundary and np.isclose(x[1], 0)

    def ref_sol(x):
        return pinnacle_wave1d_ref_sol(x, a)

    bcs = [dde.icbc.NeumannBC(geom, lambda _: 0, boundary_t0),
           dde.icbc.DirichletBC(geom, ref_sol, boundary_t0),
           dde.icbc.DirichletBC(geom, ref_sol, boundary_x0)]
    return dde.data.PDE(geom, pde, bcs, num_domain=num_domain, num_boundary=num_boundary,
                        **kwargs)


def _deepxde_inside(geom, x):
    if hasattr(geom, "timedomain"):  # GeometryXTime: space x time, time last
        return (np.asarray(geom.geometry.inside(x[:, :-1]))
                & np.asarray(geom.timedomain.inside(x[:, -1:])).reshape(-1))
    return np.asarray(geom.inside(x))


def _target(condition, x):
    fn = getattr(condition, "target", condition[2])
    return np.asarray(fn(tf.constant(x, tf.float64)), np.float64)


def check_deepxde_peer(data, prob, terms, n_collocation, n_condition, where, solution=None,
                       seed=0):
    """Raise ValueError (naming `where`, the config to change) unless DeepXDE's `data`
    (a `dde.data.PDE`/`TimePDE`) poses hogrod's `prob` with the same points:

    - the same domain: DeepXDE's `geom.inside` equals `prob.domain.inside` at 4,000 random
      points of hogrod's bounding box enlarged twice about its centre;
    - the same point counts: `data.num_domain` = n_collocation, `data.num_boundary` = the
      sum of n_condition (DeepXDE's boundary and initial points), and each condition's
      DeepXDE share within 4 binomial standard deviations of n_condition's (DeepXDE draws a
      boundary's pieces at random);
    - the same conditions: `terms` = [(hogrod condition name, sign)] in DeepXDE's `bcs`
      order; DeepXDE's target at its points equals sign x hogrod's there (sign -1 where
      DeepXDE's Neumann condition on an outward normal -e_j is hogrod's on d/dx_j), and
      every hogrod condition point lies on the DeepXDE condition's piece;
    - the same solution: `solution(prob.grid)` (DeepXDE's side's closed form, if any)
      equals `prob.reference(prob.grid)`.
    """
    conds = {c[0]: c for c in prob.conditions}
    names = [name for name, _ in terms]
    if sorted(names) != sorted(conds) or len(data.bcs) != len(terms):
        raise ValueError(f"{where}: hogrod's conditions {sorted(conds)} and DeepXDE's "
                         f"{len(data.bcs)} terms {names} differ")
    if data.num_domain != n_collocation:
        raise ValueError(f"{where}: DeepXDE has {data.num_domain} domain points, hogrod "
                         f"pinn_experiment.n_collocation = {n_collocation}")
    total = sum(n_condition.values())
    dde_total = data.num_boundary + (getattr(data, "num_initial", 0) or 0)
    if dde_total != total:
        raise ValueError(f"{where}: DeepXDE has {dde_total} boundary and initial points, hogrod "
                         f"pinn_experiment.n_condition sums to {total} ({n_condition})")
    rng = np.random.default_rng(seed)
    box = prob.domain.bbox  # and as much again around it: a larger DeepXDE domain shows
    x = box.low + (box.high - box.low) * (2 * rng.random((4000, prob.domain.dim)) - 0.5)
    differ = int(np.sum(_deepxde_inside(data.geom, x) != prob.domain.inside(x)))
    if differ:
        raise ValueError(f"{where}: DeepXDE's and hogrod's domains differ at {differ} of "
                         "4,000 points")
    bounds = np.cumsum([0] + list(data.num_bcs))
    for i, ((name, sign), bc) in enumerate(zip(terms, data.bcs)):
        got, want = data.num_bcs[i], n_condition[name]
        sd = math.sqrt(total * (want / total) * (1 - want / total))
        if abs(got - want) > 4 * sd + 1:
            raise ValueError(f"{where}: DeepXDE gives condition {name!r} {got} points, hogrod "
                             f"pinn_experiment.n_condition[{name!r}] = {want}")
        xb = data.train_x_bc[bounds[i]:bounds[i + 1]].astype(np.float64)
        v = np.asarray(bc.func(xb, 0, len(xb), None), np.float64)  # DeepXDE's cached form
        dde_target = np.broadcast_to(v.reshape(-1, 1) if v.size == len(xb) else v,
                                     (len(xb), 1))
        if not np.allclose(dde_target, sign * _target(conds[name], xb), atol=1e-6):
            raise ValueError(f"{where}: condition {name!r}: DeepXDE's target and hogrod's "
                             "differ at DeepXDE's points")
        ours = np.asarray(conds[name][1](64, seed), np.float64)
        if len(bc.filter(ours)) != len(ours):
            raise ValueError(f"{where}: hogrod's points of condition {name!r} are not all on "
                             "the DeepXDE condition's piece of the boundary")
    if solution is not None:
        ref = np.asarray(prob.reference(prob.grid), np.float64)
        if not np.allclose(solution(prob.grid), ref, rtol=1e-10, atol=1e-12):
            raise ValueError(f"{where}: DeepXDE's solution and hogrod's reference differ on "
                             "prob.grid")


def torch_maml_net(problem, n_way, image_size=28):
    """The MAML benchmark's torch peer network: (torch module, loss(outputs, targets)), the
    computation of `experiments.bench.maml.keras_net` (the sinusoid's 1-40-40-1 ReLU MLP,
    MSE; conv4, cross-entropy), its parameters in the Keras model's order."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    if problem == "sinusoid":
        return (nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(),
                              nn.Linear(40, 1)),
                lambda out, y: torch.mean((out - y) ** 2))

    class SamePad(nn.Module):
        """TensorFlow's 'same' padding of a 3x3 window of stride 2: the total padding
        (2 (ceil(n / 2) - 1) + 3 - n) split with the smaller half before."""

        def forward(self, x):
            pads = []
            for n in (x.shape[-1], x.shape[-2]):  # F.pad: (left, right, top, bottom)
                total = max(2 * ((n + 1) // 2 - 1) + 3 - n, 0)
                pads += [total // 2, total - total // 2]
            return F.pad(x, pads)

    class BatchNorm(nn.Module):
        """Keras's BatchNormalization in training mode: the batch's mean and (biased)
        variance, epsilon 1e-3, differentiated exactly to every order (`F.batch_norm`'s
        double backward under `vmap` is wrong)."""

        def __init__(self, channels):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(channels))
            self.bias = nn.Parameter(torch.zeros(channels))

        def forward(self, x):
            mean = x.mean((0, 2, 3), keepdim=True)
            variance = ((x - mean) ** 2).mean((0, 2, 3), keepdim=True)
            scale = torch.rsqrt(variance + 1e-3) * self.weight[:, None, None]
            return (x - mean) * scale + self.bias[:, None, None]

    class FlattenNHWC(nn.Module):
        """Keras's Flatten of an NHWC tensor: rows, then columns, then channels."""

        def forward(self, x):
            return x.permute(0, 2, 3, 1).flatten(1)

    layers, channels, side = [], 1, image_size
    for _ in range(4):
        layers += [SamePad(), nn.Conv2d(channels, 64, 3, stride=2), BatchNorm(64), nn.ReLU()]
        channels, side = 64, (side + 1) // 2
    layers += [FlattenNHWC(), nn.Linear(64 * side * side, n_way)]
    return nn.Sequential(*layers), F.cross_entropy


def torch_layout(w):
    """A Keras weight as torch holds it: kernels [in, out] -> [out, in], [h, w, in, out]
    -> [out, in, h, w]."""
    return w.T if w.ndim == 2 else w.transpose(3, 2, 0, 1) if w.ndim == 4 else w


def keras_layout(w):
    """`torch_layout`'s inverse."""
    return w.T if w.ndim == 2 else w.transpose(2, 3, 1, 0) if w.ndim == 4 else w


def to_torch(batch):
    """A numpy or TensorFlow meta-batch as torch tensors: images NHWC -> NCHW, integer
    labels int64 (torch's cross-entropy takes no other)."""
    import torch
    out = []
    for a in batch:
        a = np.asarray(a)
        if a.ndim == 5:  # [tasks, examples, h, w, c]
            a = a.transpose(0, 1, 4, 2, 3)
        if np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int64)
        out.append(torch.from_numpy(np.ascontiguousarray(a)))
    return out


def versions(*modules):
    """{module: its `__version__`, None where it is not installed} for TensorFlow and
    `modules` (the peers' import names: 'torch', 'jax', 'deepxde', ...), for the metrics:
    a ratio is measured against one build of each (torch's CPU and CUDA builds share a
    version number but not the kernels: `torch.__version__` says which)."""
    import importlib
    out = {"tensorflow": tf.__version__}
    for name in modules:
        try:
            out[name] = importlib.import_module(name).__version__
        except ImportError:
            out[name] = None
    return out


def relative_error(ref, got, tol, what):
    """The relative difference of two lists of arrays, raising above `tol`.

    Args:
      ref: the reference arrays.
      got: the compared arrays, the same shapes and order.
      tol: the largest relative difference accepted.
      what: the comparison's name, for the message.

    Returns:
      ``||got - ref|| / ||ref||`` over every entry, a float.

    Raises:
      AssertionError: the difference exceeds `tol` or the shapes differ.
    """
    if [np.shape(a) for a in ref] != [np.shape(a) for a in got]:
        raise AssertionError(f"{what}: shapes differ: {[np.shape(a) for a in got]} against "
                             f"the reference's {[np.shape(a) for a in ref]}")
    r = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in ref])
    g = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in got])
    err = float(np.linalg.norm(g - r) / np.linalg.norm(r))
    if not err <= tol:
        raise AssertionError(f"{what} disagrees with the float64 reference: rel err "
                             f"{err:.2e} > {tol:.2e}")
    return err


# Float32's unit roundoff: a float32 computation's result carries, relative to the exact
# result on the same (float32) inputs, about this times the computation's condition, times
# a count of roundings along its longest chain.
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}
# Float32 rounds every intermediate of a computation, not only its inputs; the measured
# condition (`Reference.condition`) covers the inputs' rounding, and this factor the
# intermediates': at each of a few dozen sequential stages (layers, an inner step and its
# backward, the outer backward) the rounding is amplified at most as the inputs' is. Too
# small, it fails on another CPU's summation order (the conv4 meta-gradient: 2e-3 between
# two float32 kernels); a wrong layout, transposed kernel or missing term is off by 1e-2 to 1.
ROUNDING_FACTOR = 64.0


class Reference:
    """A float64 reference of a benchmark's computation and the tolerance each side gets.

    Built from `fn64(inputs)`, the computation in float64 (any side's, the one the
    benchmark trusts) on `inputs`, a list of numpy arrays (weights, data): the float32
    inputs every side is given, so the reference is the exact result on exactly those;
    `exact` lists the positions of inputs that are exact in any dtype (0/1 masks), never
    moved.
    Its relative condition is measured at float32's rounding: `fn64` again on inputs each
    of whose floating entries is moved by a random +-eps32 relative (a float32 rounding of
    the inputs), the largest relative change over `draws` such moves, over eps32, at
    least 1. A side computing in `dtype` agrees when its relative difference from the
    reference is at most `ROUNDING_FACTOR * EPS[dtype] * condition`: float32's rounding
    of that computation, not another float32 side's, so another CPU's kernels do not
    change the verdict.

    Attributes:
      value: the float64 reference (a list of arrays).
      condition: the measured relative condition (>= 1).
    """

    def __init__(self, fn64, inputs, draws=2, seed=0, exact=()):
        inputs = [np.asarray(a) for a in inputs]
        exact = set(exact)  # indicators (0/1 masks): exact in every dtype, never moved
        as64 = [a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a
                for a in inputs]
        self.value = [np.asarray(v, np.float64) for v in fn64(as64)]
        rng = np.random.default_rng(seed)
        ref = np.concatenate([v.ravel() for v in self.value])
        change = 0.0
        for _ in range(draws):
            moved = [a * (1 + EPS["float32"] * rng.choice([-1.0, 1.0], a.shape))
                     if np.issubdtype(a.dtype, np.floating) and i not in exact else a
                     for i, a in enumerate(as64)]
            got = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in fn64(moved)])
            change = max(change, float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
        self.condition = max(change / EPS["float32"], 1.0)

    def tolerance(self, dtype):
        """The relative difference a side computing in `dtype` may show (see the class)."""
        return ROUNDING_FACTOR * EPS[dtype] * self.condition

    def check(self, sides, dtype, what):
        """Each side against the reference; raises on the first that disagrees.

        Args:
          sides: {name: list of arrays in the reference's order and shapes}.
          dtype: the sides' computing dtype, 'float32' or 'float64'.
          what: the computation's name, for the message.

        Returns:
          {name: relative difference from the reference}.

        Raises:
          AssertionError: a side's difference exceeds `tolerance(dtype)` (naming it, the
            tolerance and the condition), or its shapes differ.
        """
        tol = self.tolerance(dtype)
        return {name: relative_error(
            self.value, got, tol, f"{what}: {name} ({dtype}, tolerance {ROUNDING_FACTOR:g} x "
            f"eps x condition {self.condition:.3g})") for name, got in sides.items()}
