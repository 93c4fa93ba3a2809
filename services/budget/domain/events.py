"""A batch of job events folded over the budget's job rows in memory: what applying each event in turn, one
statement at a time, leaves in each row, the ceiling history rows it adds and what it announces.

The budget service reads every job of a batch once (locked), folds the events here, then writes each table
once (services/budget/jobevents.py). The rules per event, in (job, seq) order, are those of the budget's
account (ledger.py):

- an event newer than the job's last (by seq) moves its state, event seq, lease epoch (never backwards) and,
  when it moves the job into ``running``, the start of the run; a terminal state closes the account;
- a submission sets the ceiling of its spec (and the owner, the devices, the checkpoint figures, the org); a
  requeue with a ceiling replaces it; each is kept in the ceiling history once by (job, event seq), and the
  ceiling in force is the one of the latest event seq, whatever order redeliveries come in;
- the account is judged after each event (overshoot, exhaustion announced once per ceiling);
- a submission whose estimated first checkpoint costs more than the ceiling warns once per job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.contracts.jobs import TERMINAL_STATES, JobEvent, JobEventKind, JobSpec

from . import ledger
from .ledger import Account, Decision, FirstCheckpointWarning


@dataclass
class JobRow:
    """The columns of ``budget.jobs`` a job event reads or writes, and the latest ceiling of its history."""

    job_id: str
    state: str | None = None
    event_seq: int = 0
    epoch: int = 0
    running_since: datetime | None = None
    ceiling: float | None = None
    consumed: float = 0.0
    exhausted_for: float | None = None
    overshoot: float = 0.0
    owner: str | None = None
    devices: int | None = None
    checkpoint_every_steps: int | None = None
    estimated_step_seconds: float | None = None
    org: str = "default"
    warned: bool = False  # a first-checkpoint warning is stored
    ceiling_seq: int | None = None  # the event seq of the latest ceiling history row (None: no history)
    ceiling_latest: float | None = None
    # What the fold did to the row: state or account written (its updated_at moves), anything written at all.
    touched: bool = False
    changed: bool = False
    warning: FirstCheckpointWarning | None = None  # a warning stored by this batch

    def account(self) -> Account:
        return Account(ceiling=self.ceiling, consumed=self.consumed, exhausted_for=self.exhausted_for,
                       overshoot=self.overshoot, active=self.state not in TERMINAL_STATES)

    def stored(self) -> tuple:
        return (self.ceiling, self.consumed, self.exhausted_for, self.overshoot)


@dataclass(frozen=True)
class CeilingRow:
    """A row of the ceiling history (``budget.ceilings``), added once by (job, event seq)."""

    job_id: str
    event_seq: int
    ceiling_seconds: float
    actor: str | None
    reason: str
    consumed_seconds: float
    set_at: datetime


@dataclass(frozen=True)
class Exhausted:
    job_id: str
    account: Account


@dataclass(frozen=True)
class Warned:
    job_id: str
    warning: FirstCheckpointWarning
    consumed: float


@dataclass
class Fold:
    rows: dict[str, JobRow]
    ceilings: list[CeilingRow] = field(default_factory=list)  # to insert, at most one per (job, event seq)
    announced: list[Exhausted | Warned] = field(default_factory=list)  # in the order the events caused them

    def changed(self) -> list[JobRow]:
        return [r for _, r in sorted(self.rows.items()) if r.changed]


def fold(rows: dict[str, JobRow], events: Iterable[JobEvent], spec_of: Callable[[dict[str, Any]], JobSpec | None]
         ) -> Fold:
    """Apply ``events`` in (job, seq) order to ``rows`` (changed in place; every event's job must be there)."""
    out = Fold(rows)
    added: set[tuple[str, int]] = set()
    for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
        _apply(out, rows[ev.job_id], ev, spec_of, added)
    return out


def _apply(out: Fold, row: JobRow, ev: JobEvent, spec_of: Callable[[dict[str, Any]], JobSpec | None],
           added: set[tuple[str, int]]) -> None:
    before = row.account()
    decision = Decision(before, False)
    if ev.seq > row.event_seq:
        if ledger.starts_run(str(ev.state), ev.previous_state and str(ev.previous_state)):
            row.running_since = ev.time
        row.state, row.event_seq, row.epoch = str(ev.state), ev.seq, max(row.epoch, ev.epoch or 0)
        row.touched = row.changed = True
        if ev.state in TERMINAL_STATES:
            decision = Decision(ledger.on_terminal(decision.account), False)

    ceiling, actor, spec = None, None, None
    if ev.event == JobEventKind.SUBMITTED:
        spec = spec_of(ev.detail)
        ceiling, actor = (spec.gpu_ceiling_seconds if spec else None), ev.detail.get("owner")
    elif ev.event == JobEventKind.REQUEUED and ev.detail.get("gpu_ceiling_seconds") is not None:
        ceiling, actor = float(ev.detail["gpu_ceiling_seconds"]), ev.detail.get("actor")
    if ceiling is not None:
        if row.ceiling_seq is None or ev.seq > row.ceiling_seq:
            # The latest now; a seq at or below the latest may be in the history already, which then stays.
            row.ceiling_seq, row.ceiling_latest = ev.seq, ceiling
        if (ev.job_id, ev.seq) not in added:
            added.add((ev.job_id, ev.seq))
            out.ceilings.append(CeilingRow(ev.job_id, ev.seq, ceiling, actor, str(ev.event),
                                           decision.account.consumed, ev.time))
        decision = ledger.on_ceiling(decision.account, row.ceiling_latest)  # type: ignore[arg-type]
    acc = decision.account
    if decision.exhausted or (acc.ceiling, acc.consumed, acc.exhausted_for, acc.overshoot) != row.stored():
        row.ceiling, row.consumed, row.exhausted_for, row.overshoot = (acc.ceiling, acc.consumed, acc.exhausted_for,
                                                                      acc.overshoot)
        row.touched = row.changed = True
        if decision.exhausted:
            out.announced.append(Exhausted(ev.job_id, acc))

    if spec is not None:
        devices = ledger.gang_devices(spec.workers, spec.gpus_per_worker)
        row.owner = row.owner if row.owner is not None else actor
        row.devices, row.checkpoint_every_steps = devices, spec.checkpoint_every_steps
        row.estimated_step_seconds = spec.estimated_step_seconds
        row.org = ev.detail.get("org") if ev.detail.get("org") is not None else row.org
        row.changed = True
        if not row.warned:
            w = ledger.first_checkpoint_warning(spec.checkpoint_every_steps, spec.estimated_step_seconds, devices,
                                                acc.ceiling, "estimate")
            if w is not None:
                row.warned, row.warning = True, w
                out.announced.append(Warned(ev.job_id, w, acc.consumed))
