"""What the health service exports as metrics from check reports: which reports are results (a test ended),
and the figures they carry, per node and test. Pure: the handler feeds the series after its commit."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from libs.contracts.nodes import CheckReport, CheckStatus

# A test ended with these; waiting, pending and running are progress, not results.
RESULT_STATUSES = frozenset({CheckStatus.PASSED, CheckStatus.FAILED, CheckStatus.NOT_APPLICABLE})


@dataclass(frozen=True)
class CheckResult:
    node_id: str
    test: str
    status: str
    figures: tuple[tuple[str, float], ...]


def results_of(reports: Iterable[CheckReport]) -> list[CheckResult]:
    """One result per report of a test that ended (a report about the whole run, or progress, is none)."""
    return [CheckResult(r.node_id, str(r.test), str(r.status), tuple(sorted(r.figures.items())))
            for r in reports if r.test is not None and r.status in RESULT_STATUSES]
