"""K-FAC (Martens and Grosse 2015; kfac-jax's algorithm) as a step optimizer.

Every step, inside the one compiled train step (`hogrod.train.make_train_step`):

1. one captured forward pass of the model on this replica's batch and the backward passes
   of its output cotangents (`hogrod.curvature.kfac_capture`: type-2 Fisher, one Monte
   Carlo label per example, or the empirical Fisher) give each Dense / Conv2D layer's
   Kronecker factors A and G (`kfac_blocks.batch_factors`), averaged over the replicas;
   layers it cannot factor get a diagonal of the curvature with `other_layers="diagonal"`,
   the sum over examples of their gradients' squares: a normalization layer's scale and
   offset (BatchNorm, LayerNorm, GroupNorm) per example as kfac-jax, from the same
   backward pass (an example's gradient is its own rows of the layer's output gradients
   times x_hat: the examples' coupling through the batch statistics ignored, as the
   Kronecker factors ignore it), any other layer's exact per-example gradients (one
   vectorized Jacobian, N backward passes);
2. the factors' running average: kfac-jax's weighted average with `decay`, whose first
   value is the first batch's factors (`kfac_blocks.running_average`);
3. every `inverse_every` steps (a `tf.cond` on the step counter), the inverses of the
   factors with pi-corrected factored Tikhonov damping `damping + l2_reg`
   (`kfac_blocks.damped_inverses`);
4. the preconditioned gradient p, the update delta = -learning_rate p + momentum v (v the
   previous update), or with `adaptive=True` kfac-jax's learning rate and momentum that
   minimize the exact quadratic model (Gauss-Newton plus `l2_reg` plus the damping) in the
   span of p and v;
5. every `damping_adaptation_interval` steps, the reduction ratio rho of the step (the
   objective on the step's batch, before and after, against the quadratic model with
   exact Gauss-Newton products, no damping) and the Levenberg-Marquardt rule
   (`common.levenberg_marquardt`, factor `damping_decay ** damping_adaptation_interval`).

`l2_reg` is kfac-jax's: the curvature of an L2 term the objective already holds (the
objective's weight decay is not added here, only its curvature).
"""

import math
from typing import Callable, Dict, List, Optional, Sequence

import gin
import keras
import tensorflow as tf

from hogrod import checks
from hogrod.curvature.data import check_loss_dtype, fold_replica
from hogrod.curvature.kfac_capture import (Block, layer_blocks, layer_statistics,
                                           output_cotangents)
from hogrod.curvature.kronecker import FISHERS, OTHER_LAYERS
from hogrod.curvature.likelihood import Likelihood, likelihood_of
from hogrod.functional import functional_call
from hogrod.second_order import common, kfac_blocks
from hogrod.train.protocol import StepOptimizer, assign, replica_mean, state_variable
from hogrod.types import Batch, Loss, Tensor

__all__ = ["kfac", "KFAC"]

WHERE = "kfac"
INVALID_RHO = -100.0  # kfac-jax's stand-in for a reduction ratio that is not finite


