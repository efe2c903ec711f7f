"""The linearized (GLM) predictive of a Laplace posterior, shared by every posterior class:
f ~ N(f(x; theta*), J(x) P^-1 J(x)^T), the probit or Monte Carlo class probabilities."""

import math
from typing import Tuple, Union

import tensorflow as tf

from hogrod import checks
from hogrod.types import TensorLike, Tree

__all__ = ["LinearizedPredictive", "LINK_APPROXES"]

LINK_APPROXES = ("probit", "mc")


class LinearizedPredictive:
    """`predictive` for `BaseLaplace` (which supplies `output_jacobian`, `_variance`,
    `_delta` and the hyperparameters)."""

    def functional_variance(self, jac: TensorLike) -> tf.Tensor:
        """J P^-1 J^T per example at the stored hyperparameters.

        Args:
          jac: [N, C, n_params] Jacobians (`output_jacobian`).

        Returns:
          [N, C, C] float64 tensor.
        """
        self._require_fit("functional_variance")
        return self._variance(tf.cast(jac, tf.float64),
                              self._delta(None, "Laplace.functional_variance"),
                              tf.constant(1 / self.sigma_noise ** 2, tf.float64))

    def predictive(self, x: Tree, link_approx: str = "probit", n_samples: int = 100,
                   seed: int = 0, observation_noise: bool = False
                   ) -> Union[tf.Tensor, Tuple[tf.Tensor, tf.Tensor]]:
        """The linearized predictive at inputs `x`.

        Args:
          x: a batch of model inputs.
          link_approx: classification: "probit" (softmax(mu * kappa), kappa = 1 / sqrt(1 +
            pi/8 diag(var))) or "mc" (the mean of softmax over draws of f).
          n_samples: the draws of f for "mc".
          seed: their stateless seed.
          observation_noise: regression: add sigma_noise^2 I (the predictive of y).

        Returns:
          Regression: `(mean [N, C], variance [N, C, C])` at the model's dtype;
          classification: class probabilities [N, C].

        Raises:
          ValueError: not fitted.
          ArgumentError: `link_approx`, `n_samples` or `seed` invalid.
        """
        where = "Laplace.predictive"
        self._require_fit("predictive")
        z, jac = self.output_jacobian(x)
        var = self.functional_variance(jac)
        mu = tf.cast(z, tf.float64)
        if self.likelihood == "regression":
            if observation_noise:
                var = var + self.sigma_noise ** 2 * tf.eye(z.shape[-1], dtype=tf.float64)
            return tf.cast(mu, self.dtype), tf.cast(var, self.dtype)
        checks.choice(link_approx, LINK_APPROXES, "link_approx", where)
        n_samples = checks.integer(n_samples, "n_samples", where, least=1)
        seed = checks.seed(seed, "seed", where)
        return tf.cast(self.class_probs(mu, var, link_approx, n_samples, seed), self.dtype)

    __call__ = predictive

    def class_probs(self, mu: tf.Tensor, var: tf.Tensor, link_approx: str, n_samples: int,
                    seed: int) -> tf.Tensor:
        """Class probabilities from the logits' mean and variance.

        Args:
          mu: [N, C] logits' means.
          var: [N, C, C] logits' covariances.
          link_approx: "probit" or "mc".
          n_samples: the draws of "mc".
          seed: their integer stateless seed.

        Returns:
          [N, C] class probabilities at mu's dtype.
        """
        if link_approx == "probit":
            kappa = 1 / tf.sqrt(1 + math.pi / 8 * tf.linalg.diag_part(var))
            return tf.nn.softmax(kappa * mu)
        samples = self.sample_functions(mu, var, n_samples, seed)
        return tf.reduce_mean(tf.nn.softmax(samples), 0)

    @staticmethod
    def sample_functions(mu: tf.Tensor, var: tf.Tensor, n_samples: int,
                         seed: int) -> tf.Tensor:
        """Draws of N(mu, var) per example.

        A symmetric square root of var is used, so a singular variance is fine.

        Args:
          mu: [N, C] means.
          var: [N, C, C] covariances.
          n_samples: S.
          seed: an integer stateless seed.

        Returns:
          [S, N, C] tensor at mu's dtype.
        """
        evals, evecs = tf.linalg.eigh(var)
        root = evecs * tf.sqrt(tf.maximum(evals, 0.0))[:, None, :]
        eps = tf.random.stateless_normal(tf.concat([[n_samples], tf.shape(mu)], 0),
                                         [int(seed), 0], dtype=mu.dtype)
        return mu[None] + tf.einsum("nck,snk->snc", root, eps)
