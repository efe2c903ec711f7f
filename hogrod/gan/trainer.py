"""The GAN trainer: its loss and regularizers chosen by gin reference.

    step = make_gan_step(generator, critic, critic_optimizer, generator_optimizer, latent_dim,
                         loss=relativistic_loss,
                         critic_penalties=[(r1_penalty, 0.1, 1), (r2_penalty, 0.1, 1)],
                         n_critic=1)
    logs = step(next(grouped(batches, step.n_critic)))

In gin (`configs/gan/`):

    make_gan_step.loss = @nonsaturating_loss
    make_gan_step.critic_penalties = [(@r1_penalty, 0.1, 16)]         # lazy R1
    make_gan_step.generator_penalties = [(@path_length_penalty(), 2.0, 4)]

One call of `step(real_batches)` runs `n_critic` critic updates, each on its own fresh
batch, then one generator update on the last batch, all in one compiled function
(`jit_compile`: XLA when it compiles, see `hogrod.train.compiled`). Each update is a
`hogrod.train.make_train_step` step (named terms, weights, NaN guard, strategies):

- the critic minimizes ``loss(D(real), D(fake)).critic + sum_k weight_k * penalty_k``, each
  critic penalty `penalty(critic, real, fake, *, noise)` (`hogrod.gan.penalties`,
  `consistency_penalty`) computed every `lazy_every` critic updates and multiplied by it
  (`lazy_term`, on the critic optimizer's `iterations`);
- the generator minimizes ``loss(D(real), D(fake)).generator + sum_k weight_k * value_k``,
  each generator penalty a `GeneratorPenalty` (`path_length_penalty()`,
  `latent_consistency_penalty()`) on the generator and the step's latent codes, lazy on the
  generator optimizer's `iterations`, its state kept in variables (`step.generator_state`,
  checkpoint it) and unchanged on the steps it skips. The critic scores the real batch in
  the generator step too: the relativistic loss's generator term needs D(real) (a loss that
  ignores it costs nothing: the unused scores are pruned from the compiled step);
- every `SpectralNormalization` layer of the critic advances its power iteration once per
  critic update, before it (the generator's once per generator update), however many times
  the update calls the critic.

A batch is the real samples, or a dict {"real": x, "z": latent codes, and the penalties'
noise: `NOISE_KEYS` for the critic penalties, `GENERATOR_NOISE_KEYS` for the generator's}
(`with_noise`), which carries the step's random numbers with the data: under a
tf.distribute strategy every replica then draws nothing itself and the distributed step
equals the single-device one; a resumed run draws what an uninterrupted one would.
"""

import inspect
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import gin
import keras
import tensorflow as tf

from hogrod import checks, train
from hogrod.gan import lazy, losses, penalties, spectral
from hogrod.gan.generator_penalties import GENERATOR_NOISE_KEYS
from hogrod.types import Batch

__all__ = ["make_gan_step", "grouped", "with_noise"]

_LOSSES = "wasserstein_loss, nonsaturating_loss, relativistic_loss, saturating_loss"


