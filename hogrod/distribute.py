"""Strategies from gin, TF_CONFIG checked before use, and a local multi-worker launcher.

Scale-out in hogrod is `tf.distribute` and nothing else. This module only chooses a
strategy and gets the processes of a multi-worker run started:

- `make_strategy(kind)`: "default" (one device), "mirrored" (all local GPUs, or N logical
  CPU devices for testing), "multi_worker" (`MultiWorkerMirroredStrategy`, workers named by
  TF_CONFIG). Gin-configurable, so every binary takes its strategy from its config.
- `parse_tf_config()`: TF_CONFIG validated with errors that say what is wrong, and the
  peers probed over TCP with a deadline, so a bad cluster fails in seconds, not a hang.
- `shard(strategy, tensors)`: a fixed set of tensors (collocation points, a small data
  set) split along axis 0 into one equal shard per replica, for `strategy.run`.
- `distribute_dataset(strategy, data)`: a Dataset's batches split over the replicas, as
  `strategy.experimental_distribute_dataset` does, with tf.data's autotuning off
  (`without_autotune`: deleting an autotuned iterator can stall the process for a minute).
- `launch_local(argv, num_workers)`: N processes on loopback, each with its TF_CONFIG: the
  test harness for multi-worker code and the recipe for a real cluster (there, each machine
  runs the same command with its own TF_CONFIG).
"""

import json
import os
import socket
import subprocess
import sys
import time
from typing import Mapping, Optional, Sequence, Union

import gin
import tensorflow as tf

from hogrod.types import Tree

__all__ = ["make_strategy", "shard", "distribute_dataset", "without_autotune", "parse_tf_config",
           "launch_local", "free_ports", "ClusterError"]

STRATEGY_KINDS = ("default", "mirrored", "multi_worker")
_MIRRORED = {}


class ClusterError(RuntimeError):
    """TF_CONFIG is malformed, or a worker cannot be reached in time."""


def _logical_cpus(n: int) -> None:
    """Split the first CPU into n logical devices (must run before TF initializes devices)."""
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) == n:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError as e:
        have = len(tf.config.list_logical_devices("CPU"))
        if have < n:
            raise RuntimeError(
                f"make_strategy.logical_cpus = {n}, but TensorFlow already started with {have} "
                "CPU device(s); create the strategy before any other TensorFlow work") from e


@gin.configurable
def make_strategy(kind: str = "default", logical_cpus: int | None = None,
                  connect_timeout_s: float = 60.0,
                  collective_timeout_s: float | None = None) -> tf.distribute.Strategy:
    """A `tf.distribute.Strategy` by name.

    Args:
      kind: "default", "mirrored" or "multi_worker".
      logical_cpus: for testing without GPUs, split the CPU into this many logical devices
        (mirrored: one replica per device; multi_worker: devices per worker); None or 0:
        the devices as they are. Must come before any other TensorFlow work.
      connect_timeout_s: multi_worker: how long to wait, in seconds, for every peer in
        TF_CONFIG to accept a TCP connection before raising ClusterError.
      collective_timeout_s: multi_worker: a deadline in seconds for each collective op, so
        a worker that dies mid-run fails the others instead of hanging them; None: no
        deadline.

    Returns:
      "default": the current strategy (`tf.distribute.get_strategy()`); "mirrored": a
      `MirroredStrategy` over every local GPU, else every logical CPU, one instance per
      device set and process (a second call returns the same object); "multi_worker": a
      `MultiWorkerMirroredStrategy` whose peers have been reached.

    Raises:
      ValueError: `kind` is not one of the three.
      RuntimeError: `logical_cpus` asks for more CPU devices than TensorFlow started with.
      ClusterError: multi_worker: TF_CONFIG is unset or malformed, or a peer is unreachable
        within `connect_timeout_s`.
    """
    if kind not in STRATEGY_KINDS:
        raise ValueError(f"make_strategy.kind must be one of {STRATEGY_KINDS}, got {kind!r}")
    if logical_cpus:
        _logical_cpus(int(logical_cpus))
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = tuple(d.name for d in gpus) or tuple(
            d.name for d in tf.config.list_logical_devices("CPU"))
        # One MirroredStrategy per device set and process: two live instances number their
        # collectives alike, and TensorFlow then mixes up their all-reduces.
        if devices not in _MIRRORED:
            _MIRRORED[devices] = tf.distribute.MirroredStrategy(list(devices))
        return _MIRRORED[devices]
    config = parse_tf_config()
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=collective_timeout_s,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    # Each worker's server listens once its strategy exists; probe the peers now so a wrong
    # address or a worker that never started is an error in seconds, not a silent hang.
    wait_for_peers(config, connect_timeout_s)
    return strategy


