"""Meta-train through long unrolls: an estimator over truncated unrolls, the outer step,
evaluations, checkpoints that resume exactly (`hogrod.learned`).

    hogrod-learned-optimizer --gin_file=learned/influence_balancing_pes_k1.gin
    hogrod-learned-optimizer --gin_file=learned/toy_regression_pes.gin --output_dir=runs/toy_pes
    python -m experiments.learned_optimizer --compare OUT_DIR RUN_DIR [RUN_DIR ...]

`problem` is an `InnerProblem` factory (`@hogrod.learned.influence_balancing`, without
parentheses), called with `learned=` and `family=` where its signature names them
(`@hogrod.learned.optimizer_problem`). theta starts at `learned.init(seed)`, else at
`init_theta` (in the dtype of the problem's state). A meta-step is one estimate
(`estimator = @hogrod.learned.pes()`) and one step of `outer_optimizer(outer_lr)`
(`hogrod.learned.meta_step`), compiled once; one whose estimate, meta-loss or new theta is
not finite is not applied: the run stops, writes `diverged: true` with the last finite
theta, and exits 0. Every `eval_every` meta-steps the run records the mean meta-loss since
the last record and `eval_loss`, the meta-objective of a fresh `eval_steps`-step unroll.

Outputs: metrics.json (`theta` up to 64 entries, `eval_loss`, `diverged`, `meta_steps_done`,
`estimator`, `theta_error` given `reference_theta`), eval_history.json, TensorBoard events,
checkpoints (theta, the outer optimizer's state, the particles and PES's accumulators, the
step: the same --output_dir resumes exactly; a finished run re-evaluates), meta_loss.png;
given `surface` bounds, surface.png (the full-unroll meta-objective of a two-entry theta
and the run's path; `--compare` draws several runs' paths on one surface); for a learned
optimizer, learned_optimizer.npz (`learned.load`) and with `baseline_rates` the held-out
comparison with Adam (`heldout_*`, heldout_curves.npz, inner_curves.png); with
`select_every`, both of the theta of the lowest validation loss (`selected_meta_step`,
`validation_loss`; each record's `validation_loss` in eval_history.json)."""

import inspect
import itertools
import json
import math
import os
import sys

import gin
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import checks, distribute, harness, optim, taskmap, train, tree
from hogrod import learned as learned_lib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WHERE = "learned_optimizer_experiment"
THETA_LISTED = 64  # theta is written to the history and metrics up to this many entries


# ---- the run's state in variables ----------------------------------------------------------

class Held:
    """A nest of tensors (`value`) kept in `tf.Variable`s, one per leaf, for a checkpoint."""

    def __init__(self, value, name):
        self.structure = value
        self.variables = [tf.Variable(t, trainable=False, name=f"{name}_{i}")
                          for i, t in enumerate(tf.nest.flatten(value))]

    def read(self):
        """The nest's current value."""
        return tf.nest.pack_sequence_as(self.structure, [v.read_value() for v in self.variables])

    def assign_where(self, ok, value):
        """Assign `value` (a nest of the same structure) where `ok`, a scalar bool, holds."""
        for v, t in zip(self.variables, tf.nest.flatten(value)):
            v.assign(tf.where(ok, t, v.read_value()))


def _finite(*trees):
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(t)))
                          for t in tf.nest.flatten(trees)])


def _norm(t):
    """The global norm of a nest in float64, scaled by its largest entry: no overflow below
    float64's largest number (5e299 has norm 5e299, not inf)."""
    flat = tree.flatten(tf.nest.map_structure(tf.convert_to_tensor, t), tf.float64)
    top = tf.reduce_max(tf.abs(flat))
    scale = tf.where(top > 0, top, tf.ones_like(top))
    return scale * tf.norm(flat / scale)