def _signature_takes(fn, args, kwargs):
    """Whether `fn`'s signature binds these arguments (True where it cannot be read)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or extension: nothing to check
        return True
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def _checked_loss(loss, where):
    if not callable(loss):
        raise checks.ArgumentError(f"{where} must be a GAN loss function ({_LOSSES} or your "
                                   f"own), got {type(loss).__name__} {loss!r}; bind one by "
                                   f"reference, e.g. {where} = @nonsaturating_loss")
    if not _signature_takes(loss, ("real_scores", "fake_scores"), {}):
        raise TypeError(f"{where}: {getattr(loss, '__name__', loss)!s} must take (real_scores, "
                        "fake_scores) and return GanLosses(critic, generator) (see "
                        "hogrod.gan.losses)")
    return loss


def _checked_critic_penalty(penalty, where):
    if not callable(penalty) or isinstance(penalty, type):
        raise checks.ArgumentError(
            f"{where}: the penalty must be a critic penalty function, got "
            f"{type(penalty).__name__} {penalty!r}; bind one by reference, e.g. "
            f"(@r1_penalty, 0.1, 1)")
    if not _signature_takes(penalty, ("critic", "real", "fake"), {"noise": {}}):
        raise TypeError(f"{where}: {getattr(penalty, '__name__', penalty)!s} must take "
                        "(critic, real, fake, *, noise) (see hogrod.gan.penalties)")
    return penalty


def _checked_generator_penalty(penalty, where):
    if not (callable(getattr(penalty, "init", None)) and callable(getattr(penalty, "apply", None))):
        hint = (" (a factory: bind its evaluated reference, @path_length_penalty() with the "
                "parentheses)" if callable(penalty) else "")
        raise checks.ArgumentError(f"{where}: the penalty must be a GeneratorPenalty(init, "
                                   f"apply), got {type(penalty).__name__} {penalty!r}{hint}")
    return penalty


def _penalty_name(penalty):
    fn = getattr(penalty, "apply", penalty)  # a GeneratorPenalty is named by its factory
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "penalty"
    return name.split(".")[0].strip("<>") or "penalty"


def _regularizers(entries, where, check):
    """[(name, penalty, weight, lazy_every)] from a list of (penalty, weight, lazy_every)."""
    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        raise checks.ArgumentError(f"{where} must be a list of (penalty, weight, lazy_every) "
                                   f"triples, got {type(entries).__name__} {entries!r}")
    out, seen = [], {}
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise checks.ArgumentError(f"{at} must be a (penalty, weight, lazy_every) triple, "
                                       f"e.g. (@r1_penalty, 0.1, 1), got {entry!r}")
        penalty = check(entry[0], at)
        weight = checks.nonnegative(entry[1], "weight", at)
        every = checks.integer(entry[2], "lazy_every", at, least=1)
        name = _penalty_name(penalty)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:  # the same penalty twice (other hyperparameters): its own term
            name = f"{name}_{seen[name]}"
        out.append((name, penalty, weight, every))
    if "adversarial" in seen:
        raise checks.ArgumentError(f"{where}: a penalty named 'adversarial' would hide the "
                                   "loss's term in the logs; rename it")
    return out


def _counter(optimizer, who, regularizers):
    """The optimizer's update counter, which lazy regularization reads (0 if none is lazy)."""
    if all(every == 1 for *_, every in regularizers):
        return lambda: 0
    if getattr(optimizer, "iterations", None) is None:
        raise checks.ArgumentError(
            f"make_gan_step: lazy_every > 1 in {who}_penalties needs the {who} optimizer's "
            f"update counter `iterations` (a Keras optimizer's); got "
            f"{type(optimizer).__name__}")
    return lambda: optimizer.iterations


def _scores(critic: keras.Model, x: tf.Tensor) -> tf.Tensor:
    # half precision is reduced in float32; float64 stays float64
    s = critic(x, training=True)
    if s.dtype in (tf.float16, tf.bfloat16):
        s = tf.cast(s, tf.float32)
    return tf.reshape(s, [-1])


def _game(loss, critic, real, fake):
    out = loss(_scores(critic, real), _scores(critic, fake))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"make_gan_step.loss must return GanLosses(critic, generator), got "
                        f"{type(out).__name__}")
    return losses.GanLosses(*out)


def _merged(first, later):
    """One critic update's logs for the call: each value the first non-finite one of the
    call's updates, else the last's (so the training loop's guard sees any bad update);
    "applied" 1 only if every update was applied."""
    out = {}
    for k, v in later.items():
        if k == "applied":
            out[k] = first[k] * v
        else:
            out[k] = tf.where(tf.math.is_finite(first[k]), v, first[k])
    return out


def _generator_state(generator, regularizers, strategy):
    """A `tf.Module` whose `penalties` are {name: {key: variable}}, each generator
    penalty's state from its `init` at the generator's dtype, made in `strategy`'s scope."""
    dtype = tf.as_dtype(generator.trainable_variables[0].dtype)
    module = tf.Module(name="generator_penalty_state")
    with strategy.scope():
        module.penalties = {
            name: {key: train.state_variable(value, f"{name}_{key}")
                   for key, value in penalty.init(dtype).items()}
            for name, penalty, _, _ in regularizers}
    return module


