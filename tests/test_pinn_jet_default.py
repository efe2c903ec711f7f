"""The operator jet as `pdes.residual`'s default derivative path, in float64: residuals and
their weight gradients against residuals written here from nested-tape `partials`."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import hogrod
from hogrod.models import dense_net
from hogrod import pinn
from hogrod.pinn import jet, networks, pdes
from hogrod.pinn import pinnacle as P


def _net(dim, outputs=1, activation="tanh", dtype="float64"):
    keras.utils.set_random_seed(5)
    return dense_net((dim, 6, 6, outputs), activation, dtype=dtype)


def _x(dim, n=7, dtype=np.float64):
    return tf.constant(np.random.default_rng(dim).uniform(-1.0, 1.0, (n, dim)).astype(dtype))


def _lap(d, dim):
    return tf.add_n([d[(i, i)] for i in range(dim)])


def _sines(x):
    return tf.reduce_prod(tf.sin(math.pi * x), axis=1, keepdims=True)


# name: (PDE, input dim, outputs, the residual from a full `partials` dict, written here)
CASES = {
    "burgers": (pinn.pdes.burgers(0.03), 2, 1,
                lambda x, d: d[(1,)] + d[()] * d[(0,)] - 0.03 * d[(0, 0)]),
    "heat": (pinn.pdes.heat(2, 0.7), 3, 1, lambda x, d: d[(2,)] - 0.7 * _lap(d, 2)),
    "wave": (pinn.pdes.wave(1.5), 2, 1, lambda x, d: d[(1, 1)] - 2.25 * d[(0, 0)]),
    "poisson": (pinn.pdes.poisson(2), 2, 1,
                lambda x, d: _lap(d, 2) + 2 * math.pi ** 2 * _sines(x)),
    "allen_cahn": (pinn.pdes.allen_cahn(1e-3, 5.0), 2, 1,
                   lambda x, d: d[(1,)] - 1e-3 * d[(0, 0)] + 5.0 * (d[()] ** 3 - d[()])),
    "advection": (pinn.pdes.advection(0.8), 2, 1, lambda x, d: d[(1,)] + 0.8 * d[(0,)]),
    "helmholtz": (pinn.pdes.helmholtz(2.0, 2), 2, 1,
                  lambda x, d: _lap(d, 2) + 4.0 * d[()] - (4.0 - 2 * math.pi ** 2) * _sines(x)),
    "pinnacle_ns": (P.navier_stokes(0.01, "ns"), 2, 3, None),
    "pinnacle_heat2d_ms": (P.pinnacle_heat2d_multiscale().pde, 3, 1, None),
    "pinnacle_poisson_nd": (P.pinnacle_poisson_nd(dim=3).pde, 3, 1, None),
}
ALL_KEYS = {2: [(), (0,), (1,), (0, 0), (0, 1), (1, 1)],
            3: [(), (0,), (1,), (2,), (0, 0), (1, 1), (2, 2)]}


def _value_and_grads(fn, net):
    with tf.GradientTape() as tape:
        r = fn()
        loss = tf.reduce_sum(tf.sin(r) + r ** 2)  # nonlinear: every channel's backward counts
    grads = tape.gradient(loss, net.trainable_variables)
    # a linear PDE's residual does not depend on the output bias (a None gradient)
    return r, [np.zeros(v.shape) if g is None else g for g, v in
               zip(grads, net.trainable_variables)]


def _assert_close(got, want, tol=1e-12):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_residual_and_weight_gradient_equal_nested_tapes(case):
    pde, dim, outputs, by_hand = CASES[case]
    net, x = _net(dim, outputs), _x(dim)
    assert pdes.jet_applies(pde, net, x)
    r, g = _value_and_grads(lambda: pinn.residual(pde, net, x), net)
    # PINNacle's residuals read only `wanted` keys: the nested-tape path is their oracle
    ref = by_hand or (lambda x, d: pde.residual(x, d))
    r_ref, g_ref = _value_and_grads(lambda: ref(x, pinn.partials(net, x, ALL_KEYS[dim])), net)
    assert r.shape == r_ref.shape == (7, outputs if case == "pinnacle_ns" else 1)
    _assert_close([r] + g, [r_ref] + g_ref)
    r_off, g_off = _value_and_grads(lambda: pinn.residual(pde, net, x, use_jet=False), net)
    _assert_close([r_off] + g_off, [r_ref] + g_ref)
    if case == "burgers":  # in a step: the inner XLA-compiled jet
        r_xla, g_xla = tf.function(lambda: _value_and_grads(
            lambda: pinn.residual(pde, net, x), net))()
        _assert_close([r_xla] + g_xla, [r_ref] + g_ref)


def test_output_scale_is_carried_and_every_partial_matches():
    keras.utils.set_random_seed(2)
    net = networks.mlp_network(2, 5, 2, outputs=2, output_scale=3.0, dtype="float64")
    x = _x(2)
    assert jet.applies(net, tf.float64)
    want = pinn.partials(net, x, ALL_KEYS[2] + [(1, 0)])
    got = jet.jet_partials(net, x, ALL_KEYS[2] + [(1, 0)])
    assert set(got) == set(want)
    _assert_close([got[k] for k in want], [want[k] for k in want])


def _spy(monkeypatch):
    calls = {"jet": 0, "partials": 0}
    real_jet, real_partials = jet.jet_partials, pdes.partials

    def spy_jet(*a, **k):
        calls["jet"] += 1
        return real_jet(*a, **k)

    def spy_partials(*a, **k):
        calls["partials"] += 1
        return real_partials(*a, **k)
    monkeypatch.setattr(jet, "jet_partials", spy_jet)
    monkeypatch.setattr(pdes, "partials", spy_partials)
    return calls


def _path_taken(monkeypatch, pde, u_fn, x, **kw):
    calls = _spy(monkeypatch)
    r = pinn.residual(pde, u_fn, x, **kw)
    assert calls["jet"] + calls["partials"] == 1
    return ("jet" if calls["jet"] else "partials"), r


def test_the_jet_is_taken_for_a_tanh_mlp_and_partials_otherwise(monkeypatch):
    pde, x = pinn.pdes.burgers(0.03), _x(2)
    net = _net(2)
    assert _path_taken(monkeypatch, pde, net, x)[0] == "jet"
    assert _path_taken(monkeypatch, pde, net, x, use_jet=False)[0] == "partials"
    # pinn_loss passes the experiment's pinn_experiment.use_jet down to the residual
    problem = pinn.Problem(name="b", pde=pde, domain=pinn.Box((-1.0, -1.0), (1.0, 1.0)))
    for use_jet, path in ((True, "jet"), (False, "partials")):
        calls = _spy(monkeypatch)
        pinn.pinn_loss(problem, net, x, [], use_jet=use_jet)()
        assert calls[path] == 1 and sum(calls.values()) == 1
        monkeypatch.undo()
    transform = lambda z: z[:, 1:2] * net(z)  # noqa: E731  an output transform
    emb = networks.mlp_network(2, 4, 1, embedding=lambda dtype=None: networks.FourierFeatures(
        3, dtype=dtype), dtype="float64")
    for u_fn in (transform, emb, _net(2, activation="sigmoid"), _net(2, activation="relu"),
                 networks.modified_mlp(2, 4, 1, dtype="float64")):
        assert not jet.applies(u_fn, tf.float64)
        path, r = _path_taken(monkeypatch, pde, u_fn, x)
        assert path == "partials"
    assert _path_taken(monkeypatch, pinn.PDE([(0, 0, 0)], lambda x, d: d[(0, 0, 0)]), net,
                       x)[0] == "partials"  # third order


def test_a_float32_net_at_float64_points_behaves_as_partials(monkeypatch):
    """Keras casts x to the net's float32; `partials` then meets float64 u_x and float32 u
    in Burgers' u u_x and raises: the default path must do the same, not run the jet."""
    pde, net, x = pinn.pdes.burgers(0.03), _net(2, dtype="float32"), _x(2)
    assert not jet.applies(net, tf.float64) and jet.applies(net, tf.float32)
    calls = _spy(monkeypatch)
    with pytest.raises(tf.errors.InvalidArgumentError, match="double"):
        pinn.residual(pde, net, x)
    assert calls == {"jet": 0, "partials": 1}
    monkeypatch.undo()
    with pytest.raises(tf.errors.InvalidArgumentError, match="double"):
        pinn.residual(pde, net, x, use_jet=False)


