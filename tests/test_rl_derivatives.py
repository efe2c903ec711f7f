"""The exact-derivatives binary (experiments/dice_derivatives.py), in float64. Oracles: its
exact gradient, Hessian and third directional derivative against central differences of
the order below; its estimators on every trajectory of a tiny MDP weighted by its
probability (their exact expectations) against the exact derivatives (DiCE and Loaded DiCE
equal at every order, the naive surrogate's Hessian not); its state values against the
exact return; a tiny run's outputs."""

import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from experiments import dice_derivatives as dd
from hogrod import harness

S, A, T, GAMMA = 2, 2, 2, 0.9
MDP = dd.random_mdp(S, A, 3)


def test_the_exact_derivatives_equal_central_differences_of_the_order_below():
    exact = dd.make_exact(MDP, GAMMA, T)
    j, g, h, d3 = (x.numpy() for x in exact(MDP["theta"]))
    u, v, eps = MDP["u"].ravel(), MDP["v"].ravel(), 1e-5
    fd_g, fd_h, fd_d3 = np.zeros(S * A), np.zeros((S * A, S * A)), np.zeros(S * A)
    for i in range(S * A):
        shifted = []
        for sign in (1, -1):
            theta = MDP["theta"].copy()
            theta.flat[i] += sign * eps
            shifted.append([x.numpy() for x in exact(theta)])
        (jp, gp, hp, _), (jm, gm, hm, _) = shifted
        fd_g[i] = (jp - jm) / (2 * eps)
        fd_h[:, i] = (gp - gm) / (2 * eps)
        fd_d3[i] = u @ (hp - hm) @ v / (2 * eps)  # of the Hessian-vector product H v
    np.testing.assert_allclose(g, fd_g, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(h, fd_h, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(d3, fd_d3, rtol=1e-6, atol=1e-10)
    assert np.abs(d3).max() > 1e-3  # a vanishing third derivative would test nothing
    assert exact.experimental_get_tracing_count() == 1
    # the Loaded DiCE baseline: the state values, whose initial mean is the return
    values = dd.state_values(MDP, GAMMA, T)
    np.testing.assert_allclose(MDP["initial"] @ values[0], j, rtol=1e-13)


def every_trajectory():
    """States, actions `[N, T]` of every trajectory and their probabilities `[N]`."""
    theta = MDP["theta"]
    pi = np.exp(theta) / np.exp(theta).sum(1, keepdims=True)
    states, actions, probs = [], [], []
    for choice in itertools.product(range(S), range(A), repeat=T):
        s, a = np.array(choice[0::2]), np.array(choice[1::2])
        probs.append(MDP["initial"][s[0]] * np.prod(pi[s, a])
                     * np.prod(MDP["transitions"][s[:-1], a[:-1], s[1:]]))
        states.append(s)
        actions.append(a)
    return np.array(states, np.int32), np.array(actions, np.int32), np.array(probs)


def test_the_estimators_expectations_over_every_trajectory_are_the_exact_derivatives():
    """Each trajectory's reward and value weighted by N times its probability (constants):
    the batch mean is the expectation, so DiCE's and Loaded DiCE's derivatives of every
    order are exact; the naive surrogate's gradient is, its Hessian and D3 are not."""
    _, *exact = dd.exact_derivatives(MDP, GAMMA, T)  # checked by the test above
    states, actions, probs = every_trajectory()
    assert probs.sum() == pytest.approx(1.0, abs=1e-14)
    values = dd.baseline_values(tf.constant(dd.state_values(MDP, GAMMA, T)), states).numpy()
    table = dd.state_values(MDP, GAMMA, T)
    np.testing.assert_array_equal(values, table[np.arange(T)[None, :], states])
    w = len(probs) * probs[:, None]
    out = dd.make_estimates(MDP, GAMMA, T)(states, actions,
                                           MDP["rewards"][states, actions] * w, values * w)
    for kind in ("dice", "loaded_dice"):
        for k, (est, want) in enumerate(zip(out[kind], exact), 1):
            np.testing.assert_allclose(est, want, rtol=1e-10, atol=1e-12,
                                       err_msg=f"{kind} order {k}")
    grad, hess, d3 = (x.numpy() for x in out["naive"])
    np.testing.assert_allclose(grad, exact[0], rtol=1e-10, atol=1e-12)
    assert dd.relative_error(hess, exact[1]) > 0.5 and dd.relative_error(d3, exact[2]) > 0.5


def test_a_tiny_run_writes_sane_outputs(tmp_path):
    bindings = ["dice_derivatives_experiment.batch_sizes = (64, 256)",
                "dice_derivatives_experiment.seeds = 2",
                f"dice_derivatives_experiment.states = {S}",
                f"dice_derivatives_experiment.actions = {A}",
                "dice_derivatives_experiment.horizon = 3"]
    out, m = harness.run(dd.dice_derivatives_experiment, [], bindings, str(tmp_path))
    for name in ("metrics.json", "errors.png", "operative_config.gin"):
        assert os.path.exists(os.path.join(out, name)), name
    assert m["batch_sizes"] == [64, 256] and m["estimate_traces"] == 1
    assert m["sample_traces"] == 2  # once per batch size
    np.testing.assert_allclose(m["exact_return_check"], m["exact_return"], rtol=1e-13)
    for kind in dd.ESTIMATORS:
        for k in dd.ORDERS:
            name = f"{kind}_order{k}"
            errors, corrs = np.array(m[f"errors_{name}"]), np.array(m[f"correlations_{name}"])
            assert errors.shape == corrs.shape == (2, 2), name
            assert np.all(errors > 0) and np.all(np.isfinite(errors)), name
            assert np.all(np.abs(corrs) <= 1), name
            np.testing.assert_allclose(m[f"mean_error_{name}"], errors.mean(0))
            assert m[f"slope_{name}"] == pytest.approx(
                np.log(errors.mean(0)[1] / errors.mean(0)[0]) / np.log(4))
    # the naive surrogate's Hessian is biased: its error stays far above the unbiased ones'
    for k in (2, 3):
        naive = m[f"mean_error_naive_order{k}"][-1]
        assert naive > 2 * max(m[f"mean_error_dice_order{k}"][-1],
                               m[f"mean_error_loaded_dice_order{k}"][-1]), k
    for binding, message in (("batch_sizes = (64, 64)", "batch_sizes must be at least two"),
                             ("actions = 1", "actions must be >= 2"),
                             ("discount = 0.0", r"discount must be in \(0, 1\]")):
        with pytest.raises(ValueError, match=message):
            harness.run(dd.dice_derivatives_experiment, [],
                        [f"dice_derivatives_experiment.{binding}"], str(tmp_path / "b"))
    assert not os.path.exists(tmp_path / "b")  # refused before anything is written
