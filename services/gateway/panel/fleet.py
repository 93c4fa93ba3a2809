"""What the operations pages show, derived from the API's rows: pure functions, no I/O.

- Executors: the signal badge (the SAME block the job's badge reads: ``signal`` plus the health service's
  thresholds and measured seconds), the heartbeat age, and whether the executor is a zombie (it sent messages
  under a lease it no longer held, ``stale_reports`` + ``stale_heartbeats`` > 0, and still names that run).
- Nodes: a group's counts per state in lifecycle order.
- Check runs: progress per run, per node and per test, and each figure against its reference: the verdict's
  (a configured baseline, or the group's median over its ready nodes, the node itself left out), else the
  median of that figure over the nodes of this run.
- Gang policy: the bounds of each field, read from the contract (libs/contracts/policies.py) so the page's
  as-you-type check and the server judge by the same numbers.
- Audit: the filters of the log page.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from annotated_types import Ge, Gt, Le

from libs.contracts.policies import GangPolicy, NodeFailureStrategy

from ..domain import departures
from .fmt import parse_time

SIGNALS = ("stuck", "no_signal")
NODE_STATES = ("joining", "checking", "ready", "failed", "recovering", "replaced", "drained", "gone")
FINAL_NODE = ("passed", "failed")
FINAL_TEST = ("passed", "failed", "not_applicable")


# -- executors ---------------------------------------------------------------------------------------------


def executor_signal(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The executor's signal block as the job badge reads it (None: no alert to show)."""
    if row.get("signal") not in SIGNALS:
        return None
    detail = row.get("detail") if isinstance(row.get("detail"), Mapping) else {}
    return {**detail, "signal": row["signal"], "signal_since": row.get("signal_since")}


