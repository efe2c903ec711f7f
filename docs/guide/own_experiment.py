"""Your own gin-configured experiment binary on `hogrod.harness`: flags, config, outputs,
checkpoints, resume, held-out evaluations.

    # the binary (absl flags; bindings override the file; same --output_dir resumes)
    python docs/guide/own_experiment.py --gin_file=docs/guide/own_experiment.gin \
        --gin_param='own_regression.steps = 800' --output_dir=runs/own
    # the self-check: run, resume, compare with an uninterrupted run (in a temporary dir)
    python docs/guide/own_experiment.py [--quick]

The experiment fits y = sin(2x) + noise with an MLP. Its loss has two named terms, "mse"
and "smooth" (the squared input gradient, a smoothness penalty made with
`hogrod.gan.input_gradient_norm`), weighted by the binding
`make_train_step.weights = {'smooth': 1e-3}`.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gin  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
# Import every subpackage whose configurables the config binds BEFORE the config is parsed:
# `hogrod.train` and the others load lazily, and gin knows only what has been imported.
import hogrod.distribute  # noqa: E402,F401  (make_strategy.*)
import hogrod.gan  # noqa: E402,F401
import hogrod.train  # noqa: E402,F401  (make_train_step.*)
from hogrod import harness  # noqa: E402

GIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "own_experiment.gin")


def data(n, noise, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, (n, 1)).astype(np.float32)
    return x, (np.sin(2 * x) + noise * rng.normal(size=x.shape)).astype(np.float32)


@gin.configurable
def own_regression(output_dir, steps: harness.PositiveInt = 600, width: harness.PositiveInt = 32,
                   learning_rate: harness.Positive = 0.01, batch_size: harness.PositiveInt = 32,
                   n_train: harness.PositiveInt = 256, noise: harness.NonNegative = 0.1,
                   eval_every: harness.PositiveInt = 100,
                   checkpoint_every: harness.PositiveInt = 100, seed: harness.Count = 0):
    """The experiment: a gin configurable `fn(output_dir) -> metrics dict`."""
    if steps < 1 or eval_every < 1:
        raise ValueError(f"own_regression.steps ({steps}) and .eval_every ({eval_every}) "
                         "must be >= 1")
    keras.utils.set_random_seed(seed)
    strategy = hogrod.distribute.make_strategy()  # gin: make_strategy.kind, configs/strategy/
    with strategy.scope():                        # models and optimizers under its scope
        model = keras.Sequential([keras.Input((1,)),
                                  keras.layers.Dense(width, activation="tanh"),
                                  keras.layers.Dense(width, activation="tanh"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(learning_rate)
    x, y = data(n_train, noise, seed)
    x_test = np.linspace(-3, 3, 200, dtype=np.float32)[:, None]
    y_test = np.sin(2 * x_test)

    def loss_fn(batch):
        xb, yb = batch
        return {"mse": tf.reduce_mean(tf.square(model(xb, training=True) - yb)),
                "smooth": tf.reduce_mean(tf.square(hogrod.gan.input_gradient_norm(model, xb)))}

    step = hogrod.train.make_train_step(loss_fn, optimizer, model.trainable_variables,
                                        strategy=strategy)  # weights etc. from gin
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n_train, seed=seed)
               .repeat().batch(batch_size, drop_remainder=True))
    iterator = iter(hogrod.distribute.distribute_dataset(strategy, dataset))
    ckpt = hogrod.train.Checkpointer(output_dir, model=model, optimizer=optimizer, data=iterator)
    # everything is built from the bindings: restore the checkpoint, then the harness
    # writes config.gin (a binding refused above leaves no output directory)
    resumed_from = harness.started(output_dir, ckpt)
    # the evaluations up to the checkpoint
    history = hogrod.train.read_history(output_dir, resumed_from)

    def test_mse():
        return float(np.mean((model(x_test).numpy() - y_test) ** 2))

    def evaluate(i, logs):
        if i % eval_every == 0 or i == steps:
            hogrod.train.record_eval(output_dir, history, {"step": i, "test_mse": test_mse()})

    logs = hogrod.train.train_loop(step, iterator, steps, ckpt, output_dir,
                                   checkpoint_every=checkpoint_every, callback=evaluate)
    return {"steps": int(ckpt.step), "resumed_from": resumed_from, "test_mse": test_mse(),
            "zero_predictor_mse": float(np.mean(y_test ** 2)),
            **{f"final_{k}": v for k, v in logs.items()}}


def main(quick=False):
    total, first = (60, 40) if quick else (600, 400)
    params = [f"own_regression.eval_every = {total // 3 if quick else 100}",
              f"own_regression.checkpoint_every = {first // 2}"]
    with tempfile.TemporaryDirectory() as tmp, gin.unlock_config():
        straight, resumed = os.path.join(tmp, "straight"), os.path.join(tmp, "resumed")
        _, uninterrupted = harness.run(own_regression, [GIN_FILE],
                                       params + [f"own_regression.steps = {total}"], straight)
        harness.run(own_regression, [GIN_FILE], params + [f"own_regression.steps = {first}"],
                    resumed)                                       # "killed" after `first` steps
        # continuing with more steps is a changed config: refused unless asked for, and
        # then recorded in config_changes.txt
        _, metrics = harness.run(own_regression, [GIN_FILE],
                                 params + [f"own_regression.steps = {total}"], resumed,
                                 allow_config_change=True)
        with open(os.path.join(resumed, "metrics.json")) as f:
            assert json.load(f)["steps"] == total
        with open(os.path.join(resumed, "eval_history.json")) as f:
            eval_steps = [h["step"] for h in json.load(f)]
        with open(os.path.join(resumed, "operative_config.gin")) as f:
            operative = f.read()
        outputs = sorted(os.listdir(resumed))

    print(f"own_experiment: outputs {outputs}; resumed from step {metrics['resumed_from']}; "
          f"evaluations at steps {eval_steps}; test MSE {metrics['test_mse']:.4f} (zero "
          f"predictor {metrics['zero_predictor_mse']:.3f}); final terms mse "
          f"{metrics['final_mse']:.4f}, smooth {metrics['final_smooth']:.3f}")
    assert "make_train_step.weights = {'smooth': 0.001}" in operative
    assert metrics["resumed_from"] == first and len(eval_steps) == len(set(eval_steps))
    assert "config_changes.txt" in outputs
    assert not gin.config_str()  # harness.run leaves no binding behind
    # the oracle: a resumed run ends where an uninterrupted one does (same weights, data order)
    assert np.isclose(metrics["test_mse"], uninterrupted["test_mse"], rtol=1e-5)
    assert metrics["test_mse"] < 0.5 * metrics["zero_predictor_mse"]
    return metrics


if __name__ == "__main__":
    if any(a.startswith(("--gin", "--output_dir", "--verbosity")) for a in sys.argv[1:]):
        harness.main(own_regression)
    else:
        main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
