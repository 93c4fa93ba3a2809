"""The budget service's tables (schema ``budget``): the append-only ledger, ceilings and per-job accounts.

Every change to an account is made under its row lock (``FOR UPDATE``, jobs locked in id order so two
replicas never deadlock), in the same transaction as the ledger rows that caused it and the events it emits.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg

from libs.contracts.budget import BudgetEvent, BudgetEventKind
from libs.contracts.envelope import Envelope
from libs.contracts.jobs import TERMINAL_STATES
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import StepReport, UsageSample
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime.fencing import StaleEpoch, is_stale

from . import grants
from .domain import ledger, usage
from .domain.ledger import Account, Decision, FirstCheckpointWarning, StepStats
from .domain.usage import Charge, Reconciliation

log = logging.getLogger(__name__)

SCHEMA = "budget"
CEILING_REASON = "gpu_ceiling"


@dataclass
class Effects:
    """What a transaction did, for the caller's counters and the tests."""

    events: list[tuple[str, Envelope]] = field(default_factory=list)
    stale: list[StaleEpoch] = field(default_factory=list)  # messages ignored for an old lease epoch
    inserted: int = 0
    late: int = 0  # usage records of an old lease epoch, charged all the same
    duplicates: int = 0  # usage records already charged
    charged: float = 0.0  # GPU-seconds appended to the ledger
    overshoot: float = 0.0  # growth of the jobs' overshoot (charged past a ceiling)
    held: int = 0  # usage records waiting for their grant (domain/grants.py)
    refused: int = 0  # usage records no grant allows: refused on teto.rejected.budget, never charged


_LOCK_JOBS = ("SELECT * FROM budget.jobs WHERE job_id = ANY(ARRAY(SELECT json_array_elements_text($1::json)))"
              " ORDER BY job_id FOR UPDATE")


async def locked(conn: asyncpg.Connection, job_ids: list[str], select: str) -> dict[str, asyncpg.Record]:
    """The jobs' rows, locked in id order by ``select`` (``$1``: the ids as JSON), in id order; a job not known
    yet is created first. Known jobs (nearly every batch) take one statement. Unknown ones are then inserted in id
    order and locked by a second read, which also sees a row another replica created meanwhile: every
    transaction locks the rows that exist in id order before it inserts any, and inserts in id order, so two
    replicas never wait on each other in a cycle."""
    ordered = sorted(set(job_ids))  # the lock order; one JSON parameter (see ``_LEDGER_ROWS``)
    rows = {r["job_id"]: r for r in await conn.fetch(select, json.dumps(ordered))}
    missing = [j for j in ordered if j not in rows]
    if missing:
        more = json.dumps(missing)
        await conn.execute("INSERT INTO budget.jobs (job_id) SELECT json_array_elements_text($1::json)"
                           " ON CONFLICT DO NOTHING", more)
        rows.update((r["job_id"], r) for r in await conn.fetch(select, more))
        rows = dict(sorted(rows.items()))
    return rows


async def lock_jobs(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, asyncpg.Record]:
    return await locked(conn, job_ids, _LOCK_JOBS)


def account_of(row: asyncpg.Record) -> Account:
    return Account(ceiling=row["ceiling_seconds"], consumed=row["consumed_seconds"],
                   exhausted_for=row["exhausted_for_ceiling"], overshoot=row["overshoot_seconds"],
                   active=row["state"] not in TERMINAL_STATES)


def exhausted_event(subjects: Subjects, job_id: str, acc: Account) -> tuple[str, BudgetEvent]:
    return subjects.budget(job_id, "exhausted"), BudgetEvent(
        job_id=job_id, event=BudgetEventKind.EXHAUSTED, ceiling_seconds=acc.ceiling, consumed_seconds=acc.consumed,
        reason=CEILING_REASON, detail={"overshoot_seconds": max(0.0, acc.consumed - acc.ceiling)})


def charge_of(executor_id: str, record: UsageRecord | UsageSample) -> Charge:
    """A usage record (or a sample from a heartbeat of an agent that predates usage reports) as a ledger row."""
    return Charge(job_id=record.job_id, executor_id=executor_id, epoch=record.epoch, seq=record.seq,
                  devices=record.devices, wall_seconds=record.wall_seconds,
                  started_at=getattr(record, "started_at", None), ended_at=getattr(record, "ended_at", None),
                  last=getattr(record, "last", False))


def charges_of(reports: list[UsageReport]) -> list[Charge]:
    """Every record of the reports as a ledger row (``charge_of`` without its look-ups: a record has every field)."""
    return [Charge(rec.job_id, r.executor_id, rec.epoch, rec.seq, rec.devices, rec.wall_seconds, rec.started_at,
                   rec.ended_at, rec.last) for r in reports for rec in r.records]


