"""Queries of the public views other services declare: the gateway reads nothing else.

``queue.jobs_public`` / ``queue.job_events_public`` (queue), ``health.executors_public`` /
``health.job_signals_public`` (health), ``budget.jobs_public`` (budget), ``audit.log_public`` (audit). Each view
is created by its owner's migrations; until the owner has run, a missing view reads as "no data" rather than
an error, so the gateway can start first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from .audit_verify import ask_verify
from .domain import departures, logviews, paging, views

log = logging.getLogger(__name__)

_MISSING = (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError)
_JSON_COLUMNS = frozenset({"spec", "attempts", "last_checkpoint", "ceiling_history", "detail", "gpus", "warning",
                           "payload", "figures", "states", "nodes", "gang", "alert", "metrics",
                           "waiting"})
# A job with its health signal, budget, usage records of its current run and latest events, each a row of its
# view's type, in one round trip. ``LIMIT 1``: the view-by-view read keeps one row per job too. The events come
# newest first (the latest ``$2``) and are turned to seq order by the caller.
_JOB_AT_ONCE = """
SELECT j AS job,
       (SELECT s FROM health.job_signals_public s WHERE s.job_id = j.id LIMIT 1) AS signal,
       (SELECT b FROM budget.jobs_public b WHERE b.job_id = j.id LIMIT 1) AS budget,
       ARRAY(SELECT u FROM budget.usage_public u WHERE u.job_id = j.id AND u.epoch = COALESCE(j.lease_epoch, 0)
             ORDER BY u.executor_id, u.seq) AS usage,
       ARRAY(SELECT e FROM queue.job_events_public e WHERE e.job_id = j.id ORDER BY e.seq DESC LIMIT $2) AS events
