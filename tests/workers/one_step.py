"""One train step under a strategy, for the multi-worker equivalence test.

usage: one_step.py KIND RESULT.npy  (KIND: default | multi_worker)
Every process builds the same model and global batch; under multi_worker each worker
feeds its half of the global batch. Worker 0 writes the weights after the step.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from hogrod import distribute, train  # noqa: E402

kind, result = sys.argv[1], sys.argv[2]
strategy = distribute.make_strategy(kind, connect_timeout_s=60, collective_timeout_s=120)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_fixtures import GLOBAL_BATCH, make_problem  # noqa: E402

with strategy.scope():
    model, opt, loss_fn, data = make_problem()
step = train.make_train_step(loss_fn, opt, model.trainable_variables, strategy=strategy)
dist = strategy.experimental_distribute_dataset(data.batch(GLOBAL_BATCH))
step(next(iter(dist)))
index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
if index == 0:
    np.save(result, np.concatenate([v.numpy().ravel() for v in model.trainable_variables]))
print("DONE", strategy.num_replicas_in_sync)
