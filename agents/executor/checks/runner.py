"""Runs the check suite in a child process and streams its per-test records to the agent.

The child gets the spec on stdin and prints JSON lines (see ``__main__``); each becomes a callback here. A
child that overruns ``timeout`` is killed and every test it had not finished is reported failed with that
reason, so a hung collective cannot leave a node checking forever. A record whose figures could not be sent
(inf, nan) becomes a failure with the reason (``suite.sendable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from .spec import Spec
from .suite import sendable

log = logging.getLogger(__name__)
Record = dict[str, Any]


async def run_suite(spec: Spec, on_record: Callable[[Record], Awaitable[None]], *, timeout: float,
                    env: dict[str, str] | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents.executor.checks", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})},
        start_new_session=True)
    assert proc.stdin and proc.stdout and proc.stderr
    proc.stdin.write(json.dumps(asdict(spec)).encode())
    proc.stdin.close()
    done: set[str] = set()
    stderr = asyncio.create_task(proc.stderr.read())

    async def pump() -> None:
        while line := await proc.stdout.readline():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("status") != "running":
                done.add(record["test"])
            await on_record(sendable(record))

    try:
        await asyncio.wait_for(pump(), timeout)
        rc = await proc.wait()
        why = f"the check process exited with {rc}" if rc else None
    except asyncio.TimeoutError:
        why = f"the check process overran {timeout:g}s and was killed"
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    tail = (await stderr).decode("utf-8", "replace")[-1500:]
    for test in spec.tests:
        if test not in done:
            await on_record({"test": test, "status": "failed", "figures": {}, "detail": {"stderr": tail},
                             "error": why or "the check process ended without a result"})
