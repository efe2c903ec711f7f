"""Benchmark: Newton-CG on the 5-D Rosenbrock function, `hessian_free.from_objective` against
scipy's `minimize(method="Newton-CG")`.

From scipy's documented start x0 = [1.3, 0.7, 0.8, 1.9, 1.2], float64, exact
Hessian-vector products. hogrod runs `hessian_free.from_objective` as a truncated Newton
method (the config: damping 0, cold CG starts, no CG backtracking, CG to
``||r|| <= min(0.5, sqrt(||g||)) ||g||``, Armijo backtracking from rate 1) through
`make_train_step`, until f < `target`; scipy runs with ``xtol`` to its own stop, its
functions counted, and its counts when its iterate first has f < `target` (its callback)
are reported too. Reported side by side: iterations, function and gradient evaluations,
Hessian-vector products (hogrod's `products` log: every CG step's, and the one that finds
negative curvature, which the Hessian at x0, indefinite, has; scipy's `hessp` calls) and the
final f.

hogrod's function evaluations are the train step's (one value with each gradient) and the
optimizer's (its `evaluations` log: the value at the current weights, which the
step-optimizer protocol does not hand over, and the line search's).

    python -m experiments.bench.newton_cg --gin_file=experiments/bench/configs/newton_cg.gin
"""

import gin
import numpy as np
import scipy.optimize
import tensorflow as tf

from hogrod import harness, train
from hogrod.second_order import hessian_free

X0 = (1.3, 0.7, 0.8, 1.9, 1.2)


def rosenbrock(x):
    """The Rosenbrock function of a float64 vector, in TensorFlow (scipy's `rosen`)."""
    return tf.reduce_sum(100.0 * tf.square(x[1:] - tf.square(x[:-1])) + tf.square(1.0 - x[:-1]))


def _scipy(x0, xtol, target):
    """scipy's Newton-CG with counted callbacks: its result and its counts at f < target."""
    counts = {"function_evaluations": 0, "gradient_evaluations": 0, "hvps": 0}
    at_target = {}

    def f(x):
        counts["function_evaluations"] += 1
        return scipy.optimize.rosen(x)

    def jac(x):
        counts["gradient_evaluations"] += 1
        return scipy.optimize.rosen_der(x)

    def hessp(x, p):
        counts["hvps"] += 1
        return scipy.optimize.rosen_hess_prod(x, p)

    iterations = [0]

    def callback(xk):
        iterations[0] += 1
        if not at_target and scipy.optimize.rosen(xk) < target:
            at_target.update(counts, iterations=iterations[0])

    res = scipy.optimize.minimize(f, np.array(x0), method="Newton-CG", jac=jac, hessp=hessp,
                                  callback=callback, options={"xtol": xtol})
    final = dict(counts, iterations=int(res.nit), f=float(res.fun), success=bool(res.success))
    return final, at_target


def _hogrod(x0, target, max_steps):
    """`hessian_free.from_objective` (its gin bindings) in a train step until f < target."""
    x = tf.Variable(np.array(x0, np.float64), name="x")

    def objective(batch):
        del batch  # one deterministic problem: the batch is a placeholder
        return rosenbrock(x)

    optimizer = hessian_free.from_objective([x])
    step = train.make_train_step(objective, optimizer, [x])
    batch = tf.zeros([1], tf.float64)
    steps = hvps = evaluations = 0
    while float(rosenbrock(x)) >= target and steps < max_steps:  # the oracle's check
        logs = step(batch)
        steps += 1
        hvps += int(logs["products"])  # CG's steps and the negative-curvature detecting one
        evaluations += int(logs["evaluations"])
    return {"iterations": steps, "gradient_evaluations": steps,
            "function_evaluations": steps + evaluations,
            "function_evaluations_beyond_the_protocol": evaluations,
            "hvps": hvps, "f": float(rosenbrock(x)), "x": x.numpy().tolist(),
            "traces": int(step.experimental_get_tracing_count())}


@gin.configurable
def bench_newton_cg(output_dir, x0=X0, target=1e-10, scipy_xtol=1e-8, max_steps=100):
    """Both methods on the Rosenbrock function (the module docstring).

    Args:
      output_dir: the run's directory (metrics.json is written by the harness).
      x0: the start point.
      target: hogrod runs until f < target.
      scipy_xtol: scipy's ``xtol``.
      max_steps: hogrod's most steps.

    Returns:
      The metrics: {"hogrod": {...}, "scipy": {...}, "scipy_at_target": {...}}.
    """
    del output_dir
    ours = _hogrod(x0, target, max_steps)
    scipy_final, scipy_at_target = _scipy(x0, scipy_xtol, target)
    keys = ("iterations", "function_evaluations", "gradient_evaluations", "hvps")
    print(f"{'':24s} {'hogrod':>10s} {'scipy@target':>12s} {'scipy':>10s}")
    for key in keys:
        print(f"{key:24s} {ours[key]:10d} {scipy_at_target.get(key, -1):12d} "
              f"{scipy_final[key]:10d}")
    print(f"{'f':24s} {ours['f']:10.3g} {'':12s} {scipy_final['f']:10.3g}")
    return {"hogrod": ours, "scipy": scipy_final, "scipy_at_target": scipy_at_target,
            "target": target}


def main():
    """`python -m experiments.bench.newton_cg` (see the module docstring)."""
    harness.main(bench_newton_cg)


if __name__ == "__main__":
    main()
