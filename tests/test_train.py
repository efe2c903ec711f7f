"""The training-loop toolkit against the definitions: accumulation equals the big batch,
clipping bounds the norm, per-group rates, mixed precision vs float32, the NaN guard,
kill-and-resume equality, strategy equivalence, attribution completeness, bad input."""

import logging
import os
import runpy
import signal
import subprocess
import sys

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import train
from conftest import REPO_ROOT
from train_fixtures import GLOBAL_BATCH, make_problem, weights

WORKERS = os.path.join(REPO_ROOT, "tests", "workers")


def big_batch(data, n=GLOBAL_BATCH):
    return next(iter(data.batch(n)))


def manual_sgd_step(model, objective, batch, lr, weights_=None):
    """The oracle: w - lr * grad of the weighted total, by a plain tape."""
    with tf.GradientTape() as tape:
        terms = objective(batch)
        total = sum((weights_ or {}).get(k, 1.0) * v for k, v in terms.items())
    grads = tape.gradient(total, model.trainable_variables)
    return np.concatenate([(v - lr * g).numpy().ravel()
                           for v, g in zip(model.trainable_variables, grads)])


def test_step_equals_manual_sgd_with_term_weights_and_does_not_retrace():
    model, opt, objective, data = make_problem()
    batch = big_batch(data)
    expected = manual_sgd_step(model, objective, batch, 0.1, {"l2": 0.5})
    step = train.make_train_step(objective, opt, model.trainable_variables, weights={"l2": 0.5})
    logs = step(batch)
    np.testing.assert_allclose(weights(model), expected, rtol=1e-5, atol=1e-6)
    assert set(logs) == {"mse", "l2", "loss", "grad_norm", "lr", "applied"}
    np.testing.assert_allclose(float(logs["loss"]), float(logs["mse"]) + 0.5 * float(logs["l2"]),
                               rtol=1e-6)
    for b in data.skip(16).batch(GLOBAL_BATCH).take(3):
        step(b)
    assert step.experimental_get_tracing_count() == 1


def test_accumulation_equals_one_step_on_the_whole_batch():
    model, opt, objective, data = make_problem()
    batch = big_batch(data)
    expected = manual_sgd_step(model, objective, batch, 0.1)
    step = train.make_train_step(objective, opt, model.trainable_variables, accumulation_steps=4)
    step(batch)
    np.testing.assert_allclose(weights(model), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="must divide the batch size"):
        train.make_train_step(objective, keras.optimizers.SGD(0.1), model.trainable_variables,
                              accumulation_steps=3)(batch)


def test_clip_by_global_norm_bounds_the_update_and_clip_by_value_bounds_entries():
    model, opt, objective, data = make_problem(lr=1.0)
    batch = big_batch(data)
    before = weights(model)
    step = train.make_train_step(objective, opt, model.trainable_variables,
                                 transform=train.clip_by_global_norm(0.01))
    logs = step(batch)
    assert float(logs["grad_norm"]) > 0.01  # the raw gradient was larger than the bound
    np.testing.assert_allclose(np.linalg.norm(weights(model) - before), 0.01, rtol=1e-4)
    before = weights(model)
    step = train.make_train_step(objective, keras.optimizers.SGD(1.0), model.trainable_variables,
                                 transform=train.chain(train.clip_by_value(1e-3)))
    step(batch)
    assert np.abs(weights(model) - before).max() <= 1e-3 + 1e-7


def test_per_group_optimizers_move_each_group_by_its_own_rate():
    model, _, objective, data = make_problem()
    batch = big_batch(data)
    backbone, head = model.layers[0].trainable_variables, model.layers[1].trainable_variables
    with tf.GradientTape() as tape:
        total = sum(objective(batch).values())
    grads = tape.gradient(total, backbone + head)
    before = [v.numpy() for v in backbone + head]
    step = train.make_train_step(objective, [(keras.optimizers.SGD(1e-5), backbone),
                                           (keras.optimizers.SGD(1e-3), head)])
    logs = step(batch)
    np.testing.assert_allclose([logs["lr"], logs["lr_group_1"]], [1e-5, 1e-3], rtol=1e-6)
    for i, (v, g, b) in enumerate(zip(backbone + head, grads, before)):
        lr = 1e-5 if i < len(backbone) else 1e-3
        np.testing.assert_allclose(v.numpy(), b - lr * g.numpy(), rtol=1e-6, atol=1e-9)


