"""The queue's one statement per transition for its events, their outbox rows and the placement's wake-up
(services/queue/store.py, ``events_statement``): what it writes, in which order, with which parameters. The
statement itself runs against PostgreSQL in every queue integration test."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.jobs import JobEvent
from services.queue import store
from tests.support import builders

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def _event(seq: int) -> JobEvent:
    return builders.job_event(seq=seq, detail={"k": seq}, time=NOW)


ROWS = [("m1", "teto.a", b"1", "{}"), ("m2", "teto.b", b"2", "{}")]


def test_events_rows_and_a_wake_up_are_one_statement_with_the_parameters_in_order():
    sql, args = store.events_statement([_event(1), _event(2)], ROWS, "teto_placement")
    assert sql.startswith('WITH events AS (INSERT INTO "queue".job_events') and sql.count("INSERT INTO") == 2
    assert "queued AS (INSERT INTO \"queue\".outbox" in sql and "unnest($12::text[], $13::text[]" in sql
    assert sql.endswith("SELECT pg_notify($16, '')") and "ORDER BY n" in sql  # the outbox keeps the rows' order
    assert len(args) == 16 and args[-1] == "teto_placement"
    assert args[0] == ["j1", "j1"] and args[1] == [1, 2] and args[8] == ['{"k": 1}', '{"k": 2}']
    assert args[11:15] == [["m1", "m2"], ["teto.a", "teto.b"], [b"1", b"2"], ["{}", "{}"]]


@pytest.mark.parametrize(("events", "rows", "wake", "starts", "ends", "count"), [
    ([1], [], None, 'WITH events AS (INSERT INTO "queue".job_events', "SELECT 1", 11),
    ([], ROWS, None, 'WITH queued AS (INSERT INTO "queue".outbox', "SELECT 1", 4),
    ([], ROWS, "w", 'WITH queued AS (INSERT INTO "queue".outbox', "SELECT pg_notify($5, '')", 5),
    ([], [], "w", "SELECT pg_notify($1, '')", "SELECT pg_notify($1, '')", 1),
    ([1], ROWS, None, "WITH events AS", "SELECT 1", 15),
])
def test_each_part_is_there_only_when_it_has_something_to_do(events, rows, wake, starts, ends, count):
    sql, args = store.events_statement([_event(s) for s in events], rows, wake)
    assert sql.startswith(starts) and sql.endswith(ends) and len(args) == count
    assert ("$1::text[]" in sql) == bool(events or rows)


def test_nothing_to_write_and_nobody_to_wake_is_no_statement():
    assert store.events_statement([], [], None) is None
