"""Random layers in meta-learning. Dropout on the inputs makes the masks observable: the
meta-loss's gradient with respect to an input entry is exactly zero where that entry was
dropped. From those masks a numpy computation of the meta-loss must reproduce the value;
identical tasks, support and query, steps and meta-steps must get different masks; a
fixed seed state reproduces them; rate 0 is the model without Dropout; eager calls are
quiet. (Every algorithm with Dropout in a compiled train step: test_meta.py.)"""

import logging

import keras
import numpy as np
import tensorflow as tf

from hogrod import meta

RATE = 0.5


def mse(y, p):
    return tf.reduce_mean((y - p) ** 2)


def dropout_model(rate=RATE, dropout=True, dim=6):
    """Dropout on the inputs, then a linear layer (float64)."""
    keras.utils.set_random_seed(0)
    layers = [keras.Input((dim,), dtype="float64")]
    if dropout:
        layers.append(keras.layers.Dropout(rate, dtype="float64"))
    return keras.Sequential(layers + [keras.layers.Dense(1, dtype="float64")])


def identical_tasks(n=3, k=8, dim=6, seed=0):
    rng = np.random.default_rng(seed)
    task = [rng.normal(size=(k, dim)), rng.normal(size=(k, 1)), rng.normal(size=(k, dim)),
            rng.normal(size=(k, 1))]
    return tuple(tf.constant(np.repeat(t[None], n, 0)) for t in task)


def seed_state(model):
    return model.non_trainable_variables[0]


def loss_and_input_grads(algo, tasks):
    with tf.GradientTape() as tape:
        tape.watch(tasks)
        loss = algo.meta_loss(tasks)["loss"]
    return loss.numpy(), [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, tasks)]


def numpy_maml_loss(w, b, tasks, keep_s, keep_q, lr, rate=RATE):
    """One inner step of MAML on a linear model whose inputs are masked and rescaled."""
    losses = []
    for t in range(tasks[0].shape[0]):
        xs, ys, xq, yq = (np.asarray(x[t]) for x in tasks)
        xs, xq = xs * keep_s[t] / (1 - rate), xq * keep_q[t] / (1 - rate)
        r = xs @ w + b - ys
        w1, b1 = w - lr * 2 * xs.T @ r / len(xs), b - lr * 2 * r.mean(0)
        losses.append(np.mean((xq @ w1 + b1 - yq) ** 2))
    return np.mean(losses)


def test_masks_are_fresh_per_task_and_pass_and_the_value_uses_them():
    model = dropout_model()
    w, b = (v.numpy() for v in model.trainable_variables)
    tasks = identical_tasks()
    algo = meta.maml(model, mse, inner_lr=0.1, inner_steps=1)
    loss, (g_xs, _, g_xq, _) = loss_and_input_grads(algo, tasks)
    keep_s, keep_q = g_xs != 0, g_xq != 0
    assert 0.3 < keep_s.mean() < 0.7 and 0.3 < keep_q.mean() < 0.7
    np.testing.assert_allclose(loss, numpy_maml_loss(w, b, tasks, keep_s, keep_q, 0.1),
                               rtol=1e-12)
    for t in range(3):  # the tasks are identical; their masks are not
        assert (keep_s[t] != keep_q[t]).any()
        for u in range(t):
            assert (keep_s[t] != keep_s[u]).any() and (keep_q[t] != keep_q[u]).any()
    # the next meta-step draws new masks
    _, (g_xs2, _, g_xq2, _) = loss_and_input_grads(algo, tasks)
    assert ((g_xs2 != 0) != keep_s).any() and ((g_xq2 != 0) != keep_q).any()


def test_every_inner_step_has_its_own_mask():
    # an input entry reaches the meta-loss if either step kept it: 1 - 0.8^2 = 36% of them
    # with independent masks, 20% with one mask for both steps
    model = dropout_model(rate=0.8)
    tasks = identical_tasks(n=1, k=100)
    algo = meta.maml(model, mse, inner_lr=0.1, inner_steps=2)
    _, (g_xs, _, _, _) = loss_and_input_grads(algo, tasks)
    assert 0.3 < (g_xs != 0).mean() < 0.42


def test_meta_steps_advance_the_seed_state_and_a_fixed_state_reproduces():
    model = dropout_model()
    tasks = identical_tasks()
    algo = meta.maml(model, mse, inner_lr=0.1, inner_steps=2)
    start = seed_state(model).numpy()
    first, second = (float(algo.meta_loss(tasks)["loss"]) for _ in range(2))
    assert first != second
    np.testing.assert_array_equal(seed_state(model).numpy(), start + [0, 2])
    seed_state(model).assign(start)  # as a restored checkpoint does
    assert float(algo.meta_loss(tasks)["loss"]) == first
    again = dropout_model()  # the same global seed builds the same model and generator
    assert float(meta.maml(again, mse, inner_lr=0.1, inner_steps=2).meta_loss(
        tasks)["loss"]) == first