def _unpack(batch, latent_dim):
    """(real, z, the critic penalties' noise, the generator penalties' noise) of a batch."""
    if not isinstance(batch, dict):
        batch = {"real": batch}
    if "real" not in batch:
        raise ValueError(f"a batch dict needs the key 'real' (and optionally 'z' and the "
                         f"penalties' noise, see with_noise); got keys {sorted(batch)}")
    unknown = sorted(set(batch) - {"real", "z"} - set(penalties.NOISE_KEYS)
                     - set(GENERATOR_NOISE_KEYS))
    if unknown:
        raise ValueError(f"unknown batch key(s) {unknown}: a batch holds 'real', 'z' and the "
                         f"penalties' noise {penalties.NOISE_KEYS + GENERATOR_NOISE_KEYS}")
    real = batch["real"]
    z = batch.get("z")
    if z is None:
        z = tf.random.normal([tf.shape(real)[0], latent_dim], dtype=real.dtype)
    pick = lambda keys: {k: batch[k] for k in keys if k in batch}  # noqa: E731
    return real, z, pick(penalties.NOISE_KEYS), pick(GENERATOR_NOISE_KEYS)


def _term_dtype(real):  # one dtype on both branches of a lazy cond
    return tf.float64 if real.dtype == tf.float64 else tf.float32


def _objectives(generator, critic, loss, latent_dim, critic_side, generator_side, state):
    """The critic's and the generator's objectives, `batch -> {term: scalar}`; each side a
    pair (regularizers, update counter); `state` the generator penalties' variables."""
    (critic_regs, critic_count), (generator_regs, generator_count) = critic_side, generator_side

    def sampler(dtype):
        return lambda w: tf.cast(generator(w, training=True), dtype)

    def critic_terms(batch):
        real, z, noise, _ = _unpack(batch, latent_dim)
        fake = sampler(real.dtype)(z)
        terms = {"adversarial": _game(loss, critic, real, fake).critic}
        for name, penalty, _, every in critic_regs:
            terms[name] = lazy.lazy_term(
                lambda p=penalty: p(critic, real, fake, noise=noise), critic_count(), every,
                _term_dtype(real))
        return terms

    def generator_terms(batch):
        real, z, _, noise = _unpack(batch, latent_dim)
        sample = sampler(real.dtype)
        terms = {"adversarial": _game(loss, critic, real, sample(z)).generator}
        for name, penalty, _, every in generator_regs:
            variables = state[name]
            before = {k: tf.convert_to_tensor(v) for k, v in variables.items()}
            terms[name], after = lazy.lazy_term(
                lambda p=penalty, s=before: p.apply(sample, z, s, noise=noise),
                generator_count(), every, _term_dtype(real), state=before)
            keys = sorted(variables)
            if keys:  # written in the step: the lazy term kept it on the skipped steps
                train.assign([variables[k] for k in keys], [after[k] for k in keys])
        return terms

    return critic_terms, generator_terms