def utc(at: datetime | None) -> str | None:
    """A time as PostgreSQL reads a ``timestamptz`` from JSON: with its offset, or, naive, converted as asyncpg
    converts one (the machine's local time)."""
    if at is None:
        return None
    return (at if at.tzinfo is not None else at.astimezone(UTC)).isoformat()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_EXACT_MICROS = 2 ** 53  # PostgreSQL multiplies an interval by a float8: exact for whole numbers below this


def micros(at: datetime | None) -> int | str | None:
    """A time as the batch's JSON carries it: whole microseconds since the Unix epoch (an integer, a quarter of
    ``isoformat``'s cost, and no text for PostgreSQL to parse), read back by ``_at``'s SQL to the same instant. A time
    more than 285 years from 1970 travels as ``utc``'s text instead, so every instant lands exactly."""
    if at is None:
        return None
    n = ((at if at.tzinfo is not None else at.astimezone(UTC)) - _EPOCH) // _MICROSECOND
    return n if -_EXACT_MICROS < n < _EXACT_MICROS else utc(at)


def _at(field: int) -> str:
    """SQL reading ``micros``' value at index ``field`` of the row ``r`` as a ``timestamptz``."""
    return (f"CASE jsonb_typeof(r->{field}) WHEN 'number' THEN timestamptz 'epoch' + (r->>{field})::bigint"
            f" * interval '1 microsecond' ELSE (r->>{field})::timestamptz END")


# A batch's rows travel as one JSON parameter, unpacked by PostgreSQL, rather than one array per column: asyncpg
# checks every element of an array parameter against several abstract base classes (about 30 checks per usage
# record, the largest Python cost of a batch after decoding it).
_LEDGER_ROWS = """(SELECT r->>0 AS job_id, (r->>1)::int AS epoch, r->>2 AS executor_id, (r->>3)::int AS seq,
                          (r->>4)::int AS devices, (r->>5)::float8 AS wall_seconds, (r->>6)::float8 AS gpu_seconds,
                          """ + _at(7) + " AS started_at, " + _at(8) + """ AS ended_at, (r->>9)::bool AS last
                   FROM jsonb_array_elements($1::jsonb) AS r)"""


def _ledger_rows(batch: list[Charge]) -> str:
    return json.dumps([[c.job_id, c.epoch, c.executor_id, c.seq, c.devices, c.wall_seconds, c.gpu_seconds,
                        micros(c.started_at), micros(c.ended_at), c.last] for c in batch])


# What charging reads of a job, locked (``lock_jobs`` reads every column: a usage batch decoded 19 a job).
_LOCK_ACCOUNTS = ("SELECT job_id, state, epoch, ceiling_seconds, consumed_seconds, exhausted_for_ceiling,"
                  " overshoot_seconds FROM budget.jobs"
                  " WHERE job_id = ANY(ARRAY(SELECT json_array_elements_text($1::json))) ORDER BY job_id FOR UPDATE")


def _set_accounts(param: str) -> str:
    """The charged jobs' accounts and lease epochs, from the JSON parameter ``param``: [[job, ceiling, consumed,
    exhausted_for, overshoot, epoch], ...] (``_Charging.accounts``)."""
    return f"""UPDATE budget.jobs AS j SET ceiling_seconds = u.ceiling, consumed_seconds = u.consumed,
                  exhausted_for_ceiling = u.exhausted_for, overshoot_seconds = u.overshoot,
                  epoch = GREATEST(j.epoch, u.epoch), updated_at = now()
           FROM (SELECT a->>0 AS job_id, (a->>1)::float8 AS ceiling, (a->>2)::float8 AS consumed,
                        (a->>3)::float8 AS exhausted_for, (a->>4)::float8 AS overshoot, (a->>5)::int AS epoch
                 FROM jsonb_array_elements({param}::jsonb) AS a) AS u
           WHERE j.job_id = u.job_id"""


# The ledger rows and the accounts they make, in one statement: the accounts are written only when every row was
# new (the accounts were decided for exactly those); otherwise nothing is charged and the identities that did
# land come back ($3: how many rows), for the batch to be planned again against the ledger.
_CHARGE = f"""WITH added AS (
    INSERT INTO budget.ledger (job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds, started_at,
                               ended_at, last)
    SELECT * FROM {_LEDGER_ROWS} AS r ON CONFLICT (job_id, epoch, executor_id, seq) DO NOTHING
    RETURNING job_id, executor_id, epoch, seq),
  charged AS ({_set_accounts('$2')} AND (SELECT count(*) FROM added) = $3)
SELECT count(*) AS n, CASE WHEN count(*) < $3 THEN json_agg(json_build_array(job_id, executor_id, epoch, seq))
                      END::text AS landed FROM added"""