def shard(strategy: tf.distribute.Strategy, tensors: Tree) -> Tree:
    """Split every tensor of a nested structure into one equal shard per replica.

    Each tensor is split along axis 0 into equal, contiguous shards, one per replica of
    `strategy` (over all workers): replica i gets rows ``[i * n / r, (i + 1) * n / r)``.
    A replica's term that is a mean over its shard then averages (over replicas) to the
    mean over all rows, which is what `make_train_step` computes; so every row count must
    divide by the number of replicas.

    Args:
      strategy: the strategy whose replicas get the shards (`num_replicas_in_sync` of them).
      tensors: a nested structure of tensors (or arrays), each of rank at least 1 with a
        row count divisible by the number of replicas.

    Returns:
      A distributed value of `tensors`' structure to pass to a step built with `strategy`
      (`strategy.experimental_distribute_values_from_function`); with one replica, the
      tensors themselves (converted to tensors).

    Raises:
      ValueError: a tensor is a scalar or its row count does not divide into equal shards;
        the message names the tensor's index in the flattened structure and its shape.
    """
    n = strategy.num_replicas_in_sync
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors)]
    for i, t in enumerate(flat):
        if t.shape.rank == 0 or t.shape[0] % n:
            raise ValueError(f"shard: tensor {i} of shape {t.shape} does not split into "
                             f"{n} equal shards along axis 0 (one per replica)")
    if n == 1:
        return tf.nest.pack_sequence_as(tensors, flat)

    def part(ctx):
        i = ctx.replica_id_in_sync_group
        return tf.nest.pack_sequence_as(tensors, [
            t[i * (t.shape[0] // n):(i + 1) * (t.shape[0] // n)] for t in flat])
    return strategy.experimental_distribute_values_from_function(part)


def without_autotune(data: tf.data.Dataset) -> tf.data.Dataset:
    """`data` with tf.data's autotuning off: the same elements in the same order.

    Deleting a tf.data iterator can wait for an autotuning thread to wake by itself,
    which it does at intervals that grow to 60 s, and a garbage collection that frees such
    an iterator stalls the whole process meanwhile. Measured on two CPU replicas: an
    iterator over a distributed dataset used for 25 s took 16 s to delete, and with other
    autotuned iterators alive, even iterators without autotuning took 14-40 s; with
    autotuning off everywhere, every deletion took 0.4 s. Autotuning only chooses buffer
    sizes and parallelism (`tf.data.AUTOTUNE` then means one thread per core), so the
    iterators hogrod makes (`distribute_dataset`, the curvature operators' passes over
    their data) go without it.

    Args:
      data: a `tf.data.Dataset`.

    Returns:
      `data.with_options(...)` with `autotune.enabled = False`.

    Raises:
      TypeError: `data` is not a `tf.data.Dataset`.
    """
    if not isinstance(data, tf.data.Dataset):
        raise TypeError(f"data must be a tf.data.Dataset, got {type(data).__name__}")
    options = tf.data.Options()
    options.autotune.enabled = False
    return data.with_options(options)


def distribute_dataset(
        strategy: tf.distribute.Strategy,
        data: tf.data.Dataset) -> Union[tf.data.Dataset, tf.distribute.DistributedDataset]:
    """`strategy.experimental_distribute_dataset(without_autotune(data))`: the batches of
    `data` split over the replicas, without the slow iterator deletion autotuning brings
    (`without_autotune`).

    Args:
      strategy: the strategy whose replicas get the batches.
      data: a `tf.data.Dataset` of global batches; each is split over the replicas.

    Returns:
      A `tf.distribute` DistributedDataset, or under a one-device strategy the Dataset
      itself, as `experimental_distribute_dataset` returns.

    Raises:
      TypeError: `data` is not a `tf.data.Dataset`.
    """
    if not isinstance(data, tf.data.Dataset):
        raise TypeError(f"distribute_dataset: data must be a tf.data.Dataset of batches, got "
                        f"{type(data).__name__}")
    return strategy.experimental_distribute_dataset(without_autotune(data))


def parse_tf_config(raw: Optional[str] = None) -> dict:
    """The TF_CONFIG of this process, checked: a dict with 'cluster' and 'task'.

    Args:
      raw: the TF_CONFIG JSON text; None: the environment variable TF_CONFIG.

    Returns:
      The parsed dict: 'cluster' maps each job to its list of "host:port" addresses (a
      non-empty 'worker' list among them), 'task' is {"type": a job of the cluster,
      "index": an index into that job's list}.

    Raises:
      ClusterError: naming the problem (unset, not JSON, no 'worker' list, a task index
        outside it, an address without a port).
    """
    raw = os.environ.get("TF_CONFIG") if raw is None else raw
    if not raw:
        raise ClusterError("TF_CONFIG is not set; a multi_worker strategy needs it (see "
                           "WORKSPACE.md, 'Scale-out')")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(config, dict) or "cluster" not in config or "task" not in config:
        raise ClusterError(f"TF_CONFIG needs keys 'cluster' and 'task', got {raw[:200]!r}")
    cluster, task = config["cluster"], config["task"]
    workers = cluster.get("worker") if isinstance(cluster, dict) else None
    if not isinstance(workers, list) or not workers:
        raise ClusterError(f"TF_CONFIG cluster needs a non-empty 'worker' list, got {cluster!r}")
    for address in sum((v for v in cluster.values() if isinstance(v, list)), []):
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise ClusterError(f"TF_CONFIG address {address!r} is not host:port")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ClusterError(f"TF_CONFIG task type {task!r} is not a job of the cluster "
                           f"{sorted(cluster)}")
    index = task.get("index")
    if not isinstance(index, int) or not 0 <= index < len(cluster[task["type"]]):
        raise ClusterError(f"TF_CONFIG task index {index!r} is outside the "
                           f"{len(cluster[task['type']])} {task['type']}(s) of the cluster")
    return config


def wait_for_peers(config: dict, timeout_s: float) -> None:
    """Block until every other address in the cluster accepts TCP, or raise ClusterError."""
    me = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    peers = [a for addrs in config["cluster"].values() for a in addrs if a != me]
    deadline = time.monotonic() + timeout_s
    for address in peers:
        host, _, port = address.rpartition(":")
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"worker {address} in TF_CONFIG is unreachable after {timeout_s:.0f} s "
                        "(is it started? is the port right?)") from None
                time.sleep(0.2)


def free_ports(n: int) -> list[int]:
    """Distinct free TCP ports on loopback (127.0.0.1).

    The ports are free when found; another process may take one before it is used.

    Args:
      n: how many ports.

    Returns:
      `n` distinct port numbers.
    """
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch_local(argv: Sequence[str], num_workers: int = 2, timeout_s: float = 300,
                 env: Optional[Mapping[str, str]] = None,
                 cwd: Optional[str] = None) -> list[subprocess.CompletedProcess]:
    """Run `argv` as `num_workers` processes on loopback, each with its own TF_CONFIG.

    Args:
      argv: the command, e.g. [sys.executable, "-m", "experiments.maml", "--gin_file=..."];
        each worker gets the same argv.
      num_workers: how many processes.
      timeout_s: a deadline for the whole run; on expiry every worker is killed and a
        ClusterError raised (never a hang).
      env: extra environment variables for the workers, on top of this process's (None:
        none); each worker's TF_CONFIG is set over them.
      cwd: the workers' working directory (None: this process's).

    Returns:
      A list of `subprocess.CompletedProcess`, one per worker (index order), with its
      stdout and stderr as text.

    Raises:
      ClusterError: the run exceeded `timeout_s` (every worker killed), or a worker exited
        non-zero (the message holds the tail of its stderr).
    """
    addresses = [f"localhost:{p}" for p in free_ports(num_workers)]
    procs = []
    for i in range(num_workers):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
        worker_env = dict(os.environ, **(env or {}), TF_CONFIG=json.dumps(tf_config))
        procs.append(subprocess.Popen(argv, env=worker_env, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout_s
    results = []
    try:
        for i, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ClusterError(f"local multi-worker run exceeded {timeout_s} s "
                                   f"(worker {i} still running); all workers killed") from None
            results.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, r in enumerate(results):
        if r.returncode != 0:
            raise ClusterError(f"worker {i} exited with {r.returncode}:\n{r.stderr[-3000:]}")
    return results


if __name__ == "__main__":  # python -m hogrod.distribute N python -m experiments.X ...
    results = launch_local(sys.argv[2:], int(sys.argv[1]))
    for i, r in enumerate(results):
        print(f"--- worker {i}\n{r.stdout}")
