"""Benchmark: one PES meta-gradient of a learned optimizer, hogrod against JAX.

The setting is `configs/learned/digits_mlp_pes.gin`'s: `mlp_optimizer` (defaults, step_mult
1e-2) training 64-32-5 ReLU MLPs on sklearn's digits (`digits_mlp`, batches of 32,
float32), `pes` with 16 particles (8 staggered antithetic pairs), sigma 0.01, K = 10,
T = 200. One estimate: the particles whose episode ended reset, K inner steps of every
particle under its perturbed theta, PES's weights and estimate; the state carried from call
to call as in training. Candidates, interleaved (`timing.interleaved_samples`):
- hogrod: ``estimator.estimate(problem, theta, state, seed)`` in one `tf.function`
  (autograph off; the unroll one XLA computation, `pes`'s default), as
  `hogrod.learned.meta_step` compiles it for `experiments.learned_optimizer` (call n's
  seed folded from the run's seed and n); `hogrod_plain` the same with
  ``pes(jit_compile=False)``;
- JAX (the `bench` extra): the same in plain JAX under one `jax.jit`: the reset (a fresh
  task and optimizer state, under `lax.cond` as hogrod's `tf.cond`), the batches' and
  perturbations' draws (`jax.random`: other draws than hogrod's), `jax.vmap` over
  particles of a `lax.scan` over the K steps (`jax.grad` of the task's loss, the update of
  `hogrod/learned/mlp_optimizer.py`'s docstring), PES's accumulators and pair terms; its
  state starts from hogrod's (tasks, schedule).

    python -m experiments.bench.pes --gin_file=experiments/bench/configs/pes.gin

Agreement before speed: on the first `check_calls` calls (by default through the first
that resets a pair), JAX's estimate without its draws is given hogrod's inputs of the call
as arrays: theta, the particles after hogrod's `reset`, the perturbations (drawn as the
estimator draws them, checked against its accumulators) and the batches (`problem.batch`,
`family.examples`). Each side's estimate and new state (parameters, momenta, second
moments, accumulators, meta-loss) is compared with a float64 reference on those inputs
(hogrod's `truncated_unroll` of the float64 problem, PES's weights in numpy), within
float32's rounding of that computation (`experiments.bench.peers.Reference`); then both
in float64 from hogrod's float64 state. A disagreement stops the binary. Reported:
estimates/s (median of the rounds; `best_*`: the best round), `ratio_hogrod_over_jax`
(JAX's time over hogrod's: above 1, hogrod is faster), `ratio_hogrod_over_hogrod_plain`
(what XLA gives; the plain estimate's agreement with the default one is a test's), the
errors and conditions, versions. Without JAX hogrod's sides run alone, the JAX metrics None.
"""

import gin
import numpy as np
import tensorflow as tf

from experiments.bench.peers import Reference, relative_error, versions
from experiments.bench.pes_jax import digits_tables, jax_float64, jax_peer
from experiments.bench.timing import interleaved_samples
from hogrod import harness, tree
from hogrod import learned as learned_lib

WHERE = "bench_pes"


def setting(step_mult, classes, hidden_sizes, batch_size, sigma, particles, truncation,
            horizon, dtype, constants=None):
    """(learned, family, problem, estimator) of the benchmarked setting in `dtype`; the
    optimizer's settings `constants` where given (`rounded`), else its defaults."""
    learned = learned_lib.mlp_optimizer(**(constants or dict(step_mult=step_mult)),
                                        dtype=dtype)
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
    rows = [[], [], [], []]  # labels, positions, images, labels as the loss sees them
    for p in range(int(seeds.shape[0])):
        for k in range(truncation):
            batch = problem.batch(data_seeds[p], particles.steps[p] + k)
            for row, v in zip(rows, (*batch, *family.examples(particles.inner.task[p], batch))):
                row.append(v.numpy())
    labels, positions, xs, ys = (np.reshape(r, (len(seeds), truncation) + r[0].shape)
                                 for r in rows)
    return dict(particles=particles, finished=finished.numpy(), eps=_np(eps), labels=labels,
                positions=positions, xs=xs, ys=ys)


def float_state(particles, accumulated):
    """The floating leaves of a call's state: params, momenta, second moments (each a list
    over the task's tensors, a leading [P] axis) and the accumulators."""
    inner = particles.inner
    return (_np(inner.params) + _np(inner.opt_state.momenta)
            + _np(inner.opt_state.second_moment) + _np(accumulated))


