"""``bench_audit --reader``: the audit reader's CPU per row alone, without servers, reading every command it
times (bench/bench_audit.py)."""

from __future__ import annotations

import gc
import re

import pytest

from bench import bench_audit
from services.audit.domain import entries

pytestmark = pytest.mark.unit


def test_the_reader_alone_reads_every_command_and_gives_its_cpu_per_row(monkeypatch):
    read = []
    real = entries.from_command
    monkeypatch.setattr(entries, "from_command", lambda *a: read.append(a[2]) or real(*a))
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    note = bench_audit.reader_alone(30, 8, rounds=2)
    assert read == [f"CMD-{j}" for j in range(30)] * 2
    assert re.search(r"30 commands in batches of 8: CPU [0-9.]+ us/row \(best of 2\)", note)
    assert gc.get_threshold() == thresholds  # as it was
    assert gc.get_freeze_count() == 0 if frozen == 0 else gc.get_freeze_count() >= frozen
