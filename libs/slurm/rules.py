"""Pure rules of Teto as a Slurm guest: pilot phases from Slurm job states, node states and whose drain it is,
the drain reason a failed check writes, the Slurm actions a node transition asks for, and the warning a job gets
when its GPU ceiling outlasts its pilot's allocation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

TETO = "teto:"  # every reason Teto writes on a Slurm node starts so: only those drains are Teto's to undo
REASON_MAX = 240


class PilotPhase(StrEnum):
    WAITING = "waiting"  # queued in Slurm, not started
    STARTING = "starting"  # allocated, its nodes being set up
    RUNNING = "running"  # the agent runs in its allocation
    ENDING = "ending"  # the allocation is being torn down
    ENDED = "ended"  # finished, cancelled, timed out, failed: no agent
    UNKNOWN = "unknown"  # Slurm no longer knows the job (older than MinJobAge)


JOB_PHASES: dict[str, PilotPhase] = {
    "PENDING": PilotPhase.WAITING, "REQUEUED": PilotPhase.WAITING, "REQUEUE_HOLD": PilotPhase.WAITING,
    "REQUEUE_FED": PilotPhase.WAITING, "RESV_DEL_HOLD": PilotPhase.WAITING, "SUSPENDED": PilotPhase.WAITING,
    "CONFIGURING": PilotPhase.STARTING, "RESIZING": PilotPhase.STARTING,
    "RUNNING": PilotPhase.RUNNING, "SIGNALING": PilotPhase.RUNNING, "STAGE_OUT": PilotPhase.ENDING,
    "COMPLETING": PilotPhase.ENDING, "STOPPED": PilotPhase.ENDING,
    "COMPLETED": PilotPhase.ENDED, "CANCELLED": PilotPhase.ENDED, "TIMEOUT": PilotPhase.ENDED,
    "FAILED": PilotPhase.ENDED, "NODE_FAIL": PilotPhase.ENDED, "PREEMPTED": PilotPhase.ENDED,
    "OUT_OF_MEMORY": PilotPhase.ENDED, "BOOT_FAIL": PilotPhase.ENDED, "DEADLINE": PilotPhase.ENDED,
    "REVOKED": PilotPhase.ENDED, "SPECIAL_EXIT": PilotPhase.ENDED,
}


def pilot_phase(job_state: str | None) -> PilotPhase:
    """A pilot's phase from its Slurm job state (``RUNNING``, ``CANCELLED by 0``, ``PENDING``...)."""
    if not job_state:
        return PilotPhase.UNKNOWN
    return JOB_PHASES.get(job_state.split()[0].upper(), PilotPhase.UNKNOWN)


def node_flags(state: str) -> set[str]:
    """``IDLE+DRAIN`` -> {"IDLE", "DRAIN"}; ``drained*`` (sinfo's short forms) are not parsed here."""
    return {part for part in state.upper().replace("*", "").split("+") if part}


def drained(state: str) -> bool:
    """DRAIN flag set (Slurm shows DRAINING while jobs still run, DRAINED once idle: both are drains)."""
    flags = node_flags(state)
    return bool({"DRAIN", "DRAINED", "DRAINING"} & flags)


def reboot_pending(state: str) -> bool:
    """A reboot asked for and not yet carried out (Slurm waits for the node to be idle)."""
    return "REBOOT_REQUESTED" in node_flags(state)


def teto_reason(reason: str | None) -> bool:
    return bool(reason) and reason.strip().startswith(TETO)


def may_resume(state: str, reason: str | None) -> bool:
    """Teto resumes only a node it drained itself: an administrator's drain (any other reason) stays."""
    return drained(state) and teto_reason(reason)


def _clean(text: str) -> str:
    return " ".join(str(text).split())


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


def drain_reason(failed: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The Slurm reason for a node that failed its checks, from each failed test's verdict (its reason and its
    comparisons): ``teto: membw copy_gbps 1.2 vs median 10.4`` for a figure below the bar, ``teto: matmul
    failed: <why>`` for a test the node failed by itself."""
    parts = []
    for test, verdict in failed:
        slow = [c for c in verdict.get("comparisons") or () if not c.get("ok", True)]
        if slow:
            for c in slow:
                ref = "baseline" if c.get("source") == "baseline" else "median"
                parts.append(f"{test} {c.get('metric')} {_fmt(c.get('value'))} vs {ref} {_fmt(c.get('reference'))}")
        else:
            why = _clean(verdict.get("reason") or "failed")
            parts.append(f"{test} failed: {why}")
    text = f"{TETO} " + ("; ".join(parts) if parts else "failed its health checks")
    return text[:REASON_MAX]


def operator_drain_reason(reason: str | None) -> str:
    return f"{TETO} drained: {_clean(reason or 'drained by an operator')}"[:REASON_MAX]


def ceiling_warning(remaining_gpu_seconds: float | None, devices: int, seconds_left: float | None,
                    lead_seconds: float) -> str | None:
    """A run whose remaining GPU ceiling lasts longer than its pilot's allocation (up to the stop signal) will be
    checkpointed and stopped before it is spent, and resume on another pilot: said on the job when it starts."""
    if remaining_gpu_seconds is None or seconds_left is None:
        return None
    usable = max(0.0, seconds_left - lead_seconds)
    wall = remaining_gpu_seconds / max(1, devices)
    if wall <= usable:
        return None
    return (f"the job's remaining GPU ceiling ({remaining_gpu_seconds:.0f} GPU-seconds on {max(1, devices)} "
            f"device(s): {wall:.0f}s) outlasts this pilot's Slurm allocation ({usable:.0f}s until its stop signal, "
            f"{lead_seconds:.0f}s before the time limit): it will be checkpointed and stopped then and resume on "
            "another pilot")
