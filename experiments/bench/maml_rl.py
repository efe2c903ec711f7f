"""Benchmark: the MAML-RL meta-gradient on 2D navigation, hogrod against torch.func, and the
environment's steps/s compiled in TensorFlow against a gymnasium vector environment.

Meta-gradient: a `GaussianPolicy` on a 2-64-64-2 tanh net (init std 1), `Navigation2D`,
20 tasks of 20 episodes of 100 steps (MAML's 2D navigation). One fixed `MetaBatch` is
sampled as `MamlRL.sample` computes it (`fixed_batch`); the timed function is the gradient
in the initial parameters of the mean over tasks of the importance-weighted surrogate, each
task's adaptation (`inner_step`, Loaded DiCE with the baseline's values) recomputed from them
(`MamlRL.surrogate_and_kl`, the tasks mapped as `task_map` says, one `tf.function`,
compiled by XLA with `jit_compile`).
PyTorch (the `bench` extra): the same computation with `torch.func.grad` for the inner
step, `torch.func.vmap` over tasks and `functional_call`, on the Keras weights and the same
episodes. Before timing, both float32 meta-gradients and torch's float64 one are compared
with hogrod's float64 meta-gradient on the same float32 weights and episodes, each within
its dtype's rounding of that computation (`experiments.bench.peers.Reference`); the binary
stops if one disagrees. Without torch the PyTorch side is skipped (logged) and its
metrics are None.

Environment: `rl.rollout` of the same policy (its initial weights) on the meta-batch,
compiled, against `rl.gym_rollout` of a numpy `gymnasium.Env` with the same dynamics in a
`gymnasium.vector.SyncVectorEnv` (and `AsyncVectorEnv` with `vector_envs`), in env steps/s.

Full run, from the repository with the `bench` and `rl` extras installed:

    python -m experiments.bench.maml_rl --gin_file=experiments/bench/configs/maml_rl.gin

Target: hogrod >= 1.5x PyTorch's meta-gradients/s.
"""

import gin
import gymnasium
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from experiments.bench.peers import Reference
from experiments.bench.timing import interleaved_rates
from hogrod import checks, harness, models, rl

def _masked_mean(x, m):
    return tf.reduce_sum(x * m) / tf.maximum(tf.reduce_sum(m), tf.ones([], m.dtype))


def fixed_batch(algo, tasks):
    """`MamlRL.sample`'s `MetaBatch` built task by task, eagerly (nothing to compile).

    Args:
      algo: the `MamlRL` (environment, policy, sizes, baseline, step size, discount).
      tasks: the meta-batch's tasks, a leading task axis.

    Returns:
      The `MetaBatch`: pre-adaptation episodes, the baseline's values, the inner scales
      (1 / (mean length * the advantages' std)), post-adaptation episodes, their normalized
      advantages (baseline refitted) and the sampling distributions' fields.
    """
    policy, base, d, lam = algo.policy, algo.baseline, algo.discount, algo.gae_lambda
    params = [tf.convert_to_tensor(v) for v in policy.trainable_variables]
    n = tf.nest.flatten(tasks)[0].shape[0]

    def values_advantages(obs, r, m):
        v = base.predict(obs, m, base.solve(obs, rl.discounted_returns(r, d, m), m))
        adv = rl.gae_advantages(r, v, d, lam, m)
        return v, adv, tf.sqrt(_masked_mean(tf.square(adv - _masked_mean(adv, m)), m))
    inner = rl.rollout(algo.env, policy, tasks, 1, algo.batch, algo.horizon)
    values, scales, fast = [], [], []
    for i in range(n):
        e = rl.Trajectories(*[f[i] for f in inner])
        v, _, std = values_advantages(e.observations, e.rewards, e.mask)
        length = tf.reduce_sum(e.mask) / algo.batch
        values.append(v)
        scales.append(1.0 / (length * (std + tf.constant(1e-8, std.dtype))))
        fast.append(rl.inner_step(policy, params, e, algo.inner_lr, d, v, lam, scales[-1]))
    fast = [tf.stack(p) for p in zip(*fast)]
    outer = rl.rollout(algo.env, policy, tasks, 2, algo.batch, algo.horizon, fast, True)
    advantages, old = [], []
    for i in range(n):
        obs, r, m = outer.observations[i], outer.rewards[i], outer.mask[i]
        _, adv, std = values_advantages(obs, r, m)
        advantages.append(m * (adv - _masked_mean(adv, m)) / (std + 1e-8))
        old.append(tuple(rl.policy_distribution(policy, obs, [p[i] for p in fast])))
    return rl.MetaBatch(inner, tf.stack(values), tf.stack(scales), outer,
                        tf.stack(advantages), tuple(tf.stack(f) for f in zip(*old)))


