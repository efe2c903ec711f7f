"""Benchmark: one PES meta-gradient of a learned optimizer, hogrod against JAX.

The setting is `configs/learned/digits_mlp_pes.gin`'s: `hogrod.learned.mlp_optimizer`
(its defaults, step_mult 1e-2) training 64-32-5 ReLU MLPs on sklearn's digits
(`digits_mlp`, batches of 32, float32), `pes` with 16 particles (8 antithetic pairs,
staggered), sigma 0.01, truncation K = 10, horizon T = 200. One estimate = the particles
whose episode ended reset, K inner steps of every particle under its perturbed theta, the
PES weights and the estimate; the estimator's state carried from call to call as in
training. Candidates, interleaved (`timing.interleaved_samples`):
- hogrod: ``estimator.estimate(problem, theta, state, seed)`` in one `tf.function`
  (autograph off, no XLA), as `hogrod.learned.meta_step` compiles it for
  `experiments.learned_optimizer` (its seed folded from the run's seed and the call count
  there too);
- JAX (the `bench` extra): the same computation written in plain JAX, the whole estimate
  under one `jax.jit`: the reset (a fresh task and zero optimizer state where an episode
  ended, under `lax.cond` as hogrod's `tf.cond`), the batches' draws and gather, the
  perturbations (`jax.random`), `jax.vmap` over particles of a `lax.scan` over the K steps
  (`jax.grad` of the task's loss, the MLP optimizer's update as
  `hogrod/learned/mlp_optimizer.py`'s docstring states it), PES's accumulated
  perturbations and pair terms. Its random streams are its own (`jax.random`), so the
  timed runs draw other tasks, batches and perturbations than hogrod's; the schedule
  (steps, episode lengths) starts from hogrod's state.

    python -m experiments.bench.pes --gin_file=experiments/bench/configs/pes.gin

Agreement before speed: for the first `check_calls` calls of a run (by default through
the first that resets a pair), JAX's core (everything but the random draws) is given
hogrod's inputs of that call as arrays: theta, the particles' states after hogrod's
`reset`, the perturbations (drawn as hogrod's estimator draws them, checked against the
accumulators it returns) and the batches (`problem.batch`, `family.examples`). Each side's
estimate and new state (parameters, momenta, second moments, accumulators, meta-loss) is
compared with a float64 reference on the same inputs (hogrod's `truncated_unroll` of the
float64 problem, and the PES weights written from the paper in numpy), within float32's
rounding of that computation (`experiments.bench.peers.Reference`); then the same in
float64 (hogrod's estimator and JAX in float64 from hogrod's float64 state). The binary
stops on a disagreement. Reported: estimates/s (median of the rounds and the best round,
`best_*`), `ratio_hogrod_over_jax` (JAX's time over hogrod's: above 1, hogrod is faster),
the agreement errors and conditions, versions. Without JAX hogrod's side runs alone and the
JAX metrics are None.
"""

import math

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.peers import Reference, relative_error, versions
from experiments.bench.timing import interleaved_samples
from hogrod import harness, tree
from hogrod import learned as learned_lib

WHERE = "bench_pes"


def setting(step_mult, classes, hidden_sizes, batch_size, sigma, particles, truncation,
            horizon, dtype):
    """(learned, family, problem, estimator) of the benchmarked setting in `dtype`."""
    learned = learned_lib.mlp_optimizer(step_mult=step_mult, dtype=dtype)
    family = learned_lib.digits_mlp(classes=classes, hidden_sizes=hidden_sizes,
                                    batch_size=batch_size, dtype=dtype)
    problem = learned_lib.optimizer_problem(learned, family)
    estimator = learned_lib.pes(sigma=sigma, particles=particles, truncation=truncation,
                                horizon=horizon)
    return learned, family, problem, estimator


