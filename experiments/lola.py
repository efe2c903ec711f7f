"""LOLA-DiCE and naive learners on the iterated prisoner's dilemma (Foerster et al. 2018,
"DiCE", the LOLA experiment; `hogrod.rl.make_lola_update`).

    python -m experiments.lola --gin_file=configs/rl/lola_dice.gin
    python -m experiments.lola --gin_file=configs/rl/lola_dice_batch_mean.gin
    python -m experiments.lola --gin_file=configs/rl/lola_naive.gin \
        --gin_param="lola_experiment.seeds = (0, 1, 2)"

Two agents with tabular memory-one policies (a cooperation logit per own-perspective
state) learn for `updates` updates from games of `horizon` rounds, `batch` games per
batch; `inner_steps` = 0 is two naive learners. `baseline` "value" is the DiCE authors'
value baseline (each agent's value head fitted at `value_lr`), "batch_mean" the one their
IPD script runs; `order` "sequential" is the authors' update order (agent 0 steps first,
and agent 1's gradient, on the batches drawn before, reads agent 0's new parameters),
"simultaneous" both agents' from the same parameters. Each seed of `seeds` is an independent run (its initial parameters and
every batch drawn from it); a seed cooperates when both
agents' mean return over its last `last` updates is at least `cooperation_threshold`
(mutual cooperation pays -1 a round, mutual defection -2).

Outputs: metrics.json (`returns`: updates x agents, each agent's discount-weighted mean
per-step return at the parameters before each update, averaged over seeds;
`returns_by_seed`, `final_returns`, `cooperating_seeds`, the final cooperation
probabilities; strict JSON), returns.png (the curves per agent and seed),
eval_history.json (each update's returns per seed), operative_config.gin and checkpoints:
a re-run with the same --output_dir resumes exactly where it stopped, and with
--allow_config_change and a larger `updates` continues into the longer run (the
checkpoint holds the parameters only; the returns so far are in eval_history.json).
"""

import itertools
import math
import os

import gin
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import checks, harness, rl, train
from hogrod.rl import lola as lola_rl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