def make_advance(meta, held):
    """The compiled meta-step on the held state: one estimate and outer step, applied only
    where the estimate, the meta-loss, the new theta and the logs are finite. Returns the
    logs (`meta_loss`, `grad_norm`, `grad_stderr`, `theta_norm`), NaN where the step was
    not applied."""

    @tf.function(autograph=False)
    def advance(_):
        new, estimate = meta.step(held.read())
        leaves = [tf.convert_to_tensor(r) for r in tf.nest.flatten(estimate.per_particle)]
        rows = tf.shape(leaves[0])[0]
        terms = tf.concat([tf.reshape(tf.cast(r, tf.float64), [rows, -1]) for r in leaves], 1)
        count = tf.cast(rows, tf.float64)
        variance = tf.reduce_sum(tf.math.reduce_variance(terms, 0)) * count / tf.maximum(
            count - 1, 1.0)
        logs = {"meta_loss": tf.cast(estimate.meta_loss, tf.float64),
                "grad_norm": _norm(estimate.grads), "grad_stderr": tf.sqrt(variance / count),
                "theta_norm": _norm(new.theta)}
        ok = _finite(new.theta, estimate.grads, logs)
        held.assign_where(ok, new)
        return {k: tf.where(ok, v, tf.constant(np.nan, tf.float64)) for k, v in logs.items()}

    return advance


# ---- evaluations ---------------------------------------------------------------------------

def evaluate_many(problem, thetas, steps, seeds):
    """The meta-objective of a fresh `steps`-step unroll under each row of `thetas` (a nest
    with a leading axis), particle i from the initial state and data of `seeds[i]` ([rows,
    2]): `hogrod.learned.evaluate` for many, in one compiled loop over the steps."""
    rows = seeds.shape[0]
    particles = learned_lib.init_particles(problem, seeds, None, [0] * rows)
    _, values = learned_lib.truncated_unroll(problem, thetas, particles, steps)
    return values


def _flat(theta):
    return tree.flatten(theta, tf.float64).numpy()


def _number(x):
    """A JSON number, None where not finite (metrics stay strict JSON)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _listed(theta):
    flat = _flat(theta)
    return flat.tolist() if flat.size <= THETA_LISTED else None


# ---- plots ---------------------------------------------------------------------------------

def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_meta_loss(path, history, title):
    """The meta-loss (mean over each record's interval) and the fresh unroll's `eval_loss`
    against meta-steps."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("meta_loss", "meta-loss (truncations, mean since the last record)"),
                       ("eval_loss", "eval_loss (fresh full unroll)")):
        points = [(h["step"], h[key]) for h in history if h.get(key) is not None]
        if points:
            ax.plot(*zip(*points), label=label)
    values = [h[k] for h in history for k in ("meta_loss", "eval_loss") if h.get(k) is not None]
    if values and min(values) > 0:
        ax.set_yscale("log")
    ax.set(xlabel="meta-step", ylabel="meta-objective")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    _save(fig, path)


def surface_grid(problem, theta, steps, bounds, points, seed):
    """The full-unroll meta-objective over a `points` x `points` grid of a two-entry theta
    (like `theta`) in `bounds` ((low, high) of each entry): (the axes' values [points]
    each, values [points, points], row i at the second entry's i-th value)."""
    (lo0, hi0), (lo1, hi1) = bounds
    a, b = np.linspace(lo0, hi0, points), np.linspace(lo1, hi1, points)
    grid = tf.constant(np.stack(np.meshgrid(a, b), -1).reshape(-1, 2))
    seeds = tf.tile(tf.constant([[seed, 0]], tf.int64), [points * points, 1])
    values = tf.function(lambda g: evaluate_many(
        problem, tf.vectorized_map(lambda row: tree.unflatten(row, theta), g), steps, seeds),
        autograph=False)(grid)
    return a, b, values.numpy().reshape(points, points)


