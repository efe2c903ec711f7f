"""Timing for the benchmark binaries: candidates measured in interleaved rounds.

Machines here are shared and noisy; timing every candidate once per round, round after
round, exposes them to the same noise, and the medians' ratios are what the benchmarks
report (never absolute targets).
"""

import time

import numpy as np
import tensorflow as tf

__all__ = ["interleaved_rates", "interleaved_samples", "matmul_floor"]


def interleaved_rates(candidates, rounds, calls_per_round=1, warmup=5):
    """{name: median calls per second} for {name: zero-argument callable}."""
    samples = interleaved_samples(candidates, rounds, calls_per_round, warmup)
    return {name: float(np.median(r)) for name, r in samples.items()}


def interleaved_samples(candidates, rounds, calls_per_round=1, warmup=5):
    """{name: [calls per second in each round]}: the rounds' rates, for statistics other
    than the median (on a machine other jobs load, the best round is the least disturbed)."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    rates = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            for _ in range(calls_per_round):
                fn()
            rates[name].append(calls_per_round / (time.perf_counter() - t0))
    return rates


def matmul_floor(rows, width, count):
    """Candidates for `interleaved_rates` doing `count` float32 [rows, width] x [width,
    width] products and nothing else, and a function of the rates giving the floor.

    A step whose work is those products cannot run faster than them on this machine with
    TensorFlow's kernels. They run in one `tf.function` both chained (one after another,
    each using every intra-op thread) and independent (TensorFlow may run them
    concurrently); the faster arrangement is the floor. Timed in the same interleaved
    rounds as the step, a baseline's time over the floor is the best ratio over that
    baseline that any TensorFlow step doing those products can reach here.

    Returns ({name: callable}, floor_seconds(rates)); with no products, ({}, 0).
    """
    if count < 1:
        return {}, lambda rates: 0.0
    x = tf.random.stateless_normal([rows, width], [count, 1])
    scale = width ** -0.5  # keeps a chain of products O(1): no overflow, no denormals
    ws = [scale * tf.random.stateless_normal([width, width], [i, 0]) for i in range(count)]

    @tf.function
    def chained():
        h = x
        for w in ws:  # distinct weights: nothing for grappler to merge
            h = tf.matmul(h, w)
        return h[:1, :1]  # every product is still needed; only one number is copied out

    @tf.function
    def independent():
        return [tf.matmul(x, w) for w in ws]

    candidates = {"floor_chained": lambda: chained().numpy(),
                  "floor_independent": lambda: independent()[0].numpy()}
    return candidates, lambda rates: 1.0 / max(rates[k] for k in candidates)


def floor_metrics(floor, rates):
    """`matmul_floor_ms` and, for each candidate's rate (calls/s) in `rates`,
    `floor_ratio_over_<name>`: its time over the floor's, the best ratio over it a step doing
    only the floor's products could reach. A floor of 0 (no products) gives no ratios."""
    metrics = {"matmul_floor_ms": 1e3 * floor}
    for k in rates if floor else ():
        metrics[f"floor_ratio_over_{k}"] = 1.0 / (floor * rates[k])
    return metrics