async def _charged(conn: asyncpg.Connection, batch: list[Charge]) -> dict[tuple[str, str, int, int], Charge]:
    rows = await conn.fetch(
        f"""SELECT l.job_id, l.executor_id, l.epoch, l.seq, l.devices, l.wall_seconds FROM budget.ledger l
            JOIN {_LEDGER_ROWS} AS k USING (job_id, executor_id, epoch, seq)""", _ledger_rows(batch))
    return {(r["job_id"], r["executor_id"], r["epoch"], r["seq"]): Charge(
        r["job_id"], r["executor_id"], r["epoch"], r["seq"], r["devices"], r["wall_seconds"]) for r in rows}


@dataclass
class _Charging:
    """The accounts a batch's new ledger rows make, decided before they are written."""

    before: dict[str, Account]
    decisions: dict[str, Decision]
    epochs: dict[str, int]
    charged: float

    @classmethod
    def of(cls, rows: dict[str, asyncpg.Record], fresh: list[Charge]) -> _Charging:
        added: dict[str, float] = {}
        epochs: dict[str, int] = {}
        for c in fresh:
            added[c.job_id] = added.get(c.job_id, 0.0) + c.gpu_seconds
            epochs[c.job_id] = max(epochs.get(c.job_id, 0), c.epoch)
        before = {job_id: account_of(rows[job_id]) for job_id in sorted(added)}
        return cls(before, {job_id: ledger.on_usage(acc, added[job_id]) for job_id, acc in before.items()}, epochs,
                   sum(added.values()))

    def accounts(self) -> str:
        return json.dumps([[j, d.account.ceiling, d.account.consumed, d.account.exhausted_for, d.account.overshoot,
                            self.epochs[j]] for j, d in self.decisions.items()])


async def record_usage(conn: asyncpg.Connection, batch: list[Charge], subjects: Subjects,
                       admission: grants.Admission | None = None) -> Effects:
    """Append usage records to the ledger and charge their jobs, each (job, executor, epoch, seq) once.

    With ``admission`` (the service's path), only what a lease grant allows is charged (grants.py): the rest is
    held for its grant or refused on ``teto.rejected.budget`` in the same transaction.

    A record of an old lease epoch is charged too (counted in ``late``): the worker really ran. The job rows
    are locked first, so two replicas charging the same job serialise and the second sees the first's rows.
    The batch's distinct records are inserted with the accounts they make, decided as if none had been charged
    before (``_CHARGE``: one statement). Only when some were in the ledger already (a redelivery) are those read
    back, the batch planned again against them and the accounts of the rows that did land written, so the counts
    are those of planning against the ledger first (``usage.plan_charges``): two statements a batch of known jobs
    with nothing redelivered.
    """
    effects = Effects()
    if not batch:
        return effects
    rows = await locked(conn, [c.job_id for c in batch], _LOCK_ACCOUNTS)
    if admission is not None:
        judged, notes = await grants.admit(conn, batch, rows, admission, subjects)
        effects.events.extend(notes)
        effects.held, effects.refused, batch = len(judged.held), len(judged.refused), judged.charged
        if not batch:
            return effects
    epochs_now = {j: r["epoch"] for j, r in rows.items()}
    plan = usage.plan_charges(batch, {}, epochs_now)  # every identity of the batch once: never empty
    charging = _Charging.of(rows, plan.fresh)
    landed = await conn.fetchrow(_CHARGE, _ledger_rows(plan.fresh), charging.accounts(), len(plan.fresh))
    if landed["n"] < len(plan.fresh):  # some were charged before: the figures they were charged with decide
        added_keys = {tuple(k) for k in json.loads(landed["landed"] or "[]")}
        plan = usage.plan_charges(batch, await _charged(conn, [c for c in plan.fresh if c.key not in added_keys]),
                                  epochs_now)
        charging = _Charging.of(rows, plan.fresh)  # exactly the rows that landed
        if plan.fresh:
            await conn.execute(_set_accounts("$1"), charging.accounts())
    effects.late, effects.duplicates = plan.late, plan.duplicates
    for c in plan.conflicts:
        log.warning("usage record %s sent again with other figures (%s devices x %ss): the first one stays charged",
                    c.key, c.devices, c.wall_seconds)
    effects.inserted, effects.charged = landed["n"], charging.charged
    for job_id, d in charging.decisions.items():
        effects.overshoot += max(0.0, d.account.overshoot - charging.before[job_id].overshoot)
        if d.exhausted:
            effects.events.append(exhausted_event(subjects, job_id, d.account))
    return effects


