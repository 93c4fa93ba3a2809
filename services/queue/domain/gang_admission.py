"""Gang admission, as pure arithmetic and rules: which gangs may be admitted in a placement pass, how long a
gang may take to form, how long it waits after a timeout, and where its workers meet (the rendezvous port).

A gang is a job with ``workers > 1``. Reserving its nodes all at once is the placement's all-or-nothing rule
(``tenancy/placement.py``); this module adds what only gangs need. Nothing here reads a clock or a random
source: ``now`` and the jitter draw are arguments, so every sequence of back-offs is exact in tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from libs.contracts.jobs import JobSpec
from libs.contracts.policies import GangPolicy

JITTER_FRACTION = 0.1  # a timed-out gang waits up to 10% longer than the formula, so gangs spread out


@dataclass(frozen=True)
class QueuedJob:
    """A queued job as gang admission sees it: its arrival and its shape."""

    job_id: str
    created_at: datetime
    workers: int = 1
    gpus_per_worker: int = 0


def is_gang(spec: JobSpec) -> bool:
    return spec.workers > 1


# -- ready timeout ----------------------------------------------------------------------------------------

def ready_timeout(spec: JobSpec, policy: GangPolicy) -> float:
    """The job's own timeout when it asked for one (never longer than the policy's), else the policy's.

    The policy may have been shortened since the job was accepted; the shorter of the two always wins."""
    if spec.ready_timeout_seconds is None:
        return policy.ready_timeout_seconds
    return min(spec.ready_timeout_seconds, policy.ready_timeout_seconds)


def spec_refusal(spec: JobSpec, policy: GangPolicy) -> tuple[str, dict[str, float]] | None:
    """Why a job spec is refused under the policy (reason and numbers), or None when it is acceptable."""
    asked = spec.ready_timeout_seconds
    if asked is not None and asked > policy.ready_timeout_seconds:
        return (f"ready_timeout_seconds {asked:g} is longer than the gang policy's {policy.ready_timeout_seconds:g}"
                "; a job may only ask for a shorter one",
                {"ready_timeout_seconds": asked, "policy_ready_timeout_seconds": policy.ready_timeout_seconds})
    return None


def ready_deadline(granted_at: datetime, spec: JobSpec, policy: GangPolicy) -> datetime:
    return granted_at + timedelta(seconds=ready_timeout(spec, policy))


def timed_out(deadline: datetime | None, now: datetime) -> bool:
    """At the deadline itself the gang has had its whole timeout: it is over."""
    return deadline is not None and now >= deadline


# -- back-off ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Backoff:
    """The n-th back-off of a job: how long it waits, and the numbers behind it (shown on its event)."""

    n: int  # 1 for the first back-off
    base_delay_seconds: float  # base x 2^(n-1), capped at max
    delay_seconds: float  # with jitter
    jitter: float  # the draw in [0, 1) that made the jitter

    def requeue_at(self, now: datetime) -> datetime:
        return now + timedelta(seconds=self.delay_seconds)


def capped_delay(policy: GangPolicy, n: int) -> float:
    """``base x 2^(n-1)`` seconds, capped at ``max``; n counts back-offs from 1."""
    if n < 1:
        raise ValueError(f"back-offs are counted from 1, not {n}")
    # Compare exponents rather than computing 2^(n-1) for a huge n (an unlimited policy can reach any n).
    if n - 1 >= 64:
        return policy.backoff_max_seconds
    return min(policy.backoff_base_seconds * 2 ** (n - 1), policy.backoff_max_seconds)


def next_backoff(policy: GangPolicy, backoffs_so_far: int, draw: float) -> Backoff | None:
    """The back-off after a ready timeout, or None when the job has used up ``backoff_limit`` (it then fails
    with reason ``gang_timeout``). ``draw`` is a uniform number in [0, 1) from the caller's random source."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"a jitter draw is in [0, 1), not {draw}")
    n = backoffs_so_far + 1
    if policy.backoff_limit is not None and n > policy.backoff_limit:
        return None
    base = capped_delay(policy, n)
    return Backoff(n=n, base_delay_seconds=base, delay_seconds=base * (1.0 + JITTER_FRACTION * draw), jitter=draw)


def backoff_due(next_admission_at: datetime | None, now: datetime) -> bool:
    return next_admission_at is not None and now >= next_admission_at


# -- which gangs a placement pass may admit ---------------------------------------------------------------

def admissible(queued: Sequence[QueuedJob], *, admitting_now: int, sequential: bool) -> list[QueuedJob]:
    """The queued jobs a placement pass may consider.

    Jobs of one worker never form a gang and are always considered. With ``sequential`` admission at most one
    gang is admitting at any time: while one is, no other gang is considered; otherwise only the first gang in
    arrival order is (placement may still pass it over if it does not fit, and then no gang is admitted in
    this pass: a later, smaller gang must not overtake it and take the nodes it waits for).
    """
    ordered = sorted(queued, key=lambda j: (j.created_at, j.job_id))
    if not sequential:
        return ordered
    out: list[QueuedJob] = []
    gang_slot = admitting_now == 0
    for job in ordered:
        if job.workers <= 1:
            out.append(job)
        elif gang_slot:
            out.append(job)
            gang_slot = False
    return out


# -- rendezvous -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PortRange:
    first: int
    count: int

    def __post_init__(self) -> None:
        if not (1024 <= self.first and self.count >= 1 and self.first + self.count - 1 <= 65535):
            raise ValueError(f"port range {self.first}+{self.count} is outside 1024-65535")


def rendezvous_port(job_id: str, epoch: int, used: Collection[int], ports: PortRange) -> int | None:
    """A port for rank 0's store, stable for (job, epoch) and different from every port a gang now forming or
    running holds; None when the range is full.

    Each admission is a new epoch and so, usually, a new port: a process of the previous attempt still
    stopping cannot collide with the next one."""
    digest = hashlib.sha256(f"{job_id}:{epoch}".encode()).digest()
    start = int.from_bytes(digest[:4], "big") % ports.count
    for i in range(ports.count):
        port = ports.first + (start + i) % ports.count
        if port not in used:
            return port
    return None


def rendezvous(address: str | None, port: int) -> str:
    host = address or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
