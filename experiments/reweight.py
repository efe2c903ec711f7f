"""Learning to reweight examples (Ren et al. 2018) on class-imbalanced digits, 4 against 9.

The training set of scikit-learn's digits (`digits_imbalanced`) holds `train_size` examples
of which a fraction `positive_fraction` (2%) are the positive class (9) and the rest the
negative one (4); a small clean validation set holds `val_per_class` of each, and the test
set is balanced, from the examples left. A small Keras classifier (`reweight_model`, one
logit) is trained with SGD on the weighted sum of per-example cross-entropies, the weights
coming from a weighting scheme chosen by gin reference (`reweight_experiment.weighting`):

- `@plain_weights`: uniform, 1/B each;
- `@class_balanced_weights`: inverse class frequency of the training set (sklearn's
  "balanced": n / (2 n_class), over B);
- `@learned_weights`: Ren et al.'s per-step weights. One lookahead SGD step (the inner
  step, at `inner_lr`) on sum_i eps_i l_i(w) from the current weights w with eps = 0, the
  gradient of the mean validation loss after it with respect to eps (hogrod.hypergrad's
  `one_step`), then w_i = max(-grad_i, 0) normalized to sum 1 (all zero: all weights 0, no
  update). At eps = 0 the lookahead leaves w unchanged, so
  grad_i = -inner_lr <d L_val(w), d l_i(w)> and the normalized weights do not depend on
  inner_lr.

    python -m experiments.reweight --gin_file=configs/reweight/learned.gin
    hogrod-reweight --gin_file=reweight/plain.gin --gin_param='reweight_experiment.num_seeds=5'

Each seed (`seed`, `seed + 1`, ... `num_seeds` of them) draws its own split and
initialization and trains in `<output_dir>/seed_<s>/` (checkpoints: a re-run with the same
--output_dir resumes each seed; a finished seed re-evaluates its final model;
train_loss.json, the per-step training loss; the seed's metrics.json). metrics.json: test error, balanced test error
and the error on each class, per seed and as mean and standard deviation over the seeds.
"""

import json
import os

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from hogrod.models import dense_net
from hogrod import checks, distribute, functional_call, harness, hypergrad, optim, train

DIGIT_CLASSES = tuple(range(10))


# ---- data -----------------------------------------------------------------------------------

def _positive_count(train_size, positive_fraction):
    """The number of positives in a training set of `train_size` with exactly that fraction."""
    checks.probability(positive_fraction, "digits_imbalanced.positive_fraction",
                       "digits_imbalanced", open_ends=True)
    n = train_size * positive_fraction
    count = int(round(n))
    if abs(n - count) > 1e-9 * train_size or count == 0 or count == train_size:
        raise ValueError(
            f"digits_imbalanced.train_size * positive_fraction = {train_size} * "
            f"{positive_fraction} = {n:g} must be a whole number of positives, at least one "
            "and fewer than train_size, so that the training set has exactly that fraction: "
            "change digits_imbalanced.train_size or digits_imbalanced.positive_fraction")
    return count


@gin.configurable
def digits_imbalanced(seed, negative=4, positive=9, positive_fraction=0.02, train_size=100,
                      val_per_class=5):
    """The imbalanced split of scikit-learn's digits, deterministic in `seed`.

    Each class's examples are shuffled with `np.random.default_rng(seed)`; the first
    `val_per_class` of each go to the validation set, then `train_size * (1 -
    positive_fraction)` negatives and `train_size * positive_fraction` positives (a whole
    number, checked) to the training set; the test set takes as many of each class as the
    class with fewer left has (balanced). Pixels are scaled to [0, 1]; labels are 1.0 for
    `positive` and 0.0 for `negative`.

    Returns:
      {"train": (x, y), "validation": (x, y), "test": (x, y)}, float32 numpy arrays.
    """
    from sklearn.datasets import load_digits  # only this data set needs scikit-learn

    negative, positive = (
        checks.integer(value, f"digits_imbalanced.{name}", "digits_imbalanced",
                       least=min(DIGIT_CLASSES), most=max(DIGIT_CLASSES))
        for name, value in (("negative", negative), ("positive", positive)))
    if negative == positive:
        raise ValueError(f"digits_imbalanced.negative and digits_imbalanced.positive are both "
                         f"{negative}; they must be two different digits")
    train_size = checks.integer(train_size, "digits_imbalanced.train_size", "digits_imbalanced",
                                least=2)
    val_per_class = checks.integer(val_per_class, "digits_imbalanced.val_per_class",
                                   "digits_imbalanced", least=1)
    n_pos = _positive_count(train_size, positive_fraction)
    n_train = {negative: train_size - n_pos, positive: n_pos}
    digits = load_digits()
    x_all = (digits.data / 16.0).astype(np.float32)
    rng = np.random.default_rng(seed)
    parts = {}
    for cls in (negative, positive):
        idx = rng.permutation(np.flatnonzero(digits.target == cls))
        need = val_per_class + n_train[cls] + 1
        if len(idx) < need:
            raise ValueError(
                f"digit {cls} has {len(idx)} examples, fewer than the {need} needed for "
                f"digits_imbalanced.val_per_class={val_per_class}, {n_train[cls]} training "
                "examples and at least one test example: lower digits_imbalanced.train_size "
                "or val_per_class")
        parts[cls] = (idx[:val_per_class], idx[val_per_class:val_per_class + n_train[cls]],
                      idx[val_per_class + n_train[cls]:])
    n_test = min(len(parts[c][2]) for c in parts)

    def take(which, limit=None):
        idx = np.concatenate([parts[c][which][:limit] for c in (negative, positive)])
        idx = rng.permutation(idx)
        return x_all[idx], (digits.target[idx] == positive).astype(np.float32)

    return {"validation": take(0), "train": take(1), "test": take(2, n_test)}


