"""MAML on your own Keras model (BatchNorm and Dropout) and your own task generator.

    python docs/guide/maml_own_model.py            # 2,000 meta-steps
    python docs/guide/maml_own_model.py --quick    # 60 meta-steps (HOGROD_GUIDE_QUICK=1)

The tasks are random cubic polynomials on [-2, 2]: K support and Q query points each. The
algorithm is second-order MAML (`hogrod.meta.maml`), trained by the same compiled step as
any other model (`hogrod.train.make_train_step`), evaluated by `hogrod.meta.evaluate`.
A short Meta-SGD run shows `Algorithm.variables`: the algorithm's own trainables.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402


def make_model(width=40, dropout=0.1):
    """Any built Keras 3 model: here BatchNorm after each hidden layer and one Dropout."""
    inputs = keras.Input((1,))
    h = inputs
    for i in range(2):
        h = keras.layers.Dense(width, name=f"dense{i}")(h)
        h = keras.layers.BatchNormalization(name=f"bn{i}")(h)
        h = keras.layers.ReLU()(h)
    h = keras.layers.Dropout(dropout, name="dropout")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(h))


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true - y_pred))


def sample_tasks(seed, num_tasks, k_support, k_query):
    """Your own task generator: a meta-batch (x_s, y_s, x_q, y_q), each [tasks, points, 1].

    Stateless seeds make the stream reproducible and its tf.data iterator checkpointable.
    """
    s = tf.random.experimental.stateless_split(seed, 3)
    coef = tf.random.stateless_normal([num_tasks, 1, 4], s[0])       # y = c0 + c1 x + c2 x^2 + c3 x^3
    xs = tf.random.stateless_uniform([num_tasks, k_support, 1], s[1], -2.0, 2.0)
    xq = tf.random.stateless_uniform([num_tasks, k_query, 1], s[2], -2.0, 2.0)
    cubic = lambda x: tf.reduce_sum(coef * tf.pow(x, [0.0, 1.0, 2.0, 3.0]), -1, keepdims=True) / 4
    return xs, cubic(xs), xq, cubic(xq)


def meta_batches(seed, num_tasks, k_support=10, k_query=10):
    """An infinite tf.data stream of meta-batches: fresh tasks at every step."""
    return tf.data.Dataset.range(2 ** 62).map(
        lambda i: sample_tasks(tf.stack([tf.cast(seed, tf.int64), i]), num_tasks,
                               k_support, k_query))


def main(quick=False):
    keras.utils.set_random_seed(0)
    steps, meta_batch = (60, 8) if quick else (2000, 25)
    model = make_model()
    algo = hogrod.meta.maml(model, mse, inner_lr=0.01, inner_steps=1)
    # algo.meta_loss(tasks, step) -> {"loss": scalar}; algo.variables == [] for MAML.
    # step, the outer iteration, is read by MAML++ only; passing it always lets any
    # algorithm of the family replace maml here.
    variables = model.trainable_variables + algo.variables
    optimizer = keras.optimizers.Adam(1e-3)
    step = hogrod.train.make_train_step(lambda tasks: algo.meta_loss(tasks, optimizer.iterations),
                                        optimizer, variables,
                                        transform=hogrod.train.clip_by_global_norm(10.0))

    test_tasks = sample_tasks(tf.constant([123, 0], tf.int64), 100 if quick else 600, 10, 10)
    # evaluator: traced once, called before and after training (meta.evaluate traces on
    # every call); task_map="sequential": tasks in a tf.map_fn, which traces faster than
    # tf.vectorized_map (the default) and holds one task's activations at a time
    evaluator = hogrod.meta.evaluator(algo, model, mse, steps=(0, 1, 5), task_map="sequential")
    evaluate = lambda: evaluator(test_tasks)  # noqa: E731
    before = evaluate()

    for _, tasks in zip(range(steps), meta_batches(seed=0, num_tasks=meta_batch)):
        logs = step(tasks)          # {"loss", "grad_norm", "lr", "applied"}: tensors
    after = evaluate()      # {"loss_after_0": ..., "loss_after_0_ci95": ..., ...}: floats

    # One task by hand: adapt returns fast weights (a list of tensors, the order of
    # model.trainable_variables); predict with them through functional_call.
    xs, ys, xq, yq = (t[0] for t in test_tasks)
    fast = algo.adapt((xs, ys), 5)
    assert [f.shape for f in fast] == [v.shape for v in model.trainable_variables]
    pred = hogrod.functional_call(model, fast, xq, training=True)  # what evaluate does
    assert pred.shape == yq.shape

    # The meta-gradient itself, without a train step: (loss, grads), the gradient over
    # model.trainable_variables + algo.variables (what the step above applies).
    loss, grads = hogrod.meta.meta_gradient(algo, model, test_tasks)
    assert [g.shape for g in grads] == [v.shape for v in variables] and np.isfinite(float(loss))

    # The model's own BatchNorm statistics are never written by meta-training: every call
    # uses the batch's statistics (transductive) through functional_call's explicit state.
    bn = model.get_layer("bn0")
    assert np.allclose(bn.moving_mean.numpy(), 0.0) and np.allclose(bn.moving_variance, 1.0)

    # Meta-SGD: `variables` holds one learned rate per weight entry; train them with the model.
    sgd_model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
    sgd = hogrod.meta.meta_sgd(sgd_model, mse, inner_lr=0.01)
    assert [r.shape for r in sgd.variables] == [v.shape for v in sgd_model.trainable_variables]
    sgd_step = hogrod.train.make_train_step(
        sgd.meta_loss, keras.optimizers.Adam(1e-3), sgd_model.trainable_variables + sgd.variables)
    for _, tasks in zip(range(2), meta_batches(seed=1, num_tasks=4)):
        sgd_step(tasks)
    assert not np.allclose(sgd.variables[0].numpy(), 0.01), "the learned rates were trained"

    print(f"maml_own_model: query MSE after 0 / 1 / 5 steps, before meta-training "
          f"{before['loss_after_0']:.3f} / {before['loss_after_1']:.3f} / "
          f"{before['loss_after_5']:.3f}; after {steps} meta-steps {after['loss_after_0']:.3f} / "
          f"{after['loss_after_1']:.3f} / {after['loss_after_5']:.3f} "
          f"(+- {after['loss_after_5_ci95']:.3f}); last meta-loss {float(logs['loss']):.3f}")
    assert float(logs["applied"]) == 1.0
    # the oracle: adaptation helps, and meta-training made the adapted model better
    assert after["loss_after_5"] < after["loss_after_0"]
    assert after["loss_after_1"] < before["loss_after_1"]
    return {"before": before, "after": after}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
