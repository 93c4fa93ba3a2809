"""Verdicts on check results, as pure functions: a node against its group, and a node's run as a whole.

The agent decides what it can decide alone (a wrong matmul result, a memory pattern mismatch, an ECC error)
and reports ``failed``. Throughput figures it cannot judge alone: a node fails a figure when it is below
``min_ratio`` (0.75) of the reference, which is a configured baseline for that figure when there is one, else
the median of the same figure over the group's healthy nodes (ready nodes' latest passing results, the node
itself left out). With neither, the figure is recorded and passes ("no reference yet"): the first node of a
group sets the bar. Both numbers are in the verdict. A failed test is re-run once before it counts, so one
noisy run does not reboot a node.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from libs.contracts.nodes import CheckStatus

MIN_RATIO = 0.75
MAX_ATTEMPTS = 2  # the first run and one re-run

FINAL = frozenset({CheckStatus.PASSED, CheckStatus.FAILED, CheckStatus.NOT_APPLICABLE})


def compared(metric: str) -> bool:
    """Figures where more is better and a slow node shows: throughput and bandwidth."""
    return metric.startswith("tflops_") or metric.endswith("_gbps")


@dataclass(frozen=True)
class Comparison:
    metric: str
    value: float
    reference: float | None
    source: str  # "baseline", "group median of N", or "none"
    ratio: float | None
    ok: bool

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "reference": self.reference, "source": self.source,
                "ratio": self.ratio, "ok": self.ok}


@dataclass(frozen=True)
class Verdict:
    status: CheckStatus  # passed, failed or not_applicable: what this attempt's result is
    rerun: bool  # failed, and one more attempt is due before it counts
    reason: str | None = None
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)

    def detail(self) -> dict[str, Any]:
        return {"reason": self.reason, "comparisons": [c.as_dict() for c in self.comparisons]}


def group_median(peers: Iterable[Mapping[str, float]], metric: str) -> tuple[float | None, int]:
    """Median of ``metric`` over the peers that have it, and how many had it."""
    values = [float(p[metric]) for p in peers if isinstance(p.get(metric), int | float) and p[metric] > 0]
    return (statistics.median(values) if values else None), len(values)


def reference(metric: str, test: str, peers: Sequence[Mapping[str, float]],
              baselines: Mapping[str, float]) -> tuple[float | None, str]:
    """A configured baseline (``<test>.<metric>``) wins over the group's median."""
    key = f"{test}.{metric}"
    if key in baselines:
        return float(baselines[key]), "baseline"
    median, n = group_median(peers, metric)
    return (median, f"group median of {n}") if median is not None else (None, "none")


def judge(test: str, status: CheckStatus, figures: Mapping[str, float], peers: Sequence[Mapping[str, float]],
          attempt: int, *, baselines: Mapping[str, float] | None = None, min_ratio: float = MIN_RATIO,
          error: str | None = None) -> Verdict:
    """The verdict on one test's result on one node.

    ``peers``: the same test's figures on the group's healthy nodes (this node left out).
    """
    rerun_left = attempt < MAX_ATTEMPTS
    if status is CheckStatus.NOT_APPLICABLE:
        return Verdict(CheckStatus.NOT_APPLICABLE, False, error)
    if status is CheckStatus.FAILED:
        return Verdict(CheckStatus.FAILED, rerun_left, error or "the test failed on the node")
    comparisons = []
    for metric in sorted(m for m in figures if compared(m)):
        value = float(figures[metric])
        ref, source = reference(metric, test, peers, baselines or {})
        ratio = value / ref if ref else None
        comparisons.append(Comparison(metric, value, ref, source, ratio, ratio is None or ratio >= min_ratio))
    slow = [c for c in comparisons if not c.ok]
    if slow:
        reason = "; ".join(f"{c.metric} {c.value:.4g} is below {min_ratio:g} x {c.reference:.4g} ({c.source})"
                           for c in slow)
        return Verdict(CheckStatus.FAILED, rerun_left, reason, tuple(comparisons))
    return Verdict(CheckStatus.PASSED, False, None, tuple(comparisons))


def node_outcome(statuses: Iterable[CheckStatus]) -> CheckStatus | None:
    """A node's run: failed as soon as one test has finally failed, passed when every test passed or does
    not apply, else still running (None)."""
    statuses = list(statuses)
    if any(s is CheckStatus.FAILED for s in statuses):
        return CheckStatus.FAILED
    if statuses and all(s in FINAL for s in statuses):
        return CheckStatus.PASSED
    return None