def hogrod_estimate(problem, estimator, seed):
    """``estimate(theta, state, call) -> (Estimate, state)`` compiled as `meta_step`
    compiles it (one `tf.function`, autograph off), call n's seed folded from `seed`."""
    run_seed = tf.random.experimental.stateless_fold_in(seed, 1)

    @tf.function(autograph=False)
    def estimate(theta, state, call):
        return estimator.estimate(problem, theta, state,
                                  tf.random.experimental.stateless_fold_in(run_seed, call))
    return estimate, run_seed


def _np(nest):
    return [np.asarray(t) for t in tf.nest.flatten(nest)]


# ---- one call's inputs, from hogrod's side -------------------------------------------------

def call_inputs(problem, family, reset, theta, state, seed, sigma, truncation):
    """What hogrod's estimate of `state` at `seed` computes on, as numpy arrays: the
    particles after `reset` (hogrod's, compiled), the `finished` mask, the perturbations
    (drawn as the estimator draws them) and each particle's K batches (labels, positions,
    images)."""
    particles, finished = reset(state.particles)
    pairs = int(finished.shape[0]) // 2
    like = tf.nest.map_structure(lambda t: tf.zeros([pairs] + t.shape.as_list(), t.dtype),
                                 theta)
    eps = tf.nest.map_structure(lambda e: e * tf.constant(sigma, e.dtype),
                                tree.normal_like(like, seed))
    # the data seed of each particle's episode (`hogrod.learned.unroll`'s docstring)
    seeds, episode = particles.seeds, particles.episode
    data_seeds = tf.stack([seeds[:, 0], seeds[:, 1] + 2 * episode + 1], axis=1)
    labels, positions, xs, ys = [], [], [], []
    for p in range(int(seeds.shape[0])):
        rows = [], [], [], []
        for k in range(truncation):
            batch = problem.batch(data_seeds[p], particles.steps[p] + k)
            x, y = family.examples(particles.inner.task[p], batch)
            for row, value in zip(rows, (*batch, x, y)):
                row.append(value.numpy())
        for out, row in zip((labels, positions, xs, ys), rows):
            out.append(np.stack(row))
    return dict(particles=particles, finished=finished.numpy(), eps=_np(eps),
                labels=np.stack(labels), positions=np.stack(positions), xs=np.stack(xs),
                ys=np.stack(ys))


def float_state(particles, accumulated):
    """The floating leaves of a call's state: params, momenta, second moments (each a list
    over the task's tensors, a leading [P] axis) and the accumulators."""
    inner = particles.inner
    return (_np(inner.params) + _np(inner.opt_state.momenta)
            + _np(inner.opt_state.second_moment) + _np(accumulated))


# ---- the float64 reference -----------------------------------------------------------------

def pes_terms(values, xi, sigma):
    """PES's pair terms ``(L+ - L-) xi+ / (2 sigma^2)`` (Vicol et al. 2021), numpy."""
    half = len(values) // 2
    diff = values[:half] - values[half:]
    return [diff.reshape((-1,) + (1,) * (x.ndim - 1)) * x[:half] / (2 * sigma * sigma)
            for x in xi]


def reference_fn(problem64, theta, truncation, sigma):
    """`fn(inputs, particles, finished) -> (grads, state)`: the estimate in float64 by
    hogrod's `truncated_unroll` of the float64 problem, the PES weights in numpy; inputs
    the list [theta leaves, params, momenta, second moments, accumulators, eps]."""
    unroll = tf.function(lambda thetas, particles: learned_lib.truncated_unroll(
        problem64, thetas, particles, truncation), autograph=False)
    n_theta = len(tf.nest.flatten(theta))

    def fn(inputs, particles, finished):
        inputs = [np.asarray(a, np.float64) for a in inputs]
        theta_l, eps = inputs[:n_theta], inputs[-n_theta:]
        acc = inputs[-2 * n_theta:-n_theta]
        n_params = len(particles.inner.params)
        params, momenta, second = (inputs[n_theta + i * n_params:n_theta + (i + 1) * n_params]
                                   for i in range(3))
        signed = [np.concatenate([e, -e]) for e in eps]
        thetas = tf.nest.pack_sequence_as(
            theta, [tf.constant(t[None] + s) for t, s in zip(theta_l, signed)])
        opt = particles.inner.opt_state._replace(
            momenta=[tf.constant(m) for m in momenta],
            second_moment=[tf.constant(v) for v in second])
        inner = particles.inner._replace(params=[tf.constant(p) for p in params],
                                         opt_state=opt)
        new, values = unroll(thetas, particles._replace(inner=inner))
        values = values.numpy()
        mask = lambda a: finished.reshape((-1,) + (1,) * (a.ndim - 1))  # noqa: E731
        xi = [np.where(mask(a), 0.0, a) + s for a, s in zip(acc, signed)]
        grads = [t.mean(0) for t in pes_terms(values, xi, sigma)]
        return grads, float_state(new, xi)[:-n_theta] + xi + [np.mean(values)[None]]
    return fn