@gin.configurable(denylist=["generator", "critic", "critic_optimizer", "generator_optimizer"])
def make_gan_step(generator: keras.Model, critic: keras.Model,
                  critic_optimizer: keras.optimizers.Optimizer,
                  generator_optimizer: keras.optimizers.Optimizer, latent_dim: int,
                  loss: Callable[..., losses.GanLosses] = losses.wasserstein_loss,
                  critic_penalties: Optional[Sequence[tuple]] = (
                      (penalties.gradient_penalty, 10.0, 1),),
                  generator_penalties: Optional[Sequence[tuple]] = (),
                  n_critic: int = 5, strategy: Optional[tf.distribute.Strategy] = None,
                  jit_compile: Union[bool, str] = "auto"
                  ) -> Callable[[Sequence[Batch]], dict[str, tf.Tensor]]:
    """Build the GAN step: `n_critic` critic updates, then one generator update.

    The defaults are WGAN-GP (the Wasserstein loss, the gradient penalty at weight 10,
    5 critic updates). Gin-configurable: every argument but the models and the optimizers
    may be bound; see the module docstring for the recipes.

    Args:
      generator: the generator, latent codes [batch, latent_dim] to samples of the real
        batches' shape (cast to their dtype); built (it has trainable variables).
      critic: the critic, a batch to one score per example ([batch] or [batch, 1]); built.
        The loss's terms call it with `training=True`.
      critic_optimizer: the Keras optimizer of the critic's variables; its `iterations`
        count the critic updates (lazy critic penalties read it).
      generator_optimizer: the Keras optimizer of the generator's variables (its
        `iterations`: the lazy generator penalties').
      latent_dim: the latent codes' width, >= 1; codes are drawn N(0, 1) in the step when
        a batch brings no "z".
      loss: `loss(real_scores, fake_scores) -> GanLosses(critic, generator)`
        (`wasserstein_loss`, `nonsaturating_loss`, `relativistic_loss`, `saturating_loss`
        or your own), by reference in gin (`= @relativistic_loss`).
      critic_penalties: a list of (penalty, weight, lazy_every): `penalty(critic, real,
        fake, *, noise) -> scalar` (`gradient_penalty`, `r1_penalty`, `r2_penalty`,
        `lp_penalty`, `dragan_penalty`, `consistency_penalty`, or your own; its
        hyperparameters its own gin bindings), its weight >= 0 and its interval >= 1 (1:
        every update). Logged as "critic/<penalty's name>" (unweighted, times the lazy
        factor on the steps it runs). None or empty: no penalty.
      generator_penalties: a list of (penalty, weight, lazy_every), each penalty a
        `GeneratorPenalty` (`@path_length_penalty()`, `@latent_consistency_penalty()`:
        evaluated references). None or empty: none.
      n_critic: critic updates per generator update, >= 1.
      strategy: the `tf.distribute.Strategy` both updates run under; None: the current
        one. The batches are then distributed batches.
      jit_compile: True, False or "auto" (see `hogrod.train.compiled`): with one
        replica the whole call (every update, its guard and the power iterations) is one
        XLA computation; under several replicas "auto" runs plain `tf.function`s and True
        compiles each replica's gradients (`make_train_step`'s `jit_compile`).

    Returns:
      `step(real_batches) -> logs`: `real_batches` a tuple of `n_critic` batches (each the
      real samples, or a dict as `with_noise` gives). The logs are "critic/<name>" (each
      term, "loss", "grad_norm", "lr", "applied": the last critic update's, or the first
      non-finite value among the call's updates), "generator/<name>", and "loss" (=
      "critic/loss"); the loss's term is "adversarial". The function also carries
      `critic_step` and `generator_step` (the single updates, `make_train_step` steps),
      `n_critic`, `loss`, `critic_penalties` and `generator_penalties` (lists of (name,
      penalty, weight, lazy_every)) and `generator_state` (a `tf.Module`, its `penalties` the
      generator penalties' state variables by name, to checkpoint).

    Raises:
      ArgumentError: the loss or a penalty is not one, a weight is negative, a
        `lazy_every` or a count is out of range, or `jit_compile` is not True, False or
        "auto"; the message names the binding (`make_gan_step.critic_penalties[1]:
        lazy_every must be ...`).
      TypeError: the loss or a critic penalty does not take its signature.
      ValueError: the generator or critic has no trainable variables (not built yet).
    """
    where = "make_gan_step"
    loss = _checked_loss(loss, f"{where}.loss")
    critic_regs = _regularizers(critic_penalties, f"{where}.critic_penalties",
                                _checked_critic_penalty)
    generator_regs = _regularizers(generator_penalties, f"{where}.generator_penalties",
                                   _checked_generator_penalty)
    n_critic = checks.integer(n_critic, "n_critic", where, least=1)
    latent_dim = checks.integer(latent_dim, "latent_dim", where, least=1)
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        raise checks.ArgumentError(f"{where}.jit_compile must be True, False or 'auto', got "
                                   f"{jit_compile!r}")
    for name, model in (("critic", critic), ("generator", generator)):
        if not model.trainable_variables:
            raise ValueError(f"{where}: the {name} has no trainable variables; build it (call "
                             "it once on a batch) first")
    critic_count = _counter(critic_optimizer, "critic", critic_regs)
    generator_count = _counter(generator_optimizer, "generator", generator_regs)
    strategy = strategy or tf.distribute.get_strategy()
    generator_state = _generator_state(generator, generator_regs, strategy)

    critic_terms, generator_terms = _objectives(
        generator, critic, loss, latent_dim, (critic_regs, critic_count),
        (generator_regs, generator_count), generator_state.penalties)

    replicas = strategy.num_replicas_in_sync
    inner_jit = False if replicas == 1 else jit_compile is True  # one replica: the whole call
    critic_step = train.make_train_step(
        critic_terms, critic_optimizer, critic.trainable_variables,
        weights={name: w for name, _, w, _ in critic_regs}, strategy=strategy,
        jit_compile=inner_jit)
    generator_step = train.make_train_step(
        generator_terms, generator_optimizer, generator.trainable_variables,
        weights={name: w for name, _, w, _ in generator_regs}, strategy=strategy,
        jit_compile=inner_jit)
    critic_normalized = bool(spectral.spectral_layers(critic))
    generator_normalized = bool(spectral.spectral_layers(generator))

    def gan_step(real_batches):
        merged = None
        for batch in real_batches:
            if critic_normalized:
                spectral.advance_power_iteration(critic)
            logs = critic_step(batch)
            merged = logs if merged is None else _merged(merged, logs)
        if generator_normalized:
            spectral.advance_power_iteration(generator)
        out = {f"critic/{k}": v for k, v in merged.items()}
        out.update({f"generator/{k}": v for k, v in generator_step(real_batches[-1]).items()})
        out["loss"] = out["critic/loss"]
        return out

    whole = train.compiled(gan_step, jit_compile if replicas == 1 else False, where)

    def step(real_batches):
        if not isinstance(real_batches, (tuple, list)):  # a tensor would be split into rows
            raise TypeError(f"step needs a tuple of {n_critic} real batches (n_critic, e.g. "
                            f"from grouped(iterator, {n_critic})), got "
                            f"{type(real_batches).__name__}")
        if len(real_batches) != n_critic:
            raise ValueError(f"step needs {n_critic} real batches (n_critic), got "
                             f"{len(real_batches)}")
        return whole(tuple(real_batches))

    step.critic_step, step.generator_step, step.n_critic = critic_step, generator_step, n_critic
    step.loss, step.critic_penalties, step.generator_penalties = loss, critic_regs, generator_regs
    step.generator_state = generator_state
    return step


