"""Loss weighting schemes: one interface, chosen in gin by reference.

A scheme is a function

    scheme(problem, u_fn, points, condition_points, variables, gpinn=None) -> Weighting

(its hyperparameters are further keywords, bound in gin), selected with e.g.
`pinn_experiment.weighting = @ntk_weights`. The `Weighting` it returns says how it enters
training (its docstring lists the fields).

- `grad_norm_weights`: learning-rate annealing by gradient norms (Wang, Teng and
  Perdikaris 2021); `annealing_weights` is its low-level form.
- `annealed_causal_weights`: causal weights whose eps rises through a list as the
  weights open (the paper's Algorithm 1).
- `grad_norm_balance_weights`: jaxpi's gradient-norm balancing of every term (the
  residual included); `balance_grad_norms` is its low-level form.
- `ntk_weights`: neural-tangent-kernel trace ratios (Wang, Yu and Perdikaris 2022).
- `causal_weights`: temporal causality (Wang, Sankaran and Perdikaris 2024).
- `self_adaptive_weights`: trainable per-point weights (McClenny and Braga-Neto 2023).
"""

import dataclasses
import inspect
import math
from typing import Callable, Mapping, Optional, Sequence

import gin
import tensorflow as tf

from hogrod import autodiff, checks
from hogrod.pinn import training
from hogrod.pinn import weighting_parts as parts
from hogrod.pinn.problem import Problem
from hogrod.types import TensorLike

__all__ = ["Weighting", "annealing_weights", "grad_norm_weights", "balance_grad_norms",
           "grad_norm_balance_weights", "annealed_causal_weights", "ntk_trace", "ntk_weights",
           "causal_chunk_weights", "causal_weights", "self_adaptive_weights",
           "combined_weights"]


@dataclasses.dataclass(frozen=True)
class Weighting:
    """How a weighting scheme enters training; the default, `Weighting()`, is no weighting.

    Attributes:
      weights: {term name: scalar tf.Variable} multiplying `pinn_loss`'s terms.
      reducers: {term name: reduce(points, squares [n, m]) -> scalar} replacing a term's
        plain mean over its points (causal and per-point weights).
      update: None, or `update() -> {name: weight}` moving `weights`.
      every: the steps between calls of `update` (0: never).
      state: {name: variable} to checkpoint with the run.
      ascent: variables the train step maximizes the loss over, with their own optimizer.
      ascent_lr: the learning rate of that optimizer.
    """
    weights: dict = dataclasses.field(default_factory=dict)
    reducers: dict = dataclasses.field(default_factory=dict)
    update: Optional[Callable] = None
    every: int = 0
    state: dict = dataclasses.field(default_factory=dict)
    ascent: tuple = ()
    ascent_lr: float = 0.0


def annealing_weights(term_fn, variables, names, alpha=0.9, dtype=tf.float32):
    """(weights, update): `weights` {name: tf.Variable(1.0)} for `pinn_loss`, and a compiled
    `update()` that moves each toward its balancing value by a moving average (`alpha` on
    the old value):

        lambda_i <- alpha lambda_i + (1 - alpha) max |grad_theta L_r| / mean |grad_theta L_i|

    term_fn: `term_fn() -> {name: scalar}` of the UNWEIGHTED terms, "residual" among them.
    dtype: the weights' dtype (the loss terms').
    """
    weights = {n: tf.Variable(tf.ones([], dtype), trainable=False, name=f"weight_{n}")
               for n in names}

    @tf.function
    def update():
        # hogrod.grad, not tape.gradient(unconnected_gradients=ZERO): the latter fails on
        # Keras 3 variables (their dtype is a string).
        g_res = autodiff.grad(lambda: term_fn()["residual"], variables)
        top = tf.reduce_max([tf.reduce_max(tf.abs(g)) for g in g_res])
        for n in names:
            g = autodiff.grad(lambda n=n: term_fn()[n], variables)
            mean = tf.reduce_mean(tf.concat([tf.reshape(tf.abs(x), [-1]) for x in g], 0))
            target = tf.cast(top / tf.maximum(mean, 1e-12), dtype)
            weights[n].assign(alpha * weights[n] + (1 - alpha) * target)
        return {n: w.read_value() for n, w in weights.items()}
    return weights, update