# ---- model and loss -------------------------------------------------------------------------

@gin.configurable
def reweight_model(input_dim=64, hidden=(32,), activation="relu", dtype=None):
    """A classifier with one logit: an MLP with `hidden` widths (() is logistic
    regression)."""
    checks.integer(input_dim, "reweight_model.input_dim", "reweight_model", least=1)
    if not isinstance(hidden, (tuple, list)):
        raise TypeError(f"reweight_model.hidden must be a tuple of widths ((32,); () for "
                        f"logistic regression), got {hidden!r}")
    for width in hidden:
        checks.integer(width, "every width in reweight_model.hidden", "reweight_model", least=1)
    return dense_net((input_dim, *tuple(hidden), 1), activation, dtype=dtype)


def per_example_loss(model):
    """`loss(params, x, y) -> [B]`: the sigmoid cross-entropy of each example of the model
    with `params` substituted for its trainable weights (hogrod.functional_call)."""
    def loss(params, x, y):
        return _cross_entropy(functional_call(model, params, x, training=True)[:, 0], y)

    return loss


def _cross_entropy(logits, y):
    return tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(y, logits.dtype), logits)


# ---- weighting schemes ----------------------------------------------------------------------
# Each is `weights(per_example_loss, params, batch, validation, class_counts) -> [B]`, with
# `per_example_loss(params, x, y) -> [B]`, `batch` and `validation` pairs (x, y) and
# `class_counts` the training set's (negatives, positives); the training loss is
# sum_i weights_i * l_i.

_SCHEME_ARGS = ["per_example_loss", "params", "batch", "validation", "class_counts"]


@gin.configurable(denylist=_SCHEME_ARGS)
def plain_weights(per_example_loss, params, batch, validation, class_counts):
    """Uniform: 1/B each (the mean loss)."""
    y = batch[1]
    n = tf.cast(tf.shape(y)[0], params[0].dtype)
    return tf.ones(tf.shape(y), params[0].dtype) / n


@gin.configurable(denylist=_SCHEME_ARGS)
def class_balanced_weights(per_example_loss, params, batch, validation, class_counts):
    """Inverse class frequency: n / (2 n_class) / B, n and n_class counted on the training
    set (each class then carries half the expected loss)."""
    dtype = params[0].dtype
    y = tf.cast(batch[1], dtype)
    counts = tf.convert_to_tensor(class_counts, dtype)
    total = counts[0] + counts[1]
    per_class = total / (2.0 * counts)
    n = tf.cast(tf.shape(y)[0], dtype)
    return (y * per_class[1] + (1.0 - y) * per_class[0]) / n


@gin.configurable(denylist=_SCHEME_ARGS)
def learned_weights(per_example_loss, params, batch, validation, class_counts,
                    inner_lr=0.1):
    """Ren et al. (2018), Algorithm 1: per-example weights from one lookahead SGD step.

    eps = 0 (one per example); w1 = w - inner_lr * d/dw sum_i eps_i l_i(w); g = d
    L_val(w1) / d eps (hogrod.hypergrad.hypergradient with one_step(sgd)); weights =
    max(-g, 0) / sum max(-g, 0), or all 0 if that sum is 0.
    """
    checks.positive(inner_lr, "learned_weights.inner_lr", "learned_weights")
    x, y = batch
    x_val, y_val = validation
    eps = tf.zeros(tf.shape(y), params[0].dtype)

    def inner(p, e):
        return tf.reduce_sum(e * per_example_loss(p, x, y))

    def outer(p, e):
        return tf.reduce_mean(per_example_loss(p, x_val, y_val))

    method = hypergrad.one_step(optim.sgd(inner_lr))
    grads = hypergrad.hypergradient(inner, outer, list(params), eps, method).grads
    positive = tf.maximum(-grads, 0.0)
    total = tf.reduce_sum(positive)
    # Ren et al.'s normalization: divide by the sum, or by 1 when every weight is 0
    return positive / (total + tf.cast(tf.equal(total, 0.0), total.dtype))


