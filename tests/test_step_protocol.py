"""The step-optimizer protocol of `make_train_step`: a `hogrod.optim` optimizer adapted to it
equals its own `update`; an optimizer that evaluates the objective on the step's batch
takes the same steps under MirroredStrategy on two logical CPUs as on one device; what the
protocol refuses."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hogrod import checks, distribute, optim, train

MSE = keras.losses.MeanSquaredError(dtype="float64")


def mse(y, z):
    """The batch mean written out: a Keras loss object divides it by the replicas in sync
    under a multi-replica strategy (its own training step sums the replicas' losses)."""
    return tf.reduce_mean(tf.square(y - z))


def regression(n=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = x @ rng.normal(size=(3, 2)) + 0.1 * rng.normal(size=(n, 2))
    return x, y


def dense(strategy=None):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3,), dtype="float64"),
                                  keras.layers.Dense(2, dtype="float64")])
    return model


def test_a_pure_optimizer_steps_as_its_own_update():
    model = dense()
    x, y = regression()
    opt = optim.adam(0.1)

    def objective(batch):
        return MSE(batch[1], model(batch[0]))

    params = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    state = opt.init(params)
    step = train.make_train_step(objective, opt, model.trainable_variables)
    for _ in range(3):
        with tf.GradientTape() as tape:
            tape.watch(params)
            value = MSE(y, tf.matmul(x, params[0]) + params[1])
        params, state = opt.update(tape.gradient(value, params), state, params)
        logs = step((x, y))
    for v, p in zip(model.trainable_variables, params):
        np.testing.assert_allclose(v.numpy(), p.numpy(), rtol=1e-13, atol=1e-15)
    assert float(logs["lr"]) == pytest.approx(0.1)


class HalvingSearch(train.StepOptimizer):
    """A gradient step whose length is halved until the objective on the step's batch
    decreases: uses `loss` and `batch`, reports what it used."""

    def __init__(self, rate):
        super().__init__(name="halving")
        self.rate = rate

    def build(self, variables):
        self.used = train.state_variable(0.0, "used", tf.float64)
        self.value = train.state_variable(0.0, "value", tf.float64)
        self.built = True

    def apply(self, grads, variables, loss, batch):
        start = [tf.convert_to_tensor(v) for v in variables]
        before = train.replica_mean(loss(batch))
        rate = tf.constant(self.rate, tf.float64)
        for _ in range(4):  # unrolled: at most four halvings
            train.assign(variables, [p - rate * g for p, g in zip(start, grads)])
            after = train.replica_mean(loss(batch))
            rate = tf.where(after < before, rate, rate / 2)
        train.assign(variables, [p - rate * g for p, g in zip(start, grads)])
        train.assign([self.used, self.value], [rate, train.replica_mean(loss(batch))])

    @property
    def learning_rate(self):
        return self.used

    def logs(self):
        return {"used_rate": self.used, "value_after": self.value}


def run_halving(strategy, steps=3):
    model = dense(strategy)
    x, y = regression()
    with strategy.scope():
        opt = HalvingSearch(4.0)

    def objective(batch):
        return mse(batch[1], model(batch[0]))

    step = train.make_train_step(objective, opt, model.trainable_variables, strategy=strategy)
    data = distribute.distribute_dataset(
        strategy, tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat())
    it = iter(data)
    logs = [step(next(it)) for _ in range(steps)]
    return [v.numpy() for v in model.trainable_variables], logs


def test_an_optimizer_using_the_batch_steps_the_same_on_two_replicas():
    one, logs_one = run_halving(tf.distribute.get_strategy())
    two, logs_two = run_halving(distribute.make_strategy("mirrored"))
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for a, b in zip(logs_one, logs_two):
        for key in ("used_rate", "value_after", "loss", "lr"):
            np.testing.assert_allclose(float(a[key]), float(b[key]), rtol=1e-12)
    # the search did halve at least once: the first rate overshoots
    assert float(logs_one[0]["used_rate"]) < 4.0
    assert [float(log["lr"]) for log in logs_one] == [float(log["used_rate"]) for log in logs_one]
    # its report is the objective at the new weights
    x, y = regression()
    model = dense()
    for v, w in zip(model.trainable_variables, one):
        v.assign(w)
    np.testing.assert_allclose(float(logs_one[-1]["value_after"]), float(MSE(y, model(x))),
                               rtol=1e-12)


def test_what_the_protocol_refuses():
    model = dense()
    with pytest.raises(ValueError, match="accumulation_steps=2 splits the batch"):
        train.make_train_step(lambda b: MSE(b[1], model(b[0])), HalvingSearch(1.0),
                              model.trainable_variables, accumulation_steps=2)
    with pytest.raises(TypeError, match="must be called first"):
        train.make_train_step(lambda b: MSE(b[1], model(b[0])), optim.adam,
                              model.trainable_variables)
    # Keras takes a negative rate; the step would ascend and log a plausible loss
    decaying = keras.optimizers.schedules.ExponentialDecay(-1e-3, 10, 0.5)
    for opt in (keras.optimizers.SGD(-0.1), keras.optimizers.Adam(decaying)):
        with pytest.raises(checks.ArgumentError, match=r"learning_rate must be >= 0, got -"):
            train.make_train_step(lambda b: MSE(b[1], model(b[0])), opt,
                                  model.trainable_variables)
    train.make_train_step(lambda b: MSE(b[1], model(b[0])), keras.optimizers.SGD(0.0),
                          model.trainable_variables)  # a rate of 0 (frozen) is allowed


def test_loss_scaling_is_refused_for_a_step_optimizer():
    with pytest.raises(TypeError, match="does not support loss scaling"):
        train.mixed_precision(HalvingSearch(1.0), "mixed_float16")