async def reconcile(conn: asyncpg.Connection | asyncpg.Pool, job_ids: list[str] | None = None) -> list[Reconciliation]:
    """Every job's (or the named jobs') running total against the sum of its ledger rows, with the records
    missing inside each run and the runs not closed yet."""
    runs = await conn.fetch(
        """SELECT job_id, max(seq) AS highest, count(*) AS n, bool_or(last) AS closed FROM budget.ledger
           WHERE $1::text[] IS NULL OR job_id = ANY($1::text[]) GROUP BY job_id, executor_id, epoch""", job_ids)
    missing: dict[str, int] = {}
    open_runs: dict[str, int] = {}
    for r in runs:
        missing[r["job_id"]] = missing.get(r["job_id"], 0) + usage.missing_in_run(r["highest"], r["n"])
        open_runs[r["job_id"]] = open_runs.get(r["job_id"], 0) + (not r["closed"])
    rows = await conn.fetch(
        """SELECT COALESCE(j.job_id, l.job_id) AS job_id, COALESCE(j.consumed_seconds, 0) AS consumed,
                  COALESCE(l.total, 0) AS total, COALESCE(l.n, 0) AS n
           FROM (SELECT * FROM budget.jobs WHERE $1::text[] IS NULL OR job_id = ANY($1::text[])) j
           FULL JOIN (SELECT job_id, sum(gpu_seconds) AS total, count(*) AS n FROM budget.ledger
                      WHERE $1::text[] IS NULL OR job_id = ANY($1::text[]) GROUP BY job_id) l USING (job_id)
           ORDER BY 1""", job_ids)
    return [Reconciliation(r["job_id"], r["consumed"], r["total"], r["n"], missing.get(r["job_id"], 0),
                           open_runs.get(r["job_id"], 0)) for r in rows]


def warning_event(subjects: Subjects, job_id: str, w: FirstCheckpointWarning,
                   consumed: float) -> tuple[str, BudgetEvent]:
    numbers = {k: float(v) for k, v in w.as_dict().items() if isinstance(v, int | float)}
    return subjects.budget(job_id, "warning"), BudgetEvent(
        job_id=job_id, event=BudgetEventKind.WARNING, ceiling_seconds=w.ceiling_seconds, consumed_seconds=consumed,
        reason=w.reason, detail=numbers)


async def _store_warning(conn: asyncpg.Connection, job_id: str, w: FirstCheckpointWarning, consumed: float,
                         subjects: Subjects, effects: Effects) -> None:
    await conn.execute("UPDATE budget.jobs SET warning = $2::jsonb WHERE job_id = $1", job_id, json.dumps(w.as_dict()))
    effects.events.append(warning_event(subjects, job_id, w, consumed))


async def record_steps(conn: asyncpg.Connection, reports: list[StepReport], subjects: Subjects,
                       now: datetime) -> Effects:
    """Measure step time for the checkpoint ETA, and warn as soon as a measured step time says the first
    checkpoint will not fit in the ceiling (unless a warning was already given)."""
    effects = Effects()
    rows = await lock_jobs(conn, [r.job_id for r in reports])
    stats = {j: StepStats(r["last_step"], r["mean_step_seconds"], r["measured_steps"]) for j, r in rows.items()}
    for rep in sorted(reports, key=lambda r: (r.job_id, r.time)):
        if is_stale(rep.epoch, rows[rep.job_id]["epoch"]):
            effects.stale.append(StaleEpoch(rep.executor_id, rep.job_id, rep.epoch, rows[rep.job_id]["epoch"],
                                            "step report"))
            continue
        stats[rep.job_id] = ledger.on_step(stats[rep.job_id], rep.step, rep.step_seconds)
    for job_id, row in rows.items():
        st = stats[job_id]
        every = row["checkpoint_every_steps"]
        eta = ledger.next_checkpoint_eta(st.last_step, every or 0, st.mean_step_seconds)
        await conn.execute(
            "UPDATE budget.jobs SET last_step = $2, mean_step_seconds = $3, measured_steps = $4,"
            " next_checkpoint_eta_seconds = $5, step_reported_at = $6 WHERE job_id = $1",
            job_id, st.last_step, st.mean_step_seconds, st.measured_steps, eta, now)
        if row["warning"] is None and every and st.last_step is not None and st.last_step < every:
            w = ledger.first_checkpoint_warning(every, st.mean_step_seconds, row["devices"] or 1,
                                                row["ceiling_seconds"], "measured")
            if w is not None:
                await _store_warning(conn, job_id, w, row["consumed_seconds"], subjects, effects)
    return effects


async def status(pool: asyncpg.Pool, job_id: str) -> tuple[bool, float | None, float]:
    row = await pool.fetchrow("SELECT ceiling_seconds, consumed_seconds FROM budget.jobs WHERE job_id = $1", job_id)
    if row is None:
        return False, None, 0.0
    return True, row["ceiling_seconds"], row["consumed_seconds"]
