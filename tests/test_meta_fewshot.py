"""The few-shot heads in the meta-learning experiment: Snell et al.'s embedding network (its
layers and output width by hand), training episodes of their own shape (many-way, other
query counts) beside the test's, the model checked against the algorithm, and the Omniglot
configs of the heads run for two steps on small random classes in place of a data set."""

import json
import os

import keras
import numpy as np
import pytest

from hogrod import harness, meta, models


@pytest.fixture
def random_classes(monkeypatch):
    """`hogrod.meta.load_tfds_classes` giving 10 classes of 6 random 28x28 images each."""
    images = np.random.default_rng(0).integers(0, 256, size=(60, 28, 28, 1), dtype=np.uint8)
    classes = meta.ImageClasses(images, np.arange(0, 61, 6), rotations=1)
    monkeypatch.setattr(meta, "load_tfds_classes", lambda *args, **kwargs: classes)


def test_conv4_embedding_is_four_conv_batchnorm_relu_pool_blocks_giving_64_d_on_omniglot():
    net = models.conv4_embedding()
    assert net.output_shape == (None, 64)  # 28 -> 14 -> 7 -> 3 -> 1, times 64 filters
    kinds = [type(layer).__name__ for layer in net.layers]
    assert kinds == ["Conv2D", "BatchNormalization", "ReLU", "MaxPooling2D"] * 4 + ["Flatten"]
    assert all(layer.kernel_size == (3, 3) and layer.filters == 64 and layer.padding == "same"
               for layer in net.layers if isinstance(layer, keras.layers.Conv2D))
    assert models.conv4_embedding(image_size=32, filters=8).output_shape == (None, 32)  # 2x2
    with pytest.raises(ValueError, match="image_size"):
        models.conv4_embedding(image_size=8)


def test_training_episodes_have_the_training_shape_and_held_out_ones_the_test_shape(
        random_classes):
    from experiments import maml as exp
    data = exp.episode_data(0, source="mnist", n_way=2, k_shot=1, k_query=1,
                            meta_batch_size=3, eval_tasks=2, train_n_way=5, train_k_query=3,
                            also_test_n_way=(4,))
    xs, ys, xq, yq = next(iter(data.train))
    assert xs.shape == (3, 5, 28, 28, 1) and xq.shape == (3, 15, 28, 28, 1)
    for t in range(3):
        assert sorted(ys[t].numpy()) == list(range(5))
        assert np.bincount(yq[t].numpy()).tolist() == [3] * 5
    held_out = data.eval_tasks
    assert held_out[0].shape == (2, 2, 28, 28, 1) and held_out[2].shape == (2, 2, 28, 28, 1)
    assert sorted(held_out[3][0].numpy()) == [0, 1]
    assert list(data.more_eval_tasks) == ["4way"]
    assert data.more_eval_tasks["4way"][2].shape == (2, 4, 28, 28, 1)


def test_the_model_is_checked_against_the_algorithm():
    from experiments import maml as exp
    episodes = (None, np.array([[0, 1, 2]]), None, None)  # 3-way held-out episodes
    data = exp.MetaData(None, episodes, models.cross_entropy, True, 1)
    embedding = models.dense_net((4, 8, 6))
    classifier = models.dense_net((4, 8, 3))
    exp.check_model(embedding, meta.protonet, data)  # any width but the classes'
    with pytest.raises(ValueError, match="a classifier.*@conv4_embedding"):
        exp.check_model(classifier, meta.metaoptnet, data)
    with pytest.raises(ValueError, match="6 outputs but the episodes are 3-way"):
        exp.check_model(embedding, meta.maml, data)
    exp.check_model(classifier, meta.maml, data)
    with pytest.raises(ValueError, match="classification episodes"):
        exp.check_model(embedding, meta.r2d2, data._replace(classification=False))


TINY = ["episode_data.source = 'mnist'", "episode_data.train_n_way = 3",
        "episode_data.train_k_query = 2", "episode_data.n_way = 2", "episode_data.k_query = 1",
        "episode_data.also_test_n_way = (3,)", "episode_data.eval_tasks = 2",
        "episode_data.meta_batch_size = 2", "conv4_embedding.filters = 4",
        "maml_experiment.meta_iterations = 2", "maml_experiment.outer_lr_decay_every = 1"]


def test_the_omniglot_configs_of_the_heads_train_and_test_on_both_shapes(tmp_path,
                                                                        random_classes):
    import gin
    from experiments import maml as exp
    for name in ("protonet", "r2d2", "metaoptnet"):  # the protocol each config binds
        harness.parse_config([f"configs/maml/omniglot_{name}.gin"], [])
        assert gin.query_parameter("maml_experiment.algorithm").selector == name
        assert gin.query_parameter("maml_experiment.model").selector == "conv4_embedding"
        assert gin.query_parameter("episode_data.train_n_way") == 60
        assert gin.query_parameter("episode_data.train_k_query") == 5
        assert gin.query_parameter("episode_data.n_way") == 5
        assert gin.query_parameter("episode_data.also_test_n_way") == (20,)
        assert gin.query_parameter("maml_experiment.outer_lr_decay_every") == 2000
        assert gin.query_parameter("maml_experiment.eval_steps") == (0,)
        assert gin.query_parameter("maml_experiment.time_limit_s") == (
            3600 if name == "protonet" else 1800)
        gin.clear_config()
    # ProtoNet's run, tiny (the heads' steps are tested in tests/test_meta_heads.py)
    _, metrics = harness.run(exp.maml_experiment, ["configs/maml/omniglot_protonet.gin"],
                             TINY, str(tmp_path))
    assert metrics["meta_iterations"] == 2
    for key in ("accuracy_after_0", "3way/accuracy_after_0"):
        assert 0 <= metrics[key] <= 1
    with open(os.path.join(tmp_path, "eval_history.json")) as f:
        assert [h["step"] for h in json.load(f)] == [0, 2]