def plot_surface(path, surface, paths, title):
    """The meta-objective's surface (log colour scale where positive) and each run's path of
    theta; `paths` is [(label, [[theta_0, theta_1], ...])]."""
    a, b, values = surface
    fig, ax = plt.subplots(figsize=(6.5, 5))
    shown = np.log10(np.maximum(values, 1e-12)) if np.nanmin(values) > 0 else values
    mesh = ax.pcolormesh(a, b, np.where(np.isfinite(shown), shown, np.nan), shading="auto",
                         cmap="viridis")
    fig.colorbar(mesh, ax=ax, label="log10 meta-objective" if shown is not values
                 else "meta-objective")
    i, j = np.unravel_index(np.nanargmin(values), values.shape)
    ax.plot(a[j], b[i], "w*", ms=12, label="grid minimum")
    for label, points in paths:
        points = np.asarray(points)
        if len(points):
            line, = ax.plot(points[:, 0], points[:, 1], "-", lw=1.5, label=label)
            ax.plot(points[-1, 0], points[-1, 1], "o", ms=5, color=line.get_color())
    ax.set(xlabel="theta[0]", ylabel="theta[1]")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    _save(fig, path)


def _path(history):
    return [h["theta"] for h in history if isinstance(h.get("theta"), list)
            and len(h["theta"]) == 2]


def plot_compare(run_dirs, out_dir):
    """Several runs' theta paths on the surface of the first run that saved one
    (`surface.npz`); each labelled by its estimator. Returns the PNG's path."""
    surface, paths = None, []
    for d in run_dirs:
        with open(os.path.join(d, "metrics.json")) as f:
            label = json.load(f).get("estimator", os.path.basename(os.path.normpath(d)))
        with open(os.path.join(d, "eval_history.json")) as f:
            paths.append((label, _path(json.load(f))))
        npz = os.path.join(d, "surface.npz")
        if surface is None and os.path.exists(npz):
            with np.load(npz) as z:
                surface = (z["a"], z["b"], z["values"])
    if surface is None:
        raise FileNotFoundError(f"none of {list(run_dirs)} holds surface.npz; bind "
                                f"{WHERE}.surface in one run")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "surface.png")
    plot_surface(path, surface, paths, "meta-objective and each estimator's path")
    return path


# ---- a learned optimizer against Adam on held-out tasks ------------------------------------

def heldout_comparison(output_dir, learned, family, theta, rates, tasks, n, title, task_map):
    """`hogrod.learned.heldout_curves` over 2N steps, saved in heldout_curves.npz, their
    means drawn in inner_curves.png. Returns `hogrod.learned.heldout_summary`'s metrics."""
    runs = learned_lib.heldout_curves(learned, theta, family, rates, tasks, 2 * n, task_map)
    np.savez(os.path.join(output_dir, "heldout_curves.npz"), **runs)
    metrics = learned_lib.heldout_summary(runs, rates, n)
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rates:
        chosen = r in metrics["heldout_adam_best_rate"]
        ax.plot(runs[f"adam_{r:g}"].mean(0), lw=1.8 if chosen else 0.8,
                label=f"Adam {r:g}" + (" (best at N or 2N)" if chosen else ""))
    ax.plot(runs["learned"].mean(0), "k", lw=2, label="learned optimizer")
    ax.axvline(n, color="gray", ls="--", lw=0.8, label="N (meta-training horizon)")
    ax.set(yscale="log", xlabel="inner step", ylabel=f"training loss, mean of {tasks} "
           "held-out tasks")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, os.path.join(output_dir, "inner_curves.png"))
    return metrics


# ---- the experiment ------------------------------------------------------------------------

def build_problem(factory, learned, family):
    """`factory(**given)`, given `learned=` and `family=` where its signature names them
    (and they are bound); an error naming the binding otherwise."""
    if isinstance(factory, learned_lib.InnerProblem) or not callable(factory):
        raise TypeError(f"{WHERE}.problem must be an InnerProblem factory, given without "
                        "parentheses (@hogrod.learned.influence_balancing, "
                        f"@hogrod.learned.optimizer_problem), got {type(factory).__name__}")
    named = inspect.signature(factory).parameters
    given = {k: v for k, v in (("learned", learned), ("family", family)) if v is not None}
    for name in given:
        if name not in named:
            raise ValueError(f"{WHERE}.{name} is bound but {WHERE}.problem "
                             f"({getattr(factory, '__name__', factory)}) takes no {name}; "
                             f"unbind {WHERE}.{name} or choose a problem that takes one")
    problem = factory(**given)
    if not isinstance(problem, learned_lib.InnerProblem):
        raise TypeError(f"{WHERE}.problem made a {type(problem).__name__}, not a "
                        "hogrod.learned.InnerProblem")
    return problem


