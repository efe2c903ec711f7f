"""Gradient penalties and WGAN-GP training.

- `gradient_penalty`, `lp_penalty`, `r1_penalty`, `r2_penalty`, `dragan_penalty`: one
  signature `penalty(critic, real, fake, *, noise)`, gin-configurable, selected by
  reference; `input_gradient_norm`, `squared_input_gradient`, `perturbation` (`penalties.py`);
- `make_wgan_gp_step`, `grouped`, `with_noise` (`wgan_gp.py`), on
  `hogrod.train.make_train_step`;
- toy data and mode metrics: `toy_batches`, `sample_toy`, `modes`, `mode_metrics`
  (`toy_data.py`).
"""

from hogrod.gan.penalties import (NOISE_KEYS, dragan_penalty, gradient_penalty,
                                  input_gradient_norm, lp_penalty, perturbation, r1_penalty,
                                  r2_penalty, squared_input_gradient)
from hogrod.gan.toy_data import TOY, mode_metrics, modes, sample_toy, toy_batches
from hogrod.gan.wgan_gp import grouped, make_wgan_gp_step, with_noise

__all__ = ["gradient_penalty", "lp_penalty", "r1_penalty", "r2_penalty", "dragan_penalty",
           "input_gradient_norm", "squared_input_gradient", "perturbation", "NOISE_KEYS",
           "make_wgan_gp_step", "grouped", "with_noise", "TOY", "toy_batches", "sample_toy",
           "modes", "mode_metrics"]
