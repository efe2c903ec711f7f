"""jaxpi's Allen-Cahn setup: the spectral reference against the closed-form reaction ODE,
the chained (periodic, Fourier) embedding periodic to rounding, combined weighting schemes
equal to their parts."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import pinn


def test_spectral_reference_solves_the_reaction_ode_without_diffusion():
    """diffusion = 0: each grid point follows u' = r (u - u^3), whose solution is
    u0 e^{rt} / sqrt(1 + u0^2 (e^{2rt} - 1)); t = 0.2537 ends on a shortened step."""
    modes, r = 64, 5.0
    x = -1.0 + 2.0 * np.arange(modes) / modes
    for t in (0.0, 0.1, 0.2537):
        u0 = x ** 2 * np.cos(np.pi * x)
        e = math.exp(r * t)
        exact = u0 * e / np.sqrt(1 + u0 ** 2 * (e * e - 1))
        got = pinn.reference.allen_cahn_spectral(x, np.full(modes, t), 0.0, r, modes=modes, dt=1e-3)
        np.testing.assert_allclose(got, exact, atol=1e-8)
    with pytest.raises(ValueError, match="x in \\[-1, 1\\]"):
        pinn.reference.allen_cahn_spectral([1.5], [0.1])


def test_chained_periodic_and_fourier_embedding_is_periodic_in_x():
    keras.utils.set_random_seed(0)
    net = pinn.modified_mlp(2, 8, 2, dtype="float64", embedding=lambda dtype: (
        pinn.networks.embedding_chain(
            [lambda dtype: pinn.networks.periodic_embedding({0: 2.0}, dtype=dtype),
             lambda dtype: pinn.networks.fourier_features(8, 1.0, dtype=dtype)], dtype=dtype)))
    x = np.random.default_rng(0).uniform(-1, 1, (20, 2))
    shifted = x + np.array([2.0, 0.0])
    np.testing.assert_allclose(net(x).numpy(), net(shifted).numpy(), rtol=0, atol=1e-12)
    fourier = net.get_layer(index=1).parts[1]
    np.testing.assert_array_equal(fourier.b.numpy(), fourier.frequencies(3))  # not zeros
    assert np.abs(net(x + np.array([0.0, 0.5])).numpy() - net(x).numpy()).max() > 1e-6
    with pytest.raises(ValueError, match="embedding_chain.embeddings"):
        pinn.networks.embedding_chain([])
    with pytest.raises(ValueError, match="periodic_embedding.periods"):
        pinn.networks.periodic_embedding([2.0])


def test_combined_weights_are_their_parts():
    prob = pinn.problems.allen_cahn_problem(hard_constraints=False, boundary_term=False,
                                   grid_shape=(3, 3))
    assert [name for name, _, _ in prob.conditions] == ["initial"]
    keras.utils.set_random_seed(0)
    net = pinn.mlp_network(2, 6, 1, dtype="float64")
    rng = np.random.default_rng(0)
    pts = tf.constant(np.stack([rng.uniform(-1, 1, 512), rng.uniform(0, 1, 512)], 1))
    cond = [tf.constant(prob.conditions[0][1](16, 1), tf.float64)]
    args = (prob, net, pts, cond, net.trainable_variables)
    both = pinn.weighting.combined_weights(*args,
                                           schemes=[pinn.grad_norm_weights, pinn.causal_weights])
    grad, causal = pinn.grad_norm_weights(*args), pinn.causal_weights(*args, chunks=32)
    assert set(both.weights) == {"initial"} and set(both.reducers) == {"residual"}
    assert both.every == grad.every and both.update is not None
    combined = pinn.pinn_loss(prob, net, pts, cond, both.weights, reducers=both.reducers)()
    alone = pinn.pinn_loss(prob, net, pts, cond, reducers=causal.reducers)()
    np.testing.assert_allclose(combined["residual"], alone["residual"], rtol=1e-12)
    plain = pinn.pinn_loss(prob, net, pts, cond)()
    assert abs(float(combined["residual"]) - float(plain["residual"])) > 1e-9  # causal acts
    with pytest.raises(ValueError, match="reducers of \\['residual'\\]"):
        pinn.weighting.combined_weights(*args, schemes=[pinn.causal_weights, pinn.causal_weights])
    with pytest.raises(ValueError, match="combined_weights.schemes"):
        pinn.weighting.combined_weights(*args, schemes=[])
