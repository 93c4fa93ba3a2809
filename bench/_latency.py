"""Latency arithmetic shared by the benchmarks: percentiles and a summary of one timed run (pure, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(latencies: Sequence[float], seconds: float) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds and the rate (requests per second) of ``latencies`` (seconds each)
    completed in ``seconds`` of wall time."""
    if seconds <= 0:
        raise ValueError("the run took no time")
    ms = [v * 1000 for v in latencies]
    return {"p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95), "p99_ms": percentile(ms, 99),
            "max_ms": max(ms), "rate": len(ms) / seconds, "n": float(len(ms))}


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of a few rounds' figures."""
    return percentile(values, 50), min(values), max(values)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of ``values`` (order statistics: the k-th smallest
    and k-th largest, with k the largest rank whose binomial(n, 1/2) tail stays within (1 - confidence) / 2).
    Too few values for that confidence: (min, max), which then says little."""
    if not values:
        raise ValueError("no values")
    ordered, n = sorted(values), len(values)
    alpha, k, tail = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        tail += math.comb(n, k) / 2**n  # P(fewer than k + 1 of n below the median)
        if tail > alpha:
            break
        k += 1
    return (ordered[k - 1], ordered[n - k]) if k else (ordered[0], ordered[-1])
