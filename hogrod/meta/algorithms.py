"""The algorithms of the MAML family, one module each, gathered under one name.

Every algorithm is a function `(model, loss, ..., task_map="vectorized") -> Algorithm` (see `common.py`):
`meta_loss(tasks, step=None)` returns `{"loss": objective, "monitor/...": logged}` for
`hogrod.train.make_train_step`; its gradient with respect to the model's variables and
`Algorithm.variables` is the algorithm's meta-gradient (`hogrod.meta.meta_gradient`).

Reptile and iMAML do not differentiate a loss through the inner loop; their `loss` is a
surrogate whose gradient is their update: Reptile's 0.5 ||theta - sg(phi)||^2 has
gradient theta - phi, iMAML's <theta, sg(g)> has gradient g, the implicit meta-gradient.
So one compiled train step (clipping, logging, NaN guard, tf.distribute sharding of the
meta-batch across replicas) serves every algorithm.

Random layers (Dropout): each `meta_loss` call draws fresh seeds from the model's seed
generators and advances them (`hogrod.meta.inner.draw_seeds`), and every forward pass of
every task (each inner step, the query) gets its own; a fixed generator state reproduces
the masks exactly, in every task mapping. Under 'vectorized' the random ops of those
layers run as a loop over the tasks (TF cannot vectorize a per-task seed).
Evaluation (`hogrod.meta.evaluate`) gives `Algorithm.adapt` and the query pass seeds of
its own, from an evaluation seed and the task's index.
"""

from hogrod.meta.anil import anil
from hogrod.meta.common import Algorithm
from hogrod.meta.fewshot import FEW_SHOT, metaoptnet, protonet, r2d2
from hogrod.meta.imaml import imaml
from hogrod.meta.maml import fomaml, maml
from hogrod.meta.maml_plus_plus import maml_plus_plus
from hogrod.meta.meta_sgd import meta_sgd
from hogrod.meta.reptile import reptile

__all__ = ["Algorithm", "maml", "fomaml", "reptile", "anil", "meta_sgd", "maml_plus_plus",
           "imaml", "ALGORITHMS",
           "protonet", "r2d2", "metaoptnet", "FEW_SHOT"]

ALGORITHMS = {"maml": maml, "fomaml": fomaml, "reptile": reptile, "anil": anil,
              "meta_sgd": meta_sgd, "maml_plus_plus": maml_plus_plus, "imaml": imaml}
