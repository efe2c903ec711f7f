"""Meta-train a Gaussian policy on MAML's 2D navigation with MAML-RL (TRPO or a clipped
surrogate as the outer step, DiCE inner steps):

    python -m experiments.maml_rl --gin_file=configs/rl/navigation2d_maml_trpo.gin

or on MuJoCo's HalfCheetah, stepped on the host (`pip install hogrod[rl]`), with
configs/rl/halfcheetah_vel_maml_trpo.gin or halfcheetah_dir_maml_trpo.gin. The environment
is chosen by gin reference, `maml_rl_experiment.env = @navigation2d` (the factories below:
`navigation2d`, `halfcheetah_velocity`, `halfcheetah_direction`). The MAML paper's
2D-navigation baselines are configs of this binary too: navigation2d_pretrained_trpo.gin
(`adapt = False`), navigation2d_oracle_trpo.gin (the goal observed,
`navigation2d.observe_goal = True`) and navigation2d_random.gin (untrained).

Outputs: metrics.json (the mean return on held-out goals after each count of inner steps
in eval_steps,
`return_after_{s}` with 95% intervals `return_after_{s}_ci95` and the count of goals whose
return is not finite, `return_after_{s}_nonfinite`; the last meta-iteration's
logs; `train_return_before` and `train_return_after`, the training meta-batch's mean return
before and after the inner step at every meta-iteration, equal with `adapt = False`;
`train_seconds`, the meta-iterations' seconds over every run of the directory), TensorBoard
events, checkpoints (a re-run with the same --output_dir resumes; every meta-iteration's
draws follow from `seed` and its index, so a resumed run equals an uninterrupted one, up to
a time limit), operative_config.gin, eval_history.json, train_history.json (every
meta-iteration's logs and `seconds`, the meta-training seconds up to it) and
adaptation.png (the mean return against the inner steps, with 95% bands, untrained and
trained).
"""

import json
import os
import time
from typing import Annotated

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import checks, distribute, harness, models, rl, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_adaptation(path, history):
    """The held-out mean return against inner steps, one curve per evaluation kept (the
    untrained policy and the last), 95% intervals shaded."""
    fig, ax = plt.subplots(figsize=(5, 4))
    for h in ([history[0], history[-1]] if len(history) > 1 else history):
        steps = sorted(int(k.split("_")[-1]) for k in h
                       if k.startswith("return_after_") and k.split("_")[-1].isdigit())
        mean = np.array([h[f"return_after_{s}"] for s in steps])
        half = np.array([h[f"return_after_{s}_ci95"] for s in steps])
        line, = ax.plot(steps, mean, marker="o", label=f"meta-iteration {h['step']}")
        ax.fill_between(steps, mean - half, mean + half, color=line.get_color(), alpha=0.2,
                        lw=0)
    ax.set_xlabel("inner (policy-gradient) steps")
    ax.set_ylabel("mean return on held-out goals")
    ax.set_title("2D navigation, 95% interval shaded")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


@gin.configurable
def navigation2d(horizon, dtype, task_sampling, observe_goal=False):
    """MAML's 2D navigation (`rl.Navigation2D`), stepped in the graph.

    Args:
      horizon: steps per episode (the binary's `horizon`).
      dtype: the positions' dtype (the binary's `dtype`).
      task_sampling: how goals are drawn (the binary's `task_sampling`).
      observe_goal: the goal observed too (the MAML paper's oracle).

    Returns:
      The environment.
    """
    return rl.Navigation2D(horizon, dtype, observe_goal=observe_goal,
                           task_sampling=task_sampling)


@gin.configurable
def halfcheetah_velocity(horizon, dtype, task_sampling):
    """MAML's HalfCheetah velocity tasks (`rl.HalfCheetahTasks`), stepped on the host.

    Args:
      horizon: steps per episode (the binary's `horizon`).
      dtype: the goals' dtype (the binary's `dtype`).
      task_sampling: how goals are drawn (the binary's `task_sampling`).

    Returns:
      The environment.
    """
    return rl.HalfCheetahTasks("velocity", horizon=horizon, dtype=dtype,
                               task_sampling=task_sampling)


