"""Timing for the benchmark binaries: candidates measured in interleaved rounds.

Machines here are shared and noisy; timing every candidate once per round, round after
round, exposes them to the same noise, and the medians' ratios are what the benchmarks
report (never absolute targets).
"""

import time

import numpy as np

__all__ = ["interleaved_rates"]


def interleaved_rates(candidates, rounds, calls_per_round=1, warmup=5):
    """{name: median calls per second} for {name: zero-argument callable}."""
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
    return {name: float(np.median(r)) for name, r in rates.items()}
