"""Exact derivatives against their score-function estimates: DiCE, Loaded DiCE and a naive
surrogate on a small random tabular MDP (the DiCE paper's "exact derivatives" figure,
Foerster et al. 2018, extended to the third order).

    python -m experiments.dice_derivatives --gin_file=configs/rl/dice_derivatives.gin

A random MDP of `states` states and `actions` actions (transitions and initial distribution
Dirichlet, rewards standard normal, all from `mdp_seed`), a finite horizon of `horizon`
steps and a softmax policy of logits ``theta`` (standard normal, `[states, actions]`). The
exact expected discounted return ``J(theta)`` (`hogrod.rl.expected_return`, dynamic
programming) gives, by nested tapes, the gradient ``g``, the Hessian ``H`` and the third
directional derivative ``D3 = d/dtheta (u^T H(theta) v)`` for two fixed random directions
``u``, ``v``. The same nested tapes on each estimator's objective over a batch of sampled
episodes give their estimates, for

- ``dice``: `hogrod.rl.dice_surrogate` (unbiased at every order);
- ``loaded_dice``: Loaded DiCE with the exact time-dependent state values ``V_t(s_t)`` as
  the baseline (constants; unbiased at every order, lower variance);
- ``naive``: the surrogate ``mean_b sum_t log pi(a_t|s_t) * R`` with ``R`` the episode's
  discounted return: its gradient is unbiased, its Hessian misses the score's outer
  product (biased, so its error stops falling with the batch), and so does its third
  derivative.

For every estimator, order k (1: ``g``, 2: ``H``, 3: ``D3``), batch size and seed (an
independent batch from `[seed, batch size]`): the relative error ``||est - exact|| /
||exact||`` and the Pearson correlation of the estimate's entries with the exact ones. An
unbiased estimator's error falls as ``1/sqrt(batch)``: the log-log slope of the error (its
mean over seeds) against the batch size is near -0.5; a biased one's flattens.

Outputs: metrics.json (`errors_{estimator}_order{k}` and `correlations_{estimator}_order{k}`,
seeds x batch sizes; `mean_error_{estimator}_order{k}` over seeds; `slope_{estimator}_order{k}`;
the exact return and the norms of the exact derivatives; seconds taken), errors.png (the
error against the batch size, log-log, one panel per order, one line per estimator, the
seeds' range shaded), operative_config.gin.
"""

import os
import time

import gin
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import harness, rl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ESTIMATORS = ("dice", "loaded_dice", "naive")
ORDERS = (1, 2, 3)
F64 = tf.float64


def random_mdp(states, actions, seed):
    """A random MDP and policy point as float64 numpy arrays: transitions `[S, A, S]`,
    rewards `[S, A]`, initial `[S]`, logits `[S, A]` and the directions u, v `[S, A]` (unit
    norm) of the third derivative, all drawn from `seed`."""
    rng = np.random.default_rng(seed)
    transitions = rng.dirichlet(np.ones(states), size=(states, actions))
    rewards = rng.normal(size=(states, actions))
    initial = rng.dirichlet(np.ones(states))
    theta = rng.normal(size=(states, actions))
    u, v = (w / np.linalg.norm(w) for w in rng.normal(size=(2, states, actions)))
    return dict(transitions=transitions, rewards=rewards, initial=initial, theta=theta, u=u,
                v=v)


