"""The train_classifier binary end to end on tfds mock data (never a download)."""

import json

import keras
import pytest
import tensorflow_datasets as tfds

from hogrod import harness
from experiments import train_classifier as tc

TINY = ["train_classifier.steps = 6", "train_classifier.batch_size = 8",
        "train_classifier.hidden = (8,)", "train_classifier.eval_batches = 1",
        "train_classifier.checkpoint_every = 3"]


@pytest.fixture(autouse=True)
def global_policy_unchanged():
    """A run, mixed precision included, leaves Keras's global dtype policy as it found it."""
    before = keras.config.dtype_policy().name
    yield
    after = keras.config.dtype_policy().name
    keras.config.set_dtype_policy(before)  # so one failure does not cascade
    assert after == before, f"the run left the global dtype policy {after!r}, not {before!r}"


@pytest.mark.parametrize("config,extra", [
    ("configs/train/mnist_mlp.gin", []),
    ("configs/train/cnn_mixed_precision.gin", ["train_classifier.conv_filters = (4,)"]),
])
def test_runs_on_mock_data_and_writes_its_outputs(tmp_path, config, extra):
    with tfds.testing.mock_data(num_examples=64):
        _, metrics = harness.run(tc.train_classifier, [config], TINY + extra, str(tmp_path))
    assert metrics["steps"] == 6
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    for name in ("metrics.json", "operative_config.gin", "curves.png", "attribution.png"):
        assert (tmp_path / name).exists(), name
    assert "make_train_step.weights = {'l2': 1e-05}" in (tmp_path / "operative_config.gin").read_text()
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 6
    assert (tmp_path / "ckpt" / "checkpoint").exists()


def test_bad_optimizer_name_is_named():
    with tfds.testing.mock_data(num_examples=8):
        with pytest.raises(ValueError, match="train_classifier.optimizer"):
            harness.run(tc.train_classifier, ["configs/train/mnist_mlp.gin"],
                        TINY + ["train_classifier.optimizer = 'adagrad2'"], None)