def test_vectorized_sequential_and_recomputed_maps_draw_the_same_masks():
    model = dropout_model()
    tasks = identical_tasks()
    start = seed_state(model).numpy()
    values = []
    for kwargs in ({}, {"task_map": "sequential"}, {"task_map": "recomputed"}):
        seed_state(model).assign(start)
        with tf.GradientTape() as tape:
            loss = meta.maml(model, mse, inner_lr=0.1, inner_steps=2, **kwargs).meta_loss(
                tasks)["loss"]
        values.append([loss.numpy()] + [g.numpy() for g in
                                        tape.gradient(loss, model.trainable_variables)])
    for other in values[1:]:
        for a, b in zip(values[0], other):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_rate_zero_is_the_model_without_dropout():
    tasks = identical_tasks()
    results = []
    for model in (dropout_model(rate=0.0), dropout_model(dropout=False)):
        with tf.GradientTape() as tape:
            loss = meta.maml(model, mse, inner_lr=0.1, inner_steps=2).meta_loss(tasks)["loss"]
        results.append([loss.numpy()] + [g.numpy() for g in
                                         tape.gradient(loss, model.trainable_variables)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_eager_meta_loss_is_quiet():
    records = _Records()
    tf.get_logger().addHandler(records)
    try:
        algo = meta.maml(dropout_model(), mse, inner_lr=0.1)
        for seed in range(2):
            algo.meta_loss(identical_tasks(seed=seed))
        model = dropout_model(dropout=False)
        for seed in range(6):  # one trace per algorithm built, however many are built
            meta.maml(model, mse, inner_lr=0.1).meta_loss(identical_tasks(seed=seed))
        assert not [m for m in records.messages if "retracing" in m or "while_loop" in m]
        for n in range(1, 7):  # a new shape every call is real retracing, still reported
            algo.meta_loss(identical_tasks(n=n))
        assert [m for m in records.messages if "retracing" in m]
    finally:
        tf.get_logger().removeHandler(records)


def test_evaluation_gives_identical_tasks_independent_masks_and_reproduces():
    """Eight identical tasks: one mask shared by every task would make their losses equal
    (a 95% interval of exactly 0); each task's own masks spread them. The masks come from
    the evaluation's seed and the task index: the same seed gives the same numbers in
    every task mapping, another seed other numbers, and the model's seed state is left
    alone."""
    model = dropout_model()
    tasks = identical_tasks(n=8)
    algo = meta.maml(model, mse, inner_lr=0.1, inner_steps=1)
    start = seed_state(model).numpy()
    # evaluate is evaluator(...)(tasks); the evaluator keeps its traces for the last repeat
    ev = meta.evaluator(algo, model, mse, steps=(0, 1, 2))
    first = ev(tasks)
    for s in (0, 1, 2):
        assert first[f"loss_after_{s}_ci95"] > 1e-3 * first[f"loss_after_{s}"], s
    np.testing.assert_array_equal(seed_state(model).numpy(), start)
    again = meta.evaluate(algo, model, mse, tasks, steps=(0, 1, 2))
    assert again == first
    sequential = meta.evaluate(algo, model, mse, tasks, steps=(0, 1, 2),
                               task_map="sequential")
    for key, value in first.items():
        np.testing.assert_allclose(sequential[key], value, rtol=1e-12, err_msg=key)
    other = meta.evaluate(algo, model, mse, tasks, steps=(0, 1, 2), seed=1)
    assert other["loss_after_1"] != first["loss_after_1"]
    # the model's seed state does not enter: a meta-step that advances it changes nothing
    seed_state(model).assign(start + [0, 5])
    assert ev(tasks) == first


def test_evaluation_draws_a_mask_per_pass():
    """One task, one adaptation step: the query loss after it, from the masks evaluation
    draws, equals numpy's with the support and query masks read off the input gradients
    of the same passes (gradients of the query loss through the adapted weights, taken
    with those seeds), and the two masks differ."""
    from hogrod.meta.inner import evaluation_seeds
    model = dropout_model()
    w, b = (v.numpy() for v in model.trainable_variables)
    tasks = identical_tasks(n=2, k=8)
    algo = meta.maml(model, mse, inner_lr=0.1, inner_steps=1)
    got = meta.evaluate(algo, model, mse, tasks, steps=(1,), seed=3)
    seeds = evaluation_seeds(model, 2, 2, 3)  # 2 tasks, 2 passes: the step, the query
    losses = []
    for t in range(2):
        task = tuple(x[t] for x in tasks)
        with tf.GradientTape() as tape:
            tape.watch(task)
            fast = algo.adapt(task[:2], 1, seeds[t, :1])
            loss = mse(task[3], meta_run(model, fast, task[2], seeds[t, 1]))
        g_xs, _, g_xq, _ = tape.gradient(loss, task)
        keep_s, keep_q = g_xs.numpy() != 0, g_xq.numpy() != 0
        assert (keep_s != keep_q).any()
        one = tuple(x[t:t + 1] for x in tasks)
        losses.append(numpy_maml_loss(w, b, one, keep_s[None], keep_q[None], 0.1))
    np.testing.assert_allclose(got["loss_after_1"], np.mean(losses), rtol=1e-12)


def meta_run(model, fast, x, seed):
    from hogrod.meta.inner import run
    return run(model, fast, x, True, seed)