def state_values(mdp, discount, horizon):
    """The exact values ``V_t(s)`` `[horizon, S]` of softmax(theta): the expected discounted
    return of the remaining ``horizon - t`` steps from state s at step t (backward dynamic
    programming in numpy)."""
    theta = mdp["theta"]
    pi = np.exp(theta - theta.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    values = np.zeros((horizon + 1, theta.shape[0]))
    for t in reversed(range(horizon)):
        q = mdp["rewards"] + discount * mdp["transitions"] @ values[t + 1]
        values[t] = np.sum(pi * q, axis=1)
    return values[:horizon]


def derivatives(objective, theta, u, v):
    """The gradient `[n]`, Hessian `[n, n]` and third directional derivative ``d/dtheta
    (u^T H v)`` `[n]` (n = theta's size, flattened row-major) of the scalar
    `objective(theta)` at `theta`, by nested tapes."""
    theta = tf.convert_to_tensor(theta)
    with tf.GradientTape() as third:
        third.watch(theta)
        with tf.GradientTape(persistent=True) as second:
            second.watch(theta)
            with tf.GradientTape() as first:
                first.watch(theta)
                value = objective(theta)
            grad = first.gradient(value, theta)
            grad_u = tf.reduce_sum(grad * u)
        hess_u = second.gradient(grad_u, theta)
        uhv = tf.reduce_sum(hess_u * v)
        with third.stop_recording():
            hess = second.jacobian(grad, theta)
    d3 = third.gradient(uhv, theta)
    n = tf.size(theta)
    return tf.reshape(grad, [-1]), tf.reshape(hess, [n, n]), tf.reshape(d3, [-1])


def estimator_objective(kind, log_probs, rewards, values, discount):
    """The scalar whose derivatives estimate J's: `kind` one of ESTIMATORS, `log_probs`,
    `rewards`, `values` `[batch, T]` (`values` used by ``loaded_dice`` only)."""
    if kind == "dice":
        return rl.dice_surrogate(log_probs, rewards, discount)
    if kind == "loaded_dice":
        return rl.dice_surrogate(log_probs, rewards, discount, values=values)
    episode_return = rl.discounted_returns(rewards, discount)[:, 0]
    return tf.reduce_mean(tf.reduce_sum(log_probs, axis=1) * episode_return)


def make_estimates(mdp, discount, horizon):
    """A compiled `estimates(states, actions, rewards, values)` (int32 / float64 `[batch,
    horizon]`, any batch: traced once) -> `{estimator: (grad, hess, d3)}` at the MDP's
    theta."""
    theta, u, v = (tf.constant(mdp[k], F64) for k in ("theta", "u", "v"))
    spec = [tf.TensorSpec([None, horizon], tf.int32)] * 2 + [
        tf.TensorSpec([None, horizon], F64)] * 2

    @tf.function(input_signature=spec, autograph=False)
    def estimates(states, actions, rewards, values):
        index = tf.stack([states, actions], axis=-1)
        out = {}
        for kind in ESTIMATORS:
            def objective(t, kind=kind):
                log_probs = tf.gather_nd(tf.nn.log_softmax(t), index)
                return estimator_objective(kind, log_probs, rewards, values, discount)
            out[kind] = derivatives(objective, theta, u, v)
        return out
    return estimates


def make_exact(mdp, discount, horizon):
    """A compiled `exact(theta)` (float64 `[S, A]` logits; traced once) -> `(J, grad,
    hess, d3)` of the MDP's exact expected return at `theta`, along the MDP's u and v."""
    tables = [tf.constant(mdp[k], F64) for k in ("transitions", "rewards", "initial")]
    u, v = (tf.constant(mdp[k], F64) for k in ("u", "v"))

    def objective(t):
        return rl.expected_return(t, *tables, discount, horizon)

    @tf.function(input_signature=[tf.TensorSpec(mdp["theta"].shape, F64)], autograph=False)
    def exact(theta):
        return (objective(theta),) + derivatives(objective, theta, u, v)
    return exact


def exact_derivatives(mdp, discount, horizon):
    """`(J, grad, hess, d3)` of the exact expected return at the MDP's theta (numpy)."""
    value, *out = make_exact(mdp, discount, horizon)(tf.constant(mdp["theta"], F64))
    return (float(value),) + tuple(x.numpy() for x in out)


def make_sampler(mdp, horizon, values):
    """`sample(seed, batch)` -> int32 states, actions, float64 rewards and baseline values
    ``values[t, s_t]`` (`values` `[horizon, S]`), `[batch, horizon]`, of softmax(theta) on
    the MDP's `TabularMDP`, vectorized over the batch (compiled; traced once per batch
    size)."""
    env = rl.TabularMDP(mdp["transitions"], mdp["rewards"], mdp["initial"], horizon=horizon,
                        dtype="float64")
    task = tf.nest.map_structure(lambda x: x[0], env.sample_tasks(0, 1))
    logits = tf.constant(mdp["theta"], F64)

    @tf.function(autograph=False)
    def sample(seed, batch):
        state, _ = env.reset(task, seed, batch)
        key = tf.random.experimental.stateless_fold_in(seed, 1)
        states, actions, rewards = [], [], []
        for _ in range(horizon):
            key, draw = tf.unstack(tf.random.experimental.stateless_split(key, 2))
            a = rl.Categorical(tf.gather(logits, state["s"])).sample(draw)
            states.append(state["s"])
            actions.append(a)
            state, _, reward, _ = env.step(task, state, a)
            rewards.append(reward)
        states = tf.stack(states, 1)
        return (states, tf.stack(actions, 1), tf.stack(rewards, 1),
                baseline_values(values, states))
    return sample


def baseline_values(values, states):
    """``values[t, states[b, t]]`` `[batch, T]`: the state values along each episode."""
    steps = tf.broadcast_to(tf.range(tf.shape(states)[1]), tf.shape(states))
    return tf.gather_nd(values, tf.stack([steps, states], axis=-1))


def relative_error(estimate, exact):
    """``||estimate - exact|| / ||exact||`` (Frobenius)."""
    return float(np.linalg.norm(estimate - exact) / np.linalg.norm(exact))


def correlation(estimate, exact):
    """The Pearson correlation of the entries of `estimate` and `exact`."""
    return float(np.corrcoef(np.ravel(estimate), np.ravel(exact))[0, 1])


def loglog_slope(batch_sizes, errors):
    """The least-squares slope of log(error) against log(batch size)."""
    return float(np.polyfit(np.log(batch_sizes), np.log(errors), 1)[0])


def plot(path, batch_sizes, errors, title):
    """Error against batch size, log-log: a panel per order, a line per estimator (the mean
    over seeds), the seeds' range shaded, and a 1/sqrt(batch) guide."""
    fig, axes = plt.subplots(1, len(ORDERS), figsize=(4 * len(ORDERS), 3.6))
    b = np.asarray(batch_sizes, float)
    names = {"dice": "DiCE", "loaded_dice": "Loaded DiCE (V baseline)",
             "naive": "naive surrogate"}
    for ax, k in zip(axes, ORDERS):
        for kind, color in zip(ESTIMATORS, ("tab:blue", "tab:green", "tab:red")):
            e = np.asarray(errors[kind, k])  # seeds x batch sizes
            ax.plot(b, e.mean(0), marker="o", color=color, label=names[kind])
            ax.fill_between(b, e.min(0), e.max(0), color=color, alpha=0.2, lw=0)
        ref = np.asarray(errors["dice", k]).mean(0)[0] * np.sqrt(b[0] / b)
        ax.plot(b, ref, color="gray", ls="--", lw=0.8, label="1/sqrt(batch)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size (episodes)")
        ax.set_title(("gradient", "Hessian", "third derivative D3[u, v, .]")[k - 1])
    axes[0].set_ylabel("relative error ||est - exact|| / ||exact||")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def check_config():
    """The bindings of `batch_sizes`, `actions` and `discount` checked before a run starts
    (a slope needs two batch sizes, a softmax policy two actions, a return a positive
    discount).

    Raises:
      ValueError: naming the binding to change.
    """
    for name, check, wanted in (
            ("batch_sizes", lambda v: isinstance(v, (tuple, list))
             and len(set(v)) == len(v) >= 2, "at least two distinct batch sizes"),
            ("actions", lambda v: v >= 2, ">= 2"),
            ("discount", lambda v: v > 0, "in (0, 1]")):
        try:
            value = gin.query_parameter(f"dice_derivatives_experiment.{name}")
        except ValueError:  # not bound: the default
            continue
        if not check(value):
            raise ValueError(f"dice_derivatives_experiment.{name} must be {wanted}, got "
                             f"{value!r}")


@gin.configurable
def dice_derivatives_experiment(output_dir,
                                batch_sizes: tuple[harness.PositiveInt, ...] = (64, 256, 1024,
                                                                                4096),
                                seeds: harness.PositiveInt = 5,
                                states: harness.PositiveInt = 4,
                                actions: harness.PositiveInt = 3,
                                horizon: harness.PositiveInt = 5,
                                discount: harness.Fraction = 0.9,
                                mdp_seed: harness.Count = 0):
    """Estimate the derivatives for every estimator, batch size and seed; return the errors,
    correlations and log-log slopes.

    seeds: the number of independent batches per batch size (seed k's batch of size b is
    drawn from ``[k, b]``). mdp_seed: draws the MDP, the logits and the directions.
    """
    check_config()
    batch_sizes = sorted(int(b) for b in batch_sizes)
    start = time.perf_counter()
    mdp = random_mdp(states, actions, mdp_seed)
    value, *exact = exact_derivatives(mdp, discount, horizon)
    values = state_values(mdp, discount, horizon)
    sample = make_sampler(mdp, horizon, tf.constant(values, F64))
    estimates = make_estimates(mdp, discount, horizon)
    harness.started(output_dir)
    sample_seconds = estimate_seconds = 0.0
    errors = {(kind, k): np.zeros((seeds, len(batch_sizes))) for kind in ESTIMATORS
              for k in ORDERS}
    corrs = {key: np.zeros_like(e) for key, e in errors.items()}
    for j, b in enumerate(batch_sizes):
        for s in range(seeds):
            t0 = time.perf_counter()
            st, ac, rw, baseline = sample(tf.constant([s, b], tf.int64), b)
            t1 = time.perf_counter()
            out = {kind: [x.numpy() for x in est]
                   for kind, est in estimates(st, ac, rw, baseline).items()}
            t2 = time.perf_counter()
            sample_seconds += t1 - t0
            estimate_seconds += t2 - t1
            for kind in ESTIMATORS:
                for k in ORDERS:
                    errors[kind, k][s, j] = relative_error(out[kind][k - 1], exact[k - 1])
                    corrs[kind, k][s, j] = correlation(out[kind][k - 1], exact[k - 1])
        logging.info("batch %d: relative errors (dice, loaded_dice, naive) by order: %s", b,
                     {k: [round(errors[kind, k][:, j].mean(), 4) for kind in ESTIMATORS]
                      for k in ORDERS})
    metrics = dict(batch_sizes=batch_sizes, seeds=seeds, exact_return=value,
                   exact_return_check=float(mdp["initial"] @ values[0]),
                   **{f"exact_norm_order{k}": float(np.linalg.norm(exact[k - 1]))
                      for k in ORDERS},
                   sample_seconds=sample_seconds, estimate_seconds=estimate_seconds,
                   estimate_traces=int(estimates.experimental_get_tracing_count()),
                   sample_traces=int(sample.experimental_get_tracing_count()))
    for kind in ESTIMATORS:
        for k in ORDERS:
            name = f"{kind}_order{k}"
            mean = errors[kind, k].mean(0)
            metrics[f"errors_{name}"] = errors[kind, k].tolist()
            metrics[f"correlations_{name}"] = corrs[kind, k].tolist()
            metrics[f"mean_error_{name}"] = mean.tolist()
            metrics[f"mean_correlation_{name}"] = corrs[kind, k].mean(0).tolist()
            metrics[f"slope_{name}"] = loglog_slope(batch_sizes, mean)
    metrics["experiment_seconds"] = time.perf_counter() - start
    plot(os.path.join(output_dir, "errors.png"), batch_sizes, errors,
         f"{states} states, {actions} actions, horizon {horizon}, discount {discount}, "
         f"{seeds} seeds")
    return metrics


# the harness runs an experiment's `check_config` once the config is parsed, before it
# creates the output directory
dice_derivatives_experiment.check_config = check_config


def main():
    """The console command `hogrod-dice-derivatives` (see the module docstring)."""
    harness.main(dice_derivatives_experiment)


if __name__ == "__main__":
    main()