def initial_theta(problem, learned, init_theta, seed):
    """theta at meta-step 0: `learned.init(seed)`, else `init_theta` in the dtype of the
    problem's state (its first floating leaf)."""
    if (learned is None) == (init_theta is None):
        raise ValueError(f"bind exactly one of {WHERE}.learned (a learned optimizer: theta "
                         f"starts at its init) and {WHERE}.init_theta (theta's initial value)")
    if learned is not None:
        return learned.init(checks.stateless_seed(seed, "seed", WHERE))
    state = problem.init(tf.constant([seed, 0], tf.int64))
    dtype = next((t.dtype for t in tf.nest.flatten(state) if t.dtype.is_floating), tf.float64)
    value = np.asarray(init_theta, np.float64)
    if value.ndim > 1 or not np.all(np.isfinite(value)):
        raise ValueError(f"{WHERE}.init_theta must be a finite number or a list of them, got "
                         f"{init_theta!r}")
    return tf.constant(np.atleast_1d(value), dtype)


def _record(output_dir, history, step, values):
    """Record an evaluation; a re-evaluation at the last step keeps that record's other
    values (its meta-loss, measured while training)."""
    previous = history[-1] if history and history[-1]["step"] == step else {}
    train.record_eval(output_dir, history, dict(previous, step=step, **values))


