"""Fixtures of the fault matrix: one real stack per module (two replicas of each service, three executors, the
third behind a severable proxy) and the matrix of measured figures, printed at the end of the module and
written as JSON to ``$TETO_FAULTS_REPORT`` (default /tmp/teto-faults-report.json) for docs/reliability.md.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.faults.rounds import stack_place, write_report
from tests.support.faultstack import FaultStack

EXECUTORS = ("ex-a", "ex-b", "ex-c")
PROXIED = ("ex-c",)  # the one a partition cuts off


@pytest_asyncio.fixture(scope="module")
async def stack() -> AsyncIterator[FaultStack]:
    with stack_place("faults") as root:
        s = FaultStack(root)
        try:
            await s.start(EXECUTORS, proxied=PROXIED)
            yield s
        finally:
            s.close()


@pytest.fixture(scope="module")
def matrix() -> Iterator[list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    yield rows
    write_report(rows, Path(os.environ.get("TETO_FAULTS_REPORT", "/tmp/teto-faults-report.json")), "faults matrix")