@gin.configurable
def grad_norm_weights(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor], points: TensorLike,
                      condition_points: Sequence[TensorLike], variables: Sequence[tf.Variable],
                      gpinn: Optional[Mapping[int, float]] = None,
                      alpha: float = 0.9, every: int = 100) -> Weighting:
    """Learning-rate annealing (Wang, Teng and Perdikaris 2021) of the non-residual terms.

    Every `every` steps each term i other than the residual gets::

        lambda_i <- alpha lambda_i + (1 - alpha) max_theta |dL_r/dtheta| / mean_theta |dL_i/dtheta|

    (the residual's weight stays 1), so terms whose gradients are small next to the
    residual's are weighed up.

    Args:
      problem: the `Problem` (its terms: `term_names(problem, gpinn)`).
      u_fn: the solution, [n, dim] -> [n, m] (`solution_fn`).
      points: the collocation points, [n, dim], of the network's dtype (the weights').
      condition_points: one set of points per condition of the problem, in order.
      variables: the network's trainable variables.
      gpinn: None, or {coordinate: weight}, `pinn_loss`'s gPINN term.
      alpha: the moving average's weight on the old value, in [0, 1).
      every: the steps between updates, >= 1.
    Returns:
      A `Weighting` with `weights` (a variable per term) and their compiled `update`.
    Raises:
      ValueError: the residual is the problem's only term, or a bad `alpha` or `every`.
    """
    where = "grad_norm_weights"
    parts.check_every_alpha(every, alpha, where)
    names = parts.terms_to_balance(problem, gpinn, where)[1:]
    unweighted = training.pinn_loss(problem, u_fn, points, condition_points, gpinn=gpinn)
    weights, update = annealing_weights(unweighted, variables, names, alpha,
                                        parts.points_dtype(points))
    return Weighting(weights=weights, update=update, every=every,
                     state={f"weight_{n}": w for n, w in weights.items()})


def balance_grad_norms(term_fn, variables, names, alpha=0.9, dtype=tf.float32):
    """(weights, update): `weights` {name: tf.Variable(1.0)} for every term in `names`, and
    a compiled `update()` that moves each by a moving average (`alpha` on the old value)
    toward the weight that gives every term the same gradient norm:

        lambda_i <- alpha lambda_i + (1 - alpha) mean_j ||grad_theta L_j|| / ||grad_theta L_i||

    (Euclidean norms over all parameters, of the unweighted terms L_j = term_fn()[j]; the
    weighted gradients lambda_i grad L_i then all have norm mean_j ||grad L_j||).
    """
    weights = {n: tf.Variable(tf.ones([], dtype), trainable=False, name=f"weight_{n}")
               for n in names}

    @tf.function
    def update():
        norms = {}
        for n in names:
            g = autodiff.grad(lambda n=n: term_fn()[n], variables)
            norms[n] = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(x)) for x in g]))
        mean = tf.add_n(list(norms.values())) / len(names)
        for n in names:
            target = tf.cast(mean / tf.maximum(norms[n], 1e-30), dtype)
            weights[n].assign(alpha * weights[n] + (1 - alpha) * target)
        return {n: w.read_value() for n, w in weights.items()}
    return weights, update