def test_overlapping_groups_unknown_weight_and_non_scalar_term_are_clear_errors():
    model, _, objective, data = make_problem()
    vs = model.trainable_variables
    with pytest.raises(ValueError, match=r"dense\w*/kernel' is in optimizer groups 0 and 1"):
        train.make_train_step(objective, [(keras.optimizers.SGD(0.1), vs[:2]),
                                        (keras.optimizers.SGD(0.1), vs[:1])])
    step = train.make_train_step(objective, keras.optimizers.SGD(0.1), vs, weights={"l1": 2.0})
    with pytest.raises(ValueError, match=r"unknown loss term\(s\) \['l1'\]"):
        step(big_batch(data))
    bad = train.make_train_step(lambda b: {"per_example": tf.reduce_sum(b[0], axis=1)},
                                keras.optimizers.SGD(0.1), vs)
    with pytest.raises(ValueError, match="'per_example' must be a scalar"):
        bad(big_batch(data))


def test_unconnected_variables_get_zeros_and_one_warning_naming_them(caplog):
    model, opt, objective, data = make_problem()
    lonely = tf.Variable(tf.ones([3]), name="lonely_bias")
    step = train.make_train_step(objective, opt, model.trainable_variables + [lonely])
    with caplog.at_level(logging.WARNING):
        for b in data.batch(GLOBAL_BATCH).take(3):
            step(b)
    warnings = [r for r in caplog.records if "does not depend" in r.getMessage()]
    assert len(warnings) == 1 and "lonely_bias" in warnings[0].getMessage()
    np.testing.assert_array_equal(lonely.numpy(), 1.0)


def test_mixed_precision_matches_float32_and_small_gradients_do_not_underflow():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 8)), tf.float32)
    y = tf.constant(rng.normal(size=(32, 1)), tf.float32)
    global_policy = keras.config.dtype_policy().name

    def run(policy):
        keras.utils.set_random_seed(1)
        with train.precision_policy(policy):
            model = keras.Sequential([keras.Input((8,)),
                                      keras.layers.Dense(16, activation="tanh"),
                                      keras.layers.Dense(1)])
            opt = train.mixed_precision(keras.optimizers.SGD(1e4), policy)
        assert keras.config.dtype_policy().name == global_policy  # restored after the build
        before = weights(model)
        # A loss 1e-6 of the usual size: float16 gradients of it underflow without scaling.
        loss = lambda b: 1e-6 * tf.reduce_mean(  # noqa: E731
            (tf.cast(model(b[0]), tf.float32) - b[1]) ** 2)
        step = train.make_train_step(loss, opt, model.trainable_variables)
        logs = step((x, y))
        return weights(model) - before, logs, model

    delta32, _, _ = run("float32")
    delta16, logs16, model16 = run("mixed_float16")
    assert model16.layers[0](x).dtype == tf.float16  # computes in float16 outside the block
    assert {v.dtype for v in model16.trainable_variables} == {"float32"}
    assert float(logs16["applied"]) == 1.0
    assert np.count_nonzero(delta16) == np.count_nonzero(delta32) > 0  # nothing underflowed
    np.testing.assert_allclose(delta16, delta32, rtol=2e-2, atol=2e-2 * np.abs(delta32).max())


def test_precision_policy_restores_the_previous_policy_even_on_error():
    before = keras.config.dtype_policy().name
    with train.precision_policy("float64"):
        with pytest.raises(RuntimeError, match="inside"):
            with train.precision_policy("mixed_bfloat16") as policy:
                assert keras.layers.Dense(2).compute_dtype == "bfloat16" == policy.compute_dtype
                raise RuntimeError("inside")
        assert keras.config.dtype_policy().name == "float64"  # the enclosing one, not float32
    assert keras.config.dtype_policy().name == before
    with pytest.raises(ValueError, match="precision_policy's policy"):
        with train.precision_policy("mixed_flot16"):
            pass
    with pytest.raises(ValueError, match="mixed_precision's policy"):
        train.mixed_precision(keras.optimizers.SGD(0.1), "mixed_flot16")
    assert keras.config.dtype_policy().name == before


