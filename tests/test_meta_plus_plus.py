"""MAML++ against its definition: the multi-step loss with annealed weights computed by hand
(plain gradient steps with per-layer per-step rates), its second-order meta-gradient against
float64 central differences (weights and learned rates), and the first-order phase visibly
different from it."""

import keras
import numpy as np
import tensorflow as tf

import hogrod
from hogrod import meta


def mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def setup(iterations):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,), dtype="float64"),
                              keras.layers.Dense(4, activation="tanh", dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    counter = tf.Variable(iterations, dtype=tf.int64)
    algo = meta.maml_plus_plus(model, mse, inner_lr=0.1, inner_steps=2,
                               multi_step_iterations=10, first_order_iterations=5,
                               iterations=counter)
    # distinct rates per layer and per step: [layer 0: 0.1, 0.2], [layer 1: 0.3, 0.05]
    for var, values in zip(algo.variables, ([0.1, 0.2], [0.3, 0.05])):
        var.assign(values)
    rng = np.random.default_rng(0)
    tasks = tuple(tf.constant(rng.normal(size=(2, 5, 1))) for _ in range(4))
    return model, algo, counter, tasks


def by_hand(model, rates, tasks, weights):
    """Mean over tasks of sum_s w_s L_query(phi_s), phi_{s+1} = phi_s - r_{layer,s} grad."""
    total = 0.0
    for t in range(tasks[0].shape[0]):
        xs, ys, xq, yq = (x[t] for x in tasks)
        phi = hogrod.trainable_values(model)
        for s, w in enumerate(weights):
            g = hogrod.grad(lambda: mse(ys, hogrod.functional_call(model, phi, xs)), phi)
            layer_rate = [rates[0][s]] * 2 + [rates[1][s]] * 2  # kernel, bias per layer
            phi = [p - r * gi for p, r, gi in zip(phi, layer_rate, g)]
            total += w * float(mse(yq, hogrod.functional_call(model, phi, xq)))
    return total / tasks[0].shape[0]


def test_multi_step_loss_weights_anneal_from_uniform_to_the_last_step():
    model, algo, counter, tasks = setup(0)
    rates = [v.numpy() for v in algo.variables]
    for it, weights in [(0, (0.5, 0.5)), (5, (0.25, 0.75)), (10, (0.0, 1.0)), (50, (0.0, 1.0))]:
        counter.assign(it)
        got = float(algo.meta_loss(tasks)["loss"])
        np.testing.assert_allclose(got, by_hand(model, rates, tasks, weights), rtol=1e-10)


def fd_gradient(algo, tasks, var, idx, eps=1e-6):
    base = var.numpy()
    vals = []
    for sign in (1, -1):
        shifted = base.copy()
        shifted[idx] += sign * eps
        var.assign(shifted)
        vals.append(float(algo.meta_loss(tasks)["loss"]))
    var.assign(base)
    return (vals[0] - vals[1]) / (2 * eps)


def gradient(algo, tasks, variables):
    with tf.GradientTape() as tape:
        loss = algo.meta_loss(tasks)["loss"]
    return [g.numpy() for g in tape.gradient(loss, variables)]


def test_second_order_phase_matches_finite_differences():
    model, algo, counter, tasks = setup(20)  # past both annealing thresholds
    variables = model.trainable_variables + algo.variables
    got = gradient(algo, tasks, variables)
    for k, var in enumerate(variables):
        for idx in list(np.ndindex(*var.shape))[:3]:
            np.testing.assert_allclose(got[k][idx], fd_gradient(algo, tasks, var, idx),
                                       rtol=1e-5, atol=1e-9)


def test_first_order_phase_drops_the_curvature_term():
    model, algo, counter, tasks = setup(4)  # first order; weights 0.3 / 0.7
    kernel = model.trainable_variables[0]
    idx = (0, 1)
    fd = fd_gradient(algo, tasks, kernel, idx)
    first = gradient(algo, tasks, [kernel])[0][idx]
    counter.assign(5)  # second order from here; same loss once the weights match
    algo_weights_second = gradient(algo, tasks, [kernel])[0][idx]
    fd_second = fd_gradient(algo, tasks, kernel, idx)
    np.testing.assert_allclose(algo_weights_second, fd_second, rtol=1e-5)
    assert abs(first - fd) > 1e-3 * max(abs(fd), 1e-3)  # the Hessian term is really dropped


def test_per_step_batchnorm_statistics_and_non_transductive_predictions():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(momentum=0.5), keras.layers.ReLU(),
                              keras.layers.Dense(1)])
    counter = tf.Variable(100, dtype=tf.int64)  # second order, last-step loss
    algo = meta.maml_plus_plus(model, mse, inner_lr=0.1, inner_steps=2, iterations=counter,
                               multi_step_iterations=10, first_order_iterations=5,
                               transductive=False)
    assert len(algo.state) == 6  # (moving mean, moving variance) for 0, 1 and 2 updates
    rng = np.random.default_rng(0)
    tasks = tuple(tf.constant(rng.normal(size=(3, 6, d)), tf.float32) for d in (3, 1, 3, 1))
    before = [v.numpy() for v in model.non_trainable_variables]
    algo.meta_loss(tasks)
    # zero updates: the support batches seen by theta; Keras BN averages with the biased
    # variance: new = 0.5 old + 0.5 batch moment, then the mean over the meta-batch
    h = [model.layers[0](tasks[0][t]).numpy() for t in range(3)]
    np.testing.assert_allclose(algo.state[0].numpy(),
                               0.5 * np.mean([x.mean(0) for x in h], 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(algo.state[1].numpy(),
                               0.5 + 0.5 * np.mean([x.var(0) for x in h], 0), rtol=1e-5)
    # every step's statistics, by hand: the Dense outputs under the weights after s plain
    # gradient steps (rate 0.1, every layer), on the support batch, and after the last
    # update on the query batch
    phis = []
    for t in range(3):
        phi, per_step = hogrod.trainable_values(model), []
        for s in range(3):
            per_step.append(phi)
            g = hogrod.grad(lambda: mse(tasks[1][t], hogrod.functional_call(
                model, phi, tasks[0][t], training=True)), phi)
            phi = [p - 0.1 * gi for p, gi in zip(phi, g)]
        phis.append(per_step)
    for s in range(3):
        x = tasks[0] if s < 2 else tasks[2]
        h = [x[t].numpy() @ phis[t][s][0].numpy() + phis[t][s][1].numpy() for t in range(3)]
        np.testing.assert_allclose(algo.state[2 * s].numpy(),
                                   0.5 * np.mean([v.mean(0) for v in h], 0), rtol=1e-5,
                                   atol=1e-6, err_msg=f"moving mean after {s} updates")
        np.testing.assert_allclose(algo.state[2 * s + 1].numpy(),
                                   0.5 + 0.5 * np.mean([v.var(0) for v in h], 0), rtol=1e-5,
                                   err_msg=f"moving variance after {s} updates")
    for v, b in zip(model.non_trainable_variables, before):  # the model itself is untouched
        np.testing.assert_array_equal(v.numpy(), b)
    # non-transductive: a query prediction does not depend on the rest of the query batch
    xs, ys, xq = tasks[0][0], tasks[1][0], tasks[2][0]
    fast = algo.adapt((xs, ys), 1)
    batch = algo.predict(fast, xq, 1).numpy()
    alone = np.concatenate([algo.predict(fast, xq[i:i + 1], 1).numpy() for i in range(6)])
    np.testing.assert_allclose(batch, alone, rtol=1e-5, atol=1e-6)
    transductive = hogrod.functional_call(model, fast, xq, training=True).numpy()
    assert np.abs(transductive - batch).max() > 1e-3
    ev = meta.evaluate(algo, model, mse, tasks, steps=(0, 1), task_map="sequential")
    assert np.isfinite(ev["loss_after_1"])
