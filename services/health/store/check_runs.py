"""The check runs' rows: ``health.check_runs`` (a run), ``health.check_run_nodes`` (its members, by wave) and
``health.check_results`` (one test on one member), read into domain/runs.py's types and written back, and the
runs' directives into the outbox, all in the caller's transaction. Nothing here decides (domain/runs.py does)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import asyncpg

from libs.contracts.envelope import Envelope
from libs.contracts.nodes import CheckReport, CheckStatus, CheckTest
from libs.runtime import outbox

from . import SCHEMA
from ..domain.runs import Member, MemberStatus, Result


def member_of(row: asyncpg.Record | None) -> Member | None:
    return None if row is None else Member(row["run_id"], row["node_id"], MemberStatus(row["status"]), row["wave"],
                                           row["deadline_at"])


def result_of(row: asyncpg.Record | None) -> Result | None:
    return None if row is None else Result(row["test"], CheckStatus(row["status"]), row["attempt"])


# -- runs and members ----------------------------------------------------------------------------------------

async def new_run(conn: asyncpg.Connection, run_id: str, kind: str, group: str | None, actor: str | None,
                  tests: list[CheckTest], force: bool, now: datetime) -> None:
    await conn.execute(
        "INSERT INTO health.check_runs (run_id, kind, group_name, requested_by, tests, force, created_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)", run_id, kind, group, actor, [t.value for t in tests], force, now)


async def add_members(conn: asyncpg.Connection, run_id: str, node_ids: list[str]) -> None:
    """The nodes join the run waiting (the check loop starts them)."""
    await conn.executemany(
        "INSERT INTO health.check_run_nodes (run_id, node_id, status) VALUES ($1, $2, 'waiting')",
        [(run_id, node_id) for node_id in node_ids])


async def force(conn: asyncpg.Connection, run_id: str) -> bool:
    return await conn.fetchval("SELECT force FROM health.check_runs WHERE run_id = $1", run_id)


async def startable(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Every waiting member that may start now, locked, by run and node: idle (no job per its heartbeats), or
    its run forced, or joining; with its run's ``force`` and ``tests``."""
    return await conn.fetch(
        "SELECT rn.run_id, rn.node_id, r.force, r.tests FROM health.check_run_nodes rn"
        " JOIN health.check_runs r USING (run_id) JOIN health.nodes n USING (node_id)"
        " LEFT JOIN health.executors e ON e.executor_id = n.executor_id"
        " WHERE rn.status = 'waiting' AND r.state = 'running'"
        "   AND (r.force OR e.job_id IS NULL OR n.state = 'joining')"
        " ORDER BY rn.run_id, rn.node_id FOR UPDATE OF rn")


async def next_wave(conn: asyncpg.Connection, run_id: str) -> int:
    return await conn.fetchval("SELECT COALESCE(max(wave), 0) + 1 FROM health.check_run_nodes WHERE run_id = $1",
                               run_id)


async def lock_member(conn: asyncpg.Connection, run_id: str, node_id: str) -> Member | None:
    return member_of(await conn.fetchrow("SELECT * FROM health.check_run_nodes WHERE run_id = $1 AND"
                                         " node_id = $2 FOR UPDATE", run_id, node_id))


async def lock_overdue(conn: asyncpg.Connection, now: datetime) -> list[Member]:
    """Started members whose deadline has passed, locked (SKIP LOCKED: one another transaction holds is being
    answered, not overdue yet)."""
    rows = await conn.fetch("SELECT * FROM health.check_run_nodes WHERE status IN ('pending', 'running')"
                            " AND deadline_at <= $1 ORDER BY run_id, node_id FOR UPDATE SKIP LOCKED", now)
    return [m for m in map(member_of, rows) if m is not None]


async def wave_members(conn: asyncpg.Connection, run_id: str, node_id: str, whole_wave: bool,
                       wave: int | None) -> list[asyncpg.Record]:
    """The member, or with ``whole_wave`` every member of its wave (a re-run's addressees)."""
    return await conn.fetch("SELECT * FROM health.check_run_nodes WHERE run_id = $1 AND (node_id = $2 OR"
                            " ($3 AND wave = $4))", run_id, node_id, whole_wave, wave)


async def start_member(conn: asyncpg.Connection, member: Member, rank: int, world_size: int,
                       rendezvous: str | None, now: datetime) -> None:
    await conn.execute(
        "UPDATE health.check_run_nodes SET status = $8, wave = $3, rank = $4, world_size = $5,"
        " rendezvous = $6, started_at = $7, deadline_at = $9 WHERE run_id = $1 AND node_id = $2",
        member.run_id, member.node_id, member.wave, rank, world_size, rendezvous, now, member.status.value,
        member.deadline)


async def save_member(conn: asyncpg.Connection, member: Member) -> None:
    await conn.execute("UPDATE health.check_run_nodes SET status = $3, wave = $4, deadline_at = $5"
                       " WHERE run_id = $1 AND node_id = $2", member.run_id, member.node_id, member.status.value,
                       member.wave, member.deadline)


async def rearm(conn: asyncpg.Connection, run_id: str, node_id: str, deadline: datetime) -> None:
    await conn.execute("UPDATE health.check_run_nodes SET deadline_at = $3 WHERE run_id = $1 AND node_id = $2",
                       run_id, node_id, deadline)


