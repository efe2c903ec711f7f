"""Solve a PDE with a physics-informed network: Adam, then L-BFGS to convergence.

    python -m experiments.pinn --gin_file=configs/pinn/burgers.gin
    python -m experiments.pinn --gin_file=configs/pinn/burgers_inverse.gin

The problem (PDE, domain, conditions, reference) is a gin reference (`@burgers_problem`,
`@poisson_problem`, ...). Outputs: metrics.json (relative L2 error against the reference,
final loss terms, times; the learned coefficient for inverse runs), TensorBoard events and
checkpoints of the Adam phase, solution.png (prediction, reference, absolute error, and
slices at a few times).
"""

import itertools
import json
import os
import time

import gin
import keras
import matplotlib
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod import distribute, harness, pinn, train
from hogrod.pinn import pdes, training

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path, problem, pred, ref):
    shape = problem.grid_shape
    grid = problem.grid
    if len(shape) != 2:
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
def pinn_experiment(output_dir, problem=gin.REQUIRED, width=20, depth=8, n_collocation=10000,
                    n_condition=400, sampling="sobol", adam_steps=2000, adam_lr=1e-3,
                    lbfgs_iterations=10000, weights=None, inverse_initial=None,
                    n_observations=2000, weighting="fixed", annealing_every=100,
                    dtype="float32", error_every=None, thresholds=(1e-2, 1e-3),
                    jit_compile=False, checkpoint_every=500, seed=0):
    """Args:
      problem: a problem factory (`@burgers_problem`, ...).
      width, depth: the tanh MLP (Raissi: 9 layers of 20 = depth 8 hidden + output).
      inverse_initial: for Burgers, learn the viscosity from `n_observations` reference
        values, starting from this value (None: the forward problem).
      weighting: "fixed" (`weights`, default all 1) or "annealing" (learning-rate annealing
        of the condition terms every `annealing_every` Adam steps).
      jit_compile: compile the loss and gradient of the Adam steps and of L-BFGS with XLA
        (fuses the residual's many small ops).
      error_every: record the relative L2 error every this many Adam steps and L-BFGS
        iterations (metrics `error_history`: [training seconds, phase, step, error], the
        evaluation time not counted) and the training seconds to reach each of
        `thresholds` (`seconds_to_<threshold>`; None if not reached). None: no curve.
      checkpoint_every: Adam steps between checkpoints; L-BFGS's result is checkpointed
        when it ends. A re-run with the same output dir resumes Adam where it stopped (the
        error curve and its clock too), or restarts L-BFGS from the Adam weights, or, for a
        finished run with the same adam_steps and lbfgs_iterations, only re-evaluates (the
        first run's timings stay in metrics.json); other counts are an error.
    """
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    prob = problem()
    tf_dtype = tf.as_dtype(dtype)
    with strategy.scope():
        net = keras.Sequential([keras.Input((prob.domain.dim,), dtype=dtype)] +
                               [keras.layers.Dense(width, activation="tanh", dtype=dtype)
                                for _ in range(depth)] + [keras.layers.Dense(1, dtype=dtype)])
    u = training.solution_fn(prob, net)
    points = tf.constant(pinn.sample(prob.domain, n_collocation, sampling, seed), tf_dtype)
    cond_points = [tf.constant(fn(n_condition, seed + 1 + i), tf_dtype)
                   for i, (_, fn, _) in enumerate(prob.conditions)]
    variables = list(net.trainable_variables)
    extra = {}
    nu = None
    if inverse_initial is not None:
        if prob.name != "burgers":
            raise ValueError("pinn_experiment.inverse_initial is implemented for burgers_problem")
        # log-parameterized, as Raissi et al.: the viscosity is positive and ~1e-3, far from
        # the weights' scale, which L-BFGS handles badly in the raw parameter
        with strategy.scope():
            log_nu = tf.Variable(np.log(inverse_initial), dtype=tf_dtype, name="log_viscosity")
        nu = lambda: tf.exp(log_nu)  # noqa: E731
        prob = prob._replace(pde=pdes.burgers(nu))
        obs = pinn.sample(prob.domain, n_observations, "sobol", seed + 99)
        x_obs, y_obs = tf.constant(obs, tf_dtype), tf.constant(prob.reference(obs), tf_dtype)
        extra["data"] = lambda: tf.reduce_mean(tf.square(u(x_obs) - y_obs))
        variables.append(log_nu)
    callback, tracked = None, {}
    history, clock = [], {"start": time.perf_counter(), "outside": 0.0}

    eval_writer = tf.summary.create_file_writer(os.path.join(output_dir, "eval"))

    history_path = os.path.join(output_dir, "error_history.json")

    def record(phase, i):
        t0 = time.perf_counter()
        err_i = training.relative_l2(prob, u, tf_dtype)
        history.append([t0 - clock["start"] - clock["outside"], phase, i, err_i])
        harness.write_json(history_path, history)
        if err_i is not None:  # None: the problem has no reference solution
            logging.info("%s %d: relative L2 %.3e", phase, i, err_i)
            with eval_writer.as_default():  # L-BFGS iterations counted after the Adam steps
                step = i if phase == "adam" else adam_steps + i
                tf.summary.scalar("relative_l2", err_i, step=step)
            eval_writer.flush()
        clock["outside"] += time.perf_counter() - t0

    if weighting == "annealing":
        unweighted = training.pinn_loss(prob, u, points, cond_points, None, extra)
        names = [name for name, _, _ in prob.conditions] + list(extra)
        weights, update = pinn.annealing_weights(unweighted, variables, names)
        tracked = {f"weight_{n}": w for n, w in weights.items()}
        callback = lambda i, logs: update() if i % annealing_every == 0 else None  # noqa: E731
    elif weighting != "fixed":
        raise ValueError(f"pinn_experiment.weighting must be 'fixed' or 'annealing', got "
                         f"{weighting!r}")
    loss_fn = training.pinn_loss(prob, u, points, cond_points, weights, extra)
    with strategy.scope():
        opt = keras.optimizers.Adam(adam_lr)
    step = train.make_train_step(loss_fn, opt, variables, strategy=strategy,
                                 jit_compile=jit_compile)
    # the collocation and condition points, split over the replicas (the same every step)
    batch = distribute.shard(strategy, (points, cond_points))
    # what the checkpoint says besides the weights: L-BFGS's budget and iterations once it
    # has run (-1 before), and the training seconds so far (the error curve's time axis)
    lbfgs_budget = tf.Variable(-1, dtype=tf.int64, trainable=False)
    lbfgs_done = tf.Variable(0, dtype=tf.int64, trainable=False)
    seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    ckpt = train.Checkpointer(output_dir, model=net, optimizer=opt, lbfgs_budget=lbfgs_budget,
                              lbfgs_done=lbfgs_done, train_seconds=seconds, **tracked,
                              **({"log_viscosity": log_nu} if nu is not None else {}))
    restored = ckpt.restore()  # here, so that the clock and the error curve resume with it
    finished = int(lbfgs_budget) >= 0
    if finished and (restored != adam_steps or int(lbfgs_budget) != lbfgs_iterations):
        raise ValueError(
            f"{output_dir} holds a finished run ({restored} Adam steps, then L-BFGS with a "
            f"budget of {int(lbfgs_budget)} iterations); pinn_experiment.adam_steps = "
            f"{adam_steps} and lbfgs_iterations = {lbfgs_iterations} cannot continue it: use "
            "a new --output_dir")
    if restored and os.path.exists(history_path):  # the curve up to the checkpoint
        with open(history_path) as f:
            history.extend(h for h in json.load(f)
                           if finished or (h[1] == "adam" and h[2] <= restored))
    clock["start"] = time.perf_counter() - float(seconds)

    def elapsed():
        return time.perf_counter() - clock["start"] - clock["outside"]

    def adam_callback(i, logs):
        if callback is not None:
            callback(i, logs)
        if error_every and i % error_every == 0:
            record("adam", i)
        seconds.assign(elapsed())  # saved with the checkpoint that may follow this step
    metrics = {}  # what this run measured; a finished run re-run keeps the first's timings
    if not finished:
        stats = {}
        logs = train.train_loop(step, itertools.repeat(batch), adam_steps, ckpt, output_dir,
                                checkpoint_every=checkpoint_every, log_every=500,
                                callback=adam_callback, stats=stats)
        metrics["adam_seconds"] = elapsed()
        if stats:
            metrics["adam_steps_per_s"] = stats["train_steps_per_s"]
        if logs:
            metrics["adam_final_loss"] = logs["loss"]
        t_eval = time.perf_counter()
        metrics["relative_l2_after_adam"] = training.relative_l2(prob, u, tf_dtype)
        clock["outside"] += time.perf_counter() - t_eval
        if lbfgs_iterations:
            logging.info("L-BFGS: up to %d iterations", lbfgs_iterations)
        lbfgs_loss, lbfgs_iters, lbfgs_seconds = (
            training.lbfgs(loss_fn, variables, lbfgs_iterations, strategy=strategy, batch=batch,
                           callback_every=error_every or 500, jit_compile=jit_compile,
                           callback=(lambda i: record("lbfgs", i)) if error_every else None)
            if lbfgs_iterations else (None, 0, 0.0))
        metrics["total_seconds"] = elapsed()  # training time on the error curve's clock
        if error_every:
            record("end", lbfgs_iters)
        lbfgs_budget.assign(lbfgs_iterations)
        lbfgs_done.assign(lbfgs_iters)
        seconds.assign(elapsed())
        ckpt.save()  # the final weights, under the Adam step count
        metrics.update(lbfgs_seconds=lbfgs_seconds, lbfgs_iterations=lbfgs_iters,
                       lbfgs_final_loss=lbfgs_loss)
        if lbfgs_iters and lbfgs_seconds > 0:
            metrics["lbfgs_iterations_per_s"] = lbfgs_iters / lbfgs_seconds
    err = training.relative_l2(prob, u, tf_dtype)
    terms = {k: float(v) for k, v in loss_fn().items()}
    ref = None if prob.reference is None else prob.reference(prob.grid)
    plot(os.path.join(output_dir, "solution.png"), prob,
         training.predict_on_grid(prob, u, tf_dtype), ref)
    metrics.update(problem=prob.name, relative_l2=err, **{f"term_{k}": v for k, v in terms.items()})
    if history:
        metrics["error_history"] = history
        for threshold in thresholds:
            metrics[f"seconds_to_{threshold:g}"] = next(
                (h[0] for h in history if h[3] is not None and h[3] <= threshold), None)
    if nu is not None:
        true_nu = 0.01 / np.pi
        metrics.update(viscosity=float(nu()), viscosity_true=true_nu,
                       viscosity_rel_err=abs(float(nu()) - true_nu) / true_nu)
    logging.info("pinn: %s", metrics)
    return metrics


def main():
    """The console command `hogrod-pinn` (see the module docstring)."""
    harness.main(pinn_experiment)


if __name__ == "__main__":
    main()
