"""Meta-gradient estimators over truncated unrolls: TBPTT, ES, PES and full ES.

Every estimator is a gin factory returning an `Estimator(init, estimate, name)` with one
calling shape:

- ``state = init(problem, theta, seed)``: P particles at the start of their (staggered)
  first episodes, and PES's accumulated perturbations (an `EstimatorState`, a nest of
  tensors a caller may keep in `tf.Variable`s);
- ``estimate, state = estimate(problem, theta, state, seed, strategy=None)``: the
  particles whose episode ended are reset, then one truncation of K inner steps
  (`hogrod.learned.unroll`), returning `Estimate(grads, per_particle, meta_loss)`.

With L(theta) a truncation's meta-objective (`hogrod.learned.problem`) and P particles:

- `tbptt`: truncated backpropagation, ``d L_p / d theta`` of each particle's truncation,
  its state at the truncation's start held constant (biased: the influence of theta on
  that state is dropped). It does not reuse `hogrod.hypergrad.unrolled`: that method
  differentiates a fresh inner optimization (its optimizer's state initialized at each
  call) of a single outer objective, while a truncation continues a carried state of any
  `problem.step` (optimizer state, step count and data included) and sums an objective
  over its steps; `hypergrad.unrolled` is this module's oracle instead (tbptt with K = T
  equals it).
- `es`: antithetic evolution strategies on the truncation: pair j draws
  ``eps_j ~ N(0, sigma^2 I)``, its two particles start from one state and unroll under
  ``theta + eps_j`` and ``theta - eps_j``; ``g_j = (L+ - L-) eps_j / (2 sigma^2)``, an
  unbiased estimate of the gradient of the Gaussian-smoothed truncation objective (biased
  for the whole unroll, as tbptt). The pair then continues from its + particle's state
  (learned_optimization's `TruncatedES`).
- `pes`: persistent evolution strategies (Vicol, Metz, Sohl-Dickstein, ICML 2021): each
  particle keeps its own trajectory and ``xi``, the sum of the perturbations it has run
  under since its last reset; ``g_j = (L+ - L-) xi_j / (2 sigma^2)``. Summed over the
  truncations of an episode, unbiased for the gradient of the smoothed full-unroll
  objective in which every truncation draws its own perturbation.
- `full_es`: antithetic ES on whole episodes: every estimate runs T = horizon steps from a
  fresh state of each particle (pes and es with K = T and no staggering compute the same).

`per_particle` holds the independent terms whose mean is `grads`: one row per particle for
tbptt, one per antithetic pair for the others (the two particles of a pair are not
independent), so ``std(per_particle) / sqrt(rows)`` is the estimate's standard error.
Particles are ordered as evosax orders an antithetic population: the first P/2 run under
``theta + eps_j``, the last P/2 under ``theta - eps_j``; partners share their seed
(initial state, data) and their staggered start.

Under a `tf.distribute` strategy the particles are split evenly over its replicas, each
running its rows' unrolls; the rows are gathered back in order, so the estimate equals one
device's. Compile the calls (`meta_step` does): eagerly every inner step runs op by op.
"""

from typing import Any, Callable, NamedTuple, Optional, Tuple

import gin
import tensorflow as tf

from hogrod import checks, taskmap, tree
from hogrod.learned import problem as problem_lib
from hogrod.learned import unroll as unroll_lib
from hogrod.learned.problem import InnerProblem
from hogrod.learned.unroll import Particles
from hogrod.train.compile import check_jit_compile
from hogrod.types import Seed, Tree

__all__ = ["Estimate", "EstimatorState", "Estimator", "tbptt", "es", "pes", "full_es"]

_no_autograph = tf.autograph.experimental.do_not_convert


class Estimate(NamedTuple):
    """What an estimator returns for one truncation.

    Attributes:
        grads: the estimate of ``d meta-objective / d theta``, structured like theta.
        per_particle: theta's nest with a leading axis of independent terms whose mean is
            `grads` (one per particle for tbptt, one per antithetic pair otherwise).
        meta_loss: the mean meta-objective of the truncation over the particles (under
            their perturbations for the ES estimators), a scalar.
    """

    grads: Tree
    per_particle: Tree
    meta_loss: tf.Tensor


