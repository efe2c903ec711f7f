"""The second-order comparison binary (experiments/second_order.py) on a small stand-in for
Omniglot's zips: Omniglot's characters split by alphabet; the reported training loss is
the K-FAC paper's (sum over pixels) and one epoch of the batch schedule sees every example
once (numpy's loss of the initial model on the training set); the held-out metrics of the
initial model (numpy's); a step optimizer gets the model, its loss and the L2 coefficient;
a killed run resumes as the uninterrupted one (steps, losses, the clock continued); a
changed config is refused."""

import io
import json
import os
import zipfile

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from hogrod import harness, meta, train
from hogrod.curvature import data as curvature_data

BACKGROUND, EVALUATION, DRAWINGS = 4, 2, 20


@pytest.fixture(scope="module")
def omniglot(tmp_path_factory):
    """Omniglot's two zips in its layout: 4 background and 2 evaluation characters of 20
    drawings, each a white page with a black block of random size whose place is the
    character's."""
    root = tmp_path_factory.mktemp("omniglot")
    rng = np.random.default_rng(0)
    for name, count in (("images_background", BACKGROUND), ("images_evaluation", EVALUATION)):
        with zipfile.ZipFile(root / f"{name}.zip", "w") as z:
            for c in range(count):
                for i in range(DRAWINGS):
                    page = np.full((105, 105), 255, np.uint8)
                    top, left = 10 + 15 * c + rng.integers(0, 8), 20 + rng.integers(0, 30)
                    height, width = rng.integers(5, 40, size=2)
                    page[top:top + height, left:left + width] = 0
                    buf = io.BytesIO()
                    Image.fromarray(page).save(buf, "PNG")
                    z.writestr(f"{name}/Alphabet{c % 2}/character{c:02d}/{i:02d}.png",
                               buf.getvalue())
    return str(root), str(tmp_path_factory.mktemp("cache"))


def bindings(omniglot, task):
    data_dir, cache_dir = omniglot
    return [f"{task}.data_dir = '{data_dir}'", f"{task}.cache_dir = '{cache_dir}'"]


def test_omniglot_characters_split_by_alphabet_with_strokes_255(omniglot):
    data_dir, cache_dir = omniglot
    every = meta.omniglot_characters(data_dir, 28, "all", cache_dir)
    background = meta.omniglot_characters(data_dir, 28, "background", cache_dir)
    evaluation = meta.omniglot_characters(data_dir, 28, "evaluation", cache_dir)
    assert (len(every), len(background), len(evaluation)) == (6, BACKGROUND, EVALUATION)
    np.testing.assert_array_equal(np.stack(every), np.stack(background + evaluation))
    assert every[0].shape == (DRAWINGS, 28, 28) and every[0].dtype == np.uint8
    assert every[0][0, 0, 0] == 0 and every[0].max() == 255  # the page 0, the block 255
    with pytest.raises(ValueError, match="alphabets"):
        meta.omniglot_characters(data_dir, 28, "train", cache_dir)


def numpy_autoencoder_loss(model, x):
    """The sum over pixels of the sigmoid cross-entropy, mean over examples, float64."""
    h = x.astype(np.float64)
    dense = [layer for layer in model.layers if layer.weights]
    for i, layer in enumerate(dense):
        w, b = (np.asarray(v, np.float64) for v in layer.get_weights())
        h = h @ w + b
        if i != len(dense) - 1 and layer.activation.__name__ == "tanh":
            h = np.tanh(h)
    z = h
    per_pixel = np.maximum(z, 0) - z * x + np.log1p(np.exp(-np.abs(z)))
    return per_pixel.sum(-1).mean()


def test_the_autoencoder_reports_the_papers_loss_over_an_epoch_of_every_example(
        tmp_path, omniglot):
    """SGD at rate 1e-30 leaves the initial weights: over each epoch (80 drawings, 4
    batches of 20) the mean reported loss is numpy's on the whole training set, and the
    step-0 test loss is numpy's on the evaluation alphabets."""
    from experiments import second_order as exp
    params = bindings(omniglot, "autoencoder_task") + [
        "second_order_experiment.optimizer = @keras.optimizers.SGD",
        "keras.optimizers.SGD.learning_rate = 1e-30", "deep_autoencoder.widths = (8, 4)",
        "second_order_experiment.batch_size = 20", "second_order_experiment.max_steps = 8",
        "second_order_experiment.wall_seconds = None", "second_order_experiment.seed = 3",
        "second_order_experiment.eval_every = 4"]
    _, m = harness.run(exp.second_order_experiment, ["second_order/autoencoder.gin"], params,
                       str(tmp_path))
    data_dir, cache_dir = omniglot
    flat = lambda chars: np.concatenate(chars).reshape(-1, 784) / 255.0  # noqa: E731
    keras.utils.set_random_seed(3)
    model = exp.deep_autoencoder(widths=(8, 4))
    train_x = flat(meta.omniglot_characters(data_dir, 28, "background", cache_dir))
    test_x = flat(meta.omniglot_characters(data_dir, 28, "evaluation", cache_dir))
    expected = numpy_autoencoder_loss(model, train_x)
    losses = np.asarray(m["train_loss"])
    assert len(losses) == 8 == m["steps"] and len(set(losses[:4])) == 4
    np.testing.assert_allclose([losses[:4].mean(), losses[4:].mean()], expected, rtol=1e-5)
    assert [h["step"] for h in m["history"]] == [0, 4, 8]
    np.testing.assert_allclose(m["history"][0]["test_loss"],
                               numpy_autoencoder_loss(model, test_x), rtol=1e-5)
    seconds = m["train_wall_seconds"]
    # the first step (its tracing) is not counted
    assert seconds[0] < 0.1 and all(a < b for a, b in zip(seconds, seconds[1:]))
    assert m["train_seconds"] >= seconds[-1] and m["optimizer"] == "SGD"
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert json.loads((tmp_path / "metrics.json").read_text())["train_loss"] == m["train_loss"]