def setup(dtype, meta_batch, batch, horizon, inner_lr, task_map="vectorized",
          jit_compile=False):
    """The policy, `MamlRL`, its fixed `MetaBatch` and the compiled meta-gradient.

    Args:
      dtype: the policy's and the environment's dtype name.
      meta_batch: tasks.
      batch: episodes per task.
      horizon: steps per episode.
      inner_lr: the inner step.
      task_map: `MamlRL`'s `task_map`, "vectorized" or "sequential".
      jit_compile: compile the meta-gradient with XLA, as `MamlRL(jit_compile=True)` does.

    Returns:
      `(policy, algo, data, params, meta_grad)`; `meta_grad(data, params)` returns the
      gradients in `policy.trainable_variables`' order.
    """
    keras.utils.set_random_seed(0)
    env = rl.Navigation2D(horizon, dtype)
    policy = rl.GaussianPolicy(models.dense_net((2, 64, 64, 2), "tanh", dtype=dtype), 2,
                               init_std=1.0, dtype=dtype)
    policy.build((None, 2))
    algo = rl.MamlRL(env, policy, meta_batch=meta_batch, batch=batch, horizon=horizon,
                     inner_lr=inner_lr, task_map=task_map)
    params = [tf.convert_to_tensor(v) for v in policy.trainable_variables]
    data = fixed_batch(algo, env.sample_tasks(0, meta_batch))

    @tf.function(autograph=False, jit_compile=jit_compile)
    def meta_grad(data, params):
        with tf.GradientTape() as tape:
            tape.watch(params)
            surrogate = algo.surrogate_and_kl(data, params)[0]
        return tape.gradient(surrogate, params)
    return policy, algo, data, params, meta_grad


def torch_meta_grad(policy, algo, data, threads=None):
    """The same meta-gradient in torch.func, or None without torch.

    Args:
      policy: the built `GaussianPolicy` (its Keras weights are copied).
      algo: the `MamlRL` (step size, discount, GAE lambda).
      data: the fixed `MetaBatch`.
      threads: torch's intra-op threads; None: torch's default.

    Returns:
      A zero-argument function returning the gradients as numpy arrays in
      `policy.trainable_variables`' order and Keras layout, or None.
    """
    try:
        import torch
        from torch.func import functional_call, grad, vmap
    except ImportError:
        logging.warning("torch not installed (pip install -e '.[bench]'): no PyTorch baseline")
        return None
    if threads is not None:
        torch.set_num_threads(threads)
    dt = getattr(torch, tf.as_dtype(policy.log_std.dtype).name)  # float32 or float64
    net = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 2)).to(dt)
    dense = list(policy.network.trainable_variables)
    names = []  # torch's name of each Keras variable, in Keras order
    for v in policy.trainable_variables:
        if v is policy.log_std:
            names.append("log_std")
        else:
            i = [id(d) for d in dense].index(id(v))
            names.append(f"{2 * (i // 2)}.{'weight' if i % 2 == 0 else 'bias'}")
    # Keras kernels are [in, out], torch's Linear weights [out, in]
    params = {n: torch.tensor(v.numpy().T if n.endswith("weight") else v.numpy())
              for n, v in zip(names, policy.trainable_variables)}
    fields = [data.inner.observations, data.inner.actions, data.inner.rewards,
              data.inner.mask, data.inner_values, data.inner_scale, data.outer.observations,
              data.outer.actions, data.outer.log_probs, data.advantages, data.outer.mask]
    fields = [torch.tensor(f.numpy()) for f in fields]
    steps = fields[2].shape[-1]
    lag = torch.arange(steps)[:, None] - torch.arange(steps)[None, :]
    discount, gae_lambda = algo.discount, algo.gae_lambda
    gae = torch.where(lag >= 0, torch.tensor(discount * gae_lambda, dtype=dt)
                      ** lag.clamp(min=0).to(dt), torch.zeros((), dtype=dt))
    weights = torch.tensor(discount, dtype=dt) ** torch.arange(steps, dtype=dt)

    def log_prob(p, obs, actions):
        mean = functional_call(net, {n: t for n, t in p.items() if n != "log_std"}, (obs,))
        z = (actions - mean) * torch.exp(-p["log_std"])
        return -0.5 * torch.sum(z * z + 2 * p["log_std"] + np.log(2 * np.pi), -1)

    def dice(p, obs, actions, r, m, v, scale):  # Loaded DiCE, as `inner_step`
        lp = torch.where(m > 0, log_prob(p, obs, actions), torch.zeros((), dtype=dt))
        r, v = torch.where(m > 0, r, 0.0), torch.where(m > 0, v, 0.0)
        following = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], 1)
        adv = torch.where(m > 0, (r + discount * following - v) @ gae, 0.0)
        cum = torch.cumsum(lp, 1)
        box = torch.exp(cum - cum.detach()) - torch.exp((cum - lp) - (cum - lp).detach())
        return torch.mean((weights * r).sum(1) + (weights * box * adv).sum(1)) * scale

    def task(p, obs, act, r, m, v, scale, o_obs, o_act, o_lp, adv, o_m):
        g = grad(dice)(p, obs, act, r, m, v, scale)
        fast = {n: p[n] + algo.inner_lr * g[n] for n in p}
        ratio = torch.exp(log_prob(fast, o_obs, o_act) - o_lp)
        return (ratio * adv * o_m).sum() / torch.clamp(o_m.sum(), min=1.0)

    def meta(p):
        return vmap(task, in_dims=(None,) + (0,) * len(fields))(p, *fields).mean()

    def run():
        g = grad(meta)(params)
        return [g[n].detach().numpy().T if n.endswith("weight") else g[n].detach().numpy()
                for n in names]
    return run