def heartbeat_age(row: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds since the executor's last heartbeat: the health view's measure, else from ``last_heartbeat``."""
    detail = row.get("detail") if isinstance(row.get("detail"), Mapping) else {}
    measured = detail.get("seconds_since_heartbeat")
    if isinstance(measured, int | float) and math.isfinite(measured):
        return max(float(measured), 0.0)
    last = parse_time(row.get("last_heartbeat"))
    if last is None:
        return None
    return max((now - last).total_seconds(), 0.0) if last.tzinfo else None


def stale_count(row: Mapping[str, Any]) -> int:
    return int(row.get("stale_reports") or 0) + int(row.get("stale_heartbeats") or 0)


def is_zombie(row: Mapping[str, Any]) -> bool:
    """It sent reports or heartbeats under a lease it had lost (the queue and health ignored them) and still
    names the run it lost (``left_job``: the gateway's rule, services/gateway/domain/departures.py); once its
    agent has stopped that run the counts are history, not a zombie."""
    return departures.is_zombie(row)


# -- nodes -------------------------------------------------------------------------------------------------


def state_counts(states: Mapping[str, Any] | None) -> list[tuple[str, int]]:
    """A group's ``{state: n}`` as ``[(state, n)]`` in lifecycle order (unknown states last, by name)."""
    states = states or {}
    known = [(s, int(states[s])) for s in NODE_STATES if states.get(s)]
    other = sorted((s, int(n)) for s, n in states.items() if s not in NODE_STATES and n)
    return known + other


# -- check runs --------------------------------------------------------------------------------------------


def compared(metric: str) -> bool:
    """Figures judged against the group, where more is better: throughput and bandwidth (the health service's
    rule, services/health/domain/verdicts.py); the others (errors, temperatures, latencies) are shown as measured."""
    return metric.startswith("tflops_") or metric.endswith("_gbps")


def run_medians(run: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """Median of every compared figure over the nodes of this run that measured it: ``{(test, metric): median}``."""
    values: dict[tuple[str, str], list[float]] = {}
    for node in run.get("nodes") or []:
        for test in node.get("tests") or []:
            for metric, value in (test.get("figures") or {}).items():
                if compared(metric) and isinstance(value, int | float) and math.isfinite(value):
                    values.setdefault((test["test"], metric), []).append(float(value))
    return {key: statistics.median(found) for key, found in values.items()}


def figure_rows(test: Mapping[str, Any], medians: Mapping[tuple[str, str], float]) -> list[dict[str, Any]]:
    """Each figure of a test with what it is measured against: ``{metric, value, reference, source, ratio, ok}``.
    ``source`` is ``baseline`` or ``group`` (the verdict's: a configured baseline, or the median of ``peers``
    ready nodes of the group), or ``run`` (the median of this run's nodes, when the verdict had no reference:
    the first nodes of a group); ``ok`` is None when no verdict judged the figure."""
    verdict = test.get("verdict") if isinstance(test.get("verdict"), Mapping) else {}
    judged = {c.get("metric"): c for c in verdict.get("comparisons") or [] if isinstance(c, Mapping)}
    out = []
    for metric, value in sorted((test.get("figures") or {}).items(), key=lambda kv: (not compared(kv[0]), kv[0])):
        if not isinstance(value, int | float):
            continue
        seen = judged.get(metric) or {}
        reference, source = seen.get("reference"), seen.get("source")
        if reference is None and compared(metric):
            reference = medians.get((test["test"], metric))
            source = "run median" if reference is not None else None
        ratio = float(value) / float(reference) if reference else None
        kind, peers = source_kind(source)
        out.append({"metric": metric, "value": float(value), "reference": reference, "source": kind,
                    "peers": peers, "ratio": ratio, "ok": seen.get("ok"), "compared": compared(metric),
                    "decimals": significant_decimals(float(value))})
    return out


def significant_decimals(value: float, digits: int = 3) -> int:
    """Decimals that show ``digits`` significant digits (0.00412 -> 5, 12.3 -> 1, 4194304 -> 0): a CPU's
    0.004 TFLOP/s and a GPU's 700 TFLOP/s both read; a whole number gets none."""
    if not math.isfinite(value) or value == int(value):
        return 0
    return min(max(digits - 1 - math.floor(math.log10(abs(value))), 0), 8)


def source_kind(source: str | None) -> tuple[str | None, int | None]:
    """The verdict's reference source as ``(kind, peers)``: ``baseline``, ``group`` (median of ``peers``
    nodes), ``run`` (median of this run), or None."""
    if not source or source == "none":
        return None, None
    if source == "run median":
        return "run", None
    if source.startswith("group median"):
        count = source.rsplit(" ", 1)[-1]
        return "group", int(count) if count.isdigit() else None
    return "baseline", None


def run_progress(run: Mapping[str, Any]) -> dict[str, Any]:
    """How far a run is: nodes and tests final out of all, nodes passed and failed, done or not."""
    nodes = list(run.get("nodes") or [])
    tests = [t for n in nodes for t in n.get("tests") or []]
    return {"nodes": len(nodes), "nodes_done": sum(n.get("status") in FINAL_NODE for n in nodes),
            "passed": sum(n.get("status") == "passed" for n in nodes),
            "failed": sum(n.get("status") == "failed" for n in nodes),
            "tests": len(tests), "tests_done": sum(t.get("status") in FINAL_TEST for t in tests),
            "done": run.get("state") == "done"}


# -- gang policy -------------------------------------------------------------------------------------------


def policy_bounds() -> dict[str, dict[str, Any]]:
    """``{field: {kind, min, min_exclusive, max, nullable, choices}}`` from the GangPolicy contract."""
    out: dict[str, dict[str, Any]] = {}
    for name, info in GangPolicy.model_fields.items():
        spec: dict[str, Any] = {"default": info.default}
        annotation = str(info.annotation)
        spec["nullable"] = "None" in annotation
        if info.annotation is bool:
            spec["kind"] = "bool"
        elif info.annotation is NodeFailureStrategy:
            spec["kind"] = "choice"
            spec["choices"] = [s.value for s in NodeFailureStrategy]
        else:
            spec["kind"] = "int" if "int" in annotation else "number"
        for rule in info.metadata:
            if isinstance(rule, Gt):
                spec["min"], spec["min_exclusive"] = rule.gt, True
            elif isinstance(rule, Ge):
                spec["min"], spec["min_exclusive"] = rule.ge, False
            elif isinstance(rule, Le):
                spec["max"] = rule.le
        out[name] = spec
    return out


def policy_problem(name: str, text: str, bounds: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict] | None:
    """Why a typed value is not acceptable for a numeric field (a message key and its numbers), or None.
    The same rules the page's script applies as the user types (static/policy.js)."""
    spec = bounds[name]
    text = text.strip()
    if text == "":
        return None if spec.get("nullable") else ("required", {})
    try:
        value = float(text)
    except ValueError:
        return ("not_number", {})
    if not math.isfinite(value):
        return ("not_number", {})
    if spec.get("kind") == "int" and value != int(value):
        return ("not_integer", {})
    low, high = spec.get("min"), spec.get("max")
    if low is not None and (value <= low if spec.get("min_exclusive") else value < low):
        return ("above" if spec.get("min_exclusive") else "at_least", {"min": low})
    if high is not None and value > high:
        return ("at_most", {"max": high})
    return None


def plain(value: float | int) -> str:
    """A number as a form field holds it for the page's script (no grouping, ``.`` decimals): 90.0 -> ``90``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def backoff_problem(base: float | None, cap: float | None) -> tuple[str, dict] | None:
    """The contract's cross-field rule: the back-off maximum is not below its base."""
    if base is not None and cap is not None and cap < base:
        return ("max_below_base", {"base": base, "max": cap})
    return None


# -- audit -------------------------------------------------------------------------------------------------

AUDIT_FILTERS = ("actor", "job_id", "kind", "since", "until")


def audit_filters(query: Mapping[str, str | None]) -> dict[str, Any]:
    """The audit page's filters from its query: trimmed text, times parsed (a time that is not one is dropped
    and reported in ``invalid``)."""
    out: dict[str, Any] = {"invalid": []}
    for name in AUDIT_FILTERS:
        text = (query.get(name) or "").strip()[:200] or None
        if name in ("since", "until") and text is not None:
            moment = parse_time(text)
            if moment is None:
                out["invalid"].append(name)
                text = None
            else:
                out[name + "_time"] = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        out[name] = text
    return out


_METRICS = {"copy_gbps": "membw", "busbw_gbps": "busbw", "algbw_gbps": "algbw"}


def metric_label(metric: str) -> tuple[str | None, str | None, str | None]:
    """How a figure is named on the page: ``(catalogue name, qualifier, unit name)``; a figure without a
    catalogue name is shown as the agent named it (its unit is in its name: ``rtt_ms``)."""
    if metric.startswith("tflops_"):
        return "tflops", metric[len("tflops_"):], "tflops"
    if metric in _METRICS:
        return _METRICS[metric], None, "gbps"
    return None, None, None
