"""One step of every family under a two-process MultiWorkerMirroredStrategy.

usage: families.py OUT_DIR   (run by hogrod.distribute.launch_local with TF_CONFIG set)
Worker 0 writes OUT_DIR/<family>.npy; tests/test_scale_out.py compares them with the
single-device results of the same functions (tests/scale_out_fixtures.py).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from hogrod import distribute  # noqa: E402

strategy = distribute.make_strategy("multi_worker", connect_timeout_s=60,
                                    collective_timeout_s=120)
from scale_out_fixtures import FAMILIES  # noqa: E402

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
for name, fn in FAMILIES.items():
    result = fn(strategy)
    if index == 0:
        np.save(os.path.join(sys.argv[1], f"{name}.npy"), result)
print("DONE", strategy.num_replicas_in_sync, sorted(FAMILIES))
