"""Which usage records the budget believes: only what a lease grant allows the sender to have used.

The bus lets an executor publish usage only under its own id (docs/security/bus.md), but any executor can name
any job and epoch (both are public) and any figures the contract bounds allow. So a record is charged only when
the job's ``leased`` event granted that epoch to that executor, for at most the devices each worker of the grant
holds, and for at most the wall time since the grant (summed over the run's records, seq order, with a slack for
the queue's and the budget's clocks). A record of an old epoch from that epoch's holder is still charged (a worker
that lost contact kept running until it noticed: that time was really used, usage.py); a record from anyone else
is refused, visibly, and never charged.

The budget learns of grants from the job events stream and of usage from the usage stream: a record may arrive
before the grant it ran under. Nor do the job events arrive in order: the budget's replicas share their consumer,
and a batch (or a redelivery) can commit after a later one, so the job's epoch, or its end, can be known before
the ``leased`` event of that epoch is. A record without a grant is therefore held, not refused, as long as its
grant can still come: while the job runs, or, once it has ended, when its epoch is at most the job's last (the
queue announces every epoch it grants in a ``leased`` event). It is judged again when a grant of its job arrives,
the job's epoch moves or it ends (``to_judge_again``); only a record of an epoch past the end of its job is
refused for want of a grant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from .usage import Charge

# The grant's time is the queue's clock, "now" the budget's; both are servers' clocks kept by NTP.
DEFAULT_CLOCK_SLACK_SECONDS = 30.0
# A grant's devices when its job's submission (which says how many) had not reached the budget: the leased event
# can commit first (the replicas share the consumer). Every worker holds one device at least, so a record of one
# device is judged at once; one of more waits until the submission fills the grant in (``grant_of`` again).
UNKNOWN_DEVICES = 0


@dataclass(frozen=True)
class Grant:
    """One lease grant as the budget keeps it (``budget.grants``), from the job's ``leased`` event."""

    job_id: str
    epoch: int
    workers: tuple[str, ...]  # empty: granted before the budget kept grants (holder unknown, bounds still apply)
    devices: int  # per worker: what each may charge at most, per second; UNKNOWN_DEVICES: submission not seen yet
    granted_at: datetime

    def holds(self, executor_id: str) -> bool:
        return not self.workers or executor_id in self.workers


class Verdict(StrEnum):
    CHARGE = "charge"  # the holder of the record's epoch, within the grant's figures
    HOLD = "hold"  # no grant of its epoch yet, and one may still come (the job runs, or it ran that epoch)
    REFUSE = "refuse"  # not allowed by any grant: published on teto.rejected.budget, never charged


@dataclass(frozen=True)
class Judgement:
    charge: Charge
    verdict: Verdict
    reason: str = ""


@dataclass(frozen=True)
class JobLease:
    """What the budget knows of a job when judging its usage: its latest epoch and whether it has ended."""

    epoch: int = 0
    ended: bool = False


@dataclass
class Judged:
    charged: list[Charge] = field(default_factory=list)
    held: list[Charge] = field(default_factory=list)
    refused: list[Judgement] = field(default_factory=list)