class EstimatorState(NamedTuple):
    """An estimator's state between truncations.

    Attributes:
        particles: the `hogrod.learned.Particles` (inner states, step counts, seeds).
        accumulated: for `pes`, theta's nest with a leading ``[P]`` axis: each particle's
            sum of the perturbations since its last reset; ``()`` for the others.
    """

    particles: Particles
    accumulated: Tree


class Estimator(NamedTuple):
    """A meta-gradient estimator, built by `tbptt`, `es`, `pes` or `full_es`.

    Attributes:
        init: ``init(problem, theta, seed) -> EstimatorState``.
        estimate: ``estimate(problem, theta, state, seed, strategy=None) ->
            (Estimate, EstimatorState)``: one truncation (seed: its perturbations).
        name: the estimator and its settings.
    """

    init: Callable[..., EstimatorState]
    estimate: Callable[..., Tuple[Estimate, EstimatorState]]
    name: str


class _Config(NamedTuple):
    """An estimator's settings, checked once by its factory."""

    where: str
    particles: int
    truncation: int
    horizon: Optional[int]
    stagger: bool
    task_map: str
    sigma: Optional[float]  # None: tbptt
    persistent: bool
    jit_compile: Any = False  # the ES estimators' unrolls: "auto", True or False


def _config(where: str, particles: Any, truncation: Any, horizon: Any, stagger: Any,
            task_map: Any, sigma: Any = None, persistent: bool = False,
            jit_compile: Any = False) -> _Config:
    particles = checks.integer(particles, "particles", where, least=1)
    if sigma is not None:
        sigma = checks.positive(sigma, "sigma", where)
        if particles % 2:
            raise checks.ArgumentError(
                f"{where}: particles must be even (antithetic pairs: theta + eps and "
                f"theta - eps), got {particles}")
    truncation, horizon = unroll_lib.check_schedule(truncation, horizon, where)
    stagger = checks.boolean(stagger, "stagger", where)
    taskmap.check_task_map(task_map, where)
    jit_compile = check_jit_compile(jit_compile, where)
    return _Config(where, particles, truncation, horizon, stagger, task_map, sigma, persistent,
                   jit_compile)


# ---- shared pieces -------------------------------------------------------------------------

def _theta(theta: Tree, where: str) -> Tree:
    checks.params(theta, where, "theta")
    return tf.nest.map_structure(tf.convert_to_tensor, theta)


def _init(config: _Config) -> Callable[..., EstimatorState]:
    @_no_autograph
    def init(problem: InnerProblem, theta: Tree, seed: Seed) -> EstimatorState:
        where = config.where + ".init"
        problem_lib.check_problem(problem, where)
        theta = _theta(theta, where)
        seed = checks.stateless_seed(seed, "seed", where)
        pairs = config.sigma is not None
        groups = config.particles // 2 if pairs else config.particles
        seeds = tf.random.experimental.stateless_split(seed, groups)
        offsets = unroll_lib.start_offsets(groups, config.truncation, config.horizon,
                                           config.stagger)
        if pairs:  # partners share their seed (initial states, data) and their offset
            seeds, offsets = tf.concat([seeds, seeds], 0), offsets * 2
        particles = unroll_lib.init_particles(problem, seeds, config.horizon, offsets,
                                              config.task_map)
        accumulated = () if not config.persistent else tf.nest.map_structure(
            lambda t: tf.zeros([config.particles] + t.shape.as_list(), t.dtype), theta)
        return EstimatorState(particles, accumulated)
    return init


def _check_state(state: Any, theta: Tree, config: _Config, where: str) -> EstimatorState:
    if not isinstance(state, EstimatorState):
        raise checks.ArgumentError(f"{where}: state must be the EstimatorState of this "
                                   f"estimator's init, got {type(state).__name__}")
    rows = state.particles.steps.shape[0]
    if rows is not None and rows != config.particles:
        raise checks.ArgumentError(
            f"{where}: state holds {rows} particles but the estimator has particles="
            f"{config.particles}; make the state with this estimator's init")
    if config.persistent:
        try:
            tf.nest.assert_same_structure(state.accumulated, theta)
        except (ValueError, TypeError):
            raise checks.ArgumentError(
                f"{where}: state.accumulated {checks.describe(state.accumulated)} does not "
                f"match theta {checks.describe(theta)}; make the state from this theta") from None
    return state