@gin.configurable(denylist=["model", "loss"])
def kfac(model: keras.Model, loss: Loss, learning_rate: float = 0.1, damping: float = 1e-3,
         momentum: float = 0.0, l2_reg: float = 0.0, decay: float = 0.95,
         inverse_every: int = 5, fisher: str = "type2", mc_samples: int = 1,
         other_layers: str = "raise", adaptive: bool = False, adapt_damping: bool = True,
         damping_adaptation_interval: int = 5, damping_decay: float = 0.9,
         min_damping: float = 1e-8, max_damping: float = math.inf, seed: int = 0,
         name: str = "kfac") -> "KFAC":
    """The K-FAC optimizer of `model` trained on `loss` (the module docstring).

    Gin-configurable: `make_train_step`'s binaries bind its hyperparameters and pass the
    model and its loss. The train step's batches are pairs `(x, y)`.

    Args:
      model: a built Keras model with at least one Dense or Conv2D layer K-FAC factors.
      loss: its Keras loss (MeanSquaredError, BinaryCrossentropy, (Sparse)Categorical-
        Crossentropy: `hogrod.curvature.likelihood`), a mean over the batch, at the
        model's dtype.
      learning_rate: the step's rate (> 0; unused with `adaptive=True`).
      damping: the initial Tikhonov damping (>= 0, <= max_damping; damping + l2_reg > 0),
        adapted by Levenberg-Marquardt.
      momentum: the previous update's coefficient (>= 0; unused with `adaptive=True`).
      l2_reg: the L2 coefficient whose curvature is added (>= 0): the preconditioner's
        damping is `damping + l2_reg`, and the quadratic model holds it.
      decay: the factors' running-average decay, in (0, 1).
      inverse_every: the period, in steps, of the inverses' recomputation (>= 1).
      fisher: "type2" (the exact Fisher / Gauss-Newton of the loss, one backward pass per
        output), "mc" (`mc_samples` labels per example drawn from the loss's likelihood:
        one backward pass each) or "empirical" (the labels given).
      mc_samples: labels drawn per example with `fisher="mc"` (>= 1).
      other_layers: "raise" (a layer with weights K-FAC cannot factor is an error naming
        it) or "diagonal" (its variables get the diagonal of the curvature over per-example
        gradients, averaged like the factors: a normalization layer's as kfac-jax, the
        examples' coupling through the batch statistics ignored; step 1 above).
      adaptive: kfac-jax's adaptive learning rate and momentum (the quadratic model's
        minimizer in the span of the preconditioned gradient and the previous update).
      adapt_damping: whether Levenberg-Marquardt adapts the damping (else it stays fixed).
      damping_adaptation_interval: the period, in steps, of the adaptation (>= 1).
      damping_decay: the per-step factor in (0, 1); an adaptation multiplies or divides
        the damping by `damping_decay ** damping_adaptation_interval`.
      min_damping: the least damping (>= 0).
      max_damping: the largest damping (>= min_damping).
      seed: the seed of the Monte Carlo labels (with the step and the replica).
      name: the optimizer's name.

    Returns:
      A `KFAC` step optimizer.

    Raises:
      ArgumentError: a hyperparameter out of range, naming it; `model` without a layer
        K-FAC factors.
      ValueError: a layer K-FAC cannot factor with `other_layers="raise"`, naming it; a
        loss K-FAC does not know or not a batch mean.
      TypeError: `loss` is not a Keras loss object.
    """
    common.check_model_and_loss(model, loss, WHERE)
    hp = dict(
        learning_rate=checks.positive(learning_rate, "learning_rate", WHERE),
        damping=checks.nonnegative(damping, "damping", WHERE),
        momentum=checks.nonnegative(momentum, "momentum", WHERE),
        l2_reg=checks.nonnegative(l2_reg, "l2_reg", WHERE),
        decay=common.check_decay(decay, "decay", WHERE),
        inverse_every=checks.integer(inverse_every, "inverse_every", WHERE, least=1),
        fisher=checks.choice(fisher, FISHERS, "fisher", WHERE),
        mc_samples=checks.integer(mc_samples, "mc_samples", WHERE, least=1),
        adaptive=checks.boolean(adaptive, "adaptive", WHERE),
        adapt_damping=checks.boolean(adapt_damping, "adapt_damping", WHERE),
        interval=checks.integer(damping_adaptation_interval, "damping_adaptation_interval",
                                WHERE, least=1),
        damping_decay=common.check_decay(damping_decay, "damping_decay", WHERE),
        min_damping=checks.nonnegative(min_damping, "min_damping", WHERE),
        max_damping=(math.inf if max_damping == math.inf  # no bound: kfac-jax's default
                     else checks.number(max_damping, "max_damping", WHERE, low=min_damping)),
        seed=checks.seed(seed, "seed", WHERE))
    if hp["damping"] + hp["l2_reg"] == 0:
        raise checks.ArgumentError(
            f"{WHERE}: damping + l2_reg must be > 0 (got 0): a factor built from fewer "
            "examples than its width is singular without it; give damping a positive value")
    if hp["damping"] > hp["max_damping"]:
        raise checks.ArgumentError(f"{WHERE}: damping must be <= max_damping "
                                   f"({hp['max_damping']}), got {hp['damping']}")
    checks.choice(other_layers, OTHER_LAYERS, "other_layers", WHERE)
    likelihood, mean = likelihood_of(loss, WHERE)
    if not mean:
        raise ValueError(f"{WHERE}: loss must be a mean over the batch "
                         f"(reduction='sum_over_batch_size'), got {loss.reduction!r}")
    dtypes = {tf.as_dtype(v.dtype) for v in model.trainable_variables}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating:
        raise checks.ArgumentError(f"{WHERE}: model's trainable variables must share one "
                                   f"floating dtype, got {sorted(d.name for d in dtypes)}")
    check_loss_dtype(loss, next(iter(dtypes)), WHERE)
    blocks = layer_blocks(model, other_layers, WHERE)
    if not any(b.kind == "kfac" for b in blocks):
        raise checks.ArgumentError(
            f"{WHERE}: model '{model.name}' has no layer K-FAC factors (keras.layers.Dense or "
            "Conv2D with a kernel and an optional bias); use another optimizer")
    if next(iter(dtypes)) in (tf.float16, tf.bfloat16):  # the curvature in float32
        loss = type(loss).from_config(dict(loss.get_config(), dtype="float32"))
    return KFAC(model, loss, likelihood, blocks, hp, name)