def judge(charge: Charge, grant: Grant | None, job: JobLease, *, used_before: float, now: datetime,
          slack_seconds: float = DEFAULT_CLOCK_SLACK_SECONDS) -> Judgement:
    """One record against the grant of its (job, epoch). ``used_before``: wall seconds of the same run (job,
    executor, epoch) with a lower seq, charged or judged before it."""
    if grant is None:
        # The job's epoch says nothing of whether the grant was seen (job events may commit out of order): only
        # an epoch past a finished job's last can never be granted.
        if not job.ended or charge.epoch <= job.epoch:
            return Judgement(charge, Verdict.HOLD, f"epoch {charge.epoch} of job {charge.job_id} not granted yet")
        return Judgement(charge, Verdict.REFUSE,
                         f"epoch {charge.epoch} of job {charge.job_id} was never granted (the job ended at epoch "
                         f"{job.epoch})")
    if not grant.holds(charge.executor_id):
        return Judgement(charge, Verdict.REFUSE,
                         f"executor {charge.executor_id} does not hold epoch {charge.epoch} of job {charge.job_id}")
    if grant.devices == UNKNOWN_DEVICES and charge.devices > 1:
        return Judgement(charge, Verdict.HOLD, f"devices of job {charge.job_id} not known yet (its submission)")
    if charge.devices > max(1, grant.devices):
        return Judgement(charge, Verdict.REFUSE,
                         f"{charge.devices} devices claimed, {max(1, grant.devices)} granted per worker")
    allowed = max(0.0, (now - grant.granted_at).total_seconds()) + slack_seconds
    if used_before + charge.wall_seconds > allowed:
        return Judgement(charge, Verdict.REFUSE,
                         f"{used_before + charge.wall_seconds:.3f} wall seconds claimed for the run, "
                         f"{allowed - slack_seconds:.3f} since the grant")
    return Judgement(charge, Verdict.CHARGE)


def judge_batch(batch: Iterable[Charge], grants: dict[tuple[str, int], Grant], jobs: dict[str, JobLease],
                used: dict[tuple[str, str, int], float], *, now: datetime,
                slack_seconds: float = DEFAULT_CLOCK_SLACK_SECONDS) -> Judged:
    """Judge a batch, each run's records in seq order. ``used``: wall seconds already in the ledger per run (job,
    executor, epoch), not counting the batch's own seqs; a refused record does not count as used. An identity that
    appears twice in the batch is judged once; its repeats share the verdict (the ledger charges it once)."""
    out = Judged()
    verdicts: dict[tuple[str, str, int, int], Verdict] = {}
    running = dict(used)
    for c in sorted(batch, key=lambda c: (c.job_id, c.executor_id, c.epoch, c.seq)):
        verdict = verdicts.get(c.key)
        if verdict is None:
            run = (c.job_id, c.executor_id, c.epoch)
            j = judge(c, grants.get((c.job_id, c.epoch)), jobs.get(c.job_id, JobLease()),
                      used_before=running.get(run, 0.0), now=now, slack_seconds=slack_seconds)
            verdict = verdicts[c.key] = j.verdict
            if verdict is Verdict.CHARGE:
                running[run] = running.get(run, 0.0) + c.wall_seconds
            elif verdict is Verdict.REFUSE:
                out.refused.append(j)  # once per identity
                continue
        if verdict is Verdict.CHARGE:
            out.charged.append(c)  # a repeat too: the ledger counts it as a duplicate or a conflict
        elif verdict is Verdict.HOLD:
            out.held.append(c)
    return out


def to_judge_again(before: dict[str, JobLease], after: dict[str, JobLease],
                   granted: Iterable[str] = ()) -> list[str]:
    """The jobs whose held records a batch of job events makes worth judging again: a grant of theirs arrived
    (``granted``: whatever their epoch says, the ``leased`` event may come after a later event of the job), their
    epoch moved or they ended (a record of an epoch past their last will never be granted)."""
    moved = {j for j, was in before.items()
             if j in after and (after[j].epoch > was.epoch or (after[j].ended and not was.ended))}
    return sorted(moved | set(granted))


def grant_of(job_id: str, epoch: int, workers: Iterable[str], gang_devices: int | None,
             granted_at: datetime) -> Grant:
    """A ``leased`` event's grant: its workers, each allowed its share of the job's devices (the budget keeps the
    gang's total, workers x devices held each; ``UNKNOWN_DEVICES`` while the submission has not been seen)."""
    ws = tuple(dict.fromkeys(workers))
    if gang_devices is None:
        return Grant(job_id, epoch, ws, UNKNOWN_DEVICES, granted_at)
    return Grant(job_id, epoch, ws, max(1, -(-gang_devices // max(1, len(ws)))), granted_at)