def _across_replicas(strategy: Optional[tf.distribute.Strategy], fn: Callable, args: tuple,
                     rows: int, where: str) -> Any:
    """`fn(*args)` on a leading axis of `rows` rows, split evenly over the replicas of
    `strategy` (each runs its contiguous block) and gathered back in order."""
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return fn(*args)
    replicas = strategy.num_replicas_in_sync
    if rows % replicas:
        raise checks.ArgumentError(
            f"{where}: particles={rows} do not split evenly over the strategy's {replicas} "
            "replicas; choose a multiple of the replica count")
    block = rows // replicas

    def replica(*args):
        i = tf.distribute.get_replica_context().replica_id_in_sync_group
        mine = tf.nest.map_structure(
            lambda t: tf.gather(tf.reshape(t, [replicas, block] + t.shape.as_list()[1:]), i),
            args)
        return fn(*mine)

    def gather(v):  # the rows in order, their static shape kept
        return tf.ensure_shape(strategy.gather(v, axis=0),
                               [rows] + v.values[0].shape.as_list()[1:])

    return tf.nest.map_structure(gather, strategy.run(replica, args=args))


def _zero_rows(mask: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    """`t` with the rows where `mask` holds set to zero (a leading [P] axis)."""
    return tf.where(tf.reshape(mask, [-1] + [1] * (t.shape.rank - 1)), tf.zeros_like(t), t)


def _mean(rows: Tree) -> Tree:
    return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0), rows)


# ---- truncated backpropagation -------------------------------------------------------------

def _tbptt_estimate(config: _Config) -> Callable[..., Tuple[Estimate, EstimatorState]]:
    @_no_autograph
    def estimate(problem, theta, state, seed, strategy=None):
        where = config.where + ".estimate"
        problem_lib.check_problem(problem, where)
        theta = _theta(theta, where)
        state = _check_state(state, theta, config, where)
        checks.stateless_seed(seed, "seed", where)  # unused: tbptt draws nothing
        particles, _ = unroll_lib.reset(problem, state.particles, config.horizon,
                                        config.task_map)
        thetas = tf.nest.map_structure(
            lambda t: tf.tile(t[None], [config.particles] + [1] * t.shape.rank), theta)

        def rows(thetas, particles):
            with tf.GradientTape() as tape:
                tape.watch(thetas)
                particles, values = unroll_lib.truncated_unroll(
                    problem, thetas, particles, config.truncation, config.task_map)
                total = tf.reduce_sum(values)
            # row p of d(sum_p L_p)/d thetas is d L_p / d theta: L_p sees only its row
            grads = tape.gradient(total, thetas)
            missing = [i for i, g in enumerate(tf.nest.flatten(grads)) if g is None]
            if missing:
                raise checks.ArgumentError(
                    f"{where}: the meta-objective does not depend on theta leaves {missing} "
                    f"({checks.describe(theta)}); remove them from theta")
            # dense rows: a gather in a step (pfor's, or the problem's) gives IndexedSlices
            return particles, values, tf.nest.map_structure(tf.convert_to_tensor, grads)

        particles, values, grads = _across_replicas(strategy, rows, (thetas, particles),
                                                    config.particles, where)
        return (Estimate(_mean(grads), grads, tf.reduce_mean(values)),
                EstimatorState(particles, ()))
    return estimate


@gin.configurable(module="hogrod.learned")
def tbptt(particles: int, truncation: int, horizon: Optional[int] = None,
          stagger: bool = True, task_map: str = "vectorized") -> Estimator:
    """Truncated backpropagation through time: the exact gradient of each truncation.

    Args:
        particles: the number of inner problems unrolled at once, an int >= 1.
        truncation: the inner steps K per estimate, an int >= 1.
        horizon: the episode length T (a multiple of K) after which a particle restarts,
            or None (default): never.
        stagger: whether the particles' first episodes are shortened by evenly spread
            multiples of K (`hogrod.learned.start_offsets`); default True.
        task_map: how particles are mapped, one of `hogrod.taskmap.MODES`; default
            ``"vectorized"``.

    Returns:
        The `Estimator`.

    Raises:
        ArgumentError: a count is not a positive int, K does not divide T, or `task_map`
            is unknown.
    """
    config = _config("hogrod.learned.tbptt", particles, truncation, horizon, stagger,
                     task_map)
    return Estimator(_init(config), _tbptt_estimate(config),
                     f"tbptt(particles={config.particles}, truncation={config.truncation}, "
                     f"horizon={config.horizon})")


