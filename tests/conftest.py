"""Test setup: two logical CPU devices (for tf.distribute tests), quiet TF, hypothesis profile;
the data sets (HOGROD_DATA) in ../shared/data beside the repository unless set."""

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")
os.environ.setdefault("HOGROD_DATA", SHARED_DATA)  # subprocesses of tests inherit it


def central_differences(loss, variables, d=1e-6):
    """d loss / d variables by float64 central differences, each entry perturbed in place
    (the tests' oracle for gradients)."""
    out = []
    for v in variables:
        base = np.array(v.numpy())
        fd = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            values = []
            for sign in (1, -1):
                shifted = base.copy()
                shifted[idx] += sign * d
                v.assign(shifted)
                values.append(float(loss()))
            fd[idx] = (values[0] - values[1]) / (2 * d)
        v.assign(base)
        out.append(fd)
    return out


def bench_config(name):
    """The path of a benchmark's config, experiments/bench/configs/<name>.gin (benchmarks run
    from the repository; their configs are not shipped), from any working directory."""
    return os.path.join(REPO_ROOT, "experiments", "bench", "configs", f"{name}.gin")

import hypothesis  # noqa: E402


def pytest_configure(config):
    """Two logical CPUs in every process that runs tests. The pytest-xdist controller only
    schedules: importing TensorFlow there would delay every worker's start by seconds."""
    if config.getoption("numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return
    import tensorflow as tf
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError:  # already initialized (another conftest or plugin got there first)
        pass
    _iterate_without_autotune(tf)


def _iterate_without_autotune(tf):
    """Every iterator a test makes with `iter(dataset)` runs without tf.data's autotuning,
    as hogrod's own iterators do (`hogrod.distribute.without_autotune` says why): deleting
    an autotuned iterator can wait up to a minute for its autotuning thread, and a garbage
    collection that freed one left over by an earlier test stalled a worker for 40-106 s.
    The elements are the same."""
    from hogrod import distribute
    iterate = tf.data.Dataset.__iter__

    def __iter__(self):
        return iterate(distribute.without_autotune(self))
    tf.data.Dataset.__iter__ = __iter__


def pytest_collection_modifyitems(items):
    """Tests marked `slow` (tens of seconds each: subprocesses, whole binaries) run first.
    pytest-xdist's work stealing splits what is left into halves; with the long tests at
    the end of a worker's queue, the other worker would idle until the last one ends."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


hypothesis.settings.register_profile(
    "hogrod", deadline=None, max_examples=15, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("hogrod")

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_gin_bindings_between_tests():
    """Every test starts and ends without gin bindings: a config parsed by one test must not
    change the defaults another test's library calls see (the order differs per worker)."""
    with gin.unlock_config():
        gin.clear_config()
    yield
    with gin.unlock_config():
        gin.clear_config()


import gc  # noqa: E402

# Tracing a tf.function allocates millions of short-lived container objects; at Python's
# default threshold (a young collection every 700 net allocations) the collector took about
# 8% of a worker's CPU. Young collections every 20,000 allocations take under 2% with the
# same peak memory.
gc.set_threshold(20_000, 10, 10)


@pytest.fixture(autouse=True, scope="module")
def _collect_and_freeze_after_each_module():
    """After each test file, one full garbage collection over what the file left, then its
    survivors frozen (`gc.freeze`): the automatic full collections scan only the objects of
    the running file, not every graph object a worker has kept alive (over a whole suite,
    each such scan took seconds, several times per file). Frozen objects are still freed by
    reference counting; a worker's peak memory is unchanged."""
    yield
    gc.collect()
    gc.freeze()