@gin.configurable
def grad_norm_balance_weights(problem, u_fn, points, condition_points, variables, gpinn=None,
                              alpha=0.9, every=1000, reducers=None):
    """Gradient-norm balancing as jaxpi trains (Wang et al., "An expert's guide to training
    PINNs", 2023, Algorithm 1): every `every` steps EVERY term i, the residual included, gets

        lambda_i <- alpha lambda_i + (1 - alpha) mean_j ||grad_theta L_j|| / ||grad_theta L_i||

    (`balance_grad_norms`), so each weighted term pulls the parameters equally hard. Unlike
    `grad_norm_weights` (max |g_r| / mean |g_i|, which weighs a fitted term up without
    bound: the two norms differ by about sqrt(#parameters)), the weighted gradient norms
    stay at the mean of the unweighted ones.

    reducers: {term: reduce} of schemes listed before this one in `combined_weights`
    (causal weights), applied to the terms whose gradient norms are measured, as jaxpi
    measures the causally weighted residual; `combined_weights` passes them."""
    where = "grad_norm_balance_weights"
    parts.check_every_alpha(every, alpha, where)
    names = parts.terms_to_balance(problem, gpinn, where)
    unweighted = training.pinn_loss(problem, u_fn, points, condition_points, gpinn=gpinn,
                                    reducers=reducers)
    weights, update = balance_grad_norms(unweighted, variables, names, alpha,
                                         parts.points_dtype(points))
    return Weighting(weights=weights, update=update, every=every,
                     state={f"weight_{n}": w for n, w in weights.items()})


def ntk_trace(values_fn, x, variables, chunk=256):
    """The mean diagonal of a term's NTK block, tr(K_ii) / N_i = (1/N_i) sum_j
    ||d r_j / d theta||^2 over the term's N_i values r_j = values_fn(x) (rows of x times
    columns), a scalar.

    The per-value Jacobians come from `hogrod.jacobian`, `chunk` points at a time (its
    memory grows with the square of the points it is given; every point is counted)."""
    return parts.chunked_mean(parts.jacobian_square_sum(values_fn, list(variables)), x, chunk)


@gin.configurable
def ntk_weights(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor], points: TensorLike,
                condition_points: Sequence[TensorLike], variables: Sequence[tf.Variable],
                gpinn: Optional[Mapping[int, float]] = None, alpha: float = 0.9,
                every: int = 100, chunk: int = 256) -> Weighting:
    """NTK weighting (Wang, Yu and Perdikaris 2022) of every term by kernel trace ratios.

    Every `every` steps each term i gets

        lambda_i <- alpha lambda_i + (1 - alpha) sum_k tr(K_kk)/N_k / (tr(K_ii)/N_i)

    where K_ii = J_i J_i^T is the term's block of the neural tangent kernel, J_i the
    Jacobian of its N_i pointwise values (residuals, condition misfits; `ntk_trace`) with
    respect to the network's parameters. With equal point counts this is the paper's
    lambda_i = tr(K) / tr(K_ii); the mean diagonal (jaxpi's form) matches the terms, which
    are means over their points. A term's `scale` (the gPINN term's sum over coordinates)
    multiplies its trace as it multiplies its mean.

    Args:
      problem: the `Problem` (its terms: `term_names(problem, gpinn)`).
      u_fn: the solution, [n, dim] -> [n, m] (`solution_fn`).
      points: the collocation points, [n, dim], of the network's dtype (the weights').
      condition_points: one set of points per condition of the problem, in order.
      variables: the network's trainable variables.
      gpinn: None, or {coordinate: weight}, `pinn_loss`'s gPINN term.
      alpha: the moving average's weight on the old value, in [0, 1).
      every: the steps between updates, >= 1.
      chunk: points per Jacobian, >= 1; `update()` runs the compiled Jacobians chunk by
        chunk.
    Returns:
      A `Weighting` with `weights` (a variable per term) and their `update`.
    Raises:
      ValueError: the residual is the problem's only term, or a bad `alpha`, `every` or
        `chunk`.
    """
    where = "ntk_weights"
    parts.check_every_alpha(every, alpha, where)
    checks.integer(chunk, f"{where}.chunk", where, least=1)
    names = parts.terms_to_balance(problem, gpinn, where)
    terms = training.pointwise_terms(problem, u_fn, tf.convert_to_tensor(points),
                                     [tf.convert_to_tensor(x) for x in condition_points], gpinn)
    dtype = parts.points_dtype(points)
    weights = {n: tf.Variable(tf.ones([], dtype), trainable=False, name=f"weight_{n}")
               for n in names}
    variables = list(variables)

    # one compiled Jacobian per term, traced for the chunk's shape and the remainder's only;
    # the loop over chunks stays outside (one graph for all of them would grow with n)
    square_sums = {n: tf.function(parts.jacobian_square_sum(terms[n].values, variables))
                   for n in names}

    def update():
        traces = {n: tf.cast(terms[n].scale * parts.chunked_mean(square_sums[n], terms[n].points,
                                                             chunk), dtype)
                  for n in names}
        total = tf.add_n(list(traces.values()))
        for n in names:
            target = total / tf.maximum(traces[n], tf.constant(1e-30, dtype))
            weights[n].assign(alpha * weights[n] + (1 - alpha) * target)
        return {n: w.read_value() for n, w in weights.items()}
    return Weighting(weights=weights, update=update, every=every,
                     state={f"weight_{n}": w for n, w in weights.items()})