# ---- training and evaluation ----------------------------------------------------------------

def _check_split(split):
    if not isinstance(split, dict) or set(split) != {"train", "validation", "test"}:
        raise TypeError("reweight_experiment.data must return {'train': (x, y), 'validation': "
                        f"(x, y), 'test': (x, y)}}, got {type(split).__name__}"
                        + (f" with keys {sorted(split)}" if isinstance(split, dict) else ""))
    for name, (x, y) in split.items():
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"reweight_experiment.data: the {name} set has {len(x)} inputs "
                             f"and {len(y)} labels; it needs as many of each, at least one")
        if not set(np.unique(y)) <= {0.0, 1.0}:
            raise ValueError(f"reweight_experiment.data: the {name} labels must be 0 or 1, "
                             f"got {sorted(set(np.unique(y)))[:5]}")


def class_errors(logits, y):
    """(error, balanced error, error on negatives, error on positives) of logits > 0."""
    pred = tf.cast(logits > 0, y.dtype)
    wrong = tf.cast(tf.not_equal(pred, y), tf.float32)
    pos = tf.cast(y > 0.5, tf.float32)
    err_pos = tf.reduce_sum(wrong * pos) / tf.maximum(tf.reduce_sum(pos), 1.0)
    err_neg = tf.reduce_sum(wrong * (1 - pos)) / tf.maximum(tf.reduce_sum(1 - pos), 1.0)
    return tf.reduce_mean(wrong), (err_pos + err_neg) / 2, err_neg, err_pos


def _probe(weighting, example_losses, model, batch, validation, counts, dtype):
    """Run the weighting once eagerly: its own checks raise here, with their message,
    rather than wrapped in a tf.function's StagingError on the first step; and its output
    must be one finite weight per example."""
    batch = tuple(tf.constant(a, dtype) for a in batch)
    params = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
    weights = tf.convert_to_tensor(weighting(example_losses, params, batch, validation, counts))
    name = getattr(weighting, "__name__", repr(weighting))
    if weights.shape != batch[1].shape:
        raise ValueError(f"reweight_experiment.weighting ({name}) returned weights of shape "
                         f"{weights.shape} for a batch of {batch[1].shape[0]} examples; it must "
                         "return one weight per example")
    if not np.all(np.isfinite(weights.numpy())):
        raise ValueError(f"reweight_experiment.weighting ({name}) returned non-finite weights "
                         "at the initial model")


def _read_losses(path, upto_step):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in json.load(f) if r["step"] <= upto_step]


