"""Truncated unrolls of many particles of an inner problem, with resets at the horizon.

`Particles` holds P inner states stacked on a leading axis and, per particle, the steps
taken since its last reset, the length of its current episode, its episode count and its
seed. A truncation (`truncated_unroll`) runs K inner steps of every particle in one compiled
loop (`tf.while_loop` over the steps, the particles mapped by `hogrod.taskmap.map_tasks` inside
each step), each particle under its own value of theta (a perturbed one for evolution
strategies). Between truncations `reset` restarts the particles whose episode ended: a
fresh ``problem.init`` state from the seed of their next episode, their step count 0.

Resets fall between truncations only: the truncation K must divide the horizon T, and a
particle whose start is staggered (`start_offsets`) has a first episode shorter by a
multiple of K. Staggered starts (learned_optimization's random initial offsets, the PES
paper's "breakstep") spread the particles over the phases of inner training, so that a
meta-gradient averages over early and late steps instead of following all particles
through one phase at a time; after its first, shorter episode every particle runs
episodes of T steps, counted from 0.

Seeds: particle p has a ``[2]`` seed; episode e of it draws its initial state from the
seed with its second word advanced by 2e and its data (``problem.batch``) from the one
advanced by 2e + 1. These are distinct keys of TensorFlow's counter-based generator,
derived without a random op per particle (which pfor would run as a loop over particles).
"""

from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging

from hogrod import checks, taskmap
from hogrod.learned import problem as problem_lib
from hogrod.learned.problem import InnerProblem
from hogrod.train.compile import xla_blocker
from hogrod.types import Tree

__all__ = ["Particles", "check_schedule", "start_offsets", "init_particles", "reset",
           "truncated_unroll", "evaluate"]

_no_autograph = tf.autograph.experimental.do_not_convert


class Particles(NamedTuple):
    """P particles of an inner problem, every field with a leading particle axis.

    Attributes:
        inner: the inner states, ``problem.init``'s nest with a leading ``[P]`` axis.
        steps: ``[P]`` int64, the inner steps taken since each particle's last reset.
        length: ``[P]`` int64, the length of each particle's current episode (it resets
            when `steps` reaches it); -1: never (no horizon).
        episode: ``[P]`` int64, each particle's resets so far.
        seeds: ``[P, 2]`` int64, each particle's stateless seed.
    """

    inner: Tree
    steps: tf.Tensor
    length: tf.Tensor
    episode: tf.Tensor
    seeds: tf.Tensor


def check_schedule(truncation: int, horizon: Optional[int], where: str
                   ) -> Tuple[int, Optional[int]]:
    """The truncation K and horizon T checked: K >= 1, T None or a multiple of K.

    Args:
        truncation: the inner steps per truncation, an int >= 1.
        horizon: the inner steps of an episode (a particle resets after them), an int >= 1
            that `truncation` divides, or None (never reset).
        where: the public function checked, first in the message.

    Returns:
        ``(truncation, horizon)`` as Python ints (horizon None where given None).

    Raises:
        ArgumentError: either is not a positive int, or `truncation` does not divide
            `horizon`.
    """
    truncation = checks.integer(truncation, "truncation", where, least=1)
    if horizon is None:
        return truncation, None
    horizon = checks.integer(horizon, "horizon", where, least=1)
    if horizon % truncation:
        raise checks.ArgumentError(
            f"{where}: truncation={truncation} must divide horizon={horizon}: particles reset "
            "between truncations, every horizon steps; choose a truncation that divides it")
    return truncation, horizon