def causal_chunk_weights(chunk_losses, eps):
    """w_i = exp(-eps sum_{k<i} L_r(t_k)) for the residual losses L_r(t_k) of the time
    chunks in order, with the gradient stopped (the weights are not trained): 1 for the
    first chunk, non-increasing in time."""
    cumulative = tf.math.cumsum(chunk_losses, exclusive=True)
    return tf.stop_gradient(tf.exp(-eps * cumulative))


@gin.configurable
def causal_weights(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor], points: TensorLike,
                   condition_points: Sequence[TensorLike], variables: Sequence[tf.Variable],
                   gpinn: Optional[Mapping[int, float]] = None, eps: float = 1.0,
                   chunks: int = 32) -> Weighting:
    """Causal training (Wang, Sankaran and Perdikaris 2024): later times wait for earlier.

    The collocation points are split by time (the last coordinate) into `chunks` equal
    intervals t_1 < ... < t_M of the domain, and the residual term becomes

        L_r = (1/M) sum_i w_i L_r(t_i),   w_i = exp(-eps sum_{k<i} L_r(t_k))   (no gradient)

    with L_r(t_i) the mean squared residual in chunk i: a later time is weighed in only once
    the earlier ones are fitted. Computed at every evaluation (no update).

    Args:
      problem: the `Problem` (its terms: `term_names(problem, gpinn)`).
      u_fn: the solution, [n, dim] -> [n, m] (`solution_fn`).
      points: the collocation points, [n, dim], of the network's dtype (the weights').
      condition_points: one set of points per condition of the problem, in order.
      variables: the network's trainable variables.
      gpinn: None, or {coordinate: weight}, `pinn_loss`'s gPINN term.
      eps: how strictly, >= 0 (the paper raises it over training:
        `annealed_causal_weights`).
      chunks: the number of time chunks M, >= 1; each must hold collocation points.
    Returns:
      A `Weighting` with a `reducers` entry for "residual".
    Raises:
      ValueError: a problem without time (`time_dependent`), an empty chunk, or a bad
        `eps` or `chunks`.
    """
    where = "causal_weights"
    checks.nonnegative(eps, f"{where}.eps", where)
    chunk_of = parts.causal_chunks(problem, points, chunks, where)

    def reduce(x, squares):
        losses = parts.chunk_losses(chunk_of, chunks, x, squares)
        return tf.reduce_mean(causal_chunk_weights(losses, eps) * losses)
    return Weighting(reducers={"residual": reduce})