def with_noise(dataset: tf.data.Dataset, latent_dim: int, seed: int = 0) -> tf.data.Dataset:
    """Batches of `dataset` with the step's random numbers: the latent codes and the noise.

    The latent codes and every penalty's random numbers are drawn by tf.data (stateless,
    from `seed` and the batch index) instead of inside the step, so a tf.distribute
    strategy shards them with the data and a resumed run (the iterator checkpointed)
    draws what an uninterrupted one would: the critic penalties' `NOISE_KEYS` (the
    GP/DRAGAN per-example weights and DRAGAN's unit-scale perturbation, whose std is the
    whole batch's) and the generator penalties' `GENERATOR_NOISE_KEYS`.

    Args:
      dataset: a dataset of real batches [batch, ...], a float dtype.
      latent_dim: the latent codes' width.
      seed: the integer seed; seeds `seed` to `seed + 4` with the batch index draw the
        codes, the interpolation weights, the perturbation, the path-length projection and
        the latent perturbation.

    Returns:
      A dataset of dicts {"real": the batch, "z": N(0, 1) codes [batch, latent_dim],
      "interpolation": U[0, 1] weights [batch], "perturbation": `perturbation(real)`, the
      real batch's shape, "path_length": N(0, 1) of the real batch's shape (the generated
      batch's), "latent_perturbation": N(0, 1) of the codes' shape}, all in the batch's
      dtype.
    """
    def add(i, real):
        n = tf.shape(real)[0]
        return {"real": real,
                "z": tf.random.stateless_normal([n, latent_dim], [seed, i], dtype=real.dtype),
                "interpolation": tf.random.stateless_uniform([n], [seed + 1, i], dtype=real.dtype),
                "perturbation": penalties.perturbation(real, [seed + 2, i]),
                "path_length": tf.random.stateless_normal(tf.shape(real), [seed + 3, i],
                                                          dtype=real.dtype),
                "latent_perturbation": tf.random.stateless_normal([n, latent_dim],
                                                                  [seed + 4, i], dtype=real.dtype)}
    return tf.data.Dataset.zip((tf.data.Dataset.counter(), dataset)).map(add)


class grouped:  # noqa: N801  (used like a function: grouped(iterator, n))
    """An iterator of n-tuples of consecutive elements of `iterator`.

    Each tuple holds the fresh real batches of one generator step (`n` = `n_critic`);
    checkpoint the underlying iterator, which this one advances.

    Args:
      iterator: the iterator of batches.
      n: the elements per tuple.
    """

    def __init__(self, iterator: Iterator[Any], n: int) -> None:
        self.iterator, self.n = iterator, n

    def __iter__(self):
        return self

    def __next__(self):
        return tuple(next(self.iterator) for _ in range(self.n))