def test_mixed_precision_outside_its_policy_warns_that_the_model_is_not_mixed():
    """The old usage (wrap, then build under the global policy) built a float16 model; now the
    model would be float32, so the call says so instead of silently training in float32."""
    assert keras.config.dtype_policy().compute_dtype == "float32"
    with pytest.warns(UserWarning, match=r"precision_policy\('mixed_float16'\)"):
        train.mixed_precision(keras.optimizers.SGD(0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with train.precision_policy("mixed_float16"):
            train.mixed_precision(keras.optimizers.SGD(0.1))
        train.mixed_precision(keras.optimizers.SGD(0.1), "float32")


def test_nan_guard_names_step_and_term_and_keeps_last_good_checkpoint(tmp_path):
    model, opt, objective, data = make_problem()
    poison = tf.Variable(0.0)

    def loss(batch):
        terms = objective(batch)
        terms["mse"] = terms["mse"] + poison  # becomes NaN at step 3
        return terms

    step = train.make_train_step(loss, opt, model.trainable_variables)
    ckpt = train.Checkpointer(str(tmp_path), model=model, optimizer=opt)

    def cb(i, logs):
        if i == 2:
            poison.assign(float("nan"))

    it = iter(data.repeat().batch(GLOBAL_BATCH))
    with pytest.raises(train.NonFiniteError, match="step 3: loss term 'mse' is nan"):
        train.train_loop(step, it, 10, ckpt, checkpoint_every=1, callback=cb)
    good = weights(model)
    assert np.all(np.isfinite(good))  # the bad update was not applied
    assert ckpt.manager.latest_checkpoint.endswith("ckpt-2")
    model2, opt2, _, _ = make_problem()
    ckpt2 = train.Checkpointer(str(tmp_path), model=model2, optimizer=opt2)
    assert ckpt2.restore() == 2
    np.testing.assert_array_equal(weights(model2), good)


def test_checkpoint_dir_from_a_different_model_is_a_clear_error(tmp_path):
    model, opt, objective, data = make_problem()
    ckpt = train.Checkpointer(str(tmp_path), model=model)
    ckpt.save()
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(2)])
    with pytest.raises(train.CheckpointMismatchError, match="does not match"):
        train.Checkpointer(str(tmp_path), model=other).restore()