def test_the_classifier_evaluates_the_last_drawings_of_each_character(tmp_path, omniglot):
    from experiments import second_order as exp
    params = bindings(omniglot, "classifier_task") + [
        "conv4.filters = 4", "second_order_experiment.batch_size = 12",
        "second_order_experiment.max_steps = 3", "second_order_experiment.wall_seconds = None"]
    _, m = harness.run(exp.second_order_experiment, ["second_order/classifier_adam.gin"],
                       params, str(tmp_path))
    assert m["task"] == "classifier" and m["steps"] == 3 and len(m["train_loss"]) == 3
    keras.utils.set_random_seed(0)
    model = exp.conv4(image_size=28, channels=1, filters=4, n_way=BACKGROUND)
    chars = meta.omniglot_characters(omniglot[0], 28, "background", omniglot[1])
    x = np.concatenate([c[15:] for c in chars])[..., None].astype(np.float32) / 255.0
    y = np.repeat(np.arange(BACKGROUND), DRAWINGS - 15)
    # precise BatchNorm: each layer's statistics those of every training image (fewer than
    # statistics_size), set by hand, then the inference pass
    h = np.concatenate([c[:15] for c in chars])[..., None].astype(np.float32) / 255.0
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(h.mean((0, 1, 2)))
            layer.moving_variance.assign(h.var((0, 1, 2)))
        h = layer(h, training=False).numpy()
    z = model(x, training=False).numpy().astype(np.float64)
    log_p = z - z.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    first = m["history"][0]
    assert first["test_accuracy"] == pytest.approx(np.mean(np.argmax(z, -1) == y), abs=1e-6)
    assert first["test_loss"] == pytest.approx(-log_p[np.arange(len(y)), y].mean(), rel=1e-5)
    assert m["history"][-1]["step"] == 3 and 0.0 <= m["test_accuracy"] <= 1.0


GIVEN = {}


class ShrinkingStep(train.StepOptimizer):
    """A gradient step at rate / (1 + steps taken), its counter checkpointed; it evaluates
    the Keras loss of the model it was given after its update (the model and loss used)."""

    def __init__(self, model, loss, rate):
        super().__init__(name="shrinking")
        self.net, self.keras_loss, self.rate = [model], loss, rate

    def build(self, variables):
        self.count = train.state_variable(0.0, "count", tf.float32)
        self.after = train.state_variable(0.0, "after", tf.float32)
        self.built = True

    def apply(self, grads, variables, loss, batch):
        x, y = batch
        rate = self.rate / (1.0 + self.count)
        train.assign(variables, [v - rate * g for v, g in zip(variables, grads)])
        after = curvature_data.batch_loss(self.keras_loss, y, self.net[0](x, training=True))
        train.assign([self.count, self.after], [self.count + 1.0, train.replica_mean(after)])

    @property
    def learning_rate(self):
        return self.rate / self.count

    def logs(self):
        return {"loss_after": self.after}


@gin.configurable("shrinking_step", denylist=["model", "loss"])
def shrinking_step(model, loss, learning_rate=0.5, l2_reg=0.0):
    GIVEN.update(model=model, loss=loss, l2_reg=l2_reg)
    return ShrinkingStep(model, loss, learning_rate)


@gin.configurable("not_an_optimizer")
def not_an_optimizer():
    return []


class Killed(Exception):
    """Stands in for a kill."""


