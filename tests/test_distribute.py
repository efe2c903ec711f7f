"""Strategy selection, TF_CONFIG validation with clear errors, and the local launcher (its
real two-process MultiWorkerMirroredStrategy run is tests/test_scale_out.py's)."""

import json
import sys
import time

import pytest
import tensorflow as tf

from hogrod import distribute


def cfg(workers, index=0, kind="worker"):
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": kind, "index": index}})


@pytest.mark.parametrize("raw,expected", [
    ("", "not set"),
    ("{cluster:", "not valid JSON"),
    (json.dumps({"cluster": {"worker": ["localhost:1"]}}), "'task'"),
    (json.dumps({"cluster": {"chief": ["localhost:1"]}, "task": {"type": "chief", "index": 0}}),
     "'worker' list"),
    (cfg(["localhost:1", "localhost"]), "not host:port"),
    (cfg(["localhost:1"], index=3), "index 3"),
    (cfg(["localhost:1"], kind="ps"), "task type"),
])
def test_malformed_tf_config_is_a_clear_error(raw, expected):
    with pytest.raises(distribute.ClusterError, match=expected):
        distribute.parse_tf_config(raw)


def test_unreachable_worker_fails_within_the_timeout():
    port_me, port_peer = distribute.free_ports(2)
    config = json.loads(cfg([f"localhost:{port_me}", f"localhost:{port_peer}"]))
    start = time.monotonic()
    with pytest.raises(distribute.ClusterError, match=f"localhost:{port_peer}.*unreachable"):
        distribute.wait_for_peers(config, timeout_s=1.0)
    assert time.monotonic() - start < 10


def test_launcher_kills_workers_past_its_deadline():
    start = time.monotonic()
    with pytest.raises(distribute.ClusterError, match="exceeded 2 s"):
        distribute.launch_local([sys.executable, "-c", "import time; time.sleep(60)"], 2,
                                timeout_s=2)
    assert time.monotonic() - start < 20


def test_mirrored_strategy_over_two_logical_cpus_and_bad_kind():
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == len(tf.config.list_logical_devices("CPU")) == 2
    assert distribute.make_strategy("default") is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match="make_strategy.kind"):
        distribute.make_strategy("tpu_pod")


def test_distribute_dataset_splits_batches_and_turns_autotuning_off(monkeypatch):
    """Deleting an autotuned tf.data iterator can wait up to a minute for its autotuning
    thread, so hogrod's iterators go without autotuning (the elements are the same)."""
    data = tf.data.Dataset.range(8).batch(4)
    for strategy, shards in ((distribute.make_strategy("mirrored"), [[0, 1], [2, 3]]),
                             (tf.distribute.get_strategy(), [[0, 1, 2, 3]])):
        given = []
        original = strategy.experimental_distribute_dataset
        monkeypatch.setattr(strategy, "experimental_distribute_dataset",
                            lambda d, *a, **k: given.append(d) or original(d, *a, **k))
        batches = [[t.numpy().tolist() for t in strategy.experimental_local_results(b)]
                   for b in distribute.distribute_dataset(strategy, data)]
        assert given[0].options().autotune.enabled is False
        assert batches[0] == shards and len(batches) == 2
    quiet = distribute.without_autotune(data)
    assert quiet.options().autotune.enabled is False and data.options().autotune.enabled is None
    assert [b.numpy().tolist() for b in quiet] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(TypeError, match="distribute_dataset: data must be a tf.data.Dataset"):
        distribute.distribute_dataset(strategy, [0, 1])
    with pytest.raises(TypeError, match="data must be a tf.data.Dataset, got list"):
        distribute.without_autotune([0, 1])
