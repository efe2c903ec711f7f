"""The few-shot algorithms (ProtoNet, R2D2, MetaOptNet) against oracles: their meta-loss,
evaluation and meta-gradient against the heads applied by hand and float64 central
differences of the objective written out in numpy, one mirrored step, bad labels named.
In the meta-learning experiment: Snell et al.'s embedding network (its layers and output
width by hand), training episodes of their own shape (many-way, other query counts) beside
the test's, the model checked against the algorithm, and the Omniglot configs of the heads
run for two steps on small random classes in place of a data set."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from heads_fixtures import (augmented, cross_entropy, embedding_net, one_hot, svm_primal,
                            tiny_episodes)

from hogrod import checks, distribute, harness, meta, models, train
from hogrod.meta import heads


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


def direct_logits(name, model, xs, ys, xq, n_way):
    es, eq = model(xs), model(xq)
    if name == "protonet":
        return heads.prototype_logits(es, ys, eq, n_way)
    if name == "r2d2":  # the starting values bound below
        return heads.ridge_logits(es, ys, eq, n_way, l2=0.5, scale=3.0, bias=0.25)
    return 2.0 * heads.svm_logits(es, ys, eq, n_way, c=0.2)


def numpy_embed(values, x):
    return np.tanh(x @ values[0] + values[1]) @ values[2] + values[3]


def numpy_meta_loss(name, values, tasks, active=None):
    """The few-shot objective in numpy (float64): the embedding net's forward pass, the head
    in closed form (the SVM by its primal on the augmented embeddings, on each task's
    active set `active[t]`), the queries' mean cross-entropy averaged over the tasks."""
    losses = []
    for t, (xs, ys, xq, yq) in enumerate(zip(*tasks)):
        es, eq, y = numpy_embed(values, xs), numpy_embed(values, xq), one_hot(ys, 3)
        if name == "protonet":
            means = y.T @ es / y.sum(0)[:, None]
            logits = -((eq[:, None] - means[None]) ** 2).sum(-1)
        elif name == "r2d2":
            log_l2, scale, bias = values[4:]
            w = es.T @ np.linalg.solve(es @ es.T + np.exp(log_l2) * np.eye(len(es)), y)
            logits = scale * eq @ w + bias
        else:
            w = svm_primal(augmented(es, 1.0), ys, 3, 0.2, active[t])[0][:, :es.shape[1]]
            logits = values[4] * eq @ w.T
        top = logits.max(-1)
        lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
        losses.append(np.mean(lse - logits[np.arange(len(yq)), yq]))
    return np.mean(losses)


SETTINGS = {"protonet": {}, "r2d2": dict(l2=0.5, scale=3.0, bias=0.25),
            "metaoptnet": dict(c=0.2, scale=2.0)}


NAMES = ["protonet", "r2d2", "metaoptnet"]
# one algorithm vectorized (the default), the others sequentially: traces are the cost
MODES = {"protonet": "sequential", "r2d2": "vectorized", "metaoptnet": "sequential"}


@pytest.fixture(scope="module")
def meta_gradients():
    """Each head's (model, algorithm, meta-loss, meta-gradient) on `tiny_episodes()`."""
    out = {}
    for name in NAMES:
        model = embedding_net()
        algo = meta.FEW_SHOT[name](model, cross_entropy, task_map=MODES[name],
                                   **SETTINGS[name])
        out[name] = (model, algo) + tuple(meta.meta_gradient(algo, model, tiny_episodes()))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_few_shot_meta_loss_and_evaluation_equal_the_heads_on_the_embeddings(
        name, meta_gradients):
    tasks = tiny_episodes()
    mode = MODES[name]
    model, algo, loss, grads = meta_gradients[name]
    per_task = [direct_logits(name, model, *(t[i] for t in tasks[:3]), 3) for i in range(2)]
    want = np.mean([cross_entropy(tasks[3][i], per_task[i]).numpy() for i in range(2)])
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-7)
    learned = {"protonet": 0, "r2d2": 3, "metaoptnet": 1}[name]
    assert len(algo.variables) == learned
    # the meta-gradient (backbone and the head's learned scalars) against float64 central
    # differences of the objective written out in numpy
    values = [v.numpy() for v in model.trainable_variables + algo.variables]
    arrays = [t.numpy() for t in tasks]
    active = ([svm_primal(augmented(numpy_embed(values, x), 1.0), y, 3, 0.2)[1]
               for x, y in zip(arrays[0], arrays[1])] if name == "metaoptnet" else None)
    np.testing.assert_allclose(numpy_meta_loss(name, values, arrays, active), want,
                               rtol=1e-7)
    flat = np.concatenate([np.ravel(v) for v in values])

    def objective(z):
        parts = np.split(z, np.cumsum([v.size for v in values])[:-1])
        return numpy_meta_loss(name, [p.reshape(v.shape) for p, v in zip(parts, values)],
                               arrays, active)

    h = 1e-6
    fd = np.array([(objective(flat + h * e) - objective(flat - h * e)) / (2 * h)
                   for e in np.eye(flat.size)])
    got = np.concatenate([np.ravel(g.numpy()) for g in grads])
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-7)
    # not trivially zero: the backbone's part, and each learned scalar's but R2D2's bias
    # (the softmax is invariant to a shift of every logit)
    assert np.abs(fd[:flat.size - learned]).max() > 1e-3
    assert np.all(np.abs(fd[flat.size - learned:][:2]) > 1e-6)
    result = meta.evaluate(algo, model, cross_entropy, tasks, steps=(0,), accuracy=True,
                           task_map=mode)
    accuracy = np.mean([np.mean(np.argmax(per_task[i], -1) == tasks[3][i].numpy())
                        for i in range(2)])
    np.testing.assert_allclose(result["loss_after_0"], want, rtol=1e-7)
    np.testing.assert_allclose(result["accuracy_after_0"], accuracy, rtol=1e-7)
    with pytest.raises(checks.ArgumentError, match=r"steps=\(0,\)"):
        algo.adapt((tasks[0][0], tasks[1][0]), 1)