@gin.configurable
def annealed_causal_weights(problem, u_fn, points, condition_points, variables, gpinn=None,
                            eps=(1e-2, 1e-1, 1.0, 10.0, 100.0), tol=0.99, chunks=32):
    """Causal training with the causality parameter raised over training (Wang, Sankaran
    and Perdikaris 2024, Algorithm 1): the residual term is `causal_weights`'

        L_r = (1/M) sum_i w_i L_r(t_i),   w_i = exp(-eps_k sum_{l<i} L_r(t_l))   (no gradient)

    with eps_k the current entry of the increasing list `eps`; whenever the smallest weight,
    min_i w_i = w_M, exceeds `tol` (every chunk is fitted at this strictness), the next
    evaluation of the loss uses eps_{k+1} (the last entry stays). The index k is checkpointed
    (state "causal_eps_index")."""
    where = "annealed_causal_weights"
    if (not isinstance(eps, (list, tuple)) or not eps
            or not all(isinstance(e, (int, float)) and math.isfinite(e) and e >= 0 for e in eps)
            or list(eps) != sorted(eps)):
        raise ValueError(f"{where}.eps must be a non-empty increasing list of finite numbers "
                         f">= 0, got {eps!r}")
    checks.probability(tol, f"{where}.tol", where, open_ends=True)
    chunk_of = parts.causal_chunks(problem, points, chunks, where)
    dtype = parts.points_dtype(points)
    schedule = tf.constant(list(eps), dtype)
    index = tf.Variable(0, dtype=tf.int32, trainable=False, name="causal_eps_index")

    def eps_value():
        return tf.gather(schedule, index)

    def reduce(x, squares):
        losses = parts.chunk_losses(chunk_of, chunks, x, squares)
        weights = causal_chunk_weights(losses, eps_value())
        # raised after this evaluation: the loss returned is at the eps it was computed with
        index.assign(tf.where(tf.reduce_min(weights) > tol,
                              tf.minimum(index + 1, len(eps) - 1), index))
        return tf.reduce_mean(weights * losses)
    return Weighting(reducers={"residual": reduce}, state={"causal_eps_index": index})


@tf.custom_gradient
def _ascend(v):
    """The identity, whose gradient is negated: minimizing a loss through it maximizes the
    loss over `v` (gradient ascent in the same train step)."""
    return tf.identity(v), lambda g: -g


_MASKS = {"polynomial": None, "softplus": tf.nn.softplus}


