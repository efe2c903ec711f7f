"""Optimizers that train with curvature, behind `hogrod.train`'s step-optimizer protocol
(`hogrod/train/protocol.py`): each receives every step's gradient, objective and batch
from `make_train_step`, owns its state (checkpointed with it) and reports what it used.

One module per optimizer; `common.py` holds what they share (the Levenberg-Marquardt
damping rule, the reduction ratio, Gauss-Newton products on the step's batch).
"""

from hogrod.second_order.common import (gauss_newton_product, levenberg_marquardt,
                                        reduction_ratio)
from hogrod.second_order.kfac import KFAC, kfac

__all__ = ["levenberg_marquardt", "reduction_ratio", "gauss_newton_product", "kfac", "KFAC"]