def test_mirrored_step_is_the_sgd_step_on_the_meta_gradient(meta_gradients):
    # one compiled step for the three heads, each on its own backbone (the sum of their
    # objectives), one task per replica: learned scalars all-reduced (R2D2, MetaOptNet),
    # the SVM's implicit solve in each replica; the meta-gradients checked above
    strategy = distribute.make_strategy("mirrored")
    with strategy.scope():
        opt = keras.optimizers.SGD(0.5)  # exact in float32, Keras's rate dtype
        models = [embedding_net() for _ in NAMES]
        algos = [meta.FEW_SHOT[name](model, cross_entropy, task_map=MODES[name],
                                     **SETTINGS[name]) for name, model in zip(NAMES, models)]
    groups = [m.trainable_variables + a.variables for m, a in zip(models, algos)]
    step = train.make_train_step(
        lambda t: {"loss": tf.add_n([a.meta_loss(t)["loss"] for a in algos])}, opt,
        [v for g in groups for v in g], strategy=strategy)
    data = tf.data.Dataset.from_tensors(tiny_episodes()).unbatch().batch(2)
    step(next(iter(distribute.distribute_dataset(strategy, data))))
    for name, group in zip(NAMES, groups):
        model, algo, _, grads = meta_gradients[name]
        want = [v.numpy() - 0.5 * g.numpy()
                for v, g in zip(model.trainable_variables + algo.variables, grads)]
        for v, w in zip(group, want):
            np.testing.assert_allclose(v.numpy(), w, rtol=1e-9, atol=1e-10, err_msg=name)


def test_r2d2_learns_its_penalty_on_the_log_scale_and_checks_its_starting_values():
    model = embedding_net()
    algo = meta.r2d2(model, cross_entropy, l2=0.5)
    np.testing.assert_allclose(algo.variables[0].numpy(), np.log(0.5), rtol=1e-15)
    assert algo.variables[0].dtype == tf.float64
    with pytest.raises(checks.ArgumentError, match="l2"):
        meta.r2d2(model, cross_entropy, l2=0.0)
    with pytest.raises(checks.ArgumentError, match="c must"):
        meta.metaoptnet(model, cross_entropy, c=-1.0)
    with pytest.raises(checks.ArgumentError, match="task_map"):
        meta.protonet(model, cross_entropy, task_map="parallel")


def test_a_task_missing_a_class_is_named_by_the_algorithm():
    model = embedding_net()
    xs, ys, xq, yq = tiny_episodes()
    ys = tf.constant([[0, 1, 2, 0, 1, 2], [0, 1, 1, 0, 1, 0]], tf.int32)  # task 1: no class 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="no support example"):
        meta.protonet(model, cross_entropy).meta_loss((xs, ys, xq, yq))
    # no task's support holds class 2, a query does: an error naming the query labels and
    # the number of classes, not a 2-way head
    ys = tf.constant([[0, 1, 1, 0, 1, 0]] * 2, tf.int32)
    pattern = (r"protonet: the query labels \(tasks\[3\]\) must be in 0..n_way-1.*"
               r"\[n_way =\] \[2\] \[query labels from\] \[{}\] \[to\] \[{}\]")
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern.format(0, 2)) as e:
        meta.protonet(model, cross_entropy).meta_loss((xs, ys, xq, yq))
    assert "Tensor(" not in str(e.value) and "no support example" not in str(e.value)
    # a negative query label, in each algorithm (it reached the loss's own error)
    ys, yq = tiny_episodes()[1], tf.tensor_scatter_nd_update(yq, [[1, 2]], [-1])
    for name in ("r2d2", "metaoptnet"):
        with pytest.raises(tf.errors.InvalidArgumentError, match=name + ": the query labels"):
            meta.FEW_SHOT[name](model, cross_entropy).meta_loss((xs, ys, xq, yq))


def dropout_net():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((6,), dtype="float64"),
                             keras.layers.Dense(8, activation="tanh", dtype="float64"),
                             keras.layers.Dropout(0.5, dtype="float64"),
                             keras.layers.Dense(5, dtype="float64")])


def test_the_heads_evaluation_takes_the_support_pass_seed_from_the_evaluation_seed():
    from hogrod.meta.inner import evaluation_seeds, run
    model = dropout_net()
    tasks = tiny_episodes()
    algo = meta.protonet(model, cross_entropy, task_map="sequential")
    evaluate = meta.evaluator(algo, model, cross_entropy, steps=(0,), task_map="sequential",
                              seed=3)
    first = evaluate(tasks)["loss_after_0"]
    algo.meta_loss(tasks)  # moves the model's seed states, which evaluation never reads
    assert evaluate(tasks)["loss_after_0"] == first
    # the masks by hand: the query pass takes the task's pass 0, the support pass its pass 1
    seeds = evaluation_seeds(model, 2, 2, 3)
    params = model.trainable_variables
    want = np.mean([cross_entropy(tasks[3][t], heads.prototype_logits(
        run(model, params, tasks[0][t], True, seeds[t, 1]), tasks[1][t],
        run(model, params, tasks[2][t], True, seeds[t, 0]), 3)).numpy() for t in range(2)])
    np.testing.assert_allclose(first, want, rtol=1e-12)
    with pytest.raises(checks.ArgumentError, match="support pass"):
        algo.adapt((tasks[0][0], tasks[1][0]), 0, seeds[0, :0])