# ---- the float64 reference -----------------------------------------------------------------

def rounded(config, dtype):
    """The MLP optimizer's constants (its `config`) as a `dtype` computation holds them:
    the float64 reference of a float32 side computes with float32's 0.9999, whose 1 - d is
    1.7e-5 away from 1e-4, a relative 2e-5 of the PES estimate that no rounding of the
    inputs (`Reference.condition`) shows."""
    r = lambda x: float(np.asarray(x, dtype))  # noqa: E731
    return dict(decays=[r(d) for d in config["decays"]],
                second_moment_decay=r(config["second_moment_decay"]),
                step_mult=r(config["step_mult"]), exp_mult=r(config["exp_mult"]),
                timescales=[r(t) for t in config["timescales"]])


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
        half = len(values) // 2  # PES's pair terms (L+ - L-) xi+ / (2 sigma^2), their mean
        diff = values[:half] - values[half:]
        grads = [np.mean(diff.reshape((-1,) + (1,) * (x.ndim - 1)) * x[:half], 0)
                 / (2 * sigma * sigma) for x in xi]
        return grads, float_state(new, xi)[:-n_theta] + xi + [np.mean(values)[None]]
    return fn


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
    """`check_call` on the first calls of a float32 run and, where `states` has one, a
    float64 run, each carrying hogrod's state; the largest errors over the calls. Returns
    (metrics, the float32 run's state after them, the calls checked)."""
    out, calls = {}, None
    tables = digits_tables(np.float64)
    for dtype in states:
        state, resets, call = states[dtype], 0, 0
        limit = check_calls or (horizon // truncation + 1 if horizon else 1)
        while call < limit:
            errors, state, reset = check_call(sides[dtype], jax_core, fn64[dtype], thetas[dtype],
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
              warmup: harness.Count = 1, float64: bool = True, seed: harness.Count = 0):
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
      float64: whether the agreement check also runs in float64 (hogrod's float64
        estimator and JAX's; the float32 check's reference is float64 either way).
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
        if dtype == "float32" or float64:
            states[dtype] = estimator.init(
                problem, theta, tf.random.experimental.stateless_fold_in(base, 0))
        reset = tf.function(lambda p, problem=problem: learned_lib.reset(problem, p, horizon),
                            autograph=False)  # traced once, not at every reset
        sides[dtype] = (problem, family, estimate, run_seed, reset, (sigma, truncation))
        if dtype == "float32":
            config, estimate32 = learned.config, estimate
            plain = learned_lib.pes(sigma=sigma, particles=particles, truncation=truncation,
                                    horizon=horizon, jit_compile=False)
            estimate_plain = hogrod_estimate(problem, plain, base)[0]
    sizes = [64] + list(hidden_sizes) + [classes]
    peer = jax_peer(config, sizes, sigma, truncation, horizon, batch_size)
    # the float32 check's reference computes with float32's constants, the float64 one's
    # with the float64 side's problem (both traced only where a check runs)
    problem_ref = setting(step_mult, classes, hidden_sizes, batch_size, sigma, particles,
                          truncation, horizon, "float64", rounded(config, np.float32))[2]
    fn64 = {"float32": reference_fn(problem_ref, thetas["float64"], truncation, sigma),
            "float64": reference_fn(sides["float64"][0], thetas["float64"], truncation,
                                    sigma)}
    m = {k: None for k in ("estimates_per_s_jax", "best_estimates_per_s_jax",
                           "ratio_hogrod_over_jax", "best_ratio_hogrod_over_jax",
                           "grad_rel_err_jax_float32", "grad_rel_err_jax_float64")}
    checked, state, calls = check_agreement(sides, peer and peer[0], fn64, thetas, states,
                                            check_calls, horizon, truncation)
    m.update(checked)
    def hogrod_run(estimate):
        held = {"state": state, "call": calls}

        def run():
            for _ in range(calls_per_round):
                result, held["state"] = estimate(thetas["float32"], held["state"],
                                                 tf.constant(held["call"], tf.int64))
                held["call"] += 1
            return float(result.meta_loss)
        return run
    candidates = {"hogrod": hogrod_run(estimate32), "hogrod_plain": hogrod_run(estimate_plain)}
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
    m["ratio_hogrod_over_hogrod_plain"] = (m["estimates_per_s_hogrod"]
                                           / m["estimates_per_s_hogrod_plain"])
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