# ---- the JAX peer --------------------------------------------------------------------------

def accumulate(kept, signed):
    """PES's accumulated perturbation after a truncation: the kept sum plus this one's."""
    return kept + signed


def digits_tables(dtype):
    """sklearn's digits as `digits_mlp` reads them: images / 16 [n, 64] and a [10, m] table
    of each class's first m example indices (m the smallest class's size)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    per_class = [np.flatnonzero(digits.target == c) for c in range(10)]
    m = min(len(i) for i in per_class)
    return ((digits.data / 16.0).astype(dtype),
            np.stack([i[:m] for i in per_class]).astype(np.int32))


def jax_peer(config, sizes, sigma, truncation, horizon, batch_size):
    """The JAX estimate, or None without jax: ``(core, make_run)``.

    ``core(theta, inner, finished, acc, eps, xs, ys)`` (jitted; inner = (params, momenta,
    second moments, counts)) returns (grads, state leaves as `reference_fn` orders them);
    ``make_run(theta, state, seed, calls)`` a function taking `calls` jitted estimates
    carrying the state (the draws JAX's own), blocking once at the end.
    """
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        logging.warning("jax not installed (pip install -e '.[bench]'): no JAX peer")
        return None
    if config["adam_learning_rate"]:
        raise ValueError(f"{WHERE}: the JAX peer writes mlp_optimizer without Adam's term; "
                         "leave hogrod.learned.mlp_optimizer.adam_learning_rate at 0")
    decays, b2 = config["decays"], config["second_moment_decay"]
    step_mult, exp_mult = config["step_mult"], config["exp_mult"]
    timescales, k = config["timescales"], len(config["decays"])

    def task_loss(params, x, y):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            if i + 2 < len(params):
                h = jax.nn.relu(h)
        picked = jnp.take_along_axis(h, y[:, None], axis=-1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(h, axis=-1) - picked)

    def update(theta, p, g, m, v, count):
        """mlp_optimizer's update of one tensor, as its module docstring states it."""
        dt = p.dtype
        g, pf = g.reshape(-1), p.reshape(-1)
        d = jnp.asarray(decays, dt)
        m = d * m.reshape(-1, k) + (1 - d) * g[:, None]
        v = b2 * v.reshape(-1) + (1 - b2) * g * g
        f = jnp.concatenate([g[:, None], pf[:, None], m, v[:, None],
                             m / jnp.sqrt(v[:, None] + 1e-6)], axis=1)
        f = f / jnp.sqrt(1e-5 + jnp.mean(f * f, axis=0, keepdims=True))
        embed = jnp.tanh(count.astype(dt) / jnp.asarray(timescales, dt) - 1)
        h = jnp.concatenate([f, jnp.broadcast_to(embed, (f.shape[0], len(timescales)))], 1)
        for i, layer in enumerate(theta):
            h = h @ layer["kernel"] + layer["bias"]
            if i < len(theta) - 1:
                h = jax.nn.relu(h)
        step = step_mult * h[:, 0] * jnp.exp(exp_mult * h[:, 1])
        return ((pf - step).reshape(p.shape), m.reshape(p.shape + (k,)),
                v.reshape(p.shape))

    def particle(theta, params, momenta, second, count, xs, ys):
        def step(carry, batch):
            params, momenta, second, count = carry
            grads = jax.grad(task_loss)(params, *batch)
            new = [update(theta, *leaf, count) for leaf in zip(params, grads, momenta, second)]
            params, momenta, second = (list(t) for t in zip(*new))
            return (params, momenta, second, count + 1), task_loss(params, *batch)
        carry, losses = jax.lax.scan(step, (params, momenta, second, count), (xs, ys))
        return carry, jnp.mean(losses)

    def estimate(theta, inner, finished, acc, eps, xs, ys):
        leaves, structure = jax.tree_util.tree_flatten(theta)
        signed = [jnp.concatenate([e, -e]) for e in eps]
        thetas = jax.tree_util.tree_unflatten(
            structure, [t[None] + s for t, s in zip(leaves, signed)])
        (params, momenta, second, count), values = jax.vmap(particle)(thetas, *inner, xs, ys)
        xi = [accumulate(jnp.where(finished.reshape((-1,) + (1,) * (a.ndim - 1)),
                                   jnp.zeros_like(a), a), s) for a, s in zip(acc, signed)]
        half = values.shape[0] // 2
        diff = values[:half] - values[half:]
        grads = [jnp.mean(diff.reshape((-1,) + (1,) * (x.ndim - 1)) * x[:half], 0)
                 / (2 * sigma * sigma) for x in xi]
        return grads, (params, momenta, second, count), xi, jnp.mean(values)

    jitted = jax.jit(estimate)

    def core(theta, inner, finished, acc, eps, xs, ys):
        grads, (params, momenta, second, _), xi, loss = jitted(
            theta, inner, finished, acc, eps, xs, ys)
        return ([np.asarray(g) for g in grads],
                [np.asarray(a) for a in params + momenta + second + xi]
                + [np.asarray(loss)[None]])

    def make_run(theta, state, seed, calls):
        return _jax_run(jax, jnp, estimate, sizes, sigma, truncation, horizon, batch_size,
                        k, theta, state, seed, calls)
    return core, make_run


def _jax_run(jax, jnp, estimate, sizes, sigma, truncation, horizon, batch_size, k, theta,
             state, seed, calls):
    """`make_run` of `jax_peer`: JAX's whole estimate (reset, draws, core) under one jit."""
    images, table = (jnp.asarray(a) for a in digits_tables(np.float32))
    classes, per_class = sizes[-1], table.shape[1]
    inner = state.particles.inner
    theta = jax.tree_util.tree_map(jnp.asarray, tf.nest.map_structure(np.asarray, theta))
    box = dict(params=_np(inner.params), momenta=_np(inner.opt_state.momenta),
               second=_np(inner.opt_state.second_moment),
               count=np.asarray(inner.opt_state.count, np.int32),
               task=np.asarray(inner.task, np.int32),
               steps=np.asarray(state.particles.steps, np.int32),
               length=np.asarray(state.particles.length, np.int32),
               episode=np.asarray(state.particles.episode, np.int32),
               keys=(np.asarray(state.particles.seeds) % 2 ** 32).astype(np.uint32),
               acc=_np(state.accumulated))
    box = {key: jax.tree_util.tree_map(jnp.asarray, v) for key, v in box.items()}
    run_key = jax.random.PRNGKey(seed)

    def task_init(key):
        task = jax.lax.top_k(jax.random.uniform(jax.random.fold_in(key, 0), (10,)),
                             classes)[1]
        params = []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = jax.random.truncated_normal(jax.random.fold_in(key, 2 + i), -2.0, 2.0,
                                            (n_in, n_out)) / math.sqrt(n_in)
            params += [w, jnp.zeros(n_out)]
        return params, task.astype(jnp.int32)

    def batches(key, start):
        def one(t):
            a, b = jax.random.split(jax.random.fold_in(key, t))
            return (jax.random.randint(a, (batch_size,), 0, classes),
                    jax.random.randint(b, (batch_size,), 0, per_class))
        return jax.vmap(one)(start + jnp.arange(truncation))

    @jax.jit
    def step(theta, s, call):
        finished = s["steps"] == s["length"]
        episode = s["episode"] + finished
        select = lambda new, old: jnp.where(  # noqa: E731
            finished.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)

        def fresh():
            params, task = jax.vmap(task_init)(jax.vmap(jax.random.fold_in)(
                s["keys"], 2 * episode))
            zeros = lambda ts: [jnp.zeros_like(t) for t in ts]  # noqa: E731
            return ([select(n, o) for n, o in zip(params, s["params"])],
                    [select(z, o) for z, o in zip(zeros(s["momenta"]), s["momenta"])],
                    [select(z, o) for z, o in zip(zeros(s["second"]), s["second"])],
                    select(jnp.zeros_like(s["count"]), s["count"]), select(task, s["task"]))
        params, momenta, second, count, task = jax.lax.cond(
            jnp.any(finished), fresh,
            lambda: (s["params"], s["momenta"], s["second"], s["count"], s["task"]))
        steps = jnp.where(finished, 0, s["steps"])
        labels, positions = jax.vmap(batches)(
            jax.vmap(jax.random.fold_in)(s["keys"], 2 * episode + 1), steps)
        digit = jnp.take_along_axis(task, labels.reshape(labels.shape[0], -1), 1)
        xs = images[table[digit.reshape(labels.shape), positions]]
        key = jax.random.fold_in(run_key, call)
        eps = [sigma * jax.random.normal(jax.random.fold_in(key, i),
                                         (steps.shape[0] // 2,) + a.shape[1:])
               for i, a in enumerate(s["acc"])]
        grads, (params, momenta, second, count), xi, loss = estimate(
            theta, (params, momenta, second, count), finished, s["acc"], eps, xs, labels)
        return grads, loss, dict(
            params=params, momenta=momenta, second=second, count=count, task=task,
            steps=steps + truncation, length=jnp.where(finished, horizon, s["length"]),
            episode=episode, keys=s["keys"], acc=xi)

    held = {"state": box, "call": 0}

    def run():
        for _ in range(calls):
            _, loss, held["state"] = step(theta, held["state"], held["call"])
            held["call"] += 1
        return float(jax.block_until_ready(loss))
    return run


def jax_float64(on):
    """Switch JAX's 64-bit mode (a process-wide flag) on or off."""
    import jax
    jax.config.update("jax_enable_x64", on)


# ---- the agreement check -------------------------------------------------------------------

def check_call(side, jax_core, fn64, theta, state, call, dtype, tables):
    """One call of hogrod's estimate checked: hogrod's and JAX's estimate and new state
    against the float64 reference on the call's inputs. Returns (errors, hogrod's new
    state, whether a particle reset); raises AssertionError on a disagreement."""
    problem, family, estimate, run_seed, reset, (sigma, truncation) = side
    call = tf.constant(call, tf.int64)  # the seed folds the count as an int64
    got = call_inputs(problem, family, reset, theta, state,
                      tf.random.experimental.stateless_fold_in(run_seed, call), sigma,
                      truncation)
    result, new = estimate(theta, state, call)
    finished, particles = got["finished"], got["particles"]
    signed = [np.concatenate([e, -e]) for e in got["eps"]]
    kept = [np.where(finished.reshape((-1,) + (1,) * (a.ndim - 1)), 0, a)
            for a in _np(state.accumulated)]
    if not all(np.array_equal(k + s, a) for k, s, a in zip(kept, signed,
                                                          _np(new.accumulated))):
        raise AssertionError(f"{WHERE}: the perturbations drawn here are not hogrod's "
                             "(its accumulators differ): the check cannot feed JAX them")
    images, table = tables
    task = np.asarray(particles.inner.task)
    digits = np.take_along_axis(task, got["labels"].reshape(len(task), -1), 1)
    if not np.array_equal(images[table[digits.reshape(got["labels"].shape),
                                       got["positions"]]], got["xs"]):
        raise AssertionError(f"{WHERE}: JAX's gather of the digits differs from hogrod's "
                             "family.examples")
    inputs = _np(theta) + float_state(particles, state.accumulated) + got["eps"]
    ref_grads = Reference(lambda a: fn64(a, particles, finished)[0], inputs)
    ref_state = Reference(lambda a: fn64(a, particles, finished)[1], inputs)
    grads = {"hogrod": _np(result.grads)}
    states = {"hogrod": float_state(new.particles, new.accumulated)
              + [np.asarray(result.meta_loss)[None]]}
    if jax_core is not None:
        inner = particles.inner
        if dtype == "float64":
            jax_float64(True)
        try:
            grads["jax"], states["jax"] = jax_core(
                tf.nest.map_structure(np.asarray, theta),
                (_np(inner.params), _np(inner.opt_state.momenta),
                 _np(inner.opt_state.second_moment),
                 np.asarray(inner.opt_state.count, np.int32)),
                finished, _np(state.accumulated), got["eps"], got["xs"],
                got["ys"].astype(np.int32))
        finally:
            jax_float64(False)
    out = {f"grad_rel_err_{k}_{dtype}": v for k, v in
           ref_grads.check(grads, dtype, "the PES estimate").items()}
    out.update({f"state_rel_err_{k}_{dtype}": v for k, v in
                ref_state.check(states, dtype, "the state after the estimate").items()})
    out[f"grad_condition_{dtype}"] = ref_grads.condition
    out[f"state_condition_{dtype}"] = ref_state.condition
    if "jax" in grads:
        out[f"grad_rel_diff_hogrod_jax_{dtype}"] = relative_error(
            grads["hogrod"], grads["jax"], np.inf, "hogrod against JAX")
    return out, new, bool(finished.any())


def check_agreement(sides, jax_core, fn64, thetas, states, check_calls, horizon, truncation):
    """`check_call` on the first calls of a float32 and a float64 run, each carrying
    hogrod's state; the largest errors over the calls. Returns (metrics, the float32
    run's state after them, the calls checked)."""
    out, calls = {}, None
    tables = digits_tables(np.float64)
    for dtype in ("float32", "float64"):
        state, resets, call = states[dtype], 0, 0
        limit = check_calls or (horizon // truncation + 1 if horizon else 1)
        while call < limit:
            errors, state, reset = check_call(sides[dtype], jax_core, fn64, thetas[dtype],
                                              state, call, dtype, tables)
            for key, value in errors.items():
                out[key] = max(out.get(key, 0.0), value)
            call, resets = call + 1, resets + reset
            if reset and not check_calls:
                break
        states[dtype] = state
        calls = call if calls is None else calls
        out[f"check_resets_{dtype}"] = resets
    out["check_calls"] = calls
    return out, states["float32"], calls


@gin.configurable
def bench_pes(output_dir, step_mult: harness.Positive = 1e-2, classes: harness.PositiveInt = 5,
              hidden_sizes: tuple[harness.PositiveInt, ...] = (32,),
              batch_size: harness.PositiveInt = 32, sigma: harness.Positive = 0.01,
              particles: harness.PositiveInt = 16, truncation: harness.PositiveInt = 10,
              horizon: harness.PositiveInt = 200, check_calls: harness.Count = 0,
              rounds: harness.PositiveInt = 20, calls_per_round: harness.PositiveInt = 20,
              warmup: harness.Count = 1, seed: harness.Count = 0):
    """Estimates/s of hogrod's PES and JAX's, after checking they agree; the metrics.

    Args:
      output_dir: the run's directory (unused: nothing is saved but the metrics).
      step_mult: `hogrod.learned.mlp_optimizer`'s step_mult (its other settings its
        defaults).
      classes: `digits_mlp`'s classes per task.
      hidden_sizes: `digits_mlp`'s hidden widths.
      batch_size: `digits_mlp`'s examples per inner step.
      sigma: `pes`'s perturbation deviation.
      particles: `pes`'s particles (even: antithetic pairs).
      truncation: `pes`'s inner steps K per estimate.
      horizon: `pes`'s episode length T (a multiple of K).
      check_calls: the calls of each agreement run (float32, float64); 0: through the
        first that resets a particle.
      rounds: interleaved timing rounds.
      calls_per_round: estimates per candidate per round (the state carried).
      warmup: untimed rounds of each first.
      seed: theta's, the particles' and the perturbations' seed.

    Returns:
      The metrics (see the module docstring); the JAX ones None without JAX.
    """
    del output_dir
    sides, thetas, states = {}, {}, {}
    base = tf.constant([seed, 0], tf.int64)
    for dtype in ("float32", "float64"):
        learned, family, problem, estimator = setting(
            step_mult, classes, hidden_sizes, batch_size, sigma, particles, truncation,
            horizon, dtype)
        theta = learned.init(base)
        if dtype == "float64":  # the float32 theta, exactly
            theta = tf.nest.map_structure(lambda t: tf.cast(t, tf.float64), thetas["float32"])
        estimate, run_seed = hogrod_estimate(problem, estimator, base)
        thetas[dtype] = theta
        states[dtype] = estimator.init(problem, theta,
                                       tf.random.experimental.stateless_fold_in(base, 0))
        reset = tf.function(lambda p, problem=problem: learned_lib.reset(problem, p, horizon),
                            autograph=False)  # traced once, not at every reset
        sides[dtype] = (problem, family, estimate, run_seed, reset, (sigma, truncation))
        if dtype == "float32":
            config, estimate32 = learned.config, estimate
    sizes = [64] + list(hidden_sizes) + [classes]
    peer = jax_peer(config, sizes, sigma, truncation, horizon, batch_size)
    fn64 = reference_fn(sides["float64"][0], thetas["float64"], truncation, sigma)
    m = {k: None for k in ("estimates_per_s_jax", "best_estimates_per_s_jax",
                           "ratio_hogrod_over_jax", "best_ratio_hogrod_over_jax",
                           "grad_rel_err_jax_float32", "grad_rel_err_jax_float64")}
    checked, state, calls = check_agreement(sides, peer and peer[0], fn64, thetas, states,
                                            check_calls, horizon, truncation)
    m.update(checked)
    held = {"state": state, "call": calls}

    def hogrod_run():
        for _ in range(calls_per_round):
            result, held["state"] = estimate32(thetas["float32"], held["state"],
                                               tf.constant(held["call"], tf.int64))
            held["call"] += 1
        return float(result.meta_loss)
    candidates = {"hogrod": hogrod_run}
    if peer is not None:
        candidates["jax"] = peer[1](thetas["float32"], state, seed, calls_per_round)
    samples = interleaved_samples(candidates, rounds, 1, warmup)
    for name, rates in samples.items():
        m[f"estimates_per_s_{name}"] = float(np.median(rates)) * calls_per_round
        m[f"best_estimates_per_s_{name}"] = float(np.max(rates)) * calls_per_round
    if "jax" in samples:
        m["ratio_hogrod_over_jax"] = m["estimates_per_s_hogrod"] / m["estimates_per_s_jax"]
        m["best_ratio_hogrod_over_jax"] = (m["best_estimates_per_s_hogrod"]
                                           / m["best_estimates_per_s_jax"])
    m["hogrod_traces"] = estimate32.experimental_get_tracing_count()
    m.update(versions("jax"), step_mult=step_mult, classes=classes,
             hidden_sizes=list(hidden_sizes), batch_size=batch_size, sigma=sigma,
             particles=particles, truncation=truncation, horizon=horizon, rounds=rounds,
             calls_per_round=calls_per_round)
    for name, value in sorted(m.items()):
        print(f"{name:35s} {value}")
    return m


def main():
    """`python -m experiments.bench.pes` (see the module docstring)."""
    harness.main(bench_pes)


if __name__ == "__main__":
    main()
