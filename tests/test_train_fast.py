"""The fast default path of the training loop against the plain one: `jit_compile="auto"`
(XLA where it compiles, else a plain tf.function with one warning) and several steps per
compiled call (`train_loop(..., steps_per_execution=N)`) take the same steps as a plain
step called once per step (float64, to rounding); the NaN guard, checkpoints and resuming
stay per step. Oracles: the plain step (`jit_compile=False`, one step per call)."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, train
from hogrod.train import execution

RTOL = 1e-12


def problem(seed=3, nan_at=None):
    """Float64 linear regression with an L2 term; its data set (shuffled, 40 batches of 4);
    `nan_at=k`: the k-th batch (1-based) has a NaN target."""
    keras.utils.set_random_seed(seed)
    w = tf.Variable(tf.random.normal([3, 2], dtype=tf.float64), name="w")
    b = tf.Variable(tf.zeros([2], tf.float64), name="b")

    def objective(batch):
        x, y = batch
        pred = tf.matmul(x, w) + b
        return {"mse": tf.reduce_mean((pred - y) ** 2), "l2": tf.reduce_sum(w ** 2)}

    x = np.random.default_rng(seed).normal(size=(160, 3))
    y = np.sin(x[:, :2])
    if nan_at is not None:
        y[4 * (nan_at - 1), 0] = np.nan
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True)
    return [w, b], objective, data


def make_step(variables, objective, jit_compile="auto", optimizer=None):
    return train.make_train_step(objective, optimizer or keras.optimizers.Adam(0.05), variables,
                                 weights={"l2": 1e-3}, transform=train.clip_by_global_norm(0.5),
                                 jit_compile=jit_compile)


def values(variables):
    return [v.numpy().copy() for v in variables]


def assert_same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=1e-14)


def test_the_default_step_is_one_xla_computation_equal_to_the_plain_step_and_traced_once():
    runs = {}
    for jit in ("auto", False):
        variables, objective, data = problem()
        step = make_step(variables, objective, jit)
        logs = [step(batch) for batch in data.take(6)]
        runs[jit] = values(variables), logs, step
    (auto, auto_logs, step), (plain, plain_logs, _) = runs["auto"], runs[False]
    assert step.jit_compile is True and step.reason is None  # XLA took it
    assert step.experimental_get_tracing_count() == 1
    assert_same(auto, plain)
    for a, p in zip(auto_logs, plain_logs):
        assert set(a) == set(p)
        for k in a:
            np.testing.assert_allclose(float(a[k]), float(p[k]), rtol=RTOL)


@pytest.mark.parametrize("source,jit", [("tf.data", "auto"), ("tf.data", False),
                                        ("python", "auto")])
def test_several_steps_per_call_take_the_same_steps_and_call_back_per_step(source, jit):
    """Against the plain step called once per step: 11 steps in calls of 3, 4 and 3 (one
    XLA computation where the step is one)."""
    runs = {}
    for per_call in (1, 4):
        variables, objective, data = problem()
        step = make_step(variables, objective, jit if per_call > 1 else False)
        seen = []
        batches = iter(data.repeat()) if source == "tf.data" else iter(list(data) * 2)
        last = train.train_loop(step, batches, 11, log_every=None, steps_per_execution=per_call,
                                callback=lambda i, logs: seen.append((i, logs)))
        runs[per_call] = values(variables), seen, last
        assert step.experimental_get_tracing_count() == 1
        # one trace of the several-step call (its XLA compile) for its three calls
        raw = step.get_concrete_function(data.element_spec).structured_outputs
        several = execution.multi_step(step, raw, source == "tf.data")
        assert several.experimental_get_tracing_count() == (per_call > 1)
        if per_call > 1:  # the loop is one XLA computation where the step is
            assert several.jit_compile is (jit == "auto")
    (one, one_seen, one_last), (four, four_seen, four_last) = runs[1], runs[4]
    assert_same(four, one)
    assert [i for i, _ in four_seen] == list(range(1, 12))
    for (_, a), (_, p) in zip(four_seen, one_seen):
        assert set(a) == set(p)
        for k in a:
            np.testing.assert_allclose(a[k], p[k], rtol=RTOL)
    assert four_last == four_seen[-1][1] and one_last == one_seen[-1][1]


def test_python_batches_that_do_not_stack_take_the_same_steps_one_by_one():
    """Batches of different sizes from a Python iterator run one by one in the call."""
    runs = {}
    for per_call in (1, 3):
        variables, objective, data = problem()
        x, y = (np.concatenate(t) for t in zip(*[(a.numpy(), b.numpy()) for a, b in data]))
        sizes = [4, 3] * 4
        starts = np.cumsum([0] + sizes)
        batches = iter([(x[a:b], y[a:b]) for a, b in zip(starts[:-1], starts[1:])])
        step = make_step(variables, objective, False)
        train.train_loop(step, batches, 8, log_every=None, steps_per_execution=per_call)
        runs[per_call] = values(variables)
    assert_same(runs[3], runs[1])


def test_a_run_in_several_train_loop_calls_traces_its_several_step_call_once():
    """A run in rounds (a benchmark, an evaluation between calls) reuses the several-step
    call its first round traced, and takes the steps of one call."""
    runs = {}
    for rounds in ((12,), (5, 7)):
        variables, objective, data = problem()
        step = make_step(variables, objective)
        iterator = iter(data.repeat())
        for steps in rounds:  # no checkpointer: each call counts its own steps
            logs = train.train_loop(step, iterator, steps, log_every=None,
                                    steps_per_execution=3)
        runs[rounds] = values(variables), logs
        raw = step.get_concrete_function(data.element_spec).structured_outputs
        several = execution.multi_step(step, raw, True)  # the one train_loop built
        assert several.experimental_get_tracing_count() == 1
    assert_same(runs[5, 7][0], runs[12,][0])
    assert runs[5, 7][1] == pytest.approx(runs[12,][1], rel=RTOL)


@pytest.mark.parametrize("jit", ["auto", False])
def test_a_non_finite_step_inside_a_call_stops_the_call_before_later_steps_update(jit):
    """Calls of steps 1, 2-4, 5-8, 9 (ending at the run's multiples of 4); the NaN target at
    step 3 stops the second call there: the state is the one after step 2. The plain loop
    draws each batch in its step (the iterator then stands at batch 4), the XLA loop its
    call's three before them and the next call's four beside them (at batch 9)."""
    variables, objective, data = problem(nan_at=3)
    step = make_step(variables, objective, jit)
    iterator = iter(data)
    with pytest.raises(train.NonFiniteError, match="step 3: loss term 'mse' is nan"):
        train.train_loop(step, iterator, 9, log_every=None, steps_per_execution=4)
    after_call = values(variables)
    drawn = 8 if jit else 3
    np.testing.assert_array_equal(next(iterator)[0].numpy(), list(data)[drawn][0].numpy())

    variables, objective, data = problem(nan_at=3)
    step = make_step(variables, objective, jit_compile=False)
    train.train_loop(step, iter(data), 2, log_every=None)
    assert_same(after_call, values(variables))


class Killed(Exception):
    pass


def checkpointed_run(directory, steps, jit, kill_at=None, time_limit_s=None):
    """`problem` trained with checkpoints every 5 steps in calls of up to 3: calls of steps
    1, 2-3, 4-5, 6, 7-9, 10, 11-12 (ending at the multiples of 3 and 5); an XLA loop draws
    the batches of 2-3, 6, 7-9 and 11-12 during the call before (not across a checkpoint).
    `kill_at`: a callback raises `Killed` after that step's call."""
    variables, objective, data = problem()
    opt = keras.optimizers.Adam(0.05)
    step = make_step(variables, objective, jit, opt)
    iterator = iter(data.shuffle(40, seed=5).repeat())
    ckpt = train.Checkpointer(str(directory), w=variables[0], b=variables[1], optimizer=opt,
                              data=iterator)

    def kill(i, logs):
        if i == kill_at:
            raise Killed
    try:
        train.train_loop(step, iterator, steps, ckpt, log_every=None, checkpoint_every=5,
                         steps_per_execution=3, callback=kill, time_limit_s=time_limit_s)
    except Killed:
        pass
    return values(variables), ckpt


@pytest.mark.parametrize("jit", [False, "auto"])
def test_a_run_killed_after_a_checkpoint_resumes_as_the_uninterrupted_run(tmp_path, jit):
    """Killed after step 8 (the iterator then ahead of the model by step 10's batch in the
    XLA loop), the run resumes from step 5's checkpoint and ends as the uninterrupted one."""
    checkpointed_run(tmp_path / "resumed", 12, jit, kill_at=8)
    resumed, _ = checkpointed_run(tmp_path / "resumed", 12, jit)
    assert_same(resumed, checkpointed_run(tmp_path / "uninterrupted", 12, jit)[0])


def test_a_time_limit_runs_the_batches_drawn_ahead_before_it_saves(tmp_path, monkeypatch):
    """A clock where each reading is a second later (the loop reads it once per call and
    three times per step with a callback): the limit of 9 s passes after step 3, when the
    XLA loop holds steps 4-5's batches; they run before the run stops (at step 5), so the
    saved iterator is where the model is, and the resumed run ends as the uninterrupted
    one."""
    from hogrod.train import loop
    clock = iter(range(10**6))
    monkeypatch.setattr(loop, "time", type("Clock", (), {
        "perf_counter": staticmethod(lambda: float(next(clock)))}))
    _, ckpt = checkpointed_run(tmp_path / "resumed", 12, "auto", time_limit_s=9)
    stopped = ckpt.latest_step()
    assert stopped == 5, stopped
    resumed, _ = checkpointed_run(tmp_path / "resumed", 12, "auto")
    assert_same(resumed, checkpointed_run(tmp_path / "uninterrupted", 12, "auto")[0])


def numpy_scaled_problem():
    """`problem`'s objective times a factor computed by numpy (`tf.numpy_function`), an op
    XLA has no kernel for."""
    variables, objective, data = problem()

    def scaled(batch):
        factor = tf.numpy_function(lambda: np.float64(1.5), [], tf.float64, stateful=False)
        terms = objective(batch)
        return dict(terms, mse=tf.reshape(factor, []) * terms["mse"])
    return variables, scaled, data


def test_auto_falls_back_to_the_plain_step_with_one_warning_where_xla_cannot_compile(caplog):
    runs = {}
    for jit in ("auto", False):
        variables, objective, data = numpy_scaled_problem()
        step = make_step(variables, objective, jit)
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            for batch in data.take(3):
                step(batch)
            warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                      and "jit_compile" in r.getMessage()]
        runs[jit] = values(variables), warned, step
    (auto, warned, step), (plain, _, _) = runs["auto"], runs[False]
    assert len(warned) == 1, warned
    assert "XLA cannot compile" in warned[0] and "make_train_step.jit_compile = False" in warned[0]
    assert step.jit_compile is False and step.experimental_get_tracing_count() == 1
    assert_same(auto, plain)

    variables, objective, data = numpy_scaled_problem()
    before = values(variables)
    step = make_step(variables, objective, True)
    with pytest.raises(tf.errors.OpError):
        step(next(iter(data)))
    assert_same(values(variables), before)


