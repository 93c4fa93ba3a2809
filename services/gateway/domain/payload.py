"""How large a request body the gateway may accept so that every message it causes can travel on the bus. Pure.

A submit becomes a ``SubmitJob`` command, then the queue's ``submitted`` job event (the spec embedded, with the
owner and the name beside it) and one ``RunJob`` grant per worker (the spec again). Each is the spec plus an
envelope. The spec's free-form parts (argv, env) are encoded no larger than a client can send them (pydantic
writes UTF-8 unescaped and no whitespace), so the largest message is at most the body plus the largest
envelope-and-fixed-fields any spec can have: :func:`growth_bytes` measures that with the real contract classes
and the widest value of every bounded field, and :func:`body_limit` subtracts it, and the NATS headers a
publisher adds, from the server's max payload. Anything the gateway accepts can then be published.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache

from libs.contracts.agents import AcceptedCheckpoint, RunJob
from libs.contracts.bounds import INT32_MAX, MAX_SAFE_INT, SEED_MAX
from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import Envelope
from libs.contracts.jobs import (CommandWorkload, FinetuneParams, FinetuneWorkload, JobEvent, JobEventKind, JobSpec,
                                 JobState)

# NATS header block a publisher adds: "NATS/1.0", Nats-Msg-Id (an id of up to 128 characters), trace context.
HEADER_ALLOWANCE = 1024
_WIDE = "\U0001F600"  # one character, four bytes of UTF-8: the widest a bounded name can be per character
_TINY = 2.2250738585072014e-308  # a positive float whose shortest repr is among the longest
_LATE = datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


def widest_specs() -> list[JobSpec]:
    """Specs whose bounded fields are all at their widest rendering and whose free-form parts are empty."""
    fixed = dict(name=_WIDE * 200, workers=256, gpus_per_worker=64, gpu_ceiling_seconds=_TINY,
                 checkpoint_every_steps=10_000_000, max_attempts=100, estimated_step_seconds=_TINY,
                 ready_timeout_seconds=_TINY)
    params = FinetuneParams(steps=10_000_000, batch_size=4096, seq_len=4096, learning_rate=_TINY, seed=SEED_MAX,
                            step_delay_seconds=_TINY)
    return [JobSpec(workload=FinetuneWorkload(params=params), **fixed),
            JobSpec(workload=CommandWorkload(command=["x"]), **fixed)]


def messages_of_submit(spec: JobSpec, *, actor: str, job_id: str, command_id: str) -> list[Envelope]:
    """The messages one submit causes, as their owners build them (the queue's ``submitted`` event carries
    ``{"spec", "owner", "name"}``; see services/queue/domain/lifecycle.py)."""
    ident = "f" * 128
    detail = {"spec": spec.model_dump(mode="json"), "owner": actor, "name": spec.name}
    return [
        SubmitJob(command_id=command_id, actor=actor, job_id=job_id, spec=spec, id=ident, issued_at=_LATE, time=_LATE),
        JobEvent(job_id=job_id, seq=INT32_MAX, event=JobEventKind.SUBMITTED, state=JobState.QUEUED, detail=detail,
                 id=ident, time=_LATE),
        RunJob(job_id=job_id, epoch=INT32_MAX, executor_id="e" * 128, spec=spec, attempt=INT32_MAX,
               lease_seconds=_TINY, heartbeat_seconds=_TINY, rank=INT32_MAX, world_size=INT32_MAX,
               rendezvous=_WIDE * 300, ready_timeout_seconds=_TINY, id=ident, time=_LATE,
               resume_from=AcceptedCheckpoint(step=MAX_SAFE_INT, sha256="f" * 128, epoch=INT32_MAX)),
    ]


@cache
def growth_bytes() -> int:
    """The most bytes any message of a submit can carry beyond the free-form content of its body."""
    return max(len(m.encode()) for spec in widest_specs()
               for m in messages_of_submit(spec, actor=_WIDE * 200, job_id="j" * 128, command_id="c" * 128))


def body_limit(max_payload: int, configured: int) -> int:
    """The request body limit: the configured one, lowered so that every resulting message fits the bus."""
    return max(0, min(configured, max_payload - HEADER_ALLOWANCE - growth_bytes()))
