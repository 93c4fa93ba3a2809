"""How the gateway shows a job's output (pure): which chunks belong to the job, each chunk as the API shows it,
the notices that make a gap or a truncation visible, the tail a failed job's view carries, and when a follow ends.

Trust: an executor may publish output under its own id for any job id (the bus cannot know its grants), so a
chunk is shown only when the queue granted that executor that attempt and rank (the job's ``leased`` events name
the workers of each attempt, by rank), and only when the body names the same executor as the subject's last
token. A chunk from anyone else is not the job's output and is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from libs.contracts.logs import TAIL_LINES, LogChunk

# A follow ends once the job is here (and what its runs shipped has been read): nothing more runs until a
# person requeues it (interrupted) or never (terminal).
FOLLOW_END_STATES = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
PEER_LOST = 76  # a gang worker whose peer died: not the rank that tells why (DESIGN 11)

Grants = Mapping[tuple[int, int], str]


def grants(events: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], str]:
    """(attempt, rank) -> executor id, from the job's ``leased`` events (detail: attempt, workers by rank)."""
    out: dict[tuple[int, int], str] = {}
    for event in events:
        detail = event.get("detail")
        if event.get("event") != "leased" or not isinstance(detail, Mapping):
            continue
        attempt, workers = detail.get("attempt"), detail.get("workers")
        if isinstance(attempt, int) and isinstance(workers, list):
            out.update({(attempt, rank): ex for rank, ex in enumerate(workers) if isinstance(ex, str)})
    return out


def belongs(chunk: LogChunk, subject: str, job_id: str, granted: Grants) -> bool:
    """Whether a chunk read from the job's subjects is the job's output (see the module's note)."""
    sender = subject.rsplit(".", 1)[-1]
    return (chunk.job_id == job_id and chunk.executor_id == sender
            and granted.get((chunk.attempt, chunk.rank)) == sender)


def notice(chunk: LogChunk) -> str | None:
    """The marker a person reads where output is missing: dropped before this chunk, or cut by the run's limit."""
    parts = []
    if chunk.dropped_bytes:
        why = "the run's log limit was reached" if chunk.truncated and not chunk.text else \
            "the executor could not ship it in time"
        parts.append(f"[teto: {chunk.dropped_bytes} bytes of {chunk.stream.value} not shipped: {why}]")
    elif chunk.truncated and not chunk.final:
        parts.append(f"[teto: output truncated here: the run's log limit was reached; "
                     f"the rest of {chunk.stream.value} is not shipped]")
    if chunk.final:
        status = "unknown" if chunk.exit_code is None else (
            f"killed by signal {-chunk.exit_code}" if chunk.exit_code < 0 else f"exit status {chunk.exit_code}")
        parts.append(f"[teto: attempt {chunk.attempt} rank {chunk.rank} ended: {status}]")
    return " ".join(parts) or None


def chunk_view(seq: int, chunk: LogChunk) -> dict[str, Any]:
    """A chunk as GET /v1/jobs/{id}/logs shows it; ``seq`` (the stream sequence) is the paging cursor."""
    return {"seq": seq, "time": chunk.time.isoformat(), "attempt": chunk.attempt, "rank": chunk.rank,
            "stream": chunk.stream.value, "executor_id": chunk.executor_id, "epoch": chunk.epoch,
            "offset": chunk.offset, "text": chunk.text, "dropped_bytes": chunk.dropped_bytes,
            "truncated": chunk.truncated, "final": chunk.final, "exit_code": chunk.exit_code,
            "notice": notice(chunk)}


def wanted(chunk: LogChunk, *, stream: str | None) -> bool:
    """The stream filter (attempt and rank are in the subject; the stream is in the body)."""
    return stream is None or chunk.stream.value == stream or (chunk.final and not chunk.text)


def _failing(chunk: LogChunk) -> bool:
    return chunk.final and chunk.exit_code not in (None, 0, PEER_LOST)


def tail_view(last: Iterable[LogChunk]) -> dict[str, Any] | None:
    """The ``log_tail`` of a failed job from the last chunk of each rank of its last attempt: the rank whose
    process failed (not one that only lost its peer), else the first; its final lines, or the last lines of
    its last chunk when the final one never arrived."""
    chunks = sorted(last, key=lambda c: c.rank)
    if not chunks:
        return None
    chosen = next((c for c in chunks if _failing(c)), chunks[0])
    if chosen.final:
        lines = [{"stream": line.stream.value, "text": line.text} for line in chosen.tail]
    else:
        lines = [{"stream": chosen.stream.value, "text": t}
                 for t in chosen.text.rstrip("\n").split("\n")[-TAIL_LINES:] if chosen.text]
    return {"attempt": chosen.attempt, "rank": chosen.rank, "exit_code": chosen.exit_code if chosen.final else None,
            "complete": chosen.final, "lines": lines}