@gin.configurable
def self_adaptive_weights(problem: Problem, u_fn: Callable[[tf.Tensor], tf.Tensor],
                          points: TensorLike, condition_points: Sequence[TensorLike],
                          variables: Sequence[tf.Variable],
                          gpinn: Optional[Mapping[int, float]] = None,
                          terms: Optional[Sequence[str]] = None, mask: str = "polynomial",
                          power: float = 2.0, initial: float = 1.0,
                          learning_rate: float = 5e-3) -> Weighting:
    """Self-adaptive PINNs (McClenny and Braga-Neto 2023): trainable per-point weights.

    Every point j of each term in `terms` has a trainable weight lambda_j, and the term
    becomes

        L_i = mean_j m(lambda_j) r_j^2,   min over theta, MAX over lambda

    so points with large residuals get larger weights. The train step descends in the
    network's parameters and ascends in lambda (its own Adam), in one pass. The weights
    belong to the training points: the batch must be the points given here (no sharding);
    L-BFGS keeps them fixed.

    Args:
      problem: the `Problem` (its terms: `term_names(problem, gpinn)`).
      u_fn: the solution, [n, dim] -> [n, m] (`solution_fn`).
      points: the collocation points, [n, dim], of the network's dtype (the weights').
      condition_points: one set of points per condition of the problem, in order.
      variables: the network's trainable variables.
      gpinn: None, or {coordinate: weight}, `pinn_loss`'s gPINN term.
      terms: the terms weighted; None for the residual and every condition.
      mask: m, "polynomial" (lambda^power) or "softplus".
      power: the polynomial mask's exponent.
      initial: every lambda's initial value (at the points' dtype).
      learning_rate: the ascent's Adam learning rate, > 0.
    Returns:
      A `Weighting` with `reducers` for `terms`, the lambdas as `ascent` and `state`.
    Raises:
      ValueError: `terms` empty or naming no term of the problem, a bad `mask` or
        `learning_rate`, or (when evaluated) a batch of other points.
    """
    where = "self_adaptive_weights"
    checks.choice(mask, tuple(sorted(_MASKS)), f"{where}.mask", where)
    checks.positive(learning_rate, f"{where}.learning_rate", where)
    available = training.term_names(problem, gpinn)
    if terms is None:
        terms = ["residual"] + [name for name, _, _ in problem.conditions]
    terms = list(terms)
    unknown = [n for n in terms if n not in available]
    if unknown or not terms:
        raise ValueError(f"{where}.terms must name terms of problem {problem.name!r} "
                         f"({available}), got {terms}")
    pointwise = training.pointwise_terms(
        problem, u_fn, tf.convert_to_tensor(points),
        [tf.convert_to_tensor(x) for x in condition_points], gpinn)
    dtype = parts.points_dtype(points)
    lambdas = {n: tf.Variable(tf.fill([pointwise[n].points.shape[0], 1],
                                      tf.constant(initial, dtype)), name=f"sa_{n}")
               for n in terms}

    def masked(v):
        if mask == "polynomial":
            return tf.pow(v, power)
        return _MASKS[mask](v)

    def reducer(name):
        lam = lambdas[name]

        def reduce(x, squares):
            if squares.shape[0] != lam.shape[0]:
                raise ValueError(f"{where}: term {name!r} has {lam.shape[0]} per-point weights "
                                 f"but was evaluated at {squares.shape[0]} points; the "
                                 "weights belong to the training points (no sharding)")
            return tf.reduce_mean(masked(_ascend(lam)) * squares)
        return reduce
    return Weighting(reducers={n: reducer(n) for n in terms},
                     state={f"sa_{n}": v for n, v in lambdas.items()},
                     ascent=tuple(lambdas.values()), ascent_lr=learning_rate)


@gin.configurable
def combined_weights(problem, u_fn, points, condition_points, variables, gpinn=None, *,
                     schemes):
    """Several schemes at once (jaxpi: gradient-norm weights on the terms and causal
    weights inside the residual): `schemes` by reference, e.g. [@grad_norm_weights,
    @causal_weights]. Their term weights, reducers and state must not overlap; at most one
    may update (every its own `every` steps) and at most one may ascend."""
    if not isinstance(schemes, (list, tuple)) or not schemes:
        raise ValueError(f"combined_weights.schemes must be a non-empty list of weighting "
                         f"schemes by reference, got {schemes!r}")
    parts = []
    for s in schemes:
        # a scheme that measures the terms (grad_norm_balance_weights) sees the reducers of
        # the schemes before it, as they shape the loss it balances
        earlier = {k: v for p in parts for k, v in p.reducers.items()}
        extra = ({"reducers": earlier} if "reducers" in inspect.signature(s).parameters
                 else {})
        parts.append(s(problem, u_fn, points, condition_points, variables, gpinn=gpinn,
                       **extra))
    merged = {}
    for field in ("weights", "reducers", "state"):
        merged[field] = {}
        for scheme, part in zip(schemes, parts):
            clash = set(merged[field]) & set(getattr(part, field))
            if clash:
                raise ValueError(f"combined_weights: {scheme!r} sets the {field} of "
                                 f"{sorted(clash)} that an earlier scheme sets too")
            merged[field].update(getattr(part, field))
    updating = [p for p in parts if p.update is not None]
    ascending = [p for p in parts if p.ascent]
    if len(updating) > 1 or len(ascending) > 1:
        raise ValueError("combined_weights: at most one scheme may update its weights and at "
                         f"most one may ascend, got schemes {schemes!r}")
    update = updating[0] if updating else Weighting()
    ascent = ascending[0] if ascending else Weighting()
    return Weighting(update=update.update, every=update.every, ascent=ascent.ascent,
                     ascent_lr=ascent.ascent_lr, **merged)