@gin.configurable
def halfcheetah_direction(horizon, dtype, task_sampling):
    """MAML's HalfCheetah direction tasks (`rl.HalfCheetahTasks`), stepped on the host.

    Args:
      horizon: steps per episode (the binary's `horizon`).
      dtype: the goals' dtype (the binary's `dtype`).
      task_sampling: how goals are drawn (the binary's `task_sampling`).

    Returns:
      The environment.
    """
    return rl.HalfCheetahTasks("direction", horizon=horizon, dtype=dtype,
                               task_sampling=task_sampling)


def check_config():
    """The bindings of `eval_steps` and `env` checked before a run starts: the inner-step
    counts are a non-empty tuple of ints >= 0, and an environment is a gin reference to a
    factory (`@navigation2d`), not a string.

    Raises:
      ValueError: naming the binding to change.
    """
    where = "maml_rl_experiment"
    for name, check in (
            ("eval_steps", lambda v: checks.counts(v, f"{where}.eval_steps", where)),
            ("env", lambda v: checks.function(
                v, f"{where}.env", where, "(a gin reference to an environment factory: "
                "@navigation2d, @halfcheetah_velocity or @halfcheetah_direction)"))):
        try:
            value = gin.query_parameter(f"{where}.{name}")
        except ValueError:  # not bound: the default
            continue
        if not isinstance(value, gin.config.ConfigurableReference):
            check(value)  # a reference is called (and checked) by the run


def read_train_history(path, upto_step):
    """The logs of meta-iterations 1..upto_step an earlier run of the directory wrote to
    `path` (later ones are redone); an error if any is missing, since the run's returns
    would then be incomplete without a sign."""
    trained = []
    if os.path.exists(path):
        with open(path) as f:
            trained = [h for h in json.load(f) if h["step"] <= upto_step]
    if [h["step"] for h in trained] != list(range(1, upto_step + 1)):
        raise ValueError(f"{path} lists meta-iterations {[h['step'] for h in trained]}, not "
                         f"1..{upto_step} of the checkpoint it resumes from: restore the file "
                         "or start the run in a new --output_dir")
    return trained