def test_a_killed_run_resumes_as_the_uninterrupted_one(tmp_path, omniglot, monkeypatch):
    from experiments import second_order as exp
    config = ["second_order/autoencoder.gin"]
    params = bindings(omniglot, "autoencoder_task") + [
        "second_order_experiment.optimizer = @shrinking_step", "deep_autoencoder.widths = (8, 4)",
        "second_order_experiment.batch_size = 16", "second_order_experiment.max_steps = 6",
        "second_order_experiment.wall_seconds = None", "second_order_experiment.l2_reg = 1e-3",
        "second_order_experiment.checkpoint_every = 2", "second_order_experiment.eval_every = 3"]
    _, full = harness.run(exp.second_order_experiment, config, params, str(tmp_path / "full"))
    assert isinstance(GIVEN["model"], keras.Model) and GIVEN["l2_reg"] == 1e-3
    assert isinstance(GIVEN["loss"], keras.losses.BinaryCrossentropy)
    assert GIVEN["loss"].get_config()["from_logits"]

    save = train.Checkpointer.save

    def killed_saving_step_6(self):  # the curve written, the checkpoint not: step 4's is
        if int(self.step) == 6:
            raise Killed
        return save(self)
    monkeypatch.setattr(train.Checkpointer, "save", killed_saving_step_6)
    with pytest.raises(Killed):
        harness.run(exp.second_order_experiment, config, params, str(tmp_path / "resumed"))
    monkeypatch.undo()
    saved = json.loads((tmp_path / "resumed" / exp.CURVE).read_text())["train_wall_seconds"]
    assert len(saved) == 6
    _, again = harness.run(exp.second_order_experiment, config, params, str(tmp_path / "resumed"))
    assert again["steps"] == full["steps"] == 6 == len(again["train_loss"])
    assert again["train_loss"] == full["train_loss"]  # the optimizer's counter restored too
    seconds = again["train_wall_seconds"]
    assert seconds[:4] == saved[:4] and seconds[3] <= seconds[4]  # the clock continues
    assert [h["step"] for h in again["history"]] == [0, 3, 6]
    assert again["test_loss"] == full["test_loss"]
    _, finished = harness.run(exp.second_order_experiment, config, params, str(tmp_path / "full"))
    assert finished["steps"] == 6 and finished["train_loss"] == full["train_loss"]
    assert [h["step"] for h in finished["history"]] == [0, 3, 6]  # re-evaluated, listed once
    assert finished["test_loss"] == full["test_loss"] and "train_steps_per_s" not in finished
    with pytest.raises(harness.ConfigError, match="second_order_experiment.batch_size"):
        harness.run(exp.second_order_experiment, config,
                    params + ["second_order_experiment.batch_size = 8"],
                    str(tmp_path / "resumed"))


def test_bad_budgets_and_factories_are_named(tmp_path, omniglot):
    from experiments import second_order as exp
    params = bindings(omniglot, "autoencoder_task") + ["deep_autoencoder.widths = (4,)"]
    with pytest.raises(ValueError, match="bind wall_seconds or max_steps"):
        harness.run(exp.second_order_experiment, ["second_order/autoencoder_adam.gin"], params + [
            "second_order_experiment.wall_seconds = None"], str(tmp_path / "a"))
    with pytest.raises(TypeError, match="made a list, not a Keras optimizer"):
        harness.run(exp.second_order_experiment, ["second_order/autoencoder.gin"], params + [
            "second_order_experiment.optimizer = @not_an_optimizer"], str(tmp_path / "b"))
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_the_comparison_overlays_runs_and_the_grid_binds_each_rate(tmp_path):
    """plot_second_order's table against numpy on written runs; the grid's commands parse
    against the shipped configs, one rate each."""
    from experiments import plot_second_order as plot
    from experiments import second_order, second_order_grid as grid  # noqa: F401 (configurables)
    rng = np.random.default_rng(0)
    runs = []
    for name, steps in (("a", 30), ("b", 45)):
        run = tmp_path / name
        run.mkdir()
        loss = list(rng.uniform(1, 2, steps))
        (run / "metrics.json").write_text(json.dumps({
            "task": "autoencoder", "optimizer": name, "train_loss": loss,
            "train_wall_seconds": list(np.arange(1, steps + 1) / 10)}))
        (run / "eval_history.json").write_text(json.dumps([
            {"step": 0, "seconds": 0.0, "test_loss": 3.0}, {"step": steps, "seconds": 1.0,
                                                           "test_loss": 1.5}]))
        runs.append((str(run), loss))
    rows = plot.plot_comparison([r for r, _ in runs], str(tmp_path / "c.png"), window=7)
    assert (tmp_path / "c.png").stat().st_size > 0
    for row, (_, loss) in zip(rows, runs):
        windows = [np.mean(loss[max(0, i - 6):i + 1]) for i in range(len(loss))]
        assert row[1] == len(loss) and row[2] == len(loss) / 10
        np.testing.assert_allclose(row[3:], [windows[-1], min(windows)], rtol=1e-12)
    (tmp_path / "b" / "metrics.json").write_text(json.dumps({
        "task": "classifier", "train_loss": [1.0], "train_wall_seconds": [0.1]}))
    with pytest.raises(ValueError, match="mixes tasks"):
        plot.plot_comparison([r for r, _ in runs], str(tmp_path / "d.png"))
    for optimizer in grid.GRIDS:
        command = grid.grid_command("experiments", "autoencoder", optimizer, 3e-4, 60, None,
                                    str(tmp_path / "g"))
        files = [a.split("=", 1)[1] for a in command if a.startswith("--gin_file=")]
        params = [a.split("=", 1)[1] for a in command if a.startswith("--gin_param=")]
        harness.parse_config(files, params)
        rate = gin.query_parameter(f"keras.optimizers.{grid.KERAS[optimizer]}.learning_rate")
        assert rate == 3e-4 and gin.query_parameter("second_order_experiment.wall_seconds") == 60
        with gin.unlock_config():
            gin.clear_config()