class KFAC(StepOptimizer):
    """The K-FAC step optimizer (made by `kfac`, which documents the hyperparameters).

    Its state (state variables, `train.state_variable`, checkpointed with it): the step counter, the
    damping, the factors' running averages and running weight, their damped inverses, the
    previous update, and what the last step used (rate, momentum, damping, rho).

    Args:
      model: the model.
      loss: its Keras loss (a float32 copy for a half-precision model: the curvature's).
      likelihood: the loss's `hogrod.curvature.likelihood` (Monte Carlo labels).
      blocks: the layers' blocks (`kfac_capture.layer_blocks`).
      hp: the checked hyperparameters, by `kfac`'s argument names.
      name: the optimizer's name.
    """

    def __init__(self, model: keras.Model, loss: Loss, likelihood: Optional[Likelihood],
                 blocks: List[Block], hp: dict, name: Optional[str] = None) -> None:
        super().__init__(name=name)
        # kept off tf.Module's tracking: the model is checkpointed by its owner, not here
        self._problem = _Problem(model, loss, likelihood, blocks)
        self.hp = hp

    @property
    def model(self) -> keras.Model:
        """The model whose curvature preconditions the steps."""
        return self._problem.model

    @property
    def loss(self) -> Loss:
        """The Keras loss of the curvature."""
        return self._problem.loss

    @property
    def likelihood(self) -> Optional[Likelihood]:
        """The loss's likelihood (Monte Carlo labels), or None."""
        return self._problem.likelihood

    @property
    def blocks(self) -> List[Block]:
        """The layers' blocks, in the model's layer order."""
        return self._problem.blocks

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Create the state for `variables` (exactly the model's trainable variables).

        Args:
          variables: the variables `apply` will receive, in any order.

        Raises:
          ValueError: `variables` are not the model's trainable variables.
        """
        own = list(self.model.trainable_variables)
        position = {id(v): i for i, v in enumerate(variables)}
        if len(position) != len(own) or any(id(v) not in position for v in own):
            raise ValueError(f"{WHERE}: make_train_step's variables must be exactly "
                             f"model.trainable_variables of '{self.model.name}' (K-FAC "
                             "preconditions the whole model)")
        self._order = [position[id(v)] for v in own]
        var_dtype = tf.as_dtype(own[0].dtype)
        self.dtype = tf.float64 if var_dtype == tf.float64 else tf.float32
        dt, hp = self.dtype, self.hp
        self.step = state_variable(0, "step", tf.int64)
        self.damping = state_variable(hp["damping"], "damping", dt)
        self.weight = state_variable(0.0, "average_weight", dt)
        self.used = [state_variable(x, f"used_{n}", dt) for n, x in
                     (("learning_rate", hp["learning_rate"]), ("momentum", hp["momentum"]),
                      ("damping", hp["damping"]), ("rho", 0.0))]
        self.velocity = [state_variable(tf.zeros(v.shape, var_dtype), f"velocity_{i}")
                         for i, v in enumerate(own)]
        self.factors, self.inverses = [], []  # per block: [A, G] or one diagonal per variable
        for b in self.blocks:
            shapes = ([(b.d_in, b.d_in), (b.d_out, b.d_out)] if b.kind == "kfac"
                      else [s for s in b.shapes])
            self.factors.append([state_variable(tf.zeros(s, dt), f"{b.name}_factor_{j}")
                                 for j, s in enumerate(shapes)])
            self.inverses.append([state_variable(tf.zeros(s, dt), f"{b.name}_inverse_{j}")
                                  for j, s in enumerate(shapes)])
        self.built = True

    def apply(self, grads: Sequence[Tensor], variables: Sequence[tf.Variable],
              loss: Callable[[Batch], Tensor], batch: Batch) -> None:
        """One K-FAC step (the module docstring), in the train step's replica context.

        Args:
          grads: the global gradient, in `variables`' order.
          variables: the variables, as given to `build`.
          loss: the step's objective `loss(batch)`.
          batch: this replica's `(x, y)`.
        """
        x, y = common.split_batch(batch, WHERE)
        dt, hp = self.dtype, self.hp
        own = [variables[j] for j in self._order]
        grads = [tf.convert_to_tensor(grads[j]) for j in self._order]
        params = [tf.convert_to_tensor(v) for v in own]
        step = self.step.read_value()
        weight = tf.constant(hp["decay"], dt) * self.weight + 1
        factors = self._averaged(x, y, params, step, weight)
        damping = self.damping.read_value()
        inverses = tf.cond(
            tf.equal(step % hp["inverse_every"], 0),
            lambda: self._inverted(factors, damping + tf.constant(hp["l2_reg"], dt)),
            lambda: [[v.read_value() for v in vs] for vs in self.inverses])
        p = kfac_blocks.precondition(self.blocks, grads, dict(zip(self._names, inverses)), dt)
        velocity = [v.read_value() for v in self.velocity]
        rate, momentum, change = self._coefficients(x, y, params, grads, p, velocity, damping)
        delta = [tf.cast(momentum, v.dtype) * v - tf.cast(rate, u.dtype) * u
                 for u, v in zip(p, velocity)]
        new_params = [a + d for a, d in zip(params, delta)]
        new_damping, rho = self._adapted(x, y, loss, batch, own, params, new_params, grads,
                                         delta, damping, change, step)
        state = [self.step, self.damping, self.weight] + self.used + self.velocity
        values = [step + 1, new_damping, weight, rate, momentum, damping, rho] + delta
        for vs, new in zip(self.factors + self.inverses, factors + inverses):
            state += vs
            values += new
        assign(own + state, new_params + values)

    @property
    def _names(self):
        return [b.name for b in self.blocks]

    def _averaged(self, x, y, params, step, weight):
        """This batch's factors (and diagonals), averaged over the replicas, folded into
        the running averages."""
        hp, dt = self.hp, self.dtype
        key = fold_replica(tf.stack([tf.constant(hp["seed"], tf.int64), step]))
        sources = {b.name: [params[i] for i in b.indices] for b in self.blocks
                   if b.kind == "diag"}
        out, _ = layer_statistics(
            lambda: functional_call(self.model, params, x, training=True), self.blocks,
            lambda z: output_cotangents(self.loss, hp["fisher"], self.likelihood,
                                        hp["mc_samples"], key, y, tf.cast(z, dt)),
            sources, params)
        batch = [list(kfac_blocks.batch_factors(b, out[b.name], dt)) if b.kind == "kfac"
                 else [tf.cast(d, dt) for d in out[b.name]] for b in self.blocks]
        batch = replica_mean(batch)
        return [[kfac_blocks.running_average(v.read_value(), new, weight)
                 for v, new in zip(vs, news)] for vs, news in zip(self.factors, batch)]

    def _inverted(self, factors, damping):
        out = []
        for b, f in zip(self.blocks, factors):
            if b.kind == "kfac":
                out.append(list(kfac_blocks.damped_inverses(f[0], f[1], damping)))
            else:
                out.append([1 / (d + damping) for d in f])
        return out

    def _coefficients(self, x, y, params, grads, p, velocity, damping):
        """(learning rate, momentum, the quadratic model's change or None): fixed, or
        kfac-jax's adaptive pair minimizing the damped exact quadratic model."""
        hp, dt = self.hp, self.dtype
        if not hp["adaptive"]:
            return tf.constant(hp["learning_rate"], dt), tf.constant(hp["momentum"], dt), None
        vectors = [p, velocity]
        m = replica_mean(kfac_blocks.quadratic_form(self.model, self.loss, x, y, params,
                                                    vectors, dt))
        gram = tf.stack([tf.stack([_dot(u, v, dt) for v in vectors]) for u in vectors])
        b = tf.stack([_dot(grads, v, dt) for v in vectors])
        curvature = m + tf.constant(hp["l2_reg"], dt) * gram
        damped = curvature + damping * gram
        # the first step's previous update is zero: solve for the rate alone
        first = tf.equal(gram[1, 1], 0)
        one = tf.stack([-b[0] / tf.where(damped[0, 0] > 0, damped[0, 0], 1), tf.zeros([], dt)])
        safe = tf.where(first, tf.eye(2, dtype=dt), damped)
        both = -tf.linalg.solve(safe, b[:, None])[:, 0]
        w = tf.where(first, one, both)
        change = 0.5 * tf.tensordot(w, tf.linalg.matvec(curvature, w), 1) + tf.tensordot(w, b, 1)
        return -w[0], w[1], change

    def _adapted(self, x, y, loss, batch, own, params, new_params, grads, delta, damping,
                 change, step):
        """(the next damping, the rho to log): Levenberg-Marquardt on this step's reduction
        ratio every `damping_adaptation_interval` steps; the objective evaluated in a
        `keras.StatelessScope` (the model's state, BatchNorm statistics and seeds, is not
        written), the replicas' local values averaged outside the cond."""
        hp, dt = self.hp, self.dtype
        if not hp["adapt_damping"]:
            return damping, self.used[3].read_value()
        due = tf.equal((step + 1) % hp["interval"], 0)

        def local():
            gn = (tf.zeros([], dt) if change is not None else kfac_blocks.quadratic_form(
                self.model, self.loss, x, y, params, [delta], dt)[0, 0])
            return tf.stack([gn, _value(loss, batch, own, None, dt),
                             _value(loss, batch, own, new_params, dt)])

        gn, old, new = tf.unstack(replica_mean(tf.cond(due, local, lambda: tf.zeros([3], dt))))
        if change is None:
            change = (0.5 * (gn + tf.constant(hp["l2_reg"], dt) * _dot(delta, delta, dt))
                      + _dot(grads, delta, dt))
        rho = common.reduction_ratio(new, old, change)
        factor = tf.constant(hp["damping_decay"] ** hp["interval"], dt)
        adapted = common.levenberg_marquardt(damping, rho, factor, hp["min_damping"],
                                             hp["max_damping"])
        logged = tf.where(tf.math.is_finite(rho), rho, tf.constant(INVALID_RHO, dt))
        return (tf.where(due, adapted, damping), tf.where(due, logged, self.used[3]))

    @property
    def learning_rate(self) -> Tensor:
        """The learning rate the last step used."""
        return self.used[0]

    def logs(self) -> Dict[str, Tensor]:
        """What the last step used: its damping, momentum and reduction ratio (the last one
        computed; -100 where it was not finite, kfac-jax's convention).

        Returns:
          {"damping", "momentum", "rho"}: scalar variables.
        """
        return {"damping": self.used[2], "momentum": self.used[1], "rho": self.used[3]}


class _Problem:
    """What the optimizer is built for (a plain object: nothing here is its state)."""

    def __init__(self, model, loss, likelihood, blocks):
        self.model, self.loss, self.likelihood, self.blocks = model, loss, likelihood, blocks


def _dot(a, b, dtype):
    return tf.add_n([tf.reduce_sum(tf.cast(u, dtype) * tf.cast(v, dtype)) for u, v in zip(a, b)])


def _value(loss, batch, variables, values, dtype):
    """The objective on this replica's batch, at `values` for `variables` (None: as they
    are), without writing the model's state."""
    mapping = None if values is None else list(zip(variables, values))
    with keras.StatelessScope(state_mapping=mapping, collect_losses=True):  # as common.stateless
        return tf.cast(loss(batch), dtype)
