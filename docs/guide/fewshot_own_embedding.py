"""Few-shot heads on your own embedding network: Prototypical Networks, R2D2 and
MetaOptNet-SVM on a small Keras embedding and your own episode generator.

    python docs/guide/fewshot_own_embedding.py            # 300 meta-steps per algorithm
    python docs/guide/fewshot_own_embedding.py --quick    # 3 meta-steps (HOGROD_GUIDE_QUICK=1)

Two parts, each checked against an oracle that does not use the function under test:

(a) The heads on one episode (`hogrod.meta.prototype_logits`, `ridge_logits`,
    `svm_logits`): the prototypes against numpy's class means and squared distances, the
    ridge head against numpy's primal closed form, the SVM's weights (read off its logits)
    against the optimality of its primal written in numpy, and the SVM's implicit gradient
    against float64 central differences of the solve.
(b) The algorithms `hogrod.meta.protonet`, `r2d2` and `metaoptnet` meta-trained for a few
    steps through `hogrod.meta.meta_gradient`, as MAML is: the meta-gradient against
    central differences of the meta-loss, the evaluation (`steps=(0,)`,
    `accuracy_after_0`) against the heads applied by hand, and a held-out loss that
    training lowers.

No data set is needed: the episodes are drawn from Gaussian classes whose means differ in
2 of the 8 input features, the other 6 being larger noise, so a good embedding learns to
ignore them.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hogrod import meta  # noqa: E402

FEATURES, WIDTH = 8, 16
NOISE = tf.constant([0.3, 0.3] + [1.5] * (FEATURES - 2), tf.float64)


def make_embedding():
    """Your own embedding network: any built Keras 3 model from inputs to `[batch, d]`
    (no classification layer: the head classifies). float64 makes the checks tight."""
    return keras.Sequential([
        keras.Input((FEATURES,), dtype="float64"),
        keras.layers.Dense(32, activation="tanh", dtype="float64"),
        keras.layers.Dense(WIDTH, dtype="float64"),
    ])


def cross_entropy(y_true, logits):  # Keras convention: loss(y_true, y_pred)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.cast(y_true, tf.int32), logits))


def sample_episodes(seed, tasks, n_way, k_shot, k_query):
    """Your own episode generator: a meta-batch (x_s, y_s, x_q, y_q) of N-way K-shot
    episodes, inputs `[tasks, n_way * k, FEATURES]` and labels `[tasks, n_way * k]` in
    0..n_way-1, fresh classes in every task (stateless seeds: reproducible)."""
    s = tf.random.experimental.stateless_split(tf.constant(seed, tf.int64), 3)
    means = tf.random.stateless_normal([tasks, n_way, 2], s[0], dtype=tf.float64)
    means = tf.pad(means, [[0, 0], [0, 0], [0, FEATURES - 2]])

    def draw(k, key):
        labels = tf.tile(tf.repeat(tf.range(n_way), k)[None], [tasks, 1])
        x = tf.gather(means, labels, batch_dims=1) + NOISE * tf.random.stateless_normal(
            [tasks, n_way * k, FEATURES], key, dtype=tf.float64)
        return x, labels

    xs, ys = draw(k_shot, s[1])
    xq, yq = draw(k_query, s[2])
    return xs, ys, xq, yq


# ---- (a) the heads on one episode ------------------------------------------------------------

def svm_primal(w, x, y, c):
    """The Crammer-Singer primal in numpy: 1/2 ||W||^2 + c sum_i max_k (1 - delta(k, y_i) +
    x_i w_k - x_i w_{y_i}), W `[d, n_way]`."""
    scores = x @ w
    margins = 1.0 - np.eye(w.shape[1])[y] + scores - scores[np.arange(len(y)), y][:, None]
    return 0.5 * np.sum(w * w) + c * np.sum(margins.max(axis=1))


def heads_on_one_episode(n_way=5, k_shot=2, k_query=5):
    keras.utils.set_random_seed(0)
    embed = make_embedding()
    xs, ys, xq, _ = (t[0] for t in sample_episodes([7, 0], 1, n_way, k_shot, k_query))
    es, eq = embed(xs), embed(xq)                        # [n, d] and [q, d]
    s, q, labels = es.numpy(), eq.numpy(), ys.numpy()
    one_hot = np.eye(n_way)[labels]

    # Prototypical Networks: minus the squared distance to each class mean
    proto = meta.prototype_logits(es, ys, eq, n_way)     # [q, n_way]
    means = np.stack([s[labels == k].mean(0) for k in range(n_way)])
    want = -((q[:, None, :] - means[None]) ** 2).sum(-1)
    assert np.allclose(proto, want, rtol=1e-12, atol=1e-12)

    # R2D2: ridge regression onto one-hot targets (the library solves the smaller system,
    # here the Woodbury form, n x n with n = 10 < d = 16; numpy here the primal, d x d)
    l2, scale, bias = 0.5, 2.0, 0.1
    ridge = meta.ridge_logits(es, ys, eq, n_way, l2=l2, scale=scale, bias=bias)
    weights = np.linalg.solve(s.T @ s + l2 * np.eye(WIDTH), s.T @ one_hot)
    assert np.allclose(ridge, scale * q @ weights + bias, rtol=1e-10, atol=1e-12)

    # MetaOptNet-SVM, the plain Crammer-Singer SVM (kernel_ridge=0; MetaOptNet's default
    # adds the identity to the dual's kernel). The logits are linear in the query, so
    # the unit vectors as queries read off its weights W [d, n_way].
    c = 0.1
    svm = meta.svm_logits(es, ys, eq, n_way, c=c, kernel_ridge=0.0)
    w = meta.svm_logits(es, ys, tf.eye(WIDTH, dtype=tf.float64), n_way, c=c,
                        kernel_ridge=0.0).numpy()
    assert np.allclose(svm, q @ w, rtol=1e-10, atol=1e-12)
    # W minimizes the (convex) primal: no perturbation lowers it
    rng = np.random.default_rng(0)
    best = svm_primal(w, s, labels, c)
    worst_drop = max(best - svm_primal(w + h * rng.normal(size=w.shape), s, labels, c)
                     for h in (1e-4, 1e-2) for _ in range(100))
    assert worst_drop < 1e-9 * best, (best, worst_drop)

    return {"svm_primal": best, "svm_weights": w}


# ---- (b) the algorithms, meta-trained like MAML ----------------------------------------------

def direct_logits(name, algo, model, xs, ys, xq, n_way):
    """One task's query logits from the heads applied by hand to the embeddings (the
    learned scalars, where the algorithm has them, read from `algo.variables`)."""
    es, eq = model(xs), model(xq)
    if name == "protonet":
        return meta.prototype_logits(es, ys, eq, n_way)
    if name == "r2d2":
        log_l2, scale, bias = algo.variables
        return meta.ridge_logits(es, ys, eq, n_way, l2=tf.exp(log_l2), scale=scale, bias=bias)
    return algo.variables[0] * meta.svm_logits(es, ys, eq, n_way, c=0.1, **SVM_SOLVE)


SVM_SOLVE = dict(tol=1e-12)  # tight: the central differences below see it


def meta_train(name, steps, tasks, evaluate=True, n_way=5, k_shot=2, k_query=5):
    keras.utils.set_random_seed(1)
    model = make_embedding()
    settings = SVM_SOLVE if name == "metaoptnet" else {}
    # Algorithm(meta_loss, adapt, variables, predict): R2D2's variables are [log l2, scale,
    # bias], MetaOptNet's [scale], ProtoNet's none
    algo = meta.FEW_SHOT[name](model, cross_entropy, **settings)  # task_map="vectorized"
    variables = model.trainable_variables + algo.variables
    test = sample_episodes([123, 0], tasks["test"], n_way, k_shot, k_query)
    # no adaptation steps: evaluate after 0 (a head fits the support in closed form or by
    # a convex solve); an evaluator is traced once and called before and after.
    # "sequential" (tf.map_fn over the tasks) traces faster than the default here
    if evaluate:
        evaluator = meta.evaluator(algo, model, cross_entropy, steps=(0,), accuracy=True,
                                   task_map="sequential")
        before = evaluator(test)    # {"loss_after_0", "accuracy_after_0", ...}: floats

    # the meta-gradient (through the head's solution) against central differences of the
    # meta-loss in a random direction of every variable
    loss, grads = meta.meta_gradient(algo, model, test)
    if not evaluate:  # the held-out meta-loss stands in for the evaluation's loss
        before = {"loss_after_0": float(loss)}
    assert abs(float(loss) - before["loss_after_0"]) < 1e-9 * float(loss)
    rng = np.random.default_rng(2)
    direction = [rng.normal(size=v.shape) for v in variables]
    start = [v.numpy() for v in variables]

    def loss_at(t):
        for v, v0, d in zip(variables, start, direction):
            v.assign(v0 + t * d)
        return float(algo.meta_loss(test)["loss"])

    h = 1e-5
    fd = (loss_at(h) - loss_at(-h)) / (2 * h)
    loss_at(0.0)
    directional = sum(float(np.sum(g.numpy() * d)) for g, d in zip(grads, direction))
    assert abs(directional - fd) <= 1e-6 * abs(fd), (name, directional, fd)

    # meta-training: the loop of MAML's section (make_train_step works the same way)
    optimizer = keras.optimizers.Adam(1e-2)
    for i in range(steps):
        _, grads = meta.meta_gradient(algo, model, sample_episodes(
            [0, i], tasks["train"], n_way, k_shot, k_query))
        optimizer.apply(grads, variables)
    if not evaluate:
        after = {"loss_after_0": float(algo.meta_loss(test)["loss"])}
        assert after["loss_after_0"] < before["loss_after_0"], (name, before, after)
        return {"before": before, "after": after, "directional": directional, "fd": fd}
    after = evaluator(test)

    # the evaluation is the heads applied by hand, task by task
    xs, ys, xq, yq = test
    logits = [direct_logits(name, algo, model, xs[t], ys[t], xq[t], n_way)
              for t in range(len(xs))]
    by_hand = np.mean([float(cross_entropy(yq[t], logits[t])) for t in range(len(xs))])
    accuracy = np.mean([np.mean(np.argmax(logits[t], -1) == yq[t].numpy())
                        for t in range(len(xs))])
    assert abs(after["loss_after_0"] - by_hand) < 1e-9 * by_hand, (after, by_hand)
    assert abs(after["accuracy_after_0"] - accuracy) < 1e-6, (after, accuracy)
    assert after["loss_after_0"] < before["loss_after_0"], (name, before, after)
    return {"before": before, "after": after, "directional": directional, "fd": fd}


def main(quick=False):
    heads = heads_on_one_episode()
    # quick: the meta-batch has the held-out set's shape, so one trace serves both
    steps, tasks = (3, {"train": 4, "test": 4}) if quick else (300, {"train": 16, "test": 200})
    # quick: MetaOptNet is not evaluated (its evaluator would trace the SVM's solve once more)
    results = {name: meta_train(name, steps, tasks, evaluate=not quick or name != "metaoptnet")
               for name in ("protonet", "r2d2", "metaoptnet")}
    print("fewshot: held-out 5-way 2-shot query accuracy before -> after " + "; ".join(
              f"{name} {r['before'].get('accuracy_after_0', np.nan):.3f} -> "
              f"{r['after'].get('accuracy_after_0', np.nan):.3f}"
              f" (loss {r['before']['loss_after_0']:.3f} -> {r['after']['loss_after_0']:.3f})"
              for name, r in results.items()) + f", {steps} meta-steps")
    if not quick:  # meta-training taught the embedding to ignore the noise features
        for name, r in results.items():
            assert r["after"]["accuracy_after_0"] > r["before"]["accuracy_after_0"] + 0.1, name
    return {"heads": heads, **results}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