@gin.configurable
def learned_optimizer_experiment(
        output_dir, problem=gin.REQUIRED, estimator=gin.REQUIRED, learned=None, family=None,
        init_theta=None, outer_optimizer=optim.sgd, outer_lr: harness.Positive = 1e-3,
        clip_norm: harness.Positive | None = None, meta_steps: harness.PositiveInt = 1000,
        eval_steps: harness.PositiveInt = 100, eval_every: harness.PositiveInt = 10,
        reference_theta: float | None = None,
        surface: tuple[tuple[float, float], tuple[float, float]] | None = None,
        surface_points: harness.PositiveInt = 41,
        baseline_rates: tuple[harness.Positive, ...] = (),
        heldout_tasks: harness.PositiveInt = 16, task_map: str = "vectorized",
        checkpoint_every: harness.PositiveInt = 100, log_every: harness.Count = 100,
        time_limit_s: harness.Positive | None = None, seed: harness.Count = 0,
        select_every: harness.Count = 0, validation_tasks: harness.PositiveInt = 8):
    """Meta-train theta with an estimator, evaluate it, compare a learned optimizer.

    Args:
      problem: an `InnerProblem` factory (module docstring).
      estimator: a `hogrod.learned` estimator (`@hogrod.learned.pes()`).
      learned: a learned optimizer (`@hogrod.learned.mlp_optimizer()`,
        `@hogrod.learned.learned_schedule()`) given to the problem factory; theta starts at
        its `init`. None: `init_theta` is theta.
      family: a task family (`@hogrod.learned.digits_mlp()`) given to the problem factory;
        the held-out comparison draws its held-out tasks.
      init_theta: theta's initial value (a number or a list), without `learned`.
      outer_optimizer, outer_lr: the outer optimizer's factory (`@hogrod.optim.sgd`,
        `@outer/hogrod.optim.adam` with its other hyperparameters bound in that scope) and
        its rate.
      clip_norm: clip each estimate to this global norm; None: no clipping.
      meta_steps: the meta-steps of the run.
      eval_steps: the inner steps of the evaluation's fresh unroll (and N of the held-out
        comparison, which runs 2N).
      eval_every: record the meta-loss and evaluate every this many meta-steps.
      reference_theta: a known optimum (influence balancing's -1/6): `theta_error` is
        max |theta - reference_theta|.
      surface: ((low, high), (low, high)) of a two-entry theta: the surface PNG's grid;
        None: no surface.
      surface_points: the grid's points per axis.
      baseline_rates: Adam's rates for the held-out comparison of a learned optimizer
        (empty: no comparison).
      heldout_tasks: the held-out tasks of the comparison.
      task_map: how the comparison maps its tasks (`hogrod.taskmap.MODES`; "sequential"
        traces faster, "vectorized" runs faster).
      checkpoint_every: checkpoint every this many meta-steps, and at the end.
      log_every: a progress line every this many meta-steps (0: none).
      time_limit_s: stop (with a checkpoint) after this many seconds of meta-training in
        this invocation; a re-run continues. None: no limit.
      seed: the run's seed (particles, perturbations, evaluation tasks).
      select_every: every this many meta-steps and at the start (0: never), the learned
        optimizer's `validation_loss`: the mean loss after `eval_steps` inner steps on
        `validation_tasks` tasks of the held-out split that the comparison never meets. The
        theta of the lowest is the run's result (metrics, learned_optimizer.npz, the
        comparison; `selected_meta_step`), as early stopping: the meta-objective (the mean
        loss over a truncation's steps) is not the loss at N.
      validation_tasks: the validation tasks of `select_every`.

    Returns:
      The metrics (module docstring).
    """
    problem_ = build_problem(problem, learned, family)
    if not isinstance(estimator, learned_lib.Estimator):
        raise TypeError(f"{WHERE}.estimator must be a hogrod.learned estimator, with the "
                        "parentheses (@hogrod.learned.pes()), got "
                        f"{type(estimator).__name__}")
    if baseline_rates and (learned is None or family is None):
        raise ValueError(f"{WHERE}.baseline_rates compares a learned optimizer with Adam on "
                         f"held-out tasks: bind {WHERE}.learned and {WHERE}.family too, or "
                         "unbind the rates")
    taskmap.check_task_map(task_map, f"{WHERE}.task_map")
    if select_every and (learned is None or family is None):
        raise ValueError(f"{WHERE}.select_every selects a learned optimizer by its loss on "
                         f"validation tasks: bind {WHERE}.learned and {WHERE}.family too, or "
                         f"set {WHERE}.select_every = 0")
    theta0 = initial_theta(problem_, learned, init_theta, seed)
    if surface is not None and (tree.size(theta0) != 2 or not all(a < b for a, b in surface)):
        raise ValueError(f"{WHERE}.surface draws a theta of two entries over ((low, high), "
                         f"(low, high)), low < high; got {surface} for a theta of "
                         f"{tree.size(theta0)} entries")
    strategy = distribute.make_strategy()
    meta = learned_lib.meta_step(
        problem_, estimator, outer_lr, optimizer=outer_optimizer, clip_norm=clip_norm,
        strategy=strategy if strategy.num_replicas_in_sync > 1 else None)
    held = Held(meta.init(theta0, seed), "meta")
    interval = tf.Variable(tf.zeros([2], tf.float64), trainable=False, name="interval")
    diverged = tf.Variable(False, trainable=False, name="diverged")
    best = Held(theta0, "selected")  # the theta of the lowest validation loss, and its step
    best_at = tf.Variable([np.inf, 0.0], dtype=tf.float64, trainable=False, name="best_at")
    ckpt = train.Checkpointer(output_dir, meta=held.variables, interval=interval,
                              diverged=diverged, selected=best.variables, best_at=best_at)
    start = harness.started(output_dir, ckpt)
    history = train.read_history(output_dir, start)
    evaluate = tf.function(lambda t: learned_lib.evaluate(problem_, t, eval_steps, seed),
                           autograph=False)

    validate = select_every and learned_lib.validation_loss(learned, family, validation_tasks,
                                                            eval_steps, task_map)

    def record(step, final=False):
        theta = held.read().theta
        total, count = interval.numpy()
        values = {"eval_loss": _number(evaluate(theta)), "theta": _listed(theta)}
        if select_every and (step % select_every == 0 or step == meta_steps or final):
            values["validation_loss"] = _number(validate(theta))
            if values["validation_loss"] is not None and values["validation_loss"] < best_at[0]:
                best.assign_where(tf.constant(True), theta)
                best_at.assign([values["validation_loss"], step])
        if count:
            values["meta_loss"] = _number(total / count)
        _record(output_dir, history, step, values)
        interval.assign(tf.zeros([2], tf.float64))

    def on_step(step, logs):
        interval.assign_add(tf.constant([logs["meta_loss"], 1.0], tf.float64))
        if step % eval_every == 0 or step == meta_steps or (
                select_every and step % select_every == 0):
            record(step)
        if log_every and (step % log_every == 0 or step == meta_steps):
            logging.info("meta-step %d/%d: meta-loss %.5g, |grad| %.3g (+- %.2g), eval %s",
                         step, meta_steps, logs["meta_loss"], logs["grad_norm"],
                         logs["grad_stderr"], history[-1].get("eval_loss"))

    if not history:
        record(0)
    stats = {}
    if not bool(diverged):
        try:
            train.train_loop(make_advance(meta, held), itertools.repeat(None), meta_steps, ckpt,
                             output_dir, checkpoint_every=checkpoint_every, log_every=None,
                             callback=on_step, time_limit_s=time_limit_s, stats=stats)
        except train.NonFiniteError as e:
            logging.warning("diverged: %s; theta is the last finite one", e)
            diverged.assign(True)
            ckpt.save()
    done = int(ckpt.step)
    record(done, final=True)  # the final theta (a finished run re-evaluates it)
    theta = held.read().theta
    if select_every:
        theta = best.read()
        stats.update(selected_meta_step=int(best_at[1]), validation_loss=_number(best_at[0]))
    metrics = _finish(output_dir, problem_, learned, theta, history,
                      dict(done=done, diverged=bool(diverged), estimator=estimator.name,
                           reference_theta=reference_theta, surface=surface,
                           surface_points=surface_points, eval_steps=eval_steps, seed=seed,
                           family=family, baseline_rates=baseline_rates,
                           heldout_tasks=heldout_tasks, task_map=task_map))
    return dict(metrics, **stats)


