"""MAML-RL on 2D navigation against the MAML paper's baselines (its Figure 4): the mean
held-out return after each count in `steps` of policy-gradient steps of a MAML policy, a
policy pretrained by TRPO on all goals with the same budget (500 meta-iterations or 30
minutes of them; its iterations sample one batch of episodes per task where MAML's sample
two, so it takes more of them), a random initialization, and an oracle policy that
observes the goal, over seeds. The policies in `flat` (the oracle) are evaluated without
adaptation (`eval_steps = (0,)`): one that observes its goal has nothing to adapt, and a
policy-gradient step on its near-constant advantages, normalized by their standard
deviation, is a step of arbitrary size; their return is drawn flat across the steps, as the
MAML paper's figure draws the oracle.

Each (policy, seed) is one `python -m experiments.maml_rl` run of the policy's config, in
`<output_dir>/<policy>/seed<k>/`, with `maml_rl_experiment.seed = k` (every policy of a seed
is evaluated on the same held-out goals with the same seeds). The driver records what it
runs in the run's `driver.json` (config and bindings); a finished run is kept only if that
record is the same (else an error naming both), and one stopped midway resumes from its
checkpoint, its meta-training clock (`time_limit_s`) counting on from where it stopped, so
the driver can be stopped and started again. It writes metrics.json
with, per policy, `{policy}_return_after_{s}` (the mean over seeds of each seed's mean over
the held-out goals), `{policy}_return_after_{s}_ci95` (Student's t 95% interval over the
seeds' means), `{policy}_meta_iterations` and `{policy}_train_seconds` (per seed);
`figure4_ordering` (MAML's mean after one step above pretrained's and random's after the
largest count of `steps`) and navigation2d_baselines.png:

    python -m experiments.bench.navigation2d_baselines \
        --gin_file=experiments/bench/configs/navigation2d_baselines.gin
"""

import json
import os

import gin
import matplotlib
import numpy as np
from absl import logging
from scipy import stats

from experiments.bench import runs
from hogrod import checks, harness, train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _check(policies, seeds, steps, extra_params):
    where = "bench_navigation2d_baselines"
    if not isinstance(policies, dict) or not policies:
        raise ValueError(f"{where}.policies must be {{name: gin file}}, got {policies!r}")
    for name, path in policies.items():
        try:
            harness.resolve_gin_file(path)
        except harness.ConfigError as e:
            raise ValueError(f"{where}.policies[{name!r}]: {e}") from None
    missing = {"maml", "pretrained", "random"} - set(policies)
    if missing:
        raise ValueError(f"{where}.policies needs the policies {sorted(missing)} for the "
                         "figure's ordering")
    if len(set(checks.counts(seeds, f"{where}.seeds", where))) != len(seeds):
        raise ValueError(f"{where}.seeds must be distinct integer seeds >= 0, got {seeds!r}")
    if 1 not in checks.counts(steps, f"{where}.steps", where) or list(steps) != sorted(
            set(steps)):
        raise ValueError(f"{where}.steps must be increasing inner-step counts (ints >= 0) "
                         f"with 1 among them (the figure's ordering), e.g. (0, 1, 2, 3); "
                         f"got {steps!r}")
    if not isinstance(extra_params, (tuple, list)) or not all(
            isinstance(p, str) for p in extra_params):
        raise ValueError(f"{where}.extra_params must be a tuple of gin bindings, got "
                         f"{extra_params!r}")


def seed_interval(values):
    """(mean, half-width of the Student's t 95% interval) of finite per-seed values; the
    width is 0 for one seed."""
    s = runs.seed_stats(values)  # checks that there are values and that they are finite
    half = (stats.t.ppf(0.975, s["n"] - 1) * s["std"] / np.sqrt(s["n"]) if s["n"] > 1
            else 0.0)
    return s["mean"], float(half)


def summarize(per_policy, steps, flat=()):
    """The metrics of {policy: [metrics.json of each seed]} (`flat`: policies evaluated
    after 0 steps only)."""
    out = {}
    for name, per_seed in per_policy.items():
        for s in (0,) if name in flat else steps:
            key = f"return_after_{s}"
            missing = [i for i, m in enumerate(per_seed) if key not in m]
            if missing:
                raise ValueError(f"the {name} runs of seeds at positions {missing} report no "
                                 f"{key}: their eval_steps must include {tuple(steps)}")
            out[f"{name}_{key}"], out[f"{name}_{key}_ci95"] = seed_interval(
                [m[key] for m in per_seed])
        out[f"{name}_meta_iterations"] = [m["meta_iterations"] for m in per_seed]
        out[f"{name}_train_seconds"] = [m.get("train_seconds") for m in per_seed]
    last = max(steps)
    out["figure4_ordering"] = bool(
        out["maml_return_after_1"] > out[f"pretrained_return_after_{last}"]
        and out["maml_return_after_1"] > out[f"random_return_after_{last}"])
    return out