def test_auto_takes_the_plain_step_where_only_the_xla_trace_fails_and_raises_a_plain_error(
        caplog):
    """Code that takes another branch under XLA and fails there: "auto" runs the plain step
    with one warning naming the trace's error; an error of the plain trace too (the user's
    code) is raised as it is."""
    from tensorflow.python.ops import control_flow_util

    def under_xla():
        return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())

    for fails_plain in (False, True):
        variables, objective, data = problem()

        def picky(batch, objective=objective, fails_plain=fails_plain):
            if under_xla() or fails_plain:
                raise ValueError("this branch is broken")
            return objective(batch)

        step = make_step(variables, picky)
        if fails_plain:
            with pytest.raises(ValueError, match="this branch is broken"):
                step(next(iter(data)))
            continue
        with caplog.at_level(logging.WARNING):
            for batch in data.take(2):
                step(batch)
        warned = [r.getMessage() for r in caplog.records if "jit_compile" in r.getMessage()]
        assert len(warned) == 1 and "tracing it for XLA failed" in warned[0], warned
        assert "this branch is broken" in warned[0]
        assert step.jit_compile is False and step.experimental_get_tracing_count() == 1
        plain_vars, plain_objective, _ = problem()
        plain = make_step(plain_vars, plain_objective, False)
        for batch in data.take(2):
            plain(batch)
        assert_same(values(variables), values(plain_vars))


