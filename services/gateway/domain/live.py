"""Live figures of a job's GPU time, derived from facts the budget service publishes (pure: rows in, figures
out; the clock is the database's reading that came with the rows, never read here).

- Provisional consumption: the ledger grows one usage sample per heartbeat (30 s by default), so a running
  job's ledger total lags. The stretch since its current run's last sample (or since the run started, before
  its first sample) times the devices it holds is shown apart, marked provisional: it becomes ledger time when
  the next sample arrives, and is never charged by the gateway.
- Interruption cost: the steps and GPU-seconds since the last checkpoint, which an interruption would throw
  away (the next attempt resumes from that checkpoint). For a running job, what an interruption now would
  cost (ledger time of the current run after the checkpoint, plus the provisional stretch); for an interrupted
  job, what its interruption cost. A sample that straddles the checkpoint counts for its part after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

RUNNING = "running"
AT_RISK_STATES = frozenset({"running", "admitting"})  # an interruption now would throw work away
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Provisional:
    seconds: float = 0.0  # GPU-seconds since the last sample, not in the ledger yet
    since: datetime | None = None  # where the provisional stretch starts
    devices: int = 0  # GPU-seconds it grows by per second of wall time (0: not growing)


NONE = Provisional()


def as_time(value: Any) -> datetime | None:
    """A timestamp from a row (a datetime) or from JSON (ISO text); anything else is no time."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else None
    return None


def provisional(state: str | None, lease_epoch: int | None, budget: Mapping[str, Any] | None) -> Provisional:
    """The running stretch not yet in the ledger. Only for a job the queue says is running, whose current run
    (lease epoch) the budget service already knows and whose records are not closed (a closed run's process
    has exited: its time is all in the ledger)."""
    if state != RUNNING or budget is None or budget.get("run_closed"):
        return NONE
    if lease_epoch is None or budget.get("epoch") != lease_epoch:
        return NONE  # the budget service has not heard of this run yet: its samples would be the last run's
    starts = [t for t in (as_time(budget.get("last_sample_at")), as_time(budget.get("running_since"))) if t]
    read_at = as_time(budget.get("read_at"))
    if not starts or read_at is None:
        return NONE
    since = max(starts)
    devices = max(1, int(budget.get("devices") or 1))
    return Provisional(max((read_at - since).total_seconds(), 0.0) * devices, since, devices)


def live_budget(block: Mapping[str, Any], prov: Provisional) -> dict[str, Any]:
    """The budget block with the provisional stretch beside the ledger's figures (which keep their meaning)."""
    out = dict(block)
    consumed = float(out.get("consumed_seconds") or 0.0)
    live = consumed + prov.seconds
    ceiling = out.get("ceiling_seconds")
    out.update(provisional_seconds=round(prov.seconds, 3), provisional_since=prov.since,
               provisional_devices=prov.devices, consumed_live_seconds=round(live, 3),
               remaining_live_seconds=None if ceiling is None else round(max(float(ceiling) - live, 0.0), 3))
    return out


def gpu_seconds_after(samples: Iterable[Mapping[str, Any]], since: datetime | None) -> float:
    """GPU-seconds of usage samples after ``since`` (all of them when None). A sample without its stretch (an
    old agent's) counts by when it was recorded."""
    total = 0.0
    for s in samples:
        gpu = float(s.get("gpu_seconds") or 0.0)
        start, end = as_time(s.get("started_at")), as_time(s.get("ended_at"))
        if since is None:
            total += gpu
        elif start is None or end is None:
            recorded = as_time(s.get("recorded_at"))
            total += gpu if recorded is not None and recorded > since else 0.0
        elif end <= since:
            continue
        elif start >= since or end <= start:
            total += gpu
        else:
            total += gpu * (end - since).total_seconds() / (end - start).total_seconds()
    return total


def work_after_checkpoint(samples: Iterable[Mapping[str, Any]], checkpoint: Mapping[str, Any] | None) -> float:
    """The GPU-seconds of a run's usage samples after ``checkpoint`` (a checkpoint as the queue records it, with
    its ``at``): the work an interruption of that run throws away, since the next run resumes from the
    checkpoint. Without a checkpoint (or one without a time) the whole run counts. The one computation behind
    the job view's ``interruption_cost`` and the usage report's ``lost_gpu_seconds``."""
    at = checkpoint.get("at") if isinstance(checkpoint, Mapping) else None
    return gpu_seconds_after(samples, as_time(at))


def interruption_cost(job: Mapping[str, Any], samples: Iterable[Mapping[str, Any]],
                      prov: Provisional) -> dict[str, Any] | None:
    """``{kind, steps, gpu_seconds, provisional_seconds, checkpoint_step, checkpoint_at, last_step, epoch}``:
    ``kind`` is ``at_risk`` (running or forming a gang: what an interruption now throws away) or ``lost`` (an
    interrupted job: what its interruption threw away); None in any other state. ``samples`` are the usage
    records of the job's current (or, interrupted, its last) run; without a checkpoint everything since the
    run started counts. ``gpu_seconds`` includes ``provisional_seconds`` (at_risk only)."""
    state = job.get("state")
    if state in AT_RISK_STATES:
        kind = "at_risk"
    elif state == INTERRUPTED:
        kind, prov = "lost", NONE
    else:
        return None
    ckpt = job.get("last_checkpoint") if isinstance(job.get("last_checkpoint"), Mapping) else {}
    ckpt_step = ckpt.get("step")
    last_step = job.get("last_step")
    steps = max(int(last_step) - int(ckpt_step or 0), 0) if last_step is not None else 0
    ledger = work_after_checkpoint(samples, ckpt)
    return {"kind": kind, "steps": steps, "gpu_seconds": round(ledger + prov.seconds, 3),
            "provisional_seconds": round(prov.seconds, 3), "checkpoint_step": ckpt_step,
            "checkpoint_at": ckpt.get("at"), "last_step": last_step, "epoch": job.get("lease_epoch")}