def train_one_seed(output_dir, seed, weighting, data, model_fn, steps, batch_size,
                   learning_rate, momentum, checkpoint_every):
    """Train and evaluate one seed in `output_dir`; its test metrics as a dict."""
    keras.utils.set_random_seed(seed)
    split = data(seed)
    _check_split(split)
    x_tr, y_tr = split["train"]
    if batch_size > len(x_tr):
        raise ValueError(f"reweight_experiment.batch_size={batch_size} exceeds the "
                         f"{len(x_tr)} training examples")
    model = model_fn()
    dtype = model.trainable_variables[0].dtype
    example_losses = per_example_loss(model)
    validation = tuple(tf.constant(a, dtype) for a in split["validation"])
    x_te, y_te = (tf.constant(a, dtype) for a in split["test"])
    counts = np.array([np.sum(y_tr == 0), np.sum(y_tr == 1)], np.float64)

    def loss_terms(batch):
        x, y = batch
        params = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
        weights = tf.stop_gradient(weighting(example_losses, params, (x, y), validation, counts))
        losses = _cross_entropy(model(x, training=True)[:, 0], y)
        return {"weighted": tf.reduce_sum(weights * losses),
                "monitor/train_loss": tf.reduce_mean(losses),
                "monitor/positive_weight": tf.reduce_sum(weights * tf.cast(y, weights.dtype))}

    _probe(weighting, example_losses, model, (x_tr[:batch_size], y_tr[:batch_size]), validation,
           counts, dtype)
    optimizer = keras.optimizers.SGD(learning_rate, momentum=momentum)
    step = train.make_train_step(loss_terms, optimizer, model.trainable_variables)
    stream = (tf.data.Dataset.from_tensor_slices((x_tr.astype(dtype), y_tr.astype(dtype)))
              .shuffle(len(x_tr), seed=seed, reshuffle_each_iteration=True).repeat()
              .batch(batch_size, drop_remainder=True))
    iterator = iter(distribute.without_autotune(stream))
    ckpt = train.Checkpointer(output_dir, model=model, optimizer=optimizer, data=iterator)
    path = os.path.join(output_dir, "train_loss.json")
    history = _read_losses(path, ckpt.latest_step())

    def record(i, logs):
        history.append({"step": i, "train_loss": logs["monitor/train_loss"],
                        "weighted_loss": logs["loss"],
                        "positive_weight": logs["monitor/positive_weight"]})
        if i % checkpoint_every == 0 or i == steps:
            train.write_json(path, history)

    harness.started(output_dir, ckpt)
    stats = {}
    train.train_loop(step, iterator, steps, ckpt, output_dir, checkpoint_every=checkpoint_every,
                     log_every=max(steps // 4, 1), callback=record, stats=stats)

    # one call per seed: eager (a tf.function per seed's model would only add a trace)
    err, balanced, err_neg, err_pos = (float(v) for v in class_errors(model(x_te)[:, 0], y_te))
    result = {"test_error": err, "balanced_test_error": balanced,
              "test_error_negative": err_neg, "test_error_positive": err_pos,
              "steps": int(ckpt.step), "train_examples": len(x_tr),
              "train_positives": int(counts[1]), "test_examples": int(x_te.shape[0]), **stats}
    if history:
        result["final_train_loss"] = history[-1]["train_loss"]
    # the seed's own metrics.json keeps an earlier run's training stats when this one trained
    # nothing (a finished seed re-evaluated)
    harness.write_metrics(output_dir, result, resumed=True)
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return json.load(f)


@gin.configurable
def reweight_experiment(output_dir, weighting=gin.REQUIRED, data=digits_imbalanced,
                        model=reweight_model, steps: harness.Count = 1000,
                        batch_size: harness.PositiveInt = 50,
                        learning_rate: harness.Positive = 0.1, momentum: harness.Fraction = 0.9,
                        num_seeds: harness.PositiveInt = 1, seed: harness.Count = 0,
                        checkpoint_every: harness.PositiveInt = 500):
    """Train with `weighting` for `num_seeds` seeds and report test errors.

    Args:
      weighting: `@plain_weights`, `@class_balanced_weights` or `@learned_weights` (any
        function of their signature, see above).
      data: `data(seed) -> {"train", "validation", "test"}` of (x, y) pairs
        (`@digits_imbalanced`).
      model: builds the Keras classifier (one logit).
      steps, batch_size, learning_rate, momentum: SGD on the weighted loss.
      num_seeds: seeds seed, seed + 1, ..., each in `<output_dir>/seed_<s>`.
    """
    if not callable(weighting):
        raise TypeError("reweight_experiment.weighting must be a weighting function "
                        "(@plain_weights, @class_balanced_weights, @learned_weights), got "
                        f"{weighting!r}")
    for name, value in (("steps", steps), ("batch_size", batch_size),
                        ("num_seeds", num_seeds), ("checkpoint_every", checkpoint_every)):
        checks.integer(value, f"reweight_experiment.{name}", "reweight_experiment", least=1)
    checks.positive(learning_rate, "reweight_experiment.learning_rate", "reweight_experiment")
    checks.number(momentum, "reweight_experiment.momentum", "reweight_experiment", 0.0, 1.0,
                  high_open=True)
    per_seed = []
    for s in range(seed, seed + num_seeds):
        logging.info("seed %d", s)
        result = train_one_seed(os.path.join(output_dir, f"seed_{s}"), s, weighting, data,
                                model, steps, batch_size, learning_rate, momentum,
                                checkpoint_every)
        per_seed.append(dict(result, seed=s))
        logging.info("seed %d: test error %.4f (negatives %.4f, positives %.4f)", s,
                     result["test_error"], result["test_error_negative"],
                     result["test_error_positive"])
    metrics = {"weighting": getattr(weighting, "__name__", repr(weighting)),
               "num_seeds": num_seeds, "steps": steps, "per_seed": per_seed}
    for key in ("test_error", "balanced_test_error", "test_error_negative",
                "test_error_positive"):
        values = np.array([r[key] for r in per_seed])
        metrics[f"{key}_mean"] = float(values.mean())
        metrics[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return metrics


def main():
    """The console command `hogrod-reweight` (see the module docstring)."""
    harness.main(reweight_experiment)


if __name__ == "__main__":
    main()