def gym_navigation(n):
    """`Navigation2D` in numpy: `n` constructors for a `gymnasium` vector environment.

    Args:
      n: the sub-environments.

    Returns:
      A list of `n` zero-argument constructors of `gymnasium.Env`s with a `task` attribute.
    """
    class Navigation(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        action_space = gymnasium.spaces.Box(-0.1, 0.1, (2,), np.float32)

        def __init__(self):
            self.task = {"goal": np.zeros(2, np.float32)}

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.position = np.zeros(2, np.float32)
            return self.position.copy(), {}

        def step(self, action):
            self.position = self.position + np.clip(action, -0.1, 0.1)
            distance = float(np.linalg.norm(self.position - self.task["goal"]))
            return self.position.copy(), -distance, distance < 0.01, False, {}
    return [Navigation] * n


def check_agreement(sizes, policy, data, params, meta_grad, peer, torch_threads):
    """hogrod's and torch.func's meta-gradients (float32, and torch's in float64) against
    hogrod's float64 one on the float32 weights and episodes (`peers.Reference`).

    Returns:
      {"grad_rel_err_<side>_<dtype>": relative difference, "grad_condition": ...}.

    Raises:
      AssertionError: a side disagrees.
    """
    policy64, algo64, _, _, meta_grad64 = setup("float64", *sizes)
    n = len(params)

    def as64(arrays):
        return [tf.constant(a.astype(np.float64) if np.issubdtype(a.dtype, np.floating)
                            else a) for a in arrays]

    def fn64(inputs):
        return [g.numpy() for g in meta_grad64(
            tf.nest.pack_sequence_as(data, as64(inputs[n:])), as64(inputs[:n]))]
    flat = [np.asarray(p) for p in params] + [t.numpy() for t in tf.nest.flatten(data)]
    masks = [i for i, a in enumerate(flat) if i >= n and np.isin(a, (0, 1)).all()]
    ref = Reference(fn64, flat, exact=masks)  # the episodes' 0/1 masks are exact
    sides = {"hogrod": [g.numpy() for g in meta_grad(data, params)]}
    if peer is not None:
        sides["torch_func"] = peer()
    out = {f"grad_rel_err_{k}_float32": v for k, v in
           ref.check(sides, "float32", "meta-gradient").items()}
    if peer is not None:
        for v, w in zip(policy64.trainable_variables, flat[:n]):
            v.assign(w.astype(np.float64))
        data64 = tf.nest.pack_sequence_as(data, as64(flat[n:]))
        peer64 = torch_meta_grad(policy64, algo64, data64, torch_threads)
        out.update({f"grad_rel_err_{k}_float64": v for k, v in
                    ref.check({"torch_func": peer64()}, "float64", "meta-gradient").items()})
    return dict(out, grad_condition=ref.condition)


@gin.configurable
def bench_maml_rl(output_dir, meta_batch=20, batch=20, horizon=100, inner_lr=0.1,
                  rounds=10, steps_per_round=5, warmup=3, env_rounds=3,
                  vector_envs=("sync",), check_float64=True, torch_threads=None,
                  task_map="vectorized", jit_compile=False):
    """Meta-gradients/s of hogrod and torch.func and env steps/s; returns the metrics.

    Args:
      output_dir: the run's directory (unused: nothing is saved but the metrics).
      meta_batch: tasks (20 in MAML).
      batch: episodes per task (20).
      horizon: steps per episode (100).
      inner_lr: the inner step (0.1).
      rounds: interleaved rounds of the meta-gradient timing.
      steps_per_round: meta-gradients per candidate per round.
      warmup: untimed calls of each meta-gradient first (of each rollout: at most 1).
      env_rounds: interleaved rounds of the rollout timing (one rollout each).
      vector_envs: the gymnasium vector environments, "sync" and/or "async".
      check_float64: first compare hogrod's and torch's meta-gradients (float32, and
        torch's in float64) with hogrod's float64 one (`check_agreement`).
      torch_threads: torch's intra-op threads (`torch.set_num_threads`); None: torch's
        default. On a loaded machine fewer threads than cores avoids OpenMP barriers
        waiting on descheduled threads.
      task_map: `MamlRL`'s `task_map` for hogrod's meta-gradient.
      jit_compile: compile hogrod's meta-gradient with XLA (`MamlRL`'s `jit_compile`).

    Returns:
      The metrics: rates, ratios (None without torch), the agreement's relative errors.
    """
    del output_dir
    metrics = {"grad_rel_err_torch_func_float64": None, "grad_rel_err_torch_func_float32": None,
               "steps_per_s_torch_func": None, "ratio_hogrod_over_torch_func": None,
               "torch": None, "torch_threads": None}
    sizes = (meta_batch, batch, horizon, inner_lr, task_map, jit_compile)
    policy, algo, data, params, meta_grad = setup("float32", *sizes)
    peer = torch_meta_grad(policy, algo, data, torch_threads)
    if check_float64:  # agreement before speed, on the same weights and episodes
        metrics.update(check_agreement(sizes, policy, data, params, meta_grad, peer,
                                       torch_threads))
    runs = {"hogrod": lambda: meta_grad(data, params)[-1].numpy()}
    if peer is not None:
        runs["torch_func"] = peer
    rates = interleaved_rates(runs, rounds, steps_per_round, warmup)
    metrics.update({f"steps_per_s_{n}": r for n, r in rates.items()})
    if peer is not None:
        import torch
        metrics.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                       ratio_hogrod_over_torch_func=rates["hogrod"] / rates["torch_func"])

    env, tasks, n = algo.env, algo.env.sample_tasks(2, meta_batch), meta_batch * batch
    compiled = tf.function(lambda: rl.rollout(env, policy, tasks, 3, batch, horizon).rewards,
                           autograph=False)
    envs = {"tf": lambda: compiled().numpy()}
    made = {"sync": gymnasium.vector.SyncVectorEnv, "async": gymnasium.vector.AsyncVectorEnv}
    vecs = [made[checks.choice(k, tuple(made), "vector_envs", "bench_maml_rl")](
        gym_navigation(n)) for k in vector_envs]
    for kind, vec in zip(vector_envs, vecs):
        envs[f"gym_{kind}"] = lambda vec=vec: rl.gym_rollout(vec, policy, tasks, 3, batch,
                                                             horizon).rewards.numpy()
    env_rates = interleaved_rates(envs, env_rounds, 1, min(warmup, 1))
    for vec in vecs:
        vec.close()
    for name, r in env_rates.items():
        metrics[f"env_steps_per_s_{name}"] = r * n * horizon
        if name != "tf":
            metrics[f"env_ratio_tf_over_{name}"] = env_rates["tf"] / r
    metrics.update(tensorflow=tf.__version__, gymnasium=gymnasium.__version__,
                   task_map=task_map, jit_compile=jit_compile, meta_batch=meta_batch,
                   batch=batch, horizon=horizon)
    for name, value in sorted(metrics.items()):
        print(f"{name:35s} {value}")
    return metrics


def main():
    """`python -m experiments.bench.maml_rl` (see the module docstring)."""
    harness.main(bench_maml_rl)


if __name__ == "__main__":
    main()