async def finish_member(conn: asyncpg.Connection, run_id: str, node_id: str, status: CheckStatus | str,
                        reason: str | None, now: datetime) -> None:
    await conn.execute("UPDATE health.check_run_nodes SET status = $3, reason = $4, finished_at = $5"
                       " WHERE run_id = $1 AND node_id = $2", run_id, node_id, str(status), reason, now)


async def member_statuses(conn: asyncpg.Connection, run_id: str) -> list[MemberStatus]:
    return [MemberStatus(r["status"]) for r in await conn.fetch(
        "SELECT status FROM health.check_run_nodes WHERE run_id = $1", run_id)]


async def finish_run(conn: asyncpg.Connection, run_id: str, now: datetime) -> None:
    """The run is done (once: a run already done keeps its first finish time)."""
    await conn.execute("UPDATE health.check_runs SET state = 'done', finished_at = $2 WHERE run_id = $1"
                       " AND state = 'running'", run_id, now)


# -- results -------------------------------------------------------------------------------------------------

async def reset_results(conn: asyncpg.Connection, run_id: str, node_id: str, tests: list[CheckTest]) -> None:
    """The member's tests pending, attempt 1 (a member started again in a later wave starts afresh)."""
    await conn.executemany(
        "INSERT INTO health.check_results (run_id, node_id, test, status) VALUES ($1, $2, $3, 'pending')"
        " ON CONFLICT (run_id, node_id, test) DO UPDATE SET status = 'pending', attempt = 1,"
        " figures = '{}'::jsonb, verdict = '{}'::jsonb, error = NULL, updated_at = now()",
        [(run_id, node_id, t.value) for t in tests])


async def lock_result(conn: asyncpg.Connection, run_id: str, node_id: str, test: str | None) -> Result | None:
    return result_of(await conn.fetchrow("SELECT * FROM health.check_results WHERE run_id = $1 AND node_id = $2"
                                         " AND test = $3 FOR UPDATE", run_id, node_id, test))


async def lock_results(conn: asyncpg.Connection, run_id: str, node_id: str) -> list[Result]:
    return [Result(r["test"], CheckStatus(r["status"]), r["attempt"]) for r in await conn.fetch(
        "SELECT test, status, attempt FROM health.check_results WHERE run_id = $1 AND node_id = $2 FOR UPDATE",
        run_id, node_id)]


async def save_results(conn: asyncpg.Connection, run_id: str, node_id: str, results: Iterable[Result]) -> None:
    for r in results:
        await conn.execute("UPDATE health.check_results SET status = $4, attempt = $5, updated_at = now()"
                           " WHERE run_id = $1 AND node_id = $2 AND test = $3", run_id, node_id, r.test,
                           r.status.value, r.attempt)


async def record_attempt(conn: asyncpg.Connection, rep: CheckReport, test: str, verdict: dict[str, Any],
                         reason: str | None) -> None:
    """A judged attempt's figures, detail and verdict (kept even when the test re-runs)."""
    await conn.execute(
        "UPDATE health.check_results SET figures = $4::jsonb, detail = $5::jsonb, verdict = $6::jsonb,"
        " error = $7, seconds = $8, suite_version = $9 WHERE run_id = $1 AND node_id = $2 AND test = $3",
        rep.run_id, rep.node_id, test, json.dumps(rep.figures), json.dumps(rep.detail, default=str),
        json.dumps(verdict), reason, rep.seconds, rep.suite_version)


async def record_overdue(conn: asyncpg.Connection, run_id: str, node_id: str, result: Result,
                         verdict: dict[str, Any]) -> None:
    await conn.execute("UPDATE health.check_results SET error = $4, verdict = $5::jsonb WHERE run_id = $1 AND"
                       " node_id = $2 AND test = $3", run_id, node_id, result.test, result.reason, json.dumps(verdict))


async def wave_results(conn: asyncpg.Connection, run_id: str, wave: int | None
                       ) -> list[tuple[str, Result, dict[str, Any]]]:
    """Every result of the wave's members as (node id, result with its verdict's reason, verdict), by node and
    test."""
    rows = await conn.fetch(
        "SELECT rn.node_id, cr.test, cr.status, cr.attempt, cr.verdict FROM health.check_run_nodes rn"
        " JOIN health.check_results cr USING (run_id, node_id) WHERE rn.run_id = $1 AND rn.wave = $2"
        " ORDER BY rn.node_id, cr.test", run_id, wave)
    out = []
    for r in rows:
        verdict = json.loads(r["verdict"])
        out.append((r["node_id"], Result(r["test"], CheckStatus(r["status"]), r["attempt"], verdict.get("reason")),
                    verdict))
    return out


async def passed_figures(conn: asyncpg.Connection, run_id: str, node_id: str) -> list[asyncpg.Record]:
    """The node's passing tests in the run: ``test``, ``f`` (its figures) and ``suite_version``."""
    return await conn.fetch("SELECT test, figures AS f, suite_version FROM health.check_results WHERE run_id = $1"
                            " AND node_id = $2 AND status = 'passed'", run_id, node_id)


# -- directives ----------------------------------------------------------------------------------------------

async def send(conn: asyncpg.Connection, messages: list[tuple[str, Envelope]]) -> None:
    """The run's directives into the outbox, in the caller's transaction (the relay publishes them)."""
    await outbox.add(conn, SCHEMA, messages)