def plot(path, metrics, policies, steps, flat=()):
    """Mean held-out return against inner steps per policy, 95% intervals over seeds (a
    `flat` policy's return after 0 steps drawn at every step)."""
    fig, ax = plt.subplots(figsize=(5, 4))
    x = np.asarray(steps)
    for name in policies:
        at = [0 if name in flat else s for s in x]
        mean = np.array([metrics[f"{name}_return_after_{s}"] for s in at])
        half = np.array([metrics[f"{name}_return_after_{s}_ci95"] for s in at])
        line, = ax.plot(x, mean, marker="" if name in flat else "o", ls="--" if name in flat
                        else "-", label=f"{name} (not adapted)" if name in flat else name)
        ax.fill_between(x, mean - half, mean + half, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel("policy-gradient steps")
    ax.set_ylabel("mean return on held-out goals")
    ax.set_title("2D navigation, 95% interval over seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_one(output_dir, config, gin_params):
    """The metrics of one run: kept if finished with the same config and bindings (its
    `driver.json`), else run or resumed; an error if the directory holds another run."""
    record = {"config": config, "gin_params": list(gin_params)}
    path = os.path.join(output_dir, "driver.json")
    if os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)
        if earlier != record:
            raise ValueError(f"{output_dir} holds a run of {earlier}, not of {record}: remove "
                             "the directory or use another output_dir")
    elif os.path.exists(output_dir):
        raise ValueError(f"{output_dir} exists without driver.json: not a run this driver "
                         "started; remove it or use another output_dir")
    done = runs.finished_metrics(output_dir)
    if done is not None:
        return done
    os.makedirs(output_dir, exist_ok=True)
    train.write_json(path, record)
    logging.info("running %s %s in %s", config, gin_params, output_dir)
    return runs.run_binary("experiments.maml_rl", [config], gin_params, output_dir)


@gin.configurable
def bench_navigation2d_baselines(output_dir, policies=gin.REQUIRED, seeds=(0, 1, 2),
                                 steps=(0, 1, 2, 3), extra_params=(), flat=("oracle",)):
    """Run (or resume, or keep) every (policy, seed) and compare them.

    Args:
      output_dir: where the runs and the comparison go.
      policies: {name: gin file of experiments/maml_rl.py, from the repository's root};
        "maml", "pretrained" and "random" are needed (and usually "oracle").
      seeds: the seeds, each a `maml_rl_experiment.seed`.
      steps: the inner-step counts compared, increasing, 1 among them (each config's
        `eval_steps` includes them).
      extra_params: gin bindings added to every run (e.g. a shorter budget for a smoke run).
      flat: policies evaluated without adaptation (see the module docstring).

    Returns:
      The metrics (see the module docstring).
    """
    _check(policies, seeds, steps, extra_params)
    if not isinstance(flat, (tuple, list)) or set(flat) - set(policies) or set(flat) & {
            "maml", "pretrained", "random"}:
        raise ValueError(f"bench_navigation2d_baselines.flat must name policies other than "
                         f"maml, pretrained and random, got {flat!r}")
    harness.started(output_dir)
    per_policy = {}
    for name, config in policies.items():
        per_policy[name] = []
        for seed in seeds:
            out = os.path.join(output_dir, name, f"seed{seed}")
            m = run_one(out, config, [f"maml_rl_experiment.seed = {seed}"] + list(extra_params))
            lacking = [s for s in ((0,) if name in flat else steps)
                       if f"return_after_{s}" not in m]
            if lacking:
                raise ValueError(f"{out} reports no return_after_{lacking[0]}: the config "
                                 f"{config} (policies[{name!r}]) must bind "
                                 f"maml_rl_experiment.eval_steps to include {tuple(steps)}, "
                                 "or change bench_navigation2d_baselines.steps")
            per_policy[name].append(m)
    metrics = summarize(per_policy, steps, flat)
    plot(os.path.join(output_dir, "navigation2d_baselines.png"), metrics, policies, steps,
         flat)
    logging.info("%s", {k: v for k, v in metrics.items() if "_after_" in k})
    return metrics


def main():
    harness.main(bench_navigation2d_baselines)


if __name__ == "__main__":
    main()
