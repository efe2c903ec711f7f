"""Gradient penalties and WGAN-GP training.

- `gradient_penalty`, `r1_penalty`, `r2_penalty`, `dragan_penalty`, `input_gradient_norm`
  (`penalties.py`);
- `make_wgan_gp_step`, `grouped`, `with_noise` (`wgan_gp.py`), on `hogrod.train.make_train_step`;
- toy data and mode metrics: `toy_batches`, `sample_toy`, `modes`, `mode_metrics`
  (`toy_data.py`).
"""

from hogrod.gan.penalties import (dragan_penalty, gradient_penalty, input_gradient_norm,
                                  r1_penalty, r2_penalty)
from hogrod.gan.toy_data import TOY, mode_metrics, modes, sample_toy, toy_batches
from hogrod.gan.wgan_gp import PENALTIES, grouped, make_wgan_gp_step, with_noise

__all__ = ["gradient_penalty", "r1_penalty", "r2_penalty", "dragan_penalty",
           "input_gradient_norm", "make_wgan_gp_step", "grouped", "with_noise", "PENALTIES", "TOY",
           "toy_batches", "sample_toy", "modes", "mode_metrics"]
