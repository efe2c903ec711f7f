"""MAML-RL on 2D navigation against the MAML paper's baselines (its Figure 4): the mean
held-out return after 0..3 policy-gradient steps of a MAML policy, a policy pretrained by
TRPO on all goals with the same budget, a random initialization, and an oracle policy that
observes the goal, over seeds.

Each (policy, seed) is one `python -m experiments.maml_rl` run of the policy's config, in
`<output_dir>/<policy>/seed<k>/`, with `maml_rl_experiment.seed = k` (the held-out goals
and their episodes are the same for every policy of a seed). A finished run is kept (checked
to be the same seed); one stopped midway resumes from its checkpoint, and its meta-training
clock (`time_limit_s`) counts on from where it stopped, so the driver can be stopped and
started again, in several sessions. It writes metrics.json with, per policy,
`{policy}_return_after_{s}` (the mean over seeds of each seed's mean over the held-out
goals) and `{policy}_return_after_{s}_ci95` (Student's t 95% interval over the seeds'
means), `figure4_ordering` (MAML's mean after one step above pretrained's and random's
after three) and navigation2d_baselines.png:

    python -m experiments.bench.navigation2d_baselines \
        --gin_file=experiments/bench/configs/navigation2d_baselines.gin
"""

import os

import gin
import matplotlib
import numpy as np
from absl import logging
from scipy import stats

from experiments.bench import runs
from hogrod import harness

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _check(policies, seeds, steps):
    where = "bench_navigation2d_baselines"
    if not isinstance(policies, dict) or not policies:
        raise ValueError(f"{where}.policies must be {{name: gin file}}, got {policies!r}")
    for name, path in policies.items():
        if not os.path.exists(os.path.join(harness.REPO_ROOT, path)):
            raise ValueError(f"{where}.policies[{name!r}]: no config {path} (a path from the "
                             "repository's root)")
    missing = {"maml", "pretrained", "random"} - set(policies)
    if missing:
        raise ValueError(f"{where}.policies needs the policies {sorted(missing)} for the "
                         "figure's ordering")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"{where}.seeds must be distinct seeds, got {seeds}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"{where}.steps must be an int >= 1, got {steps!r}")


def seed_interval(values):
    """(mean, half-width of the Student's t 95% interval) of per-seed values; the width is
    0 for one seed."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float(values.mean()), 0.0
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return float(values.mean()), float(half)


def summarize(per_policy, steps):
    """The metrics of {policy: [metrics.json of each seed]}."""
    out = {}
    for name, per_seed in per_policy.items():
        for s in range(steps + 1):
            key = f"return_after_{s}"
            missing = [i for i, m in enumerate(per_seed) if key not in m]
            if missing:
                raise ValueError(f"the {name} runs of seeds at positions {missing} report no "
                                 f"{key}: their eval_steps must be at least {steps}")
            out[f"{name}_{key}"], out[f"{name}_{key}_ci95"] = seed_interval(
                [m[key] for m in per_seed])
        out[f"{name}_meta_iterations"] = [m["meta_iterations"] for m in per_seed]
    out["figure4_ordering"] = bool(
        out["maml_return_after_1"] > out[f"pretrained_return_after_{steps}"]
        and out["maml_return_after_1"] > out[f"random_return_after_{steps}"])
    return out


def plot(path, metrics, policies, steps):
    """Mean held-out return against inner steps per policy, 95% intervals over seeds."""
    fig, ax = plt.subplots(figsize=(5, 4))
    x = np.arange(steps + 1)
    for name in policies:
        mean = np.array([metrics[f"{name}_return_after_{s}"] for s in x])
        half = np.array([metrics[f"{name}_return_after_{s}_ci95"] for s in x])
        line, = ax.plot(x, mean, marker="o", label=name)
        ax.fill_between(x, mean - half, mean + half, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel("policy-gradient steps")
    ax.set_ylabel("mean return on held-out goals")
    ax.set_title("2D navigation, 95% interval over seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


@gin.configurable
def bench_navigation2d_baselines(output_dir, policies=gin.REQUIRED, seeds=(0, 1, 2), steps=3,
                                 extra_params=()):
    """Run (or resume, or keep) every (policy, seed) and compare them.

    Args:
      output_dir: where the runs and the comparison go.
      policies: {name: gin file of experiments/maml_rl.py, from the repository's root};
        "maml", "pretrained" and "random" are needed (and usually "oracle").
      seeds: the seeds, each a `maml_rl_experiment.seed`.
      steps: the inner steps compared (each config's `eval_steps` at least this).
      extra_params: gin bindings added to every run (e.g. a shorter budget for a smoke run).

    Returns:
      The metrics (see the module docstring).
    """
    _check(policies, seeds, steps)
    per_policy = {}
    for name, config in policies.items():
        per_policy[name] = []
        for seed in seeds:
            out = os.path.join(output_dir, name, f"seed{seed}")
            m = runs.finished_metrics(out, {"maml_rl_experiment.seed": seed})
            if m is None:
                logging.info("running %s, seed %d, in %s", name, seed, out)
                m = runs.run_binary("experiments.maml_rl", [config],
                                    [f"maml_rl_experiment.seed = {seed}"] + list(extra_params),
                                    out)
            per_policy[name].append(m)
    metrics = summarize(per_policy, steps)
    plot(os.path.join(output_dir, "navigation2d_baselines.png"), metrics, policies, steps)
    logging.info("%s", {k: v for k, v in metrics.items() if "_after_" in k})
    return metrics


def main():
    harness.main(bench_navigation2d_baselines)


if __name__ == "__main__":
    main()