FROM queue.jobs_public j WHERE j.id = $1
"""


def _row(record: asyncpg.Record) -> dict[str, Any]:
    """A record as a dict, with jsonb columns parsed (the pool has no json codec)."""
    out = dict(record)
    for key in _JSON_COLUMNS & out.keys():
        if isinstance(out[key], str):
            try:
                out[key] = json.loads(out[key])
            except ValueError:
                pass
    return out


class Reads:
    def __init__(self, pool: asyncpg.Pool, runtime: Any = None) -> None:
        self.pool = pool
        self.runtime = runtime  # the bus, for the audit service's verify RPC
        self._warned: set[str] = set()

    async def _fetch(self, view: str, sql: str, *args: Any, via: Any = None) -> list[dict[str, Any]]:
        """Rows of ``sql``; ``via``: a connection already acquired (else the pool lends one for this query)."""
        try:
            return [_row(r) for r in await (via or self.pool).fetch(sql, *args)]
        except _MISSING:
            if view not in self._warned:  # once per view: its owner has not migrated yet
                self._warned.add(view)
                log.warning("view %s does not exist yet; reading it as empty", view)
            return []

    async def public(self, view: str, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Rows of a query on one public view (or a join of public views named first by ``view``)."""
        return await self._fetch(view, sql, *args)

    async def _by_job(self, view: str, job_ids: list[str], via: Any = None) -> dict[str, dict[str, Any]]:
        rows = await self._fetch(view, f"SELECT * FROM {view} WHERE job_id = ANY($1::text[])", job_ids, via=via)
        return {r["job_id"]: r for r in rows}

    async def _decorate(self, jobs: list[dict[str, Any]], usage: list[dict[str, Any]] | None = None,
                        via: Any = None) -> list[dict[str, Any]]:
        ids = [j["id"] for j in jobs]
        if not ids:
            return []
        signals = await self._by_job("health.job_signals_public", ids, via)
        budgets = await self._by_job("budget.jobs_public", ids, via)
        return [views.job_view(j, signal=signals.get(j["id"]), budget=budgets.get(j["id"]), usage=usage)
                for j in jobs]

    async def list_jobs(self, *, state: str | None, owner: str | None, limit: int) -> list[dict[str, Any]]:
        """The first page of jobs, newest first (jobs_page without its cursor)."""
        return (await self.jobs_page(state=state, owner=owner, limit=limit))[0]

    async def jobs_page(self, *, state: str | None, owner: str | None, limit: int, name: str | None = None,
                        signal: str | None = None, cursor: paging.Position | None = None
                        ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of jobs, newest first (ties by id), and the cursor of the next page (None: the last one).
        ``name`` matches a part of the name, any case; ``signal`` the health signal of a job not finished."""
        signal_join = ""
        if signal is not None:
            signal_join = (" JOIN health.job_signals_public s ON s.job_id = j.id AND s.signal = $7"
                           " AND j.state <> ALL($8::text[])")
        args: list[Any] = [state, owner, name, cursor and cursor.created_at, cursor and cursor.job_id, limit + 1]
        if signal is not None:
            args += [signal, sorted(views.TERMINAL)]
        rows = await self._fetch(
            "queue.jobs_public",
            f"SELECT j.* FROM queue.jobs_public j{signal_join} WHERE ($1::text IS NULL OR j.state = $1)"
            " AND ($2::text IS NULL OR j.owner = $2) AND ($3::text IS NULL OR strpos(lower(j.name), lower($3)) > 0)"
            " AND ($4::timestamptz IS NULL OR j.created_at < $4 OR (j.created_at = $4 AND j.id > $5::text))"
            " ORDER BY j.created_at DESC, j.id LIMIT $6",
            *args,
        )
        rows, next_cursor = paging.page(rows, limit)
        return await self._decorate(rows), next_cursor

    async def job_row(self, job_id: str, via: Any = None) -> dict[str, Any] | None:
        rows = await self._fetch("queue.jobs_public", "SELECT * FROM queue.jobs_public WHERE id = $1", job_id,
                                 via=via)
        return rows[0] if rows else None

    async def job_names(self, job_ids: list[str]) -> dict[str, str]:
        """The name of each of these jobs that has one (the panel shows it beside the id)."""
        if not job_ids:
            return {}
        rows = await self._fetch("queue.jobs_public",
                                 "SELECT id, name FROM queue.jobs_public WHERE id = ANY($1::text[])", job_ids)
        return {r["id"]: r["name"] for r in rows if r.get("name")}

    async def job_owners(self, job_ids: list[str]) -> dict[str, str]:
        """The owner of each of these jobs (tenant scoping of the fleet lists)."""
        rows = await self._fetch("queue.jobs_public",
                                 "SELECT id, owner FROM queue.jobs_public WHERE id = ANY($1::text[])", job_ids)
        return {r["id"]: r["owner"] for r in rows}

    async def get_job(self, job_id: str, *, events: int = 20) -> dict[str, Any] | None:
        """The job as GET /v1/jobs/{id} (and a submit's 201) shows it: ONE statement (``_JOB_AT_ONCE``) that
        returns the job's row with its signal, budget, usage and latest events as rows of their views' types,
        which asyncpg decodes like the rows of five separate queries (the same Python values, so the same JSON);
        five statements were 29 % of the gateway's busy time under a stream of submits (docs/performance.md).
        Until every view exists (their owners migrate on their own start) the five queries read a missing view
        as empty."""
        async with self.pool.acquire() as conn:
            try:
                return await self._job_at_once(conn, job_id, events)
            except _MISSING as exc:
                if "job-at-once" not in self._warned:
                    self._warned.add("job-at-once")
                    log.warning("a view of the job is missing (%s): reading it view by view", exc)
            except asyncpg.OutdatedSchemaCacheError as exc:  # an owner replaced its view: decode the new row type
                log.info("a view of the job changed (%s): reloading its row types", exc)
                await conn.reload_schema_state()
            return await self._job_on(conn, job_id, events)

    async def _job_at_once(self, conn: Any, job_id: str, events: int) -> dict[str, Any] | None:
        rows = await conn.fetch(_JOB_AT_ONCE, job_id, events)
        if not rows:
            return None
        got = rows[0]
        job = _row(got["job"])
        usage = [_row(u) for u in got["usage"] or ()]
        signal = _row(got["signal"]) if got["signal"] is not None else None
        budget = _row(got["budget"]) if got["budget"] is not None else None
        decorated = views.job_view(job, signal=signal, budget=budget, usage=usage)
        decorated["events"] = [views.pick(_row(e), views.EVENT_FIELDS) for e in reversed(got["events"] or ())]
        return decorated

    async def _job_on(self, conn: Any, job_id: str, events: int) -> dict[str, Any] | None:
        job = await self.job_row(job_id, via=conn)
        if job is None:
            return None
        # The usage records of the job's current (or last) run: the time an interruption throws away.
        usage = await self._fetch("budget.usage_public",
                                  "SELECT * FROM budget.usage_public WHERE job_id = $1 AND epoch = $2"
                                  " ORDER BY executor_id, seq", job_id, job.get("lease_epoch") or 0, via=conn)
        (decorated,) = await self._decorate([job], usage=usage, via=conn)
        latest = await self._fetch(
            "queue.job_events_public",
            "SELECT * FROM (SELECT * FROM queue.job_events_public WHERE job_id = $1 ORDER BY seq DESC LIMIT $2) e"
            " ORDER BY seq",
            job_id, events, via=conn,
        )
        decorated["events"] = [views.pick(e, views.EVENT_FIELDS) for e in latest]
        return decorated

    async def job_events(self, job_id: str, *, after_seq: int, limit: int) -> list[dict[str, Any]]:
        rows = await self._fetch(
            "queue.job_events_public",
            "SELECT * FROM queue.job_events_public WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            job_id, after_seq, limit,
        )
        return [views.pick(e, views.EVENT_FIELDS) for e in rows]

    async def job_steps(self, job_id: str) -> list[dict[str, Any]]:
        """The job's accepted step reports, run by run, step by step (the queue's history)."""
        return await self._fetch("queue.job_steps_public",
                                 "SELECT epoch, step, loss, step_seconds, metrics, time FROM queue.job_steps_public"
                                 " WHERE job_id = $1 ORDER BY epoch, step", job_id)

    async def job_reports(self, job_id: str, checkpoints: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The job's latest accepted step report and its latest ``checkpoints`` accepted checkpoints' events
        (issue 27: what the job view shows of its runs' reports)."""
        latest = await self._fetch("queue.job_steps_public",
                                   "SELECT epoch, step, loss, step_seconds, metrics, time FROM queue.job_steps_public"
                                   " WHERE job_id = $1 ORDER BY epoch DESC, step DESC LIMIT 1", job_id)
        events = await self._fetch("queue.job_events_public",
                                   "SELECT * FROM queue.job_events_public WHERE job_id = $1 AND event = 'checkpointed'"
                                   " ORDER BY seq DESC LIMIT $2", job_id, checkpoints)
        return (latest[0] if latest else None), [views.pick(e, views.EVENT_FIELDS) for e in events]

    async def job_grants(self, job_id: str) -> dict[tuple[int, int], str]:
        """(attempt, rank) -> executor of every grant the job had (its ``leased`` events): whose output is its."""
        rows = await self._fetch("queue.job_events_public", "SELECT event, detail FROM queue.job_events_public"
                                 " WHERE job_id = $1 AND event = 'leased'", job_id)
        return logviews.grants(rows)

    async def executors(self) -> list[dict[str, Any]]:
        rows = await self._fetch("health.executors_public",
                                 "SELECT * FROM health.executors_public ORDER BY group_name, executor_id")
        # Messages each executor sent under a lease it no longer held (counted by the queue and by health).
        reports = await self._fetch("queue.stale_messages_public",
                                    "SELECT executor_id, count FROM queue.stale_messages_public")
        beats = await self._fetch("health.stale_heartbeats_public",
                                  "SELECT executor_id, count FROM health.stale_heartbeats_public")
        grants, runs = await self._grants(), await self._queue_runs()
        # The queue's rows of the jobs the heartbeats name (has the job left its executor?), and the nodes the
        # health service gave up (their executors' rows end): views.executor_view, domain/departures.py.
        named = sorted({r["job_id"] for r in rows if r.get("job_id")})
        jobs = {j["id"]: j for j in await self._fetch(
            "queue.jobs_public", "SELECT id, state, lease_epoch, executor_id FROM queue.jobs_public"
            " WHERE id = ANY($1::text[])", named)} if named else {}
        nodes = {n["executor_id"]: n["state"] for n in await self._fetch(
            "health.nodes_public", "SELECT executor_id, state FROM health.nodes_public WHERE executor_id IS NOT NULL")}
        return [views.executor_view(r, stale_reports={s["executor_id"]: s["count"] for s in reports},
                                    stale_heartbeats={s["executor_id"]: s["count"] for s in beats},
                                    grant=grants.get(r["executor_id"]), queue_run=runs.get(r["executor_id"]),
                                    job=jobs.get(r.get("job_id")))
                for r in rows if not departures.row_ended(nodes.get(r["executor_id"]))]

    async def _queue_runs(self) -> dict[str, dict[str, Any]]:
        """The run the queue's row names for each executor (cleared by its end report), read after the
        heartbeat-fed rows: a run that ended meanwhile is shown as ended (views.run_ended)."""
        rows = await self._fetch("queue.executors_public", "SELECT executor_id, job_id, epoch FROM"
                                 " queue.executors_public")
        return {r["executor_id"]: r for r in rows}

    async def _grants(self) -> dict[str, dict[str, Any]]:
        """The queue's grants by executor, read after the heartbeat-fed rows they are merged into: a grant made
        meanwhile is shown at once (views.grants_by_executor)."""
        granted = await self._fetch("queue.jobs_public", "SELECT * FROM queue.jobs_public WHERE state = ANY($1::text[])",
                                    sorted(views.GRANTED))
        return views.grants_by_executor(granted)

    async def nodes(self) -> list[dict[str, Any]]:
        rows = await self._fetch("health.nodes_public",
                                 "SELECT * FROM health.nodes_public ORDER BY group_name, node_id")
        grants, runs = await self._grants(), await self._queue_runs()
        return [views.node_view(r, grants.get(r.get("executor_id") or ""), runs.get(r.get("executor_id") or ""))
                for r in rows]

    async def node_groups(self) -> list[dict[str, Any]]:
        return await self._fetch("health.node_groups_public",
                                 "SELECT * FROM health.node_groups_public ORDER BY group_name")

    async def check_run(self, run_id: str) -> dict[str, Any] | None:
        rows = await self._fetch("health.check_runs_public",
                                 "SELECT * FROM health.check_runs_public WHERE run_id = $1", run_id)
        return rows[0] if rows else None

    async def gang_policy(self) -> dict[str, Any]:
        """The gang policy in force (the defaults until an admin has set one)."""
        rows = await self._fetch("queue.gang_policy_public", "SELECT * FROM queue.gang_policy_public")
        return views.gang_policy_view(rows[0] if rows else None)

    async def audit(self, f: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Audit rows by actor / job / command kind / time range, paged by ``after_seq``."""
        since: datetime | None = f.get("since")
        until: datetime | None = f.get("until")
        return await self._fetch(
            "audit.log_public",
            "SELECT * FROM audit.log_public WHERE seq > $1"
            " AND ($2::text IS NULL OR actor = $2) AND ($3::text IS NULL OR job_id = $3)"
            " AND ($4::text IS NULL OR kind = $4) AND ($5::timestamptz IS NULL OR time >= $5)"
            " AND ($6::timestamptz IS NULL OR time < $6) ORDER BY seq LIMIT $7",
            f.get("after_seq") or 0, f.get("actor"), f.get("job_id"), f.get("kind"), since, until, f["limit"],
        )

    async def command(self, command_id: str) -> list[dict[str, Any]]:
        """A command's audit rows in order: as received, and its outcome once recorded (``command_view``)."""
        return await self._fetch("audit.log_public", "SELECT seq, command_id, actor, time, kind, job_id, payload,"
                                 " outcome, reason FROM audit.log_public WHERE command_id = $1 ORDER BY seq LIMIT 20",
                                 command_id)

    async def audit_verify(self) -> dict[str, Any] | None:
        """The audit service's verdict on its log (it alone holds the key verify needs); None: no bus here.
        Raises AuditVerifierUnavailable when the audit service does not answer."""
        if self.runtime is None:
            return None
        return await ask_verify(self.runtime.nc, self.runtime.subjects)
