"""Solve a PDE with a physics-informed network: Adam, then L-BFGS to convergence.

    python -m experiments.pinn --gin_file=configs/pinn/burgers.gin
    python -m experiments.pinn --gin_file=configs/pinn/burgers_inverse.gin

The problem (PDE, domain, conditions, reference; for an inverse problem its unknown
coefficients and observations) is a gin reference (`@burgers_problem`,
`@burgers_inverse_problem`, ...): the binary has no per-problem code. Outputs: metrics.json
(relative L2 error against the reference, final loss terms, times; each unknown's learned
value, true value and relative error), the error curve (`eval_history.json`, through
`train.record_eval`, and `error_history` in metrics.json), TensorBoard events and
checkpoints, solution.png (prediction, reference, absolute error, and slices at a few times),
prediction.npz (`points`, `prediction`: u on the problem's grid) and, with a reference,
`l2re` (PINNacle's relative L2 error). The PINNacle benchmark: configs/pinn/pinnacle/.
"""

import itertools
import math
import os
from typing import Literal

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import checks, distribute, harness, pinn, train
from hogrod.pinn import training


matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path, problem, pred, ref):
    shape = problem.grid_shape
    grid = problem.grid
    if shape is None or len(shape) != 2:  # only a 2-D mesh is drawn
        return
    ext = [problem.domain.low[1], problem.domain.high[1], problem.domain.low[0],
           problem.domain.high[0]]
    panels = [(pred, "prediction")] + ([(ref, "reference"), (np.abs(pred - ref), "|error|")]
                                       if ref is not None else [])
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 4))
    for ax, (z, title) in zip(axes, panels):
        im = ax.imshow(z.reshape(shape), origin="lower", aspect="auto", extent=ext, cmap="RdBu_r")
        ax.set_title(title)
        ax.set_xlabel("coordinate 1 (t)")
        ax.set_ylabel("coordinate 0 (x)")
        fig.colorbar(im, ax=ax)
    xs = grid.reshape(shape + (-1,))[:, 0, 0]
    for j in np.linspace(0, shape[1] - 1, 4).astype(int):
        line, = axes[-1].plot(xs, pred.reshape(shape)[:, j], label=f"t={grid.reshape(shape + (-1,))[0, j, 1]:.2f}")
        if ref is not None:
            axes[-1].plot(xs, ref.reshape(shape)[:, j], "k:", lw=0.8)
    axes[-1].legend()
    axes[-1].set_title("slices (dotted: reference)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


@gin.configurable
def pinn_experiment(output_dir, problem=gin.REQUIRED, width: harness.PositiveInt = 20,
                    depth: harness.PositiveInt = 8, n_collocation: harness.PositiveInt = 10000,
                    n_condition=400, sampling: str = "sobol", adam_steps: harness.Count = 2000,
                    adam_lr: harness.Positive = 1e-3, lbfgs_maxiter: harness.Count = 10000,
                    weights=None, weighting=None, gpinn=None, dtype: str = "float32",
                    error_every: harness.PositiveInt | None = None,
                    jit_compile: bool | Literal["auto"] = "auto",
                    checkpoint_every: harness.PositiveInt = 500, seed: harness.Count = 0,
                    network=None, resample_every: harness.PositiveInt | None = None,
                    residual_on_conditions: bool = False, use_jet: bool = True,
                    jet_jit_compile: bool = True,
                    steps_per_execution: harness.PositiveInt = 1):
    """Solve a problem: Adam for a fixed number of steps, then L-BFGS to convergence.

    Args:
      output_dir: where the run writes (and resumes from).
      problem: a problem factory (`@burgers_problem`, `@burgers_inverse_problem`, ...).
      width, depth: the tanh MLP (Raissi: 9 layers of 20 = depth 8 hidden + output).
      network: None (that tanh MLP) or a network factory called as network(input_dim,
        width, depth, dtype=dtype) (`@modified_mlp`, `@mlp_network` with an embedding or
        factorization: `hogrod.pinn.networks`).
      weights: fixed loss-term weights ({term: w}, default all 1); weighting: None (the
        fixed weights) or a scheme by reference (`@grad_norm_weights`, `@ntk_weights`,
        `@causal_weights`, `@self_adaptive_weights`; `pinn.weighting`; its hyperparameters
        are its own bindings, e.g. `grad_norm_weights.every = 100`); with weights from a
        scheme, `weights` must be None.
      gpinn: gradient-enhanced PINN, {coordinate j: w_j}: adds the term sum_j w_j
        mean((d residual / d x_j)^2) (None: none).
      adam_steps: the number of Adam steps; adam_lr: its learning rate, or a Keras schedule (`@ExponentialDecay()`, ...;
        registered by `hogrod.harness`).
      lbfgs_maxiter: the most L-BFGS iterations after Adam (it stops earlier at its
        tolerance; 0: no L-BFGS).
      n_collocation, n_condition: the collocation points, and the points of each condition
        (one count, or {condition name: count}); sampling: how they are drawn
        (`pinn.sample`'s method).
      jit_compile: "auto" (default): each Adam step one XLA computation (it fuses the
        residual's many small ops) where XLA compiles it, else a plain `tf.function` with
        one warning (`train.make_train_step`), and L-BFGS's value and gradient under XLA
        when the Adam steps were; True: both under XLA, required; False: neither (the
        binding that turns XLA off).
      use_jet: the residual's partials by the forward operator jet wherever it applies
        (`pinn.residual`); False: nested tapes always.
      jet_jit_compile: compile the jet alone with XLA inside the train step (the fast
        path without `jit_compile`, which compiles the whole step).
      steps_per_execution: the most Adam steps per compiled call (`train.train_loop`: the
        NaN guard, logs and checkpoints per step, the same steps as with 1); the calls end
        at multiples of its greatest common divisor with `error_every` and the weighting
        scheme's period, so the error curve and the scheme see their step's weights. 1
        (the default) until several per call measure faster on a quiet machine.
      error_every: record the relative L2 error every this many Adam steps and L-BFGS
        iterations (eval_history.json at steps Adam step / Adam steps + L-BFGS iteration,
        and metrics `error_history`: [training seconds, phase, phase step, error], the
        evaluation time not counted). None: no curve.
      checkpoint_every: Adam steps between checkpoints; L-BFGS's result is checkpointed
        when it ends. A re-run with the same output dir resumes Adam where it stopped (the
        error curve and its clock too), or restarts L-BFGS from the Adam weights, or, for a
        finished run with the same adam_steps and lbfgs_maxiter, only re-evaluates (the
        first run's timings stay in metrics.json); other counts are an error.
      resample_every: None: the collocation and condition points are drawn once (seed)
        and every Adam step fits them; an integer k >= 1: fresh points (the same counts
        and method, seeds from (seed, k-block)) every k Adam steps, fed to the compiled
        step as a new batch of the same shape (no retracing). Fixed points in high
        dimension sample the domain thinly, and the residual can be fitted there only;
        with fresh points each step is an unbiased estimate of the loss over the domain,
        so small batches (STDE's protocol: 100 points a step) train.
        L-BFGS and the final loss terms use the points drawn with `seed`. Not with a
        weighting scheme (its state is tied to fixed points).
      residual_on_conditions: also fit the PDE residual at every condition's points (the
        residual set is the collocation points followed by the condition points). DeepXDE's
        `PDE`/`TimePDE` data do this, so PINNacle's protocol does (its base config sets it).
      dtype, width, depth, weights, seed: as above (the network's dtype, its size, fixed
        term weights, the seed of the weights and points).
    Returns:
      The metrics (also written to metrics.json by the harness).
    """
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    tf_dtype = tf.as_dtype(dtype)
    with strategy.scope():
        prob, unknowns = learnable(problem(), tf_dtype)
        net = (tanh_mlp(prob.domain.dim, width, depth, dtype) if network is None
               else network(prob.domain.dim, width, depth, dtype=dtype))
        opt = keras.optimizers.Adam(adam_lr)
        u = training.solution_fn(prob, net)
        variables = list(net.trainable_variables) + list(unknowns.values())
        points, cond_points = collocation(prob, n_collocation, n_condition, sampling, seed,
                                          tf_dtype, residual_on_conditions)
        scheme = make_weighting(prob, u, points, cond_points, variables, weights, weighting,
                                gpinn)
        _check_resample(resample_every, weighting)
        ascent_opt = keras.optimizers.Adam(scheme.ascent_lr) if scheme.ascent else None
    objective = training.pinn_loss(prob, u, points, cond_points, scheme.weights or weights,
                                   gpinn=gpinn, reducers=scheme.reducers, use_jet=use_jet,
                                   jet_jit_compile=jet_jit_compile)
    batch = distribute.shard(strategy, (points, cond_points))
    progress = Progress()
    ckpt = train.Checkpointer(output_dir, model=net, optimizer=opt, **progress.variables,
                              **scheme.state, **{f"unknown_{n}": v for n, v in unknowns.items()},
                              **({"ascent_optimizer": ascent_opt} if ascent_opt else {}))
    restored = ckpt.restore()  # before the clock and the error curve, which resume with it
    finished = progress.finished(output_dir, restored, adam_steps, lbfgs_maxiter)
    harness.started(output_dir)
    clock = training.Clock(offset=progress.seconds())
    curve = ErrorCurve(output_dir, prob, u, tf_dtype, adam_steps, clock, error_every,
                       upto_step=math.inf if finished else restored)
    metrics = {}  # what this run measured; a finished run re-run keeps the first's timings
    if not finished:
        # the self-adaptive weights ascend with their own optimizer (a second group)
        groups = ([(opt, variables), (ascent_opt, list(scheme.ascent))] if ascent_opt else opt)
        step = train.make_train_step(objective, groups, None if ascent_opt else variables,
                                     strategy=strategy, jit_compile=jit_compile)
        per_call = math.gcd(steps_per_execution, error_every or 0,
                            scheme.every if scheme.update is not None else 0)
        on_step = adam_callback(curve, progress, scheme)
        batches = (itertools.repeat(batch) if resample_every is None else
                   fresh_batches(strategy, prob, n_collocation, n_condition, sampling, seed,
                                 tf_dtype, resample_every, start=restored,
                                 residual_on_conditions=residual_on_conditions))
        metrics.update(run_adam(step, batches, adam_steps, ckpt, output_dir, checkpoint_every,
                                on_step, curve, per_call))
        # "auto": L-BFGS's value and gradient under XLA when the Adam step compiled there
        lbfgs_jit = jit_compile is True or getattr(step, "jit_compile", None) is True
        metrics.update(run_lbfgs(objective, variables, lbfgs_maxiter, strategy, batch, curve,
                                 lbfgs_jit))
        progress.save(ckpt, lbfgs_maxiter, metrics["lbfgs_iterations"], clock)
    metrics.update(evaluate(output_dir, prob, u, objective, tf_dtype), **curve.metrics(),
                   **pinn.unknowns_report(prob, unknowns))
    logging.info("pinn: %s", metrics)
    return metrics


def learnable(prob, dtype):
    """(the problem with its PDE reading its unknowns' variables, {name: variable}); a
    forward problem comes back as it is, with no variables."""
    if not prob.unknowns:
        return prob, {}
    unknowns = {u.name: u.variable(dtype) for u in prob.unknowns}
    return pinn.bind_unknowns(prob, unknowns), unknowns


def tanh_mlp(dim, width, depth, dtype):
    return keras.Sequential([keras.Input((dim,), dtype=dtype)] +
                            [keras.layers.Dense(width, activation="tanh", dtype=dtype)
                             for _ in range(depth)] + [keras.layers.Dense(1, dtype=dtype)])


def collocation(prob, n_collocation, n_condition, sampling, seed, dtype,
                residual_on_conditions=False):
    """The collocation points and one set of points per condition (seeds seed + 1, ...);
    n_condition: one count for every condition, or {condition name: count};
    residual_on_conditions: the condition points appended to the collocation points."""
    if not isinstance(residual_on_conditions, bool):
        raise ValueError("pinn_experiment.residual_on_conditions must be True or False, got "
                         f"{residual_on_conditions!r}")
    where = "pinn_experiment"
    checks.integer(n_collocation, "pinn_experiment.n_collocation", where, least=1)
    names = [name for name, _, _ in prob.conditions]
    if isinstance(n_condition, dict) and set(n_condition) != set(names):
        raise ValueError(f"pinn_experiment.n_condition must give a count for each condition "
                         f"of problem {prob.name!r}, {names}, got {sorted(n_condition)}")
    counts = n_condition if isinstance(n_condition, dict) else dict.fromkeys(names, n_condition)
    for name, count in counts.items():
        checks.integer(count, f"pinn_experiment.n_condition (condition {name!r})", where,
                       least=1)
    points = tf.constant(pinn.sample(prob.domain, n_collocation, sampling, seed, dtype=dtype))
    cond_points = [tf.constant(fn(counts[name], seed + 1 + i, dtype=dtype), dtype)
                   for i, (name, fn, _) in enumerate(prob.conditions)]
    if residual_on_conditions:
        points = tf.concat([points] + cond_points, axis=0)
    return points, cond_points


def _check_resample(resample_every, weighting):
    if resample_every is None:
        return
    checks.integer(resample_every, "pinn_experiment.resample_every (None: fixed points; k: "
                   "fresh points every k Adam steps)", "pinn_experiment", least=1)
    if weighting is not None:
        raise ValueError(f"pinn_experiment.resample_every = {resample_every} needs "
                         f"pinn_experiment.weighting = None: the scheme {weighting!r} keeps "
                         "state for the points drawn once")


def fresh_batches(strategy, prob, n_collocation, n_condition, sampling, seed, dtype, every,
                  start=0, residual_on_conditions=False):
    """An endless iterator of batches (points, condition points) for Adam steps start + 1,
    start + 2, ...: new points every `every` steps, drawn as `collocation` draws them with a
    seed from (seed, block), so a resumed run gets the points it would have had. Same shapes
    and dtype every time: the compiled step does not retrace."""
    block, batch = None, None
    for step in itertools.count(start):
        if step // every != block:
            block = step // every
            key = int(np.random.SeedSequence([seed, block]).generate_state(1)[0])
            batch = distribute.shard(strategy, collocation(prob, n_collocation, n_condition,
                                                           sampling, key, dtype,
                                                           residual_on_conditions))
        yield batch


def make_weighting(prob, u, points, cond_points, variables, weights, weighting, gpinn):
    """The `pinn.Weighting` of `pinn_experiment.weighting` (None: the fixed weights)."""
    if weighting is None:
        return pinn.Weighting()
    if not callable(weighting):
        raise ValueError(f"pinn_experiment.weighting must be None or a weighting scheme by "
                         f"reference (@grad_norm_weights, @ntk_weights, @causal_weights, "
                         f"@self_adaptive_weights), got {weighting!r}")
    scheme = weighting(prob, u, points, cond_points, variables, gpinn=gpinn)
    if not isinstance(scheme, pinn.Weighting):
        raise TypeError(f"pinn_experiment.weighting must return a pinn.Weighting, got "
                        f"{type(scheme).__name__}")
    if weights and scheme.weights:
        raise ValueError(f"pinn_experiment.weights must be None with weighting = {weighting!r} "
                         f"(the scheme sets them), got {weights!r}")
    return scheme


class Progress:
    """What the checkpoint says besides the weights: L-BFGS's budget and iterations once it
    has run (budget -1 before), and the training seconds so far (the clock's offset)."""

    def __init__(self):
        self.variables = {
            "lbfgs_budget": tf.Variable(-1, dtype=tf.int64, trainable=False),
            "lbfgs_done": tf.Variable(0, dtype=tf.int64, trainable=False),
            "train_seconds": tf.Variable(0.0, dtype=tf.float64, trainable=False)}

    def seconds(self):
        return float(self.variables["train_seconds"])

    def tick(self, clock):
        self.variables["train_seconds"].assign(clock.seconds())

    def finished(self, output_dir, restored, adam_steps, lbfgs_maxiter):
        """Whether the restored run is finished; an error if it is, with other counts."""
        budget = int(self.variables["lbfgs_budget"])
        if budget >= 0 and (restored != adam_steps or budget != lbfgs_maxiter):
            raise ValueError(
                f"{output_dir} holds a finished run ({restored} Adam steps, then L-BFGS with "
                f"a budget of {budget} iterations); pinn_experiment.adam_steps = {adam_steps} "
                f"and lbfgs_maxiter = {lbfgs_maxiter} cannot continue it: use a new "
                "--output_dir")
        return budget >= 0

    def save(self, ckpt, budget, done, clock):
        """Mark the run finished and checkpoint the final weights (under the Adam steps)."""
        self.variables["lbfgs_budget"].assign(budget)
        self.variables["lbfgs_done"].assign(done)
        self.tick(clock)
        ckpt.save()


class ErrorCurve:
    """The relative L2 error on the training clock (its evaluation time not counted), every
    `every` Adam steps and L-BFGS iterations (None: never), through `train.record_eval`:
    eval_history.json and TensorBoard's eval/, at step i for Adam step i and adam_steps + i
    for L-BFGS iteration i. Starts from the evaluations recorded up to `upto_step`."""

    def __init__(self, output_dir, prob, u, dtype, adam_steps, clock, every, upto_step):
        self.output_dir, self.prob, self.u, self.dtype = output_dir, prob, u, dtype
        self.adam_steps, self.clock, self.every = adam_steps, clock, every
        self.history = train.read_history(output_dir, upto_step)

    def error(self):
        with self.clock.paused():
            return training.relative_l2(self.prob, self.u, self.dtype)

    def record(self, phase, i):
        with self.clock.paused():
            seconds, err = self.clock.seconds(), self.error()
            step = i if phase == "adam" else self.adam_steps + i
            train.record_eval(self.output_dir, self.history, {
                "step": step, "phase": phase, "seconds": seconds, "relative_l2": err})
        if err is not None:  # None: the problem has no reference solution
            logging.info("%s %d: relative L2 %.3e", phase, i, err)

    def lbfgs_callback(self):
        return (lambda i: self.record("lbfgs", i)) if self.every else None

    def metrics(self):
        """{"error_history": [[seconds, phase, phase step, error], ...]} ({} without one)."""
        if not self.history:
            return {}
        return {"error_history": [
            [h["seconds"], h["phase"], h["step"] - (0 if h["phase"] == "adam" else
                                                    self.adam_steps), h["relative_l2"]]
            for h in self.history]}


def adam_callback(curve, progress, scheme):
    def on_step(i, logs):
        if scheme.update is not None and i % scheme.every == 0:
            scheme.update()
        if curve.every and i % curve.every == 0:
            curve.record("adam", i)
        progress.tick(curve.clock)  # saved with the checkpoint that may follow this step
    return on_step


def run_adam(step, batches, adam_steps, ckpt, output_dir, checkpoint_every, on_step, curve,
             steps_per_execution=1):
    stats = {}
    logs = train.train_loop(step, batches, adam_steps, ckpt, output_dir,
                            checkpoint_every=checkpoint_every, log_every=500, callback=on_step,
                            stats=stats, steps_per_execution=steps_per_execution)
    metrics = {"adam_seconds": curve.clock.seconds(), "relative_l2_after_adam": curve.error()}
    if stats:
        metrics["adam_steps_per_s"] = stats["train_steps_per_s"]
    if logs:
        metrics["adam_final_loss"] = logs["loss"]
    return metrics


def run_lbfgs(objective, variables, maxiter, strategy, batch, curve, jit_compile):
    """L-BFGS from the current weights, then the curve's "end" point; its metrics."""
    loss, done, seconds = None, 0, 0.0
    if maxiter:
        logging.info("L-BFGS: up to %d iterations", maxiter)
        loss, done, seconds = training.lbfgs(
            objective, variables, maxiter, strategy=strategy, batch=batch,
            callback_every=curve.every or 500, callback=curve.lbfgs_callback(),
            jit_compile=jit_compile)
    metrics = {"total_seconds": curve.clock.seconds(), "lbfgs_seconds": seconds,
               "lbfgs_iterations": done, "lbfgs_final_loss": loss}
    if done and seconds > 0:
        metrics["lbfgs_iterations_per_s"] = done / seconds
    if curve.every:
        curve.record("end", done)
    return metrics


def evaluate(output_dir, prob, u, objective, dtype):
    """The final error and loss terms; solution.png; prediction.npz (`points`: the grid,
    `prediction`: u there) and `l2re` (PINNacle's relative L2 error) where the problem has
    a grid. Grid points where the reference is NaN are left out of both errors; their
    number is `reference_rows_dropped`, and a warning in the log."""
    ref = prob.reference_on_grid
    pred = None if prob.grid is None else training.predict_on_grid(prob, u, dtype)
    plot(os.path.join(output_dir, "solution.png"), prob, pred, ref)
    out = {}
    if pred is not None:
        np.savez(os.path.join(output_dir, "prediction.npz"), points=prob.grid, prediction=pred)
        if ref is not None:
            dropped = training.reference_nan_rows(prob)
            if dropped:
                logging.warning("pinn: the reference of problem %s is NaN at %d of its %d grid "
                                "points; relative_l2 and l2re leave them out", prob.name,
                                dropped, len(prob.grid))
            out["reference_rows_dropped"] = dropped
            out["l2re"] = pinn.l2re(ref, pred)
    return dict(problem=prob.name, relative_l2=training.relative_l2(prob, u, dtype), **out,
                **{f"term_{k}": float(v) for k, v in objective().items()})


def main():
    """The console command `hogrod-pinn` (see the module docstring)."""
    harness.main(pinn_experiment)


if __name__ == "__main__":
    main()