def test_auto_leaves_xla_with_one_warning_where_it_compiles_the_step_anew_at_every_call(caplog):
    """A `tf.vectorized_map` in the step makes XLA compile it at every call (its input a
    compile-time constant): after the first calls "auto" runs the plain step, the same steps
    in float64. Oracle: the plain step."""
    x = tf.constant(np.random.default_rng(0).normal(size=(256, 3)))
    runs = {}
    for jit in ("auto", False):
        w = tf.Variable(tf.constant([0.3, -0.2, 0.5], tf.float64))
        def objective(batch, w=w):
            return tf.reduce_mean(tf.vectorized_map(
                lambda r: tf.reduce_sum(tf.sin(r * w) * tf.tanh(r - w)) ** 2, x))
        step = train.make_train_step(objective, keras.optimizers.SGD(0.1), [w],
                                     jit_compile=jit)
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            for _ in range(5):
                step(None)
            warned = [r.getMessage() for r in caplog.records if "anew" in r.getMessage()]
        runs[jit] = w.numpy(), warned, step
    (auto, warned, step), (plain, _, _) = runs["auto"], runs[False]
    assert len(warned) == 1 and "make_train_step.jit_compile = False" in warned[0], warned
    assert step.jit_compile is False
    np.testing.assert_allclose(auto, plain, rtol=1e-12)


