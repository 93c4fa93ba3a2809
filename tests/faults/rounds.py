"""One round of a fault test, shared by the fault matrix (tests/faults/test_fault_matrix.py) and the clustered
rehearsal (tests/faults/test_cluster_rehearsal.py): background jobs seen running, the fault injected, a probe job
submitted during it, the fault healed where it has an end, then every invariant waited for, with the times
measured from the fault (``probe_submit_s``, ``probe_done_s``, ``recovered_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from tests.faults.invariants import settle
from tests.support.faultstack import remove_root, stack_root
from tests.support.stackclient import StackClient
from tests.support.services import eventually

BACKGROUND_STEPS = 60  # x 0.05 s: long enough to be mid-run when the fault lands, short on 2 cores
Inject = Callable[[], Awaitable[Callable[[], Awaitable[None]] | None]]  # returns the heal, if the fault has one


async def running(stack: StackClient, job_ids: list[str], n: int) -> list[dict[str, Any]] | None:
    jobs = [await stack.job(j) for j in job_ids]
    running = [j for j in jobs if j and j["state"] == "running"]
    return running if len(running) >= n else None


async def round_of(stack: StackClient, matrix: list[dict[str, Any]], fault: str, inject: Inject, *,
                 background: int = 2, steps: int = BACKGROUND_STEPS, timeout: float = 120) -> dict[str, Any]:
    row: dict[str, Any] = {"fault": fault, "passed": False, "probe_submit_s": None, "probe_done_s": None,
                           "recovered_s": None}
    matrix.append(row)
    try:
        first = len(stack.accepted)
        jobs = [await stack.submit(stack.spec(f"{fault}-bg{i}", steps=steps)) for i in range(background)]
        await eventually(lambda: running(stack, jobs, min(background, 2)), 60, "background jobs running")
        t0 = time.monotonic()
        heal = await inject()
        probe_task = asyncio.create_task(stack.submit(stack.spec(f"{fault}-probe", steps=20), timeout=timeout))
        if heal is not None:
            await heal()
        probe = await probe_task
        row["probe_submit_s"] = next(s.answered_at for s in stack.accepted if s.job_id == probe) - t0
        await stack.wait_done(probe, timeout=timeout)
        row["probe_done_s"] = time.monotonic() - t0
        problems = []
        try:
            # Every job accepted in this round, including any the fault's injection submitted itself.
            await settle(stack, {s.job_id for s in stack.accepted[first:]}, timeout=timeout)
        except AssertionError as exc:
            problems.append(str(exc))
        crashed = stack.crashed()
        if crashed:
            problems.append(f"parts died on their own: {crashed}: {[stack.log_of(n, 800) for n in crashed]}")
        assert not problems, "\n".join(problems)
        row["recovered_s"] = time.monotonic() - t0
        row["passed"] = True
        return row
    except BaseException as exc:
        row["failure"] = f"{type(exc).__name__}: {str(exc)[:8000]}"
        raise


def write_report(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """The measured rows as JSON at ``path`` (for docs/reliability.md), and one line each on the terminal."""
    path.write_text(json.dumps(rows, indent=2))
    print(f"\n[{title}] ({path}):")
    for r in rows:
        figures = ", ".join(f"{k} {v:.1f}s" for k, v in r.items() if k.endswith("_s") and v is not None)
        print(f"  {r['fault']:<28} {'PASS' if r['passed'] else 'FAIL'}  {figures}  {r.get('failure') or ''}")


@contextlib.contextmanager
def stack_place(title: str) -> Iterator[Path]:
    """A directory for one stack, removed afterwards unless ``TETO_FAULTS_KEEP`` is set (then its path is said)."""
    root = stack_root()
    try:
        yield root
    finally:
        if os.environ.get("TETO_FAULTS_KEEP"):
            print(f"\n[{title}] stack kept at {root}")
        else:
            remove_root(root)