def test_a_callable_coefficient_uses_the_generic_jet():
    nu = tf.Variable(0.05, dtype=tf.float64)
    pde, net, x = pinn.pdes.burgers(lambda: nu), _net(2), _x(2)
    assert pde.linear is None and pdes.jet_applies(pde, net, x)
    r, g = _value_and_grads(lambda: pinn.residual(pde, net, x), net)

    def by_hand():
        d = pinn.partials(net, x, ALL_KEYS[2])
        return d[(1,)] + d[()] * d[(0,)] - 0.05 * d[(0, 0)]
    r_ref, g_ref = _value_and_grads(by_hand, net)
    _assert_close([r] + g, [r_ref] + g_ref)


def test_gpinn_jacobian_in_x_and_its_weight_gradient_through_the_jet():
    """Second order through the hand-written backward: d residual / dx, then d / d weights."""
    pde, net, x = pinn.pdes.burgers(0.03), _net(2), _x(2)

    def gpinn(use_jet):
        def f():
            jac = hogrod.batch_jacobian(lambda z: pinn.residual(pde, net, z, use_jet=use_jet),
                                        x)
            return jac[:, 0, :]
        return f
    r, g = _value_and_grads(gpinn(True), net)
    r_ref, g_ref = _value_and_grads(gpinn(False), net)
    _assert_close([r] + g, [r_ref] + g_ref, tol=1e-11)


def test_bad_linear_combinations_are_rejected():
    net, x = _net(2), _x(2)
    for linear, match in (({"l": {(): 1.0}}, "first or second partials"),
                          ({"l": {(0, 0, 1): 1.0}}, "first or second partials"),
                          ({"l": {(0,): lambda: 1.0}}, "Python numbers"),
                          ({"l": {(2,): 1.0}}, "outside the input dimension"),
                          ({"l": {}}, "non-empty")):
        pde = pinn.PDE([], lambda x, d: d["l"], linear=linear)
        with pytest.raises(ValueError, match=match):
            pinn.residual(pde, net, x)