def test_auto_keeps_a_graph_assertion_that_xla_would_drop():
    variables, objective, data = problem()

    def checked(batch):
        ok = checks.require(tf.reduce_all(batch[0] < 100.0), "inputs must be below 100")
        with tf.control_dependencies(ok):
            return objective(batch)

    step = make_step(variables, checked)
    x, y = next(iter(data))
    step((x, y))
    assert step.jit_compile is False and "assertion" in step.reason
    with pytest.raises(tf.errors.InvalidArgumentError, match="inputs must be below 100"):
        step((x + 1000.0, y))


def test_jit_compile_and_steps_per_execution_are_checked():
    variables, objective, data = problem()
    with pytest.raises(checks.ArgumentError, match="make_train_step.jit_compile must be 'auto'"):
        make_step(variables, objective, "yes")
    step = make_step(variables, objective)
    with pytest.raises(checks.ArgumentError, match="steps_per_execution"):
        train.train_loop(step, iter(data), 2, steps_per_execution=0)
    with pytest.raises(checks.ArgumentError, match="compiled.jit_compile must be 'auto'"):
        train.compiled(lambda x: x, 1, "compiled")


def test_auto_takes_the_plain_step_where_xla_would_draw_other_random_numbers():
    runs = {}
    for jit in ("auto", False):
        variables, objective, data = problem()
        counter = tf.Variable(0, dtype=tf.int64)

        def noisy(batch):
            counter.assign_add(1)
            noise = tf.random.stateless_uniform([4, 2], tf.stack([counter, 1]), dtype=tf.float64)
            x, y = batch
            return objective((x, y + 0.1 * noise))

        step = make_step(variables, noisy, jit)
        for batch in data.take(3):
            step(batch)
        runs[jit] = values(variables), step
    assert runs["auto"][1].jit_compile is False and "random" in runs["auto"][1].reason
    assert_same(runs["auto"][0], runs[False][0])