def plot(path, returns, seeds, title):
    """Each agent's return curve per seed (thin) and their mean over seeds (thick)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(returns.shape[1])
    for agent, color in ((0, "tab:blue"), (1, "tab:orange")):
        for k in range(len(seeds)):
            ax.plot(steps, returns[k, :, agent], color=color, lw=0.6, alpha=0.4)
        ax.plot(steps, returns[:, :, agent].mean(0), color=color, lw=2, label=f"agent {agent}")
    for level, name in ((-1.0, "mutual cooperation"), (-2.0, "mutual defection")):
        ax.axhline(level, color="gray", ls="--", lw=0.8)
        ax.text(0, level + 0.02, name, color="gray", fontsize=8)
    ax.set_xlabel("update")
    ax.set_ylabel("mean per-step return")
    ax.set_ylim(-2.5, -0.5)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def check_config():
    """The bindings of `seeds`, `baseline` and `order` checked before a run starts.

    Raises:
      ValueError: naming the binding to change.
    """
    where = "lola_experiment"

    def distinct(seeds):
        if len(set(checks.counts(seeds, f"{where}.seeds", where))) != len(seeds):
            raise ValueError(f"{where}.seeds must be distinct, got {seeds!r}")

    for name, check in (
            ("seeds", distinct),
            ("baseline", lambda v: checks.choice(v, lola_rl.BASELINES, f"{where}.baseline",
                                                 where)),
            ("order", lambda v: checks.choice(v, lola_rl.ORDERS, f"{where}.order", where))):
        try:
            value = gin.query_parameter(f"{where}.{name}")
        except ValueError:  # not bound: the default
            continue
        check(value)


@gin.configurable
def lola_experiment(output_dir, updates: harness.PositiveInt = 200,
                    batch: harness.PositiveInt = 64, horizon: harness.PositiveInt = 150,
                    discount: harness.Fraction = 0.96, inner_steps: harness.Count = 2,
                    inner_lr: harness.Positive = 0.1, outer_lr: harness.Positive = 0.2,
                    baseline: str = "batch_mean", value_lr: harness.Positive = 0.1,
                    value_epochs: harness.PositiveInt = 5,
                    value_minibatch: harness.PositiveInt = 16, order: str = "simultaneous",
                    seeds: tuple[harness.Count, ...] = (0,),
                    init_std: harness.NonNegative = 1 / math.sqrt(5),
                    dtype: str = "float64", checkpoint_every: harness.PositiveInt = 10,
                    cooperation_threshold: float = -1.3, last: harness.PositiveInt = 50):
    """Train the two agents for every seed; return the curves and how many seeds cooperate.

    init_std: the initial policy logits' and value weights' truncated-normal standard
    deviation (the reference's one-layer initialization, 1/sqrt(5); value biases start at
    0). The rates are the LOLA-DiCE reference's (inner 0.1, outer 0.2, plain gradient
    ascent, scripts/run_lola_dice.py; values 0.1, lola_dice/rpg.py). `baseline` and `order`
    default to the library's (`rl.make_lola_update`: the batch mean, both agents stepped
    from the same parameters); the shipped configs bind the reference's.
    """
    check_config()
    dtype = tf.as_dtype(dtype)
    env = rl.IteratedPrisonersDilemma(horizon, dtype=dtype)
    update = rl.make_lola_update(env, batch, discount, inner_steps, inner_lr, outer_lr,
                                 baseline, value_lr, value_epochs, value_minibatch, order)
    seeds = tuple(seeds)
    std = tf.constant(init_std, dtype)
    policy = tf.Variable(tf.stack([tf.random.stateless_truncated_normal(
        [2, 5], [s, 0], stddev=std, dtype=dtype) for s in seeds]), name="params")
    value = tf.Variable(tf.stack([tf.concat([tf.random.stateless_truncated_normal(
        [2, 5], [s, 1], stddev=std, dtype=dtype), tf.zeros([2, 1], dtype)], 1)
        for s in seeds]), name="value")
    # nothing sized by `updates` is checkpointed: a longer run resumes from a shorter one
    ckpt = train.Checkpointer(output_dir, params=policy, value=value)
    history = train.read_history(output_dir, ckpt.latest_step())

    def step(_):
        u = int(ckpt.step)  # the updates done so far
        new, returns = [], []
        for k, s in enumerate(seeds):  # the seed's batches: [s, u + 1] for update u
            p, r = update(rl.LolaParams(policy[k], value[k]),
                          tf.constant([s, u + 1], tf.int64))
            new.append(p)
            returns.append(r.numpy().tolist())
        policy.assign(tf.stack([p.policy for p in new]))
        value.assign(tf.stack([p.value for p in new]))
        train.record_eval(output_dir, history, {"step": u + 1, "returns": returns})
        mean = np.mean(returns, 0)
        return {"return_0": mean[0], "return_1": mean[1]}

    def progress(u, logs):
        if u % 10 == 0 or u == updates:
            logging.info("update %d/%d: mean returns %.4f %.4f", u, updates,
                         logs["return_0"], logs["return_1"])

    harness.started(output_dir, ckpt)
    stats = {}
    train.train_loop(step, itertools.repeat(None), updates, ckpt, output_dir,
                     checkpoint_every=checkpoint_every, log_every=None, callback=progress,
                     stats=stats)
    done = int(ckpt.step)
    if [h["step"] for h in history] != list(range(1, done + 1)):
        raise ValueError(f"{output_dir}/eval_history.json lists the updates "
                         f"{[h['step'] for h in history]}, the checkpoint {done}: another "
                         "run wrote it; use a new --output_dir")
    returns = np.transpose([h["returns"] for h in history], (1, 0, 2))  # seeds, done, 2
    final = returns[:, -last:].mean(1)
    cooperating = int(np.sum(np.all(final >= cooperation_threshold, axis=1)))
    name = f"LOLA-DiCE, {inner_steps} look-ahead steps" if inner_steps else "naive learners"
    plot(os.path.join(output_dir, "returns.png"), returns, seeds,
         f"{name}: {cooperating}/{len(seeds)} seeds cooperate")
    return dict(returns=returns.mean(0).tolist(), returns_by_seed=returns.tolist(),
                final_returns=final.tolist(), cooperating_seeds=cooperating,
                seeds=list(seeds), updates_done=done,
                cooperation_probabilities=tf.sigmoid(policy).numpy().tolist(), **stats)


# the harness runs an experiment's `check_config` once the config is parsed, before it
# creates the output directory
lola_experiment.check_config = check_config


def main():
    """The console command `hogrod-lola` (see the module docstring)."""
    harness.main(lola_experiment)


if __name__ == "__main__":
    main()
