"""What an interrupted job's label says: how its run really ended (issue 26 item 2).

A job is interrupted once a GPU-ceiling stop is pending and its run ends, whatever way it ended: running it again
would only overshoot further. But the way it ended is the job's story, and its label (``reason``, shown as "GPU
ceiling reached" for ``gpu_ceiling``) must tell it: a run that failed on its own before the stop reached it (a
``PermissionError`` on a checkpoint, say) failed, and spends an attempt as any failure does; a run whose executor
went silent was lost; only a run that stopped as asked (or by its executor's own clock) stopped at the ceiling."""

from __future__ import annotations

from libs.contracts.telemetry import RunOutcome

from .facts import Finished, LeaseExpired

# Labels of their own (the panel words them, job.json ``reason_<label>``), never a requeue's cause or an event's
# free text, which the same catalogue lookup would word the same way.
CEILING_STOP = "gpu_ceiling"  # a stop for the GPU ceiling; stopped as asked, or by the executor's own clock
LEASE_EXPIRED = "run_lost"  # the executor went silent for the whole lease
ABANDONED = "run_abandoned"  # the executor gave the run up (it lost contact, or was shut down)
HANDED_BACK = "run_never_started"  # the executor handed the grant back
TRAINING_ERROR = "run_failed"  # the process failed by itself


def interruption_reason(fact: Finished | LeaseExpired) -> str:
    """The label of a job interrupted at its ceiling, by the fact that ended its run. Pure."""
    if isinstance(fact, LeaseExpired):
        return LEASE_EXPIRED
    return {RunOutcome.FAILED: TRAINING_ERROR, RunOutcome.ABANDONED: ABANDONED,
            RunOutcome.HANDED_BACK: HANDED_BACK}.get(fact.outcome, CEILING_STOP)


def spends_attempt(fact: Finished | LeaseExpired) -> bool:
    """Whether the run's end spends one of the job's attempts, a ceiling stop pending or not (DESIGN.md section 3:
    only a training process that exits with failure does). Pure."""
    return isinstance(fact, Finished) and fact.outcome is RunOutcome.FAILED