# ---- evolution strategies ------------------------------------------------------------------

def _perturbations(theta: Tree, pairs: int, sigma: float, seed: tf.Tensor) -> Tree:
    """``[pairs, ...]`` draws of N(0, sigma^2 I) per leaf of theta (sigma at its dtype)."""
    like = tf.nest.map_structure(lambda t: tf.zeros([pairs] + t.shape.as_list(), t.dtype),
                                 theta)
    return tf.nest.map_structure(lambda e: e * tf.constant(sigma, e.dtype),
                                 tree.normal_like(like, seed))


def _halves(t: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    half = t.shape[0] // 2
    return t[:half], t[half:]


def _pair_terms(values: tf.Tensor, weights: Tree, sigma: float) -> Tree:
    """``(L+ - L-) w / (2 sigma^2)`` per pair, w each pair's + particle's weight."""
    plus, minus = _halves(values)

    def term(w):
        w = _halves(w)[0]
        diff = tf.cast(plus - minus, w.dtype)
        scale = tf.constant(2 * sigma * sigma, w.dtype)
        return tf.reshape(diff, [-1] + [1] * (w.shape.rank - 1)) * w / scale
    return tf.nest.map_structure(term, weights)


def _es_estimate(config: _Config, same_start: bool
                 ) -> Callable[..., Tuple[Estimate, EstimatorState]]:
    @_no_autograph
    def estimate(problem, theta, state, seed, strategy=None):
        where = config.where + ".estimate"
        problem_lib.check_problem(problem, where)
        theta = _theta(theta, where)
        state = _check_state(state, theta, config, where)
        seed = checks.stateless_seed(seed, "seed", where)
        particles, finished = unroll_lib.reset(problem, state.particles, config.horizon,
                                               config.task_map)
        eps = _perturbations(theta, config.particles // 2, config.sigma, seed)
        signed = tf.nest.map_structure(lambda e: tf.concat([e, -e], 0), eps)
        thetas = tf.nest.map_structure(lambda t, e: t[None] + e, theta, signed)

        def rows(thetas, particles):
            return unroll_lib.truncated_unroll(problem, thetas, particles, config.truncation,
                                               config.task_map, config.jit_compile)

        particles, values = _across_replicas(strategy, rows, (thetas, particles),
                                             config.particles, where)
        accumulated = ()
        weights = signed
        if config.persistent:  # xi: the perturbations since each particle's reset
            kept = tf.nest.map_structure(lambda a: _zero_rows(finished, a),
                                         state.accumulated)
            accumulated = weights = tf.nest.map_structure(tf.add, kept, signed)
        if same_start:  # both partners continue from the + particle's state
            particles = particles._replace(inner=tf.nest.map_structure(
                lambda t: tf.concat([_halves(t)[0]] * 2, 0), particles.inner))
        terms = _pair_terms(values, weights, config.sigma)
        return (Estimate(_mean(terms), terms, tf.reduce_mean(values)),
                EstimatorState(particles, accumulated))
    return estimate


def _es_estimator(name: str, sigma: Any, particles: Any, truncation: Any, horizon: Any,
                  stagger: Any, task_map: Any, jit_compile: Any, persistent: bool,
                  same_start: bool) -> Estimator:
    config = _config(f"hogrod.learned.{name}", particles, truncation, horizon, stagger,
                     task_map, sigma, persistent, jit_compile)
    return Estimator(_init(config), _es_estimate(config, same_start),
                     f"{name}(sigma={config.sigma}, particles={config.particles}, "
                     f"truncation={config.truncation}, horizon={config.horizon})")


@gin.configurable(module="hogrod.learned")
def es(sigma: float, particles: int, truncation: int, horizon: Optional[int] = None,
       stagger: bool = True, task_map: str = "vectorized",
       jit_compile: bool | str = "auto") -> Estimator:
    """Antithetic evolution strategies on each truncation (truncated ES).

    Args:
        sigma: the perturbations' standard deviation, > 0.
        particles: the number of unrolls at once, an even int (pairs theta +- eps).
        truncation: the inner steps K per estimate, an int >= 1.
        horizon: the episode length T (a multiple of K), or None (default): never reset.
        stagger: whether the pairs' first episodes are shortened by evenly spread
            multiples of K; default True.
        task_map: how particles are mapped, one of `hogrod.taskmap.MODES`; default
            ``"vectorized"``.
        jit_compile: the unrolls as one XLA computation: "auto" (default: where XLA
            compiles them and draws nothing, else one warning and plain;
            `hogrod.learned.truncated_unroll`), True or False. The perturbations, resets
            and batches are drawn outside XLA: both paths compute the same estimate.

    Returns:
        The `Estimator`.

    Raises:
        ArgumentError: `sigma` <= 0, `particles` odd, a count not a positive int, K not
            dividing T, or `task_map` or `jit_compile` unknown.
    """
    return _es_estimator("es", sigma, particles, truncation, horizon, stagger, task_map,
                         jit_compile, persistent=False, same_start=True)


@gin.configurable(module="hogrod.learned")
def pes(sigma: float, particles: int, truncation: int, horizon: Optional[int] = None,
        stagger: bool = True, task_map: str = "vectorized",
        jit_compile: bool | str = "auto") -> Estimator:
    """Persistent evolution strategies: antithetic ES with the perturbations accumulated.

    Args:
        sigma: the perturbations' standard deviation, > 0.
        particles: the number of unrolls at once, an even int (pairs theta +- eps).
        truncation: the inner steps K per estimate, an int >= 1.
        horizon: the episode length T (a multiple of K) after which a particle restarts
            with its accumulated perturbation zeroed, or None (default): never.
        stagger: whether the pairs' first episodes are shortened by evenly spread
            multiples of K; default True.
        task_map: how particles are mapped, one of `hogrod.taskmap.MODES`; default
            ``"vectorized"``.
        jit_compile: the unrolls as one XLA computation: "auto" (default: where XLA
            compiles them and draws nothing, else one warning and plain;
            `hogrod.learned.truncated_unroll`), True or False. The perturbations, resets
            and batches are drawn outside XLA: both paths compute the same estimate.

    Returns:
        The `Estimator`.

    Raises:
        ArgumentError: `sigma` <= 0, `particles` odd, a count not a positive int, K not
            dividing T, or `task_map` or `jit_compile` unknown.
    """
    return _es_estimator("pes", sigma, particles, truncation, horizon, stagger, task_map,
                         jit_compile, persistent=True, same_start=False)


@gin.configurable(module="hogrod.learned")
def full_es(sigma: float, particles: int, horizon: int, task_map: str = "vectorized",
            jit_compile: bool | str = "auto") -> Estimator:
    """Antithetic evolution strategies on whole episodes of `horizon` steps.

    Args:
        sigma: the perturbations' standard deviation, > 0.
        particles: the number of unrolls at once, an even int (pairs theta +- eps).
        horizon: the episode length T: every estimate unrolls T steps from fresh states.
        task_map: how particles are mapped, one of `hogrod.taskmap.MODES`; default
            ``"vectorized"``.
        jit_compile: the unrolls as one XLA computation: "auto" (default: where XLA
            compiles them and draws nothing, else one warning and plain;
            `hogrod.learned.truncated_unroll`), True or False. The perturbations, resets
            and batches are drawn outside XLA: both paths compute the same estimate.

    Returns:
        The `Estimator`.

    Raises:
        ArgumentError: `sigma` <= 0, `particles` odd, `horizon` not a positive int, or
            `task_map` or `jit_compile` unknown.
    """
    horizon = checks.integer(horizon, "horizon", "hogrod.learned.full_es", least=1)
    return _es_estimator("full_es", sigma, particles, horizon, horizon, False, task_map,
                         jit_compile, persistent=False, same_start=False)
