"""Why the queued jobs beyond a placement pass wait.

A pass considers at most ``max_jobs_per_pass`` queued jobs (``candidates``: by share deficit), and only those
get a reason from admission (``admission.plan``). The others were left with none (issue 26: 91 of 291 queued
jobs said nothing), yet their reason is plain: every job the pass considered comes first, and so do the ones
before them in the same order. So each one is ``behind`` as many jobs as precede it in the candidates' order
(the order later passes will see them in). Pure: ids in order and what each one's view says now, waits out.

Reading the whole order and rewriting positions costs a statement over every queued job, and a draining queue
moves every position each pass (every 0.5 s by default): so it is done on a whole pass at most once per
``waiting_refresh_seconds`` (``beyond_due``), and a job's reason is written again only where its position moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .placement_types import Wait, WaitCode


def beyond_due(since_last: float | None, refresh_seconds: float) -> bool:
    """Whether a whole pass brings the reasons beyond it up to date: the first time (``since_last`` None), then
    once ``refresh_seconds`` have passed since the last time (0: every whole pass)."""
    return since_last is None or since_last >= refresh_seconds


def beyond_pass(order: Sequence[str], considered: Sequence[str],
                stored_ahead: Mapping[str, int | None] | None = None) -> list[Wait]:
    """A ``behind`` wait for each queued job of ``order`` (every queued job in the candidates' order, up to
    where it was read) that is not among the pass's ``considered`` ones, ``ahead`` being the number of jobs
    before it in that order. ``stored_ahead``: the ``ahead`` each job's stored reason already says (None or
    missing: none stored, or another reason); a job whose reason would not change is left out, so a long queue
    costs a write only where its position moved."""
    seen = set(considered)
    stored = stored_ahead or {}
    waits: list[Wait] = []
    for ahead, job_id in enumerate(order):
        if job_id in seen:
            continue
        if job_id in stored and stored[job_id] == ahead:
            continue
        waits.append(Wait(job_id, WaitCode.BEHIND,
                          f"behind {ahead} jobs: beyond the {len(seen)} queued jobs this placement pass "
                          "considered, in fair-share order",
                          {"ahead": ahead, "considered": len(seen)}))
    return waits