def test_summaries_and_progress(tmp_path, caplog):
    model, opt, objective, data = make_problem()
    step = train.make_train_step(objective, opt, model.trainable_variables)
    # absl's own logger too: an earlier test in this process may have set its level
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="absl"):
        logs = train.train_loop(step, iter(data.repeat().batch(GLOBAL_BATCH)), 20,
                                output_dir=str(tmp_path), log_every=10, summary_every=5)
    assert logs["loss"] > 0
    events = os.listdir(tmp_path / "train")
    assert events and events[0].startswith("events")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "train"), size_guidance={"tensors": 0})
    acc.Reload()
    assert {"mse", "l2", "loss", "grad_norm", "lr", "steps_per_sec"} <= set(acc.Tags()["tensors"])
    assert any("step 20/20" in r.getMessage() and "steps/s" in r.getMessage() and "ETA" in
               r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_sigkill_and_resume_ends_with_the_uninterrupted_weights(tmp_path, monkeypatch):
    script = os.path.join(WORKERS, "resumable.py")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    ref = tmp_path / "ref.npy"
    # the uninterrupted reference runs in this process: only the killed run needs its own
    # (and a process costs a TensorFlow import)
    monkeypatch.setattr(sys, "argv", [script, str(tmp_path / "a"), "20", str(ref), "0"])
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    runpy.run_path(script, run_name="__main__")
    monkeypatch.undo()
    out = tmp_path / "resumed.npy"
    cmd = [sys.executable, script, str(tmp_path / "b"), "20", str(out), "0.2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    for line in proc.stdout:  # kill it mid-run, after the checkpoint at step 10
        if line.startswith("STEP 12"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not out.exists()
    resumed = subprocess.run(cmd[:-1] + ["0"], env=env, timeout=300, capture_output=True,
                             text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "STEP 11" in resumed.stdout and "STEP 10" not in resumed.stdout  # resumed at 10
    np.testing.assert_array_equal(np.load(out), np.load(ref))


def test_integrated_gradients_completeness_and_saliency_against_finite_differences():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3, activation="softmax")])
    x = tf.random.stateless_normal((4, 5), seed=(0, 1))
    baseline = tf.zeros_like(x)
    target = tf.constant([0, 2, 1, 2])
    ig = train.integrated_gradients(model, x, baseline, target, steps=128)
    fx = tf.gather(model(x), target, axis=1, batch_dims=1)
    fb = tf.gather(model(baseline), target, axis=1, batch_dims=1)
    np.testing.assert_allclose(tf.reduce_sum(ig, axis=1), fx - fb, rtol=1e-3, atol=1e-5)
    sal = train.saliency(model, x, 1).numpy()
    eps = 1e-2
    for j in range(5):
        e = np.zeros((1, 5), np.float32)
        e[0, j] = eps
        fd = (model(x + e)[:, 1] - model(x - e)[:, 1]) / (2 * eps)
        np.testing.assert_allclose(sal[:, j], fd, rtol=2e-2, atol=1e-4)


def test_iterator_with_python_state_is_left_out_of_checkpoints_with_a_warning(tmp_path, caplog):
    model, opt, _, _ = make_problem()
    data = tf.data.Dataset.from_generator(lambda: iter(range(100)), output_signature=tf.TensorSpec(
        [], tf.int64))
    it = iter(data)
    next(it)
    ckpt = train.Checkpointer(str(tmp_path), model=model, data=it)
    with caplog.at_level(logging.WARNING):
        ckpt.save()
    assert any("not checkpointing data iterator(s) ['data']" in r.getMessage()
               for r in caplog.records)
    again = train.Checkpointer(str(tmp_path), model=model, data=iter(data))
    assert again.restore() == 0 and "data" not in again.trackables


def test_time_limit_stops_with_a_checkpoint_and_excludes_callback_time(tmp_path):
    import time as _time

    def slow_step(_):
        _time.sleep(0.05)
        return {"loss": tf.constant(1.0)}

    counter = tf.Variable(0.0)
    ckpt = train.Checkpointer(str(tmp_path), counter=counter)
    calls = []
    train.train_loop(slow_step, iter(range(10**6)), 10**6, ckpt, time_limit_s=0.5,
                     callback=lambda i, logs: (calls.append(i), _time.sleep(0.1)))
    # ~10 steps of 0.05 s fit in 0.5 s; counting the 0.1 s callbacks would allow ~3
    assert 6 <= len(calls) <= 14
    assert train.Checkpointer(str(tmp_path), counter=counter).restore() == len(calls)


def test_accumulated_step_logs_the_mean_over_its_micro_batches():
    """Oracle: each micro-batch's terms and gradient by a plain tape, before the update."""
    model, opt, objective, data = make_problem()
    batch = big_batch(data)
    k, size = 4, GLOBAL_BATCH // 4
    micro = [tuple(t[i * size:(i + 1) * size] for t in batch) for i in range(k)]
    terms, grads = [], []
    for m in micro:
        with tf.GradientTape() as tape:
            t = objective(m)
            total = t["mse"] + 0.5 * t["l2"]
        terms.append({n: float(v) for n, v in t.items()})
        grads.append(np.concatenate([g.numpy().ravel() for g in
                                     tape.gradient(total, model.trainable_variables)]))
    mean = {n: np.mean([t[n] for t in terms]) for n in terms[0]}
    step = train.make_train_step(objective, opt, model.trainable_variables, weights={"l2": 0.5},
                                 accumulation_steps=k)
    logs = step(batch)
    for name in ("mse", "l2"):
        np.testing.assert_allclose(float(logs[name]), mean[name], rtol=1e-5)
    np.testing.assert_allclose(float(logs["loss"]), mean["mse"] + 0.5 * mean["l2"], rtol=1e-5)
    np.testing.assert_allclose(float(logs["grad_norm"]), np.linalg.norm(np.mean(grads, 0)),
                               rtol=1e-5)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_nan_guard_skips_an_update_whose_gradient_alone_is_not_finite(tmp_path, jit_compile):
    """sqrt at 0: the loss is finite, its gradient is inf; the update must not be applied,
    in the plain step as in the XLA one (its guard inside the one computation)."""
    w = tf.Variable([0.0, 4.0], name="w")
    step = train.make_train_step(lambda b: tf.reduce_sum(tf.sqrt(w)), keras.optimizers.SGD(0.1),
                                 [w], jit_compile=jit_compile)
    logs = step(tf.zeros([1]))
    assert float(logs["loss"]) == 2.0 and float(logs["grad_norm"]) == np.inf
    assert float(logs["applied"]) == 0.0
    np.testing.assert_array_equal(w.numpy(), [0.0, 4.0])
    with pytest.raises(train.NonFiniteError, match="step 1: the gradient is inf"):
        train.train_loop(step, iter([tf.zeros([1])] * 3), 3)
    np.testing.assert_array_equal(w.numpy(), [0.0, 4.0])


def test_empty_or_non_variable_variables_are_clear_errors():
    model, _, objective, _ = make_problem()
    vs = model.trainable_variables
    with pytest.raises(ValueError, match="make_train_step: variables is empty"):
        train.make_train_step(objective, keras.optimizers.SGD(0.1), [])
    with pytest.raises(ValueError, match="make_train_step: optimizer group 1's variables is empty"):
        train.make_train_step(objective, [(keras.optimizers.SGD(0.1), vs),
                                        (keras.optimizers.SGD(0.1), [])])
    with pytest.raises(ValueError, match="empty list of"):
        train.make_train_step(objective, [])
    with pytest.raises(TypeError, match=r"make_train_step: variables\[1\] must be a variable, "
                                        r"got EagerTensor"):
        train.make_train_step(objective, keras.optimizers.SGD(0.1), [vs[0], tf.ones(3)])
    with pytest.raises(ValueError, match="accumulation_steps must be an integer >= 1, got 2.5"):
        train.make_train_step(objective, keras.optimizers.SGD(0.1), vs, accumulation_steps=2.5)


def test_progress_shows_without_absl_info_and_stats_report_steps_per_s(capsys):
    """A plain script (absl logging at its WARNING default) still sees its progress lines."""
    from absl import logging as absl_logging
    step_fn = lambda batch: {"loss": tf.constant(0.5)}  # noqa: E731
    before = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        stats = {}
        train.train_loop(step_fn, iter(range(100)), 4, log_every=2, stats=stats)
        err = capsys.readouterr().err
        assert "step 2/4" in err and "step 4/4" in err and "steps/s" in err
        assert stats["train_steps"] == 4 and stats["train_steps_per_s"] > 0
        assert stats["train_seconds"] > 0
        train.train_loop(step_fn, iter(range(100)), 4, log_every=None)  # turned off
        assert "step" not in capsys.readouterr().err
    finally:
        absl_logging.set_verbosity(before)


def test_float64_loss_takes_a_python_weight_in_float64():
    """Oracle: numpy's float64 closed form of one SGD step on mean((x w - y)^2) + 1e-4 ||w||^2
    (a weight through float32, 1e-4 -> 9.99999975e-05, is off by 2.5e-9 relatively)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 1))
    w0 = 100.0 * rng.normal(size=(3, 1))  # so the weighted term dominates the loss
    w = tf.Variable(w0, name="w")
    lr, lam = 2.0 ** -7, 1e-4  # Keras keeps the rate in float32: take one it holds exactly

    def objective(batch):
        xb, yb = batch
        return {"mse": tf.reduce_mean((xb @ w - yb) ** 2), "l2": tf.reduce_sum(w ** 2),
                "monitor/abs": tf.reduce_mean(tf.abs(w))}

    step = train.make_train_step(objective, keras.optimizers.SGD(lr), [w], weights={"l2": lam})
    logs = step((tf.constant(x), tf.constant(y)))
    mse, l2 = np.mean((x @ w0 - y) ** 2), np.sum(w0 ** 2)
    grad = 2.0 / 16 * x.T @ (x @ w0 - y) + 2 * lam * w0
    assert logs["loss"].dtype == tf.float64 and logs["l2"].dtype == tf.float64
    np.testing.assert_allclose(float(logs["loss"]), mse + lam * l2, rtol=1e-14)
    np.testing.assert_allclose(float(logs["grad_norm"]), np.linalg.norm(grad), rtol=1e-6)
    np.testing.assert_allclose(w.numpy() - w0, -lr * grad, rtol=1e-12)


def test_weights_and_transform_are_checked():
    model, _, objective, data = make_problem()
    vs = model.trainable_variables
    sgd = keras.optimizers.SGD
    with pytest.raises(TypeError, match=r"make_train_step.weights\['l2'\] must be a number"):
        train.make_train_step(objective, sgd(0.1), vs, weights={"l2": "1e-4"})
    with pytest.raises(ValueError, match=r"make_train_step.weights\['l2'\] must be finite"):
        train.make_train_step(objective, sgd(0.1), vs, weights={"l2": float("nan")})
    with pytest.raises(TypeError, match="make_train_step.weights must be a dict"):
        train.make_train_step(objective, sgd(0.1), vs, weights=[("l2", 1.0)])
    with pytest.raises(TypeError, match="make_train_step: transform must be a callable"):
        train.make_train_step(objective, sgd(0.1), vs, transform=1.0)
    step = train.make_train_step(objective, sgd(0.1), vs, transform=lambda g, v: g[:1])
    with pytest.raises(ValueError, match=f"transform must return a list of {len(vs)} gradients"):
        step(big_batch(data))
    only_monitor = train.make_train_step(lambda b: {"monitor/x": tf.reduce_sum(vs[0])}, sgd(0.1),
                                         vs)
    with pytest.raises(ValueError, match=r"only monitor terms \['monitor/x'\]"):
        only_monitor(big_batch(data))


def test_an_xla_step_updates_as_the_plain_step_does_and_skips_a_non_finite_gradient():
    """With the default strategy the XLA step is one computation, its update and guard
    included: the same steps (float64), the same logs, the same skipped step."""
    def problem():
        keras.utils.set_random_seed(3)
        w = tf.Variable(tf.random.normal([3, 2], dtype=tf.float64), name="w")
        b = tf.Variable(tf.zeros([2], tf.float64), name="b")

        def objective(batch):
            x, y = batch
            pred = tf.matmul(x, w) + b
            return {"mse": tf.reduce_mean((pred - y) ** 2), "l2": tf.reduce_sum(w ** 2)}
        return [w, b], objective

    def run(jit):
        variables, objective = problem()
        step = train.make_train_step(objective, keras.optimizers.Adam(0.05), variables,
                                     weights={"l2": 1e-3}, accumulation_steps=2,
                                     transform=train.clip_by_global_norm(0.5),
                                     jit_compile=jit)
        logs = []
        for i in range(4):
            x = tf.random.stateless_normal([4, 3], [i, 0], dtype=tf.float64)
            y = tf.sin(x[:, :2]) / (i > 0)  # step 0: y inf, so is the loss
            logs.append(step((x, y)))
        return [v.numpy() for v in variables], logs, step

    plain, plain_logs, _ = run(False)
    fused, fused_logs, step = run(True)
    assert [float(lg["applied"]) for lg in fused_logs] == [0.0, 1.0, 1.0, 1.0]
    for a, e in zip(fused, plain):
        np.testing.assert_allclose(a, e, rtol=1e-12)
    for a, e in zip(fused_logs, plain_logs):
        assert set(a) == set(e)
        for k in ("loss", "mse", "grad_norm", "lr", "applied"):
            np.testing.assert_allclose(float(a[k]), float(e[k]), rtol=1e-12)