@gin.configurable
def maml_rl_experiment(output_dir, meta_iterations: harness.Count = 500,
                       hidden: tuple[harness.PositiveInt, ...] = (64, 64),
                       init_std: harness.Positive = 1.0,
                       meta_batch: harness.PositiveInt = 20, batch: harness.PositiveInt = 20,
                       horizon: harness.PositiveInt = 100, inner_lr: harness.Positive = 0.1,
                       discount: harness.Fraction = 0.99, gae_lambda: harness.Fraction = 1.0,
                       outer: str = "trpo", max_kl: harness.Positive = 0.01,
                       cg_maxiter: harness.PositiveInt = 10,
                       damping: harness.NonNegative = 1e-5,
                       line_search_maxiter: harness.PositiveInt = 15,
                       backtrack_ratio: harness.Fraction = 0.8, clip: harness.Fraction = 0.2,
                       outer_lr: harness.Positive = 1e-3,
                       outer_steps: harness.PositiveInt = 5, hvp_mode: str = "auto",
                       # two goals at least: one gives a 95% interval of 0
                       eval_tasks: Annotated[int, harness.Range(2)] = 40,
                       eval_steps: tuple[harness.Count, ...] = (0, 1, 2, 3),
                       eval_every: harness.PositiveInt = 50,
                       checkpoint_every: harness.PositiveInt = 50, seed: harness.Count = 0,
                       dtype: str = "float32", env=navigation2d,
                       adapt: bool = True, time_limit_s: harness.Positive | None = None,
                       task_sampling: str = "independent", task_map: str = "vectorized",
                       jit_compile: bool = False):
    """MAML-RL on 2D navigation (`hogrod.rl.MamlRL`), evaluated on held-out goals.

    Args:
      output_dir: where the run writes.
      meta_iterations: meta-iterations in all (a resumed run continues to this count).
      hidden: the tanh policy network's hidden widths.
      init_std: the Gaussian policy's initial standard deviation.
      meta_batch: tasks per meta-iteration (divisible by the replicas).
      batch: episodes per task and rollout.
      horizon: steps per episode (100 in MAML).
      inner_lr: the inner DiCE step's rate.
      discount: the discount.
      gae_lambda: GAE's lambda of the inner Loaded DiCE and the outer advantages.
      outer: "trpo" or "clip" (`MamlRL`'s outer step).
      max_kl: TRPO's KL bound.
      cg_maxiter: TRPO's CG iterations.
      damping: TRPO's Fisher damping.
      line_search_maxiter: TRPO's most backtracking tries.
      backtrack_ratio: TRPO's backtracking factor.
      clip: the clipped surrogate's epsilon ("clip").
      outer_lr: the clipped surrogate's Adam step ("clip").
      outer_steps: Adam steps per meta-batch ("clip").
      hvp_mode: `hogrod.hvp`'s mode for the Fisher-vector products.
      eval_tasks: held-out goals, >= 2 (drawn from `seed` + 10**6, the same in every run).
      eval_steps: the inner-step counts the evaluation reports (`return_after_{s}` for
        each), a non-empty tuple of ints >= 0.
      eval_every: meta-iterations between evaluations.
      checkpoint_every: meta-iterations between checkpoints.
      seed: the run's seed (weights, tasks and episodes).
      dtype: "float32" or "float64", the policy's and the environment's.
      env: the environment's factory, a gin reference `env(horizon, dtype, task_sampling)`:
        `@navigation2d` (in-graph; `navigation2d.observe_goal = True`: the goal observed
        too, the MAML paper's oracle), `@halfcheetah_velocity` or `@halfcheetah_direction`
        (`rl.HalfCheetahTasks`, gymnasium stepped on the host).
      adapt: False: trained without the inner step (`rl.MamlRL`'s `adapt`), the MAML
        paper's pretrained policy (and its oracle); evaluation adapts either way.
      time_limit_s: stop meta-training (with a checkpoint) once its meta-iterations have
        taken this many seconds, counted over every run of the directory (evaluations
        excluded; the first meta-iteration of each process includes its tracing); None:
        `meta_iterations` alone. A re-run of a directory past its limit trains no further
        (raise the limit with --allow_config_change to continue). Unlike
        `maml_experiment.time_limit_s`, which counts one process's steps, a resumed run
        keeps the budget it has left, so the stopping iteration depends on the machine:
        with a time limit, a resumed run equals an uninterrupted one only up to it.
      task_sampling: how each meta-batch's goals and the held-out goals are drawn, one of
        `rl.TASK_SAMPLING`: "independent" (MAML's) or "latin_hypercube" (spread evenly
        over the goal range, each still uniform: the training return's mean over a
        meta-batch varies far less between meta-iterations).
      task_map: `rl.MamlRL`'s `task_map`, "vectorized" or "sequential".
      jit_compile: `rl.MamlRL`'s `jit_compile` (XLA for the meta-gradient, the
        Fisher-vector products and the line search).

    Returns:
      The final evaluation's metrics and the last meta-iteration's logs.
    """
    check_config()
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    # float16 would fail only in the first step: TF has no float16 eigh (the baseline)
    checks.choice(dtype, ("float32", "float64"), "dtype", "maml_rl_experiment")
    env = checks.function(env, "env", "maml_rl_experiment",
                          "@navigation2d, @halfcheetah_velocity or @halfcheetah_direction")(
        horizon=horizon, dtype=dtype, task_sampling=task_sampling)
    with strategy.scope():
        policy = rl.GaussianPolicy(
            models.dense_net((env.observation_dim, *hidden, env.action_dim), "tanh", dtype),
            env.action_dim, init_std, dtype=dtype)
        policy.build((None, env.observation_dim))
    learner = rl.MamlRL(env, policy, meta_batch, batch, horizon, inner_lr, discount,
                        gae_lambda, True, outer, max_kl, cg_maxiter, damping,
                        line_search_maxiter, backtrack_ratio, clip, outer_lr, outer_steps,
                        hvp_mode=hvp_mode, strategy=strategy, adapt=adapt,
                        task_map=task_map, jit_compile=jit_compile)
    ckpt = train.Checkpointer(output_dir, policy=policy, **{
        f"outer_state_{i}": v for i, v in enumerate(tf.nest.flatten(learner.optimizer_state))})
    start = ckpt.restore()
    history = train.read_history(output_dir, start)
    train_path = os.path.join(output_dir, "train_history.json")
    trained = read_train_history(train_path, start)
    goals = env.sample_tasks(seed + 10**6, eval_tasks)
    harness.started(output_dir)

    def evaluate_now(i):
        returns = learner.evaluate(goals, seed + 2 * 10**6, eval_steps).numpy()
        result = {"step": i}
        for s, r in zip(eval_steps, returns):
            result[f"return_after_{s}"] = float(r.mean())
            # eval_tasks >= 2 (check_config): an interval over one goal is not 0
            result[f"return_after_{s}_ci95"] = float(1.96 * r.std(ddof=1) / np.sqrt(len(r)))
            # goals whose adapted policy diverged (their NaN or inf is in the mean too)
            result[f"return_after_{s}_nonfinite"] = float(np.sum(~np.isfinite(r)))
        train.record_eval(output_dir, history, result)
        logging.info("eval at %d: %s", i, {k: round(v, 3) for k, v in result.items()})
        return result

    if not history and start == 0 and meta_iterations > 0:
        evaluate_now(0)  # the untrained policy (with nothing to train, the final evaluation)
    # the meta-iterations' seconds so far, over every run of the directory (its logs keep
    # them); None once an entry lacks them (a run that did not record them)
    spent = (None if any("seconds" not in h or h["seconds"] is None for h in trained)
             else trained[-1]["seconds"] if trained else 0.0)
    if spent is None and time_limit_s is not None:
        raise ValueError(f"{train_path} does not record the seconds of every meta-iteration, "
                         "so maml_rl_experiment.time_limit_s cannot count them: unset it or "
                         "start the run in a new --output_dir")
    over = lambda: time_limit_s is not None and spent >= time_limit_s  # noqa: E731
    logs, began = {}, time.perf_counter()
    for i in range(start, meta_iterations if not over() else start):
        t = time.perf_counter()
        logs = {k: float(v) for k, v in learner.step(tf.constant([seed, i], tf.int64)).items()}
        if spent is not None:  # after the logs are read: the step's work is done
            spent += time.perf_counter() - t
        trained.append({"step": i + 1, "seconds": spent, **logs})
        ckpt.step.assign(i + 1)
        last = i + 1 == meta_iterations or over()
        if (i + 1) % checkpoint_every == 0 or last:
            # before the checkpoint: a kill between the two leaves entries past the
            # checkpoint's step, which the resumed run drops and redoes
            train.write_json(train_path, trained)
            ckpt.save()
        if last:
            if over():
                logging.info("time limit of %.0f s reached after meta-iteration %d",
                             time_limit_s, i + 1)
            break
        if (i + 1) % eval_every == 0:
            evaluate_now(i + 1)
    seconds = time.perf_counter() - began
    done = int(ckpt.step) - start
    result = evaluate_now(int(ckpt.step))  # a re-run re-evaluates, with its own settings
    plot_adaptation(os.path.join(output_dir, "adaptation.png"), history)
    return dict(result, meta_iterations=int(ckpt.step), train_seconds=spent,
                seconds_per_meta_iteration=seconds / done if done else None,
                train_return_before=[h["return_before"] for h in trained],
                train_return_after=[h["return_after"] for h in trained],
                **{f"final_train_{k}": v for k, v in logs.items()})


def main():
    """The console command `hogrod-maml-rl` (see the module docstring)."""
    harness.main(maml_rl_experiment)


# the harness runs an experiment's `check_config` once the config is parsed, before it
# writes anything
maml_rl_experiment.check_config = check_config


if __name__ == "__main__":
    main()
