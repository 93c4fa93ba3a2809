"""The queue service's memory at placement scale: the real process (``python -m teto.cli service queue``, as
``teto up`` and deploy/compose.yml start it) against the benchmark's database and NATS, left to place the
backlog by itself (its placement loop, woken every schedule interval). Its VmRSS is read from /proc once the
number of placed jobs has stopped growing (every free executor it may fill is filled), with VmHWM (the peak)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._placement_data import Sizes
from services.queue.settings import QueueSettings

SETTLE_SECONDS = 3.0
TIMEOUT_SECONDS = 120.0


def status_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


async def _placed(pool) -> int:  # noqa: ANN001
    return await pool.fetchval("SELECT count(*) FROM queue.jobs WHERE id LIKE 'q%' AND state <> 'queued'")


async def service_rss(settings: QueueSettings, pg_url: str, pool, sizes: Sizes) -> dict:  # noqa: ANN001, ARG001
    env = {**os.environ, "TETO_NATS_URL": settings.nats_url, "TETO_DATABASE_URL": pg_url,
           "TETO_SUBJECT_PREFIX": settings.subject_prefix, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="teto-bench-queue-") as tmp:
        env["TETO_DATA_DIR"] = tmp
        log = Path(tmp) / "queue.log"
        with open(log, "w") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "teto.cli", "service", "queue"], env=env,
                                    stdout=sink, stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            last, since = -1, time.monotonic()
            while time.monotonic() - t0 < TIMEOUT_SECONDS:
                if proc.poll() is not None:
                    raise RuntimeError(f"the queue service exited {proc.returncode}: {log.read_text()[-2000:]}")
                placed = await _placed(pool)
                if placed != last:
                    last, since = placed, time.monotonic()
                elif placed > 0 and time.monotonic() - since >= SETTLE_SECONDS:
                    break
                await asyncio.sleep(0.25)
            else:
                raise RuntimeError(f"the queue service placed {last} jobs in {TIMEOUT_SECONDS:.0f} s, still growing")
            kb = status_kb(proc.pid)
            seconds = since - t0
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        text = log.read_text()
    return {"rss_mb": round(kb["VmRSS"] / 1024, 1), "hwm_mb": round(kb["VmHWM"] / 1024, 1), "placed": last,
            "passes": text.count("fair-share order of this pass"), "seconds": seconds, "load": os.getloadavg()[0]}