def start_offsets(groups: int, truncation: int, horizon: Optional[int],
                  stagger: bool) -> List[int]:
    """How many steps shorter each group's first episode is: spread evenly over the horizon.

    Group g of n starts ``K * floor(g * (T / K) / n)`` steps into its first episode, so the
    groups are evenly spaced over the T / K truncations of an episode (multiples of K, so
    resets stay between truncations).

    Args:
        groups: the number of groups (particles, or antithetic pairs) to place.
        truncation: the truncation K.
        horizon: the horizon T, or None (no episodes: every offset 0).
        stagger: whether to stagger at all; False: every offset 0.

    Returns:
        One offset per group, Python ints in ``[0, T - K]``.
    """
    if horizon is None or not stagger:
        return [0] * groups
    truncations = horizon // truncation
    return [truncation * ((g * truncations) // groups) for g in range(groups)]


def _episode_seeds(seeds: tf.Tensor, episode: tf.Tensor, data: int) -> tf.Tensor:
    """The ``[P, 2]`` init (data=0) or data (data=1) seeds of each particle's episode."""
    return tf.stack([seeds[:, 0], seeds[:, 1] + 2 * episode + data], axis=1)


def _map(fn: Callable[[Tree], Tree], elems: Tree, task_map: Optional[str]) -> Tree:
    """`fn` on every row of `elems` by `map_tasks`; task_map None: one row, not mapped (a
    single particle runs eagerly at the speed of its ops)."""
    if task_map is None:
        out = fn(tf.nest.map_structure(lambda t: t[0], elems))
        return tf.nest.map_structure(lambda t: t[None], out)

    def mapped():
        return taskmap.map_tasks(lambda e, _, __: fn(e), elems, mode=task_map)
    if tf.executing_eagerly():
        # eagerly pfor traces with autograph, which turns an error fn raises (a step that
        # changes the state, ...) into a StagingError; traced here without it, it keeps
        # its type
        return tf.function(mapped, autograph=False)()
    return mapped()


def _initial_states(problem: InnerProblem, seeds: tf.Tensor, task_map: Optional[str],
                    where: str) -> Tree:
    return _map(lambda seed: problem_lib.check_state(problem.init(seed), "problem.init(seed)",
                                                     where), seeds, task_map)


@_no_autograph
def init_particles(problem: InnerProblem, seeds: tf.Tensor, horizon: Optional[int],
                   offsets: Sequence[int], task_map: str = "vectorized") -> Particles:
    """P particles at the start of their first episode.

    Args:
        problem: the inner problem.
        seeds: ``[P, 2]`` int64, one stateless seed per particle (antithetic partners share
            theirs, so they see the same initial states and data).
        horizon: the episode length T, or None (never reset).
        offsets: P Python ints, how much shorter each particle's first episode is
            (`start_offsets`); ignored without a horizon.
        task_map: how the particles are mapped, one of `hogrod.taskmap.MODES`.

    Returns:
        The `Particles`: ``problem.init`` states of episode 0, 0 steps taken.

    Raises:
        ArgumentError: `problem` is not an `InnerProblem`, `task_map` is unknown, an offset
            is outside ``[0, T - 1]`` or their count is not P, or ``problem.init`` returns a
            leaf that is not a tensor.
    """
    where = "hogrod.learned.init_particles"
    problem_lib.check_problem(problem, where)
    taskmap.check_task_map(task_map, where)
    seeds = tf.cast(seeds, tf.int64)
    count = seeds.shape[0]
    episode = tf.zeros([count], tf.int64)
    inner = _initial_states(problem, _episode_seeds(seeds, episode, 0), task_map, where)
    if horizon is None:
        length = tf.fill([count], tf.constant(-1, tf.int64))
    else:
        offsets = [checks.integer(o, f"offsets[{i}]", where, 0, horizon - 1)
                   for i, o in enumerate(offsets)]
        if len(offsets) != count:
            raise checks.ArgumentError(f"{where}: offsets has {len(offsets)} entries for "
                                       f"{count} particles (seeds' rows)")
        length = tf.constant([horizon - o for o in offsets], tf.int64)
    return Particles(inner, tf.zeros([count], tf.int64), length, episode, seeds)


def _select(mask: tf.Tensor, new: Tree, old: Tree) -> Tree:
    """Leaf by leaf, `new`'s rows where `mask` and `old`'s elsewhere (a leading [P] axis)."""
    def pick(n, o):
        m = tf.reshape(mask, [-1] + [1] * (o.shape.rank - 1))
        return tf.where(m, n, o)
    return tf.nest.map_structure(pick, new, old)


@_no_autograph
def reset(problem: InnerProblem, particles: Particles, horizon: Optional[int],
          task_map: str = "vectorized") -> Tuple[Particles, tf.Tensor]:
    """The particles whose episode ended restarted: a fresh state of their next episode.

    Args:
        problem: the inner problem.
        particles: the particles, as the last truncation left them.
        horizon: the episode length T, or None (nothing resets).
        task_map: how the particles are mapped, one of `hogrod.taskmap.MODES`.

    Returns:
        ``(particles, finished)``: the particles with those that had taken their episode's
        steps restarted (state from ``problem.init`` with the next episode's seed, 0 steps,
        episode + 1, length T), and the ``[P]`` bool mask of the restarted ones.
    """
    finished = tf.equal(particles.steps, particles.length)
    if horizon is None:
        return particles, finished
    episode = particles.episode + tf.cast(finished, tf.int64)

    def restart():
        fresh = _initial_states(problem, _episode_seeds(particles.seeds, episode, 0),
                                task_map, "hogrod.learned.reset")
        return _select(finished, fresh, particles.inner)

    # init runs only when some particle restarts (at most once per horizon / K truncations)
    inner = tf.cond(tf.reduce_any(finished), restart, lambda: particles.inner)
    steps = tf.where(finished, tf.zeros_like(particles.steps), particles.steps)
    length = tf.where(finished, tf.constant(horizon, tf.int64), particles.length)
    return Particles(inner, steps, length, episode, particles.seeds), finished


def _objective(problem: InnerProblem, state: Tree, batch: object, where: str) -> tf.Tensor:
    value = tf.convert_to_tensor(problem.objective(state, batch))
    if value.shape.rank != 0 or not value.dtype.is_floating:
        raise checks.ArgumentError(
            f"{where}: problem.objective(state, batch) must return a floating scalar, got "
            f"{value.dtype.name}{value.shape.as_list()}")
    return value


def _drawn_batches(problem: InnerProblem, particles: Particles, truncation: int) -> Tree:
    """Every particle's K batches, ``problem.batch(seed, steps + k)``, stacked ``[K, P, ...]``:
    drawn before an XLA unroll, where TensorFlow's random ops draw other numbers. One
    `tf.map_fn` over the K x P draws: pfor would run each random op of a draw as a loop over
    the particles (a stateless op takes one seed), six times slower."""
    seeds = _episode_seeds(particles.seeds, particles.episode, 1)
    ks = tf.range(truncation, dtype=tf.int64)
    rows = (tf.reshape(tf.tile(seeds[None], [truncation, 1, 1]), [-1, 2]),
            tf.reshape(particles.steps[None] + ks[:, None], [-1]))
    flat = taskmap.map_tasks(lambda e, _, __: problem.batch(*e), rows, mode="sequential")
    return tf.nest.map_structure(
        lambda t: tf.reshape(t, [truncation, -1] + t.shape[1:].as_list()), flat)


@_no_autograph
def truncated_unroll(problem: InnerProblem, thetas: Tree, particles: Particles,
                     truncation: int, task_map: Optional[str] = "vectorized",
                     jit_compile: bool | str = False) -> Tuple[Particles, tf.Tensor]:
    """One truncation: `truncation` inner steps of every particle under its own theta.

    Step k of particle p is ``s <- problem.step(s, thetas[p], problem.batch(seed, t))``
    with ``t = steps[p] + k`` and the seed of its episode's data, followed by
    ``problem.objective(s, batch)``; the steps are a `tf.while_loop` (the first step
    outside it, to learn the objective's dtype), the particles mapped by `map_tasks` in
    each. Differentiable with respect to `thetas` (truncated backpropagation); the states
    it starts from are constants.

    Args:
        problem: the inner problem.
        thetas: the meta-parameters of each particle: theta's nest with a leading ``[P]``
            axis.
        particles: the particles (after `reset`).
        truncation: the number of inner steps K, a Python int >= 1.
        task_map: how the particles are mapped, one of `hogrod.taskmap.MODES`, or None
            for a single particle run unmapped.
        jit_compile: whether the K steps run as one XLA computation: False (default),
            True, or "auto" (XLA where it compiles them and computes what TensorFlow does,
            decided when traced, else one warning and the plain steps: `hogrod.train.
            xla_blocker`). With XLA the batches are drawn first, outside it, so both paths
            see the same data and agree to rounding; a step or objective that draws
            random numbers keeps "auto" plain (XLA draws others). With XLA the unroll is
            not differentiated (TensorFlow's XLA gradient of the mapped steps does not
            compile): for the ES estimators.

    Returns:
        ``(particles, meta_objectives)``: the particles after K more steps, and the ``[P]``
        meta-objective of each particle's truncation (the mean of its K inner objectives,
        or the last one, as ``problem.meta_objective`` says).

    Raises:
        ArgumentError: ``problem.step`` changes the state's structure, shapes or dtypes,
            or ``problem.objective`` does not return a floating scalar.
    """
    where = "hogrod.learned.truncated_unroll"
    if jit_compile not in (True, False, "auto"):
        raise checks.ArgumentError(f"{where}: jit_compile must be 'auto', True or False, got "
                                   f"{jit_compile!r}")
    # the truncation's gradient starts here: earlier truncations are constants
    inner = tf.nest.map_structure(tf.stop_gradient, particles.inner)
    data_seeds = _episode_seeds(particles.seeds, particles.episode, 1)
    if jit_compile is False:
        inner, total = _steps(problem, truncation, task_map, thetas, inner, particles.steps,
                              data_seeds, None)
        return particles._replace(inner=inner, steps=particles.steps + truncation), total
    batches = () if problem.batch is None else _drawn_batches(problem, particles, truncation)

    args = (thetas, inner, particles.steps, data_seeds, batches)
    flat = tf.nest.flatten(args)  # XLA's lowering takes flat specs

    def steps(*flat):
        return _steps(problem, truncation, task_map, *tf.nest.pack_sequence_as(args, flat))
    xla = tf.function(steps, jit_compile=True, autograph=False)
    plain = tf.function(steps, autograph=False)
    if jit_compile == "auto":  # decided from the arguments' specs, nothing run
        reason = xla_blocker(xla, plain, *[tf.TensorSpec(t.shape, t.dtype) for t in flat])
        if reason is not None:
            logging.warning("%s: jit_compile='auto' runs the inner steps without XLA: %s. "
                            "Bind the estimator's jit_compile = False to skip the attempt.",
                            where, reason)
            xla = plain
    inner, total = xla(*flat)
    return particles._replace(inner=inner, steps=particles.steps + truncation), total


def _steps(problem: InnerProblem, truncation: int, task_map: Optional[str], thetas: Tree,
           inner: Tree, steps: tf.Tensor, data_seeds: tf.Tensor, batches: Optional[Tree]
           ) -> Tuple[Tree, tf.Tensor]:
    """`truncated_unroll`'s K steps from `inner`: (inner states, [P] meta-objectives);
    the batches drawn here (`batches` None) or read from `_drawn_batches`'."""
    where = "hogrod.learned.truncated_unroll"
    last = problem.meta_objective == "last"

    def one(elem):
        theta, state, t, seed, batch = elem
        if batch is None:
            batch = () if problem.batch is None else problem.batch(seed, t)
        state = problem_lib.check_step(state, problem.step(state, theta, batch), where)
        return state, _objective(problem, state, batch, where)

    def advance(k, inner):
        if batches is None:
            return _map(lambda e: one(tuple(e) + (None,)),
                        (thetas, inner, steps + k, data_seeds), task_map)
        batch = tf.nest.map_structure(lambda b: b[k], batches)
        return _map(one, (thetas, inner, steps + k, data_seeds, batch), task_map)

    inner, total = advance(tf.constant(0, tf.int64), inner)
    if truncation > 1:
        def body(k, inner, total):
            inner, value = advance(k, inner)
            return k + 1, inner, value if last else total + value

        _, inner, total = tf.while_loop(
            lambda k, *_: k < truncation, body, (tf.constant(1, tf.int64), inner, total),
            maximum_iterations=truncation - 1)
    if not last:
        total = total / tf.constant(truncation, total.dtype)
    return inner, total


@_no_autograph
def evaluate(problem: InnerProblem, theta: Tree, steps: int, seed: int = 0) -> tf.Tensor:
    """The meta-objective of one fresh episode of `steps` inner steps under theta.

    The unperturbed, untruncated value an estimator's gradient is of: e.g. influence
    balancing's evaluation (500 steps from the initial state, ``"last"``) or a learned
    schedule's summed loss over its horizon (``"sum"``).

    Args:
        problem: the inner problem.
        theta: the meta-parameters, a nest of floating tensors.
        steps: the inner steps, an int >= 1.
        seed: the particle's seed (its initial state and data), an int >= 0 or a ``[2]``
            integer tensor.

    Returns:
        The scalar meta-objective of the `steps`-step unroll from ``problem.init``.

    Raises:
        ArgumentError: `problem`, `theta`, `steps` or `seed` is invalid, or the problem's
            functions break their contract (see `truncated_unroll`).
    """
    where = "hogrod.learned.evaluate"
    problem_lib.check_problem(problem, where)
    checks.params(theta, where, "theta")
    steps = checks.integer(steps, "steps", where, least=1)
    seed = checks.stateless_seed(seed, "seed", where)
    thetas = tf.nest.map_structure(lambda t: tf.convert_to_tensor(t)[None], theta)

    def value(thetas):
        seeds, zero = seed[None], tf.zeros([1], tf.int64)
        particles = Particles(_initial_states(problem, seeds, None, where), zero, zero - 1,
                              zero, seeds)
        return truncated_unroll(problem, thetas, particles, steps, None)[1][0]
    if tf.executing_eagerly():  # compiled once here: eagerly each step would run op by op
        return tf.function(value, autograph=False)(thetas)
    return value(thetas)
