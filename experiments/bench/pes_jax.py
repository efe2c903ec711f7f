"""The PES benchmark's JAX peer (`experiments.bench.pes`): hogrod's PES estimate of the
digits learned optimizer written in plain JAX, the whole estimate under one `jax.jit`.

`jax_peer` returns the estimate without its random draws (`core`, fed hogrod's inputs by
the agreement check) and a timed run drawing its own tasks, batches and perturbations
with `jax.random` (`make_run`). The MLP optimizer's update is written from
`hogrod/learned/mlp_optimizer.py`'s docstring, the task from `digits_mlp`'s, PES from
`hogrod/learned/estimators.py`'s (Vicol et al. 2021).
"""

import math

import numpy as np
import tensorflow as tf
from absl import logging

WHERE = "bench_pes"


def _np(nest):
    return [np.asarray(t) for t in tf.nest.flatten(nest)]


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
