"""Optimizers that train with curvature, behind `hogrod.train`'s step-optimizer protocol
(`hogrod/train/protocol.py`): each receives every step's gradient, objective and batch
from `make_train_step`, owns its state (checkpointed with it) and reports what it used.

One module per optimizer; `common.py` holds what they share (the Levenberg-Marquardt
damping rule, the reduction ratio, Gauss-Newton products on the step's batch);
`diagonal.py` the Hessian-diagonal estimators of AdaHessian and Sophia.
"""

from hogrod.second_order.adahessian import adahessian
from hogrod.second_order.common import (gauss_newton_product, levenberg_marquardt,
                                        reduction_ratio)
from hogrod.second_order.hessian_free import HessianFree, hessian_free
from hogrod.second_order.kfac import KFAC, kfac
from hogrod.second_order.sophia import sophia

__all__ = ["kfac", "KFAC", "hessian_free", "HessianFree", "adahessian", "sophia",
           "levenberg_marquardt", "reduction_ratio", "gauss_newton_product"]