def _finish(output_dir, problem, learned, theta, history, run):
    """The final metrics and figures of a run (`run`: what the experiment knows of it)."""
    flat = _flat(theta)
    metrics = {"estimator": run["estimator"], "meta_steps_done": run["done"],
               "diverged": run["diverged"], "eval_loss": history[-1]["eval_loss"],
               "eval_steps": run["eval_steps"], "theta_norm": _number(_norm(theta))}
    if flat.size <= THETA_LISTED:
        metrics["theta"] = flat.tolist()
    if run["reference_theta"] is not None:
        metrics["theta_error"] = float(np.max(np.abs(flat - run["reference_theta"])))
    title = f"{run['estimator']}: {run['done']} meta-steps" + (
        " (diverged)" if run["diverged"] else "")
    plot_meta_loss(os.path.join(output_dir, "meta_loss.png"), history, title)
    if run["surface"] is not None:
        surface = surface_grid(problem, theta, run["eval_steps"], run["surface"],
                               run["surface_points"], run["seed"])
        np.savez(os.path.join(output_dir, "surface.npz"), a=surface[0], b=surface[1],
                 values=surface[2])
        plot_surface(os.path.join(output_dir, "surface.png"), surface,
                     [(run["estimator"], _path(history))], title)
    if learned is not None:
        learned.save(theta, os.path.join(output_dir, "learned_optimizer.npz"))
    if run["baseline_rates"]:
        metrics.update(heldout_comparison(output_dir, learned, run["family"], theta,
                                          run["baseline_rates"], run["heldout_tasks"],
                                          run["eval_steps"], title, run["task_map"]))
    return metrics


def main():
    """The console command `hogrod-learned-optimizer` (see the module docstring);
    `--compare OUT_DIR RUN_DIR...` as the first argument draws finished runs' paths on one
    surface instead."""
    if sys.argv[1:2] != ["--compare"]:
        harness.main(learned_optimizer_experiment)
    try:
        if len(sys.argv) < 4:
            raise ValueError("usage: --compare OUT_DIR RUN_DIR [RUN_DIR ...]")
        print(plot_compare(sys.argv[3:], sys.argv[2]))
    except (ValueError, FileNotFoundError) as e:
        print(f"learned_optimizer --compare: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
