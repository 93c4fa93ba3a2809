"""The budget's lease grants and the usage records waiting for theirs (tables ``budget.grants`` and
``budget.held_usage``): the I/O around the rule in domain/grants.py.

``admit`` runs inside the usage batch's transaction, after the batch's jobs are locked: it reads the grants of
the batch's (job, epoch) and the wall time each run already has in the ledger, keeps back what the rule holds and
turns what it refuses into ``teto.rejected.budget`` notes in the same outbox. ``store_grants`` and ``held_for``
run inside the job events' transaction (the same row locks), so a record is never held after its grant arrived.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from libs.contracts.envelope import RejectedMessage
from libs.contracts.jobs import TERMINAL_STATES
from libs.contracts.subjects import Subjects

from .domain.grants import DEFAULT_CLOCK_SLACK_SECONDS, UNKNOWN_DEVICES, Grant, JobLease, Judged, grant_of, judge_batch
from .domain.usage import Charge

log = logging.getLogger(__name__)

SERVICE = "budget"


@dataclass(frozen=True)
class Admission:
    """What judging a batch needs besides the database: the budget's clock and the slack allowed between it and
    the queue's."""

    now: datetime
    slack_seconds: float = DEFAULT_CLOCK_SLACK_SECONDS


_GRANTS_AND_USED = """
SELECT k.job_id, k.executor_id, k.epoch, g.workers, g.devices, g.granted_at,
       (SELECT COALESCE(sum(l.wall_seconds), 0) FROM budget.ledger l
        WHERE l.job_id = k.job_id AND l.epoch = k.epoch AND l.executor_id = k.executor_id
          AND NOT l.seq = ANY(k.seqs)) AS used
FROM (SELECT r->>0 AS job_id, r->>1 AS executor_id, (r->>2)::int AS epoch,
             ARRAY(SELECT jsonb_array_elements_text(r->3)::int) AS seqs
      FROM jsonb_array_elements($1::jsonb) AS r) AS k
LEFT JOIN budget.grants g ON g.job_id = k.job_id AND g.epoch = k.epoch"""

_HOLD = """
INSERT INTO budget.held_usage (job_id, epoch, executor_id, seq, devices, wall_seconds, started_at, ended_at, last)
SELECT r->>0, (r->>1)::int, r->>2, (r->>3)::int, (r->>4)::int, (r->>5)::float8, (r->>6)::timestamptz,
       (r->>7)::timestamptz, (r->>8)::bool
FROM jsonb_array_elements($1::jsonb) AS r
ON CONFLICT DO NOTHING"""


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


async def admit(conn: asyncpg.Connection, batch: list[Charge], jobs: dict[str, asyncpg.Record],
                admission: Admission, subjects: Subjects) -> tuple[Judged, list[tuple[str, RejectedMessage]]]:
    """Judge a batch whose jobs (``jobs``: their locked rows, with ``epoch`` and ``state``) are locked; store what
    is held. Returns the verdicts and the rejection notes to emit with the transaction."""
    runs: dict[tuple[str, str, int], list[int]] = {}
    for c in batch:
        runs.setdefault((c.job_id, c.executor_id, c.epoch), []).append(c.seq)
    rows = await conn.fetch(_GRANTS_AND_USED, json.dumps([[*run, seqs] for run, seqs in runs.items()]))
    grants = {(r["job_id"], r["epoch"]): Grant(r["job_id"], r["epoch"], tuple(r["workers"]), r["devices"],
                                               r["granted_at"]) for r in rows if r["workers"] is not None}
    used = {(r["job_id"], r["executor_id"], r["epoch"]): r["used"] for r in rows}
    leases = {j: JobLease(r["epoch"], r["state"] in TERMINAL_STATES) for j, r in jobs.items()}
    judged = judge_batch(batch, grants, leases, used, now=admission.now, slack_seconds=admission.slack_seconds)
    if judged.held:
        await conn.execute(_HOLD, json.dumps([[c.job_id, c.epoch, c.executor_id, c.seq, c.devices, c.wall_seconds,
                                               _iso(c.started_at), _iso(c.ended_at), c.last] for c in judged.held]))
    notes = []
    for j in judged.refused:
        c = j.charge
        log.warning("usage record %s refused: %s", c.key, j.reason)
        excerpt = json.dumps({"job_id": c.job_id, "executor_id": c.executor_id, "epoch": c.epoch, "seq": c.seq,
                              "devices": c.devices, "wall_seconds": c.wall_seconds})
        notes.append((subjects.rejected(SERVICE), RejectedMessage(
            service=SERVICE, subject=subjects.usage(c.executor_id), reason=f"usage not charged: {j.reason}",
            payload_excerpt=excerpt, payload_bytes=len(excerpt))))
    return judged, notes


async def store_grants(conn: asyncpg.Connection, grants: list[Grant]) -> None:
    """The grants of a batch of ``leased`` events (a redelivered one changes nothing)."""
    if grants:
        await conn.execute(
            """INSERT INTO budget.grants (job_id, epoch, workers, devices, granted_at)
               SELECT r->>0, (r->>1)::int, ARRAY(SELECT jsonb_array_elements_text(r->2)), (r->>3)::int,
                      (r->>4)::timestamptz
               FROM jsonb_array_elements($1::jsonb) AS r ON CONFLICT DO NOTHING""",
            json.dumps([[g.job_id, g.epoch, list(g.workers), g.devices, _iso(g.granted_at)] for g in grants]))


async def fill_devices(conn: asyncpg.Connection, gang_devices: dict[str, int]) -> list[str]:
    """Complete the grants taken before their job's submission reached the budget (``UNKNOWN_DEVICES``) with the
    devices it names (``gang_devices``: the gang's total per job); the jobs whose grants were completed."""
    if not gang_devices:
        return []
    rows = await conn.fetch("SELECT job_id, epoch, workers, granted_at FROM budget.grants"
                            " WHERE job_id = ANY($1::text[]) AND devices = $2", sorted(gang_devices), UNKNOWN_DEVICES)
    filled = [grant_of(r["job_id"], r["epoch"], r["workers"], gang_devices[r["job_id"]], r["granted_at"])
              for r in rows]
    if filled:
        await conn.execute(
            """UPDATE budget.grants AS g SET devices = (r->>2)::int FROM jsonb_array_elements($1::jsonb) AS r
               WHERE g.job_id = r->>0 AND g.epoch = (r->>1)::int""",
            json.dumps([[g.job_id, g.epoch, g.devices] for g in filled]))
    return sorted({g.job_id for g in filled})


async def held_for(conn: asyncpg.Connection, job_ids: list[str]) -> list[Charge]:
    """Take the held records of these jobs (whose epoch moved or who ended) out, to be judged again."""
    if not job_ids:
        return []
    rows = await conn.fetch(
        """DELETE FROM budget.held_usage WHERE job_id = ANY($1::text[])
           RETURNING job_id, executor_id, epoch, seq, devices, wall_seconds, started_at, ended_at, last""",
        sorted(set(job_ids)))
    return [Charge(r["job_id"], r["executor_id"], r["epoch"], r["seq"], r["devices"], r["wall_seconds"],
                   r["started_at"], r["ended_at"], r["last"]) for r in rows]
