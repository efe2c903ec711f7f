"""MAML-RL in float64. Oracles: TRPO's step against a dense natural-gradient solve (the mean
KL's Hessian by nested tapes, numpy's solve); the line search on constructed surrogates and
KLs; the meta-gradient (DiCE inner step, outer surrogate) against central differences of the
inner step written with explicit importance weights ``exp(w(theta) - w(theta0))`` (what the
magic box means); a meta-step under MirroredStrategy on two logical CPUs against one device;
the binary, resumed, against an uninterrupted run."""

import gc
import json
import logging
import shutil
import sys
import weakref

import numpy as np
import keras
import pytest
import tensorflow as tf

import hogrod
from hogrod import distribute, harness, models, rl

F64 = tf.float64


def tiny_policy(seed=0, hidden=3):
    keras.utils.set_random_seed(seed)
    policy = rl.GaussianPolicy(models.dense_net((2, hidden, 2), dtype="float64"), 2,
                               init_std=0.7, dtype="float64")
    policy.build((None, 2))
    return policy


def flat(tree):
    return np.concatenate([np.ravel(t) for t in tree])


def test_trpo_step_is_the_dense_natural_gradient_scaled_to_the_kl_bound():
    policy = tiny_policy()
    obs = tf.constant(np.random.default_rng(0).normal(size=(5, 2)))
    theta = hogrod.trainable_values(policy)
    old = tf.nest.map_structure(tf.stop_gradient, policy.distribution(obs))

    def kl(params):
        return tf.reduce_mean(old.kl(policy.distribution(obs, params)))

    with tf.GradientTape(persistent=True) as outer:
        outer.watch(theta)
        with tf.GradientTape() as inner:
            inner.watch(theta)
            value = kl(theta)
        grads = tf.concat([tf.reshape(g, [-1]) for g in inner.gradient(value, theta)], 0)
    jacobians = outer.jacobian(grads, theta, experimental_use_pfor=False)
    fisher = np.concatenate([np.reshape(j, (grads.shape[0], -1)) for j in jacobians], axis=1)
    size, damping, max_kl = fisher.shape[0], 0.05, 0.01
    g = [tf.constant(np.random.default_rng(1).normal(size=t.shape)) for t in theta]
    solved = np.linalg.solve(fisher + damping * np.eye(size), flat(g))
    scale = np.sqrt(2 * max_kl / (flat(g) @ solved))
    step, info = tf.function(lambda g: rl.natural_step(  # compiled: CG's loop is eager else
        g, lambda v: hogrod.hvp(lambda: kl(theta), theta, v, "reverse_over_reverse"), max_kl,
        maxiter=3 * size, damping=damping, tol=0.0), autograph=False)(g)
    np.testing.assert_allclose(flat(step), scale * solved, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(float(info.scale), scale, rtol=1e-8)
    # the quadratic model of the KL at the step is max_kl
    np.testing.assert_allclose(0.5 * flat(step) @ (fisher + damping * np.eye(size)) @ flat(step),
                               max_kl, rtol=1e-8)


def test_line_search_rejects_steps_over_the_kl_bound_or_without_improvement():
    x0, step = [tf.zeros([2], F64)], [tf.constant([1.0, 0.0], F64)]
    s0 = tf.constant(0.0, F64)
    cases = [  # (surrogate, kl, expected fraction or None)
        (lambda x: x[0], lambda x: 0.01 * x[0] ** 2, 1.0),  # the full step first, accepted
        (lambda x: x[0], lambda x: x[0] ** 2, 0.25),  # KL <= 0.1 first at 0.5**2
        (lambda x: x[0] - 10 * x[0] ** 2, lambda x: 0.0 * x[0], 0.0625),  # improves below 0.1
        (lambda x: 0.0 * x[0], lambda x: 0.0 * x[0], None),  # never improves (equal)
        (lambda x: x[0], lambda x: x[0] / 0.0, None),  # KL never finite
        (lambda x: tf.where(x[0] > 0.3, np.inf, x[0]), lambda x: 0.0 * x[0], 0.25),  # not finite
    ]
    for surrogate, kl, fraction in cases:
        new, info = rl.line_search(lambda c: (surrogate(c[0]), kl(c[0])), x0, step, s0, 0.1,
                                   maxiter=6, ratio=0.5)
        if fraction is None:
            assert not bool(info.accepted) and int(info.tries) == 6
            np.testing.assert_array_equal(new[0], x0[0])
        else:
            assert bool(info.accepted) and float(info.fraction) == fraction
            assert int(info.tries) == {1.0: 1, 0.25: 3, 0.0625: 5}[fraction]
            np.testing.assert_array_equal(new[0], [fraction, 0.0])
            assert float(info.kl) <= 0.1 and float(info.surrogate) > 0


class IgnoresParams(rl.GaussianPolicy):
    """A policy whose distribution forgets `params` (its variables instead)."""

    def distribution(self, observations, params=None):
        return super().distribution(observations)


def test_inner_step_names_a_parameter_the_log_probs_do_not_depend_on():
    env = rl.Navigation2D(horizon=2, dtype="float64")
    policy = tiny_policy()
    episodes = rl.rollout(env, policy, env.sample_tasks(0, 1), 0, 2)
    one = rl.Trajectories(*[t[0] for t in episodes])
    theta = hogrod.trainable_values(policy)
    fast = rl.inner_step(policy, theta, one, 0.1, 0.9)
    assert all(f.shape == t.shape for f, t in zip(fast, theta))
    forgetful = IgnoresParams(models.dense_net((2, 3, 2), dtype="float64"), 2, dtype="float64")
    forgetful.build((None, 2))
    with pytest.raises(ValueError, match=r"do not depend on parameter '\S+'"):
        rl.inner_step(forgetful, hogrod.trainable_values(forgetful), one, 0.1, 0.9)


@pytest.fixture(scope="module")
def learner():
    env = rl.Navigation2D(horizon=3, dtype="float64")
    policy = tiny_policy(1)
    return rl.MamlRL(env, policy, meta_batch=2, batch=3, inner_lr=0.3, discount=0.9,
                     gae_lambda=0.95, damping=0.1, hvp_mode="reverse_over_reverse")


@pytest.mark.parametrize("task_map", ["vectorized", "sequential"])
def test_the_meta_gradient_has_every_second_order_term(learner, task_map):
    if task_map != learner.task_map:
        learner = rl.MamlRL(learner.env, learner.policy, meta_batch=2, batch=3, inner_lr=0.3,
                            discount=0.9, gae_lambda=0.95, damping=0.1,
                            hvp_mode="reverse_over_reverse", task_map=task_map)
    policy, env = learner.policy, learner.env
    theta0 = hogrod.trainable_values(policy)
    compiled = lambda fn: tf.function(fn, autograph=False)  # noqa: E731 (eager: per-call pfor)
    data = compiled(learner.sample)(env.sample_tasks(3, 2), tf.range(2, dtype=tf.int64),
                                    tf.constant([4, 0], tf.int64), theta0)

    def gradient(data, theta):
        with tf.GradientTape() as tape:
            tape.watch(theta)
            surrogate, _ = learner.surrogate_and_kl(data, theta)
        return tape.gradient(surrogate, theta)
    meta_gradient = flat(compiled(gradient)(data, theta0))

    def log_probs(obs, actions, params):
        return rl.policy_distribution(policy, obs, params).log_prob(actions)

    def meta_objective(theta):  # no magic box: explicit importance weights around theta0
        total = 0.0
        for i in range(2):
            inner = rl.Trajectories(*[t[i] for t in data.inner])
            outer = rl.Trajectories(*[t[i] for t in data.outer])
            m, steps = inner.mask, inner.rewards.shape[1]
            adv = rl.gae_advantages(inner.rewards, data.inner_values[i], 0.9, 0.95, m)
            gamma = 0.9 ** np.arange(steps)
            w0 = tf.cumsum(m * log_probs(inner.observations, inner.actions, theta0), axis=1)
            with tf.GradientTape() as t:
                t.watch(theta)
                w = tf.cumsum(m * log_probs(inner.observations, inner.actions, theta), axis=1)
                ratio = tf.exp(w - w0)
                earlier = tf.concat([tf.ones_like(ratio[:, :1]), ratio[:, :-1]], axis=1)
                weighted = tf.reduce_mean(tf.reduce_sum(gamma * (ratio - earlier) * adv, 1))
            scale = data.inner_scale[i]
            fast = [p + 0.3 * scale * g for p, g in zip(theta, t.gradient(weighted, theta))]
            r = tf.exp(log_probs(outer.observations, outer.actions, fast) - outer.log_probs)
            total += tf.reduce_sum(r * data.advantages[i] * outer.mask) / tf.reduce_sum(
                outer.mask)
        return float(total) / 2

    rng = np.random.default_rng(5)
    h = 1e-5
    for _ in range(2):
        v = [tf.constant(rng.normal(size=t.shape)) for t in theta0]
        plus = meta_objective([t + h * u for t, u in zip(theta0, v)])
        minus = meta_objective([t - h * u for t, u in zip(theta0, v)])
        np.testing.assert_allclose(meta_gradient @ flat(v), (plus - minus) / (2 * h),
                                   rtol=1e-6, atol=1e-9)


def test_without_adaptation_the_surrogate_is_the_policy_gradient_of_the_sampled_tasks():
    """`adapt=False` (the pretrained baseline): the outer episodes are the inner ones and the
    surrogate's gradient is the plain policy gradient, mean over tasks of
    sum(grad log pi * A * mask) / sum(mask)."""
    env = rl.Navigation2D(horizon=3, dtype="float64")
    policy = tiny_policy(4)
    learner = rl.MamlRL(env, policy, meta_batch=2, batch=3, inner_lr=0.3, discount=0.9,
                        hvp_mode="reverse_over_reverse", adapt=False)
    theta = hogrod.trainable_values(policy)
    compiled = lambda fn: tf.function(fn, autograph=False)  # noqa: E731
    data = compiled(learner.sample)(env.sample_tasks(3, 2), tf.range(2, dtype=tf.int64),
                                    tf.constant([4, 0], tf.int64), theta)
    for a, b in zip(data.outer, data.inner):
        np.testing.assert_array_equal(a, b)

    def gradients(theta):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(theta)
            surrogate, kl = learner.surrogate_and_kl(data, theta)
            plain = 0.0
            for i in range(2):
                e = rl.Trajectories(*[t[i] for t in data.outer])
                lp = rl.policy_distribution(policy, e.observations, theta).log_prob(e.actions)
                plain += tf.reduce_sum(lp * data.advantages[i] * e.mask) / tf.reduce_sum(
                    e.mask) / 2
        return tape.gradient(surrogate, theta), tape.gradient(plain, theta), kl
    got, want, kl = compiled(gradients)(theta)
    np.testing.assert_allclose(flat(got), flat(want), rtol=1e-12, atol=1e-14)
    assert abs(float(kl)) < 1e-14 and np.abs(flat(want)).max() > 1e-3


def test_a_trpo_step_with_the_tasks_mapped_sequentially_or_under_xla_equals_the_plain_one():
    """The Fisher-vector products (reverse over reverse: forward mode cannot pass
    `tf.map_fn`) and the line search through `tf.map_fn` give the step
    `tf.vectorized_map` gives; so does the step with its meta-gradient, products (forward
    over reverse) and line search compiled by XLA."""
    env = rl.Navigation2D(horizon=3, dtype="float64")
    steps = {}
    for task_map, jit in (("vectorized", False), ("sequential", False), ("vectorized", True)):
        policy = tiny_policy(6)
        # "auto" is reverse over reverse with "sequential": the same products here
        mode = "reverse_over_reverse" if (task_map, jit) == ("vectorized", False) else "auto"
        learner = rl.MamlRL(env, policy, meta_batch=2, batch=3, inner_lr=0.3, discount=0.9,
                            damping=0.1, task_map=task_map, hvp_mode=mode, jit_compile=jit)
        logs = {k: float(v) for k, v in learner.step(5).items()}
        steps[task_map, jit] = logs, flat(hogrod.trainable_values(policy))
        if task_map == "sequential":
            assert learner.hvp_mode == "reverse_over_reverse"  # "auto" through tf.map_fn
    (vectorized, after), *others = steps.values()
    assert vectorized["accepted"] == 1 and vectorized["kl"] > 0
    # ten CG iterations on a near-singular Fisher amplify the maps' different rounding
    # (seen: 6e-9 relative); a task dropped or mis-mapped is off by 1e-3 or more
    for logs, params in others:
        for k in vectorized:
            np.testing.assert_allclose(logs[k], vectorized[k], rtol=1e-7, atol=1e-12,
                                       err_msg=k)
        np.testing.assert_allclose(params, after, rtol=1e-7, atol=1e-8)
    with pytest.raises(hogrod.checks.ArgumentError, match="task_map"):
        rl.MamlRL(env, policy, meta_batch=2, batch=3, task_map="recomputed")
    with pytest.raises(hogrod.checks.ArgumentError, match="jit_compile must be a bool"):
        rl.MamlRL(env, policy, meta_batch=2, batch=3, jit_compile="yes")
    with pytest.raises(hogrod.checks.ArgumentError, match="forward_over_reverse"):
        rl.MamlRL(env, policy, meta_batch=2, batch=3, task_map="sequential",
                  hvp_mode="forward_over_reverse")


@pytest.mark.slow
def test_a_meta_step_over_two_replicas_equals_one_device(learner):
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    start = hogrod.trainable_values(learner.policy)
    with strategy.scope():
        policy = tiny_policy(2)
    for v, t in zip(policy.trainable_variables, start):
        v.assign(t)
    settings = dict(meta_batch=2, batch=3, inner_lr=0.3, discount=0.9, gae_lambda=0.95,
                    outer="clip", outer_steps=1, hvp_mode="reverse_over_reverse")
    single = rl.MamlRL(learner.env, learner.policy, **settings)
    mirrored = rl.MamlRL(learner.env, policy, strategy=strategy, **settings)
    one, two = single.step(7), mirrored.step(7)
    assert float(one["kl"]) > 0
    # the episodes and the surrogate's gradient agree to rounding; ten CG iterations on a
    # near-singular Fisher amplify the rounding of the replicas' sums (seen: up to 2e-7
    # relative in the logs, 2e-8 absolute in the weights; a wrong reduction is off by 1e-3
    # or more)
    for k in one:
        np.testing.assert_allclose(float(two[k]), float(one[k]), rtol=1e-5, atol=1e-12,
                                   err_msg=k)
    for a, b in zip(policy.trainable_variables, learner.policy.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(flat(start), flat(hogrod.trainable_values(policy)))


@pytest.mark.slow
def test_the_binary_resumes_exactly(tmp_path):
    """A run of two meta-iterations (TRPO: the clipped surrogate's step is the test
    above's); another stopped by its time limit after the first, then continued to two:
    the same weights and metrics, bit for bit."""
    from experiments import maml_rl

    config = ["configs/rl/navigation2d_smoke.gin"]
    params = ["maml_rl_experiment.eval_steps = (0,)", "maml_rl_experiment.outer = 'trpo'"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    _, metrics = harness.run(maml_rl.maml_rl_experiment, config, params, str(full))
    assert (full / "adaptation.png").exists() and metrics["meta_iterations"] == 2
    assert len(metrics["train_return_after"]) == 2
    _, stopped = harness.run(maml_rl.maml_rl_experiment, config, params + [
        "maml_rl_experiment.time_limit_s = 1e-9"], str(resumed))
    assert stopped["meta_iterations"] == 1 and 0 < stopped["train_seconds"]
    # logs past the checkpoint (as a kill after writing them leaves) are dropped and redone
    for name in ("eval_history.json", "train_history.json"):
        shutil.copy(full / name, resumed / name)
    _, again = harness.run(maml_rl.maml_rl_experiment, config, params, str(resumed),
                           allow_config_change=True)
    for key in ("return_after_0", "final_train_kl", "final_train_surrogate",
                "final_train_return_before", "train_return_before", "train_return_after"):
        assert again[key] == metrics[key], key
    for name, _ in tf.train.list_variables(str(full / "ckpt" / "ckpt-2")):
        if name.startswith("policy"):
            np.testing.assert_array_equal(
                tf.train.load_variable(str(resumed / "ckpt" / "ckpt-2"), name),
                tf.train.load_variable(str(full / "ckpt" / "ckpt-2"), name))
    history = json.loads((resumed / "eval_history.json").read_text())
    assert [h["step"] for h in history] == [0, 1, 2]
    logged = json.loads((resumed / "train_history.json").read_text())
    assert 0 < logged[0]["seconds"] < logged[1]["seconds"] == again["train_seconds"]


def test_with_nothing_to_train_the_binary_evaluates_once(tmp_path):
    """The random baseline (navigation2d_random.gin): no meta-iteration, one evaluation."""
    from experiments import maml_rl
    _, m = harness.run(maml_rl.maml_rl_experiment, ["configs/rl/navigation2d_smoke.gin"],
                       ["maml_rl_experiment.meta_iterations = 0",
                        "navigation2d.observe_goal = True"], str(tmp_path))
    assert m["meta_iterations"] == 0 and m["train_seconds"] == 0.0
    assert [h["step"] for h in json.loads((tmp_path / "eval_history.json").read_text())] == [0]
    assert m["return_after_1"] != m["return_after_0"]


def test_a_resumed_run_needs_the_training_logs_up_to_its_checkpoint(tmp_path):
    from experiments.maml_rl import read_train_history
    path = tmp_path / "train_history.json"
    assert read_train_history(str(path), 0) == []
    path.write_text(json.dumps([{"step": 1, "kl": 0.1}, {"step": 2, "kl": 0.2}]))
    assert read_train_history(str(path), 1) == [{"step": 1, "kl": 0.1}]  # step 2 is redone
    with pytest.raises(ValueError, match="train_history.json lists meta-iterations"):
        read_train_history(str(path), 3)
    with pytest.raises(ValueError, match="new --output_dir"):
        read_train_history(str(tmp_path / "missing.json"), 1)


def test_inner_step_names_episodes_of_every_task_and_adapt_its_two_callables():
    env = rl.Navigation2D(horizon=2, dtype="float64")
    policy = tiny_policy()
    episodes = rl.rollout(env, policy, env.sample_tasks(0, 1), 0, 2)  # [tasks, batch, T]
    theta = hogrod.trainable_values(policy)
    with pytest.raises(hogrod.checks.ArgumentError,
                       match=r"inner_step: episodes must be one task's .* \[1, 2, 2\]"):
        rl.inner_step(policy, theta, episodes, 0.1, 0.9)
    one = rl.Trajectories(*[t[0] for t in episodes])
    with pytest.raises(hogrod.checks.ArgumentError, match="inner_step: scale must be"):
        rl.inner_step(policy, theta, one, 0.1, 0.9, scale=-1.0)
    # a Python scale at the params' dtype (float64), never through float32
    exact = tf.constant(0.1, tf.float64)
    for a, b in zip(rl.inner_step(policy, theta, one, 0.1, 0.9, scale=0.1),
                    rl.inner_step(policy, theta, one, 0.1, 0.9, scale=exact)):
        np.testing.assert_array_equal(a, b)
    for kwargs in ({}, {"objective": lambda p, s: 0.0}):
        loss = None if not kwargs else keras.losses.MeanSquaredError()
        with pytest.raises(hogrod.checks.ArgumentError, match="exactly one of loss"):
            hogrod.meta.adapt(policy, loss, (one, None, None), 0.1, params=theta, **kwargs)


def numpy_gae(r, v, discount, lam, m):
    """GAE by its definition: delta_t = r_t + discount V_{t+1} - V_t (V 0 after the end)."""
    r, v = r * m, v * m
    delta = r + discount * np.concatenate([v[:, 1:], np.zeros_like(v[:, :1])], 1) - v
    adv, acc = np.zeros_like(delta), 0.0
    for t in reversed(range(delta.shape[1])):
        acc = delta[:, t] + discount * lam * acc
        adv[:, t] = acc
    return adv * m


def sampled(learner, seed=3):
    theta = hogrod.trainable_values(learner.policy)
    data = tf.function(learner.sample, autograph=False)(
        learner.env.sample_tasks(seed, 2), tf.range(2, dtype=tf.int64),
        tf.constant([4, 0], tf.int64), theta)
    return data, theta


def _learner_without_inner_step(kind):
    if kind == "gaussian":
        env = rl.Navigation2D(horizon=4, dtype="float64")
        policy = tiny_policy(7)
    else:
        keras.utils.set_random_seed(7)
        env = rl.TabularMDP(np.random.default_rng(0).dirichlet(np.ones(3), (3, 3)),
                            np.arange(9.0).reshape(3, 3), horizon=4, dtype="float64")
        policy = rl.CategoricalPolicy(models.dense_net((3, 4, 3), dtype="float64"), 3,
                                      dtype="float64")
        policy.build((None, 3))
    return rl.MamlRL(env, policy, meta_batch=2, batch=8, discount=0.9, gae_lambda=0.95,
                     adapt=False, hvp_mode="reverse_over_reverse")


def _numpy_kl(kind, old, new):
    """KL(p || q) of each step, closed form."""
    if kind == "gaussian":
        (mp, sp), (mq, sq) = old, new
        return np.sum(sq - sp + (np.exp(2 * sp) + (mp - mq) ** 2) / (2 * np.exp(2 * sq))
                      - 0.5, -1)
    lp, lq = [x - np.log(np.exp(x).sum(-1, keepdims=True)) for x in (old[0], new[0])]
    return np.sum(np.exp(lp) * (lp - lq), -1)


@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
def test_the_scale_kl_and_clipped_surrogate_are_their_definitions(kind):
    """From the episodes in numpy: each task's inner scale is pytorch-maml-rl's, 1 /
    (sum(mask) / batch * (std of the GAE advantages over the unmasked steps + 1e-8)); at
    parameters moved from the sampling ones, the logged mean KL is the closed form of
    KL(old || new) (not KL(new || old), which differs here), each task's masked mean, then
    the tasks' mean; the clipped surrogate is ``min(r A, clip(r, 0.8, 1.2) A)``, with ratios
    outside the band on both sides and advantages of both signs. Sampling a categorical
    policy's meta-batch logs no pfor notice of per-task random ops."""
    learner = _learner_without_inner_step(kind)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tf.get_logger().addHandler(handler)
    try:
        data, theta = sampled(learner, seed=1)
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [r for r in records if "while_loop for converting" in r.getMessage()]
    rng = np.random.default_rng(2)
    moved = [t + 0.4 * rng.normal(size=t.shape) for t in theta]
    surrogate, kl = tf.function(lambda d, p: learner.surrogate_and_kl(d, p, True),
                                autograph=False)(data, moved)
    want_kl, want_surrogate, reverse, signs = [], [], [], set()
    for i in range(2):
        m = data.inner.mask[i].numpy()
        adv = numpy_gae(data.inner.rewards[i].numpy(), data.inner_values[i].numpy(), 0.9,
                        0.95, m)
        scale = 1.0 / (m.sum() / m.shape[0] * (adv[m > 0].std() + 1e-8))
        np.testing.assert_allclose(float(data.inner_scale[i]), scale, rtol=1e-12)
        o = rl.Trajectories(*[f[i] for f in data.outer])
        m = o.mask.numpy()
        new = rl.policy_distribution(learner.policy, o.observations, moved)
        old = [f[i].numpy() for f in data.old]
        forward = _numpy_kl(kind, old, [f.numpy() for f in new])
        backward = _numpy_kl(kind, [f.numpy() for f in new], old)
        want_kl.append((forward * m).sum() / m.sum())
        reverse.append((backward * m).sum() / m.sum())
        r = np.exp(new.log_prob(o.actions).numpy() - o.log_probs.numpy())
        a = data.advantages[i].numpy()
        gain = np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
        want_surrogate.append((gain * m).sum() / m.sum())
        outside = (np.abs(r - 1) > 0.2) & (m > 0)
        signs |= set(zip(np.sign(r - 1)[outside], np.sign(a)[outside]))
    assert signs == {(1, 1), (1, -1), (-1, 1), (-1, -1)}  # every side of the clip's band
    np.testing.assert_allclose(float(kl), np.mean(want_kl), rtol=1e-12)
    assert abs(np.mean(reverse) - np.mean(want_kl)) > 1e-3 * np.mean(want_kl)
    np.testing.assert_allclose(float(surrogate), np.mean(want_surrogate), rtol=1e-12)


def test_evaluate_reports_one_row_per_inner_step_count_and_refuses_recomputed():
    env = rl.Navigation2D(horizon=2, dtype="float64")
    learner = rl.MamlRL(env, tiny_policy(3), meta_batch=2, batch=2, inner_lr=0.3)
    tasks = env.sample_tasks(5, 2)
    some = learner.evaluate(tasks, 1, (1, 0)).numpy()
    unadapted = learner.evaluate(tasks, 1, (0,)).numpy()
    assert some.shape == (2, 2) and unadapted.shape == (1, 2)
    np.testing.assert_array_equal(some[1], unadapted[0])
    assert np.all(some[0] != some[1])
    for steps in (3, (), (1.5,)):
        with pytest.raises(hogrod.checks.ArgumentError, match="MamlRL.evaluate: steps"):
            learner.evaluate(tasks, 1, steps)
    with pytest.raises(hogrod.checks.ArgumentError, match="recomputed.*second"):
        rl.MamlRL(env, learner.policy, meta_batch=2, batch=2, task_map="recomputed")


def test_the_binary_refuses_one_held_out_goal_and_an_environment_by_name(tmp_path):
    """One goal would give a 95% interval of 0.0; a string is not an environment."""
    from experiments import maml_rl
    config = ["configs/rl/navigation2d_smoke.gin"]
    for binding, pattern in (("maml_rl_experiment.eval_tasks = 1", r"eval_tasks = 1: must be "
                                                                    "an integer >= 2"),
                             ("maml_rl_experiment.env = 'navigation2d'",
                              "env must be a callable .a gin reference"),
                             ("maml_rl_experiment.eval_steps = ()", "eval_steps is empty")):
        with pytest.raises((ValueError, harness.ConfigError),
                           match=f"maml_rl_experiment.{pattern}"):
            harness.run(maml_rl.maml_rl_experiment, config, [binding], str(tmp_path / "out"))
        assert not (tmp_path / "out").exists()


def test_eager_rollouts_and_inner_steps_log_no_retracing():
    """Called eagerly again and again (a user's loop), `rollout` runs one compiled loop and
    `inner_step` traces nothing: TensorFlow logs no retracing warning."""
    env = rl.Navigation2D(horizon=2, dtype="float64")
    policy = tiny_policy(8)
    tasks, theta = env.sample_tasks(0, 2), hogrod.trainable_values(policy)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tf.get_logger().addHandler(handler)
    try:
        for seed in range(7):
            episodes = rl.rollout(env, policy, tasks, seed, 2)
            rl.inner_step(policy, theta, rl.Trajectories(*[f[0] for f in episodes]), 0.1, 0.9)
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [r.getMessage() for r in records if "retracing" in r.getMessage()]
    # the compiled loop is cached per policy, and freed with it
    compiled = sys.modules["hogrod.rl.rollout"]._COMPILED
    assert policy in compiled
    key = weakref.ref(policy)
    del policy
    gc.collect()
    assert key() is None  # nothing else held it: the cache did not
