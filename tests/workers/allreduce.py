"""A multi-worker smoke program: each replica contributes replica_id + 1; prints the sum."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from hogrod.distribute import make_strategy  # noqa: E402

strategy = make_strategy("multi_worker", connect_timeout_s=30, collective_timeout_s=60)


@tf.function
def step():
    def replica():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce("sum", tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0)
    return strategy.run(replica)


print("RESULT", strategy.num_replicas_in_sync, float(strategy.experimental_local_results(step())[0]))
