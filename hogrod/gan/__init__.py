"""GAN losses, regularizers and training, and the Dirac-GAN convergence check.

- critic penalties `gradient_penalty`, `lp_penalty`, `r1_penalty`, `r2_penalty`,
  `dragan_penalty` (`penalties.py`) and `consistency_penalty` (bCR, `consistency.py`): one
  signature `penalty(critic, real, fake, *, noise)`, gin-configurable, selected by
  reference; `input_gradient_norm`, `squared_input_gradient`, `perturbation`;
- generator penalties with explicit state, `GeneratorPenalty(init, apply)`:
  `path_length_penalty` (StyleGAN2), `latent_consistency_penalty` (zCR's generator term),
  `path_lengths` (`generator_penalties.py`);
- lazy regularization `lazy_term` (`lazy.py`);
- the losses `wasserstein_loss`, `saturating_loss`, `nonsaturating_loss`,
  `relativistic_loss` (RpGAN): `loss(real_scores, fake_scores) -> GanLosses(critic,
  generator)` (`losses.py`);
- spectral normalization `SpectralNormalization`, `advance_power_iteration`,
  `spectral_layers` (`spectral.py`);
- the Dirac-GAN `dirac_gan`, `dirac_vector_field`, `dirac_jacobian`, `dirac_fixed_point`,
  `dirac_eigenvalues`, `dirac_trajectory` (`dirac.py`);
- the trainer `make_gan_step` (a loss and critic and generator penalties by gin
  reference, each penalty with its weight and `lazy_every`; `n_critic`; spectral
  normalization advanced once per update), `grouped`, `with_noise` (`trainer.py`), on
  `hogrod.train.make_train_step`;
- toy data and mode metrics: `toy_batches`, `sample_toy`, `modes`, `mode_metrics`
  (`toy_data.py`).
"""

from hogrod.gan.consistency import consistency_penalty
from hogrod.gan.dirac import (DIRAC_MODES, DiracGAN, dirac_eigenvalues, dirac_fixed_point,
                              dirac_gan, dirac_jacobian, dirac_trajectory, dirac_vector_field)
from hogrod.gan.generator_penalties import (GENERATOR_NOISE_KEYS, GeneratorPenalty,
                                            latent_consistency_penalty, path_length_penalty,
                                            path_lengths)
from hogrod.gan.lazy import lazy_term
from hogrod.gan.losses import (GanLosses, nonsaturating_loss, relativistic_loss,
                               saturating_loss, wasserstein_loss)
from hogrod.gan.penalties import (NOISE_KEYS, dragan_penalty, gradient_penalty,
                                  input_gradient_norm, lp_penalty, perturbation, r1_penalty,
                                  r2_penalty, squared_input_gradient)
from hogrod.gan.spectral import SpectralNormalization, advance_power_iteration, spectral_layers
from hogrod.gan.toy_data import TOY, mode_metrics, modes, sample_toy, toy_batches
from hogrod.gan.trainer import grouped, make_gan_step, with_noise

__all__ = ["gradient_penalty", "lp_penalty", "r1_penalty", "r2_penalty", "dragan_penalty",
           "consistency_penalty", "input_gradient_norm", "squared_input_gradient",
           "perturbation", "NOISE_KEYS", "GeneratorPenalty", "GENERATOR_NOISE_KEYS",
           "path_length_penalty", "latent_consistency_penalty", "path_lengths", "lazy_term",
           "GanLosses", "wasserstein_loss", "saturating_loss", "nonsaturating_loss",
           "relativistic_loss", "SpectralNormalization", "advance_power_iteration",
           "spectral_layers", "DiracGAN", "dirac_gan", "dirac_vector_field", "dirac_jacobian",
           "dirac_fixed_point", "dirac_eigenvalues", "dirac_trajectory", "DIRAC_MODES",
           "make_gan_step", "grouped", "with_noise", "TOY", "toy_batches", "sample_toy",
           "modes", "mode_metrics"]
