"""What a fault test does with a running stack, whichever way it was started: HTTP through any gateway replica,
submits retried under one idempotency key until accepted, job polling, read-only SQL, the bus as its admin,
and the fault workload's evidence. Used by tests/support/faultstack.py (the fault matrix's own stack) and
tests/support/clusterstack.py (``teto up --nats-cluster 3 --replicas 2``).

A class using it provides ``gateway_urls``, ``token``, ``database_url``, ``nats_url``, ``runs_dir``, ``accepted``
(a list), ``executor_ids()`` (the agents running now), ``crashed()`` (parts that died without the test killing
them) and ``log_of(name)``, and may override ``nats_credentials`` (the bus's admin credentials file).
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from nats.aio.client import Client

from libs.runtime import bus
from tests.support.fleet import WORKLOAD, read_runs
from tests.support.services import eventually

TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclass
class Submitted:
    """A submit the gateway accepted (201 or 202): from then on it must never be lost."""

    job_id: str
    answered_at: float  # time.monotonic()
    status: int


class StackClient:
    gateway_urls: list[str]
    token: str
    database_url: str
    nats_url: str
    runs_dir: Path
    accepted: list[Submitted]

    # -- the bus, as an inspector (a fresh connection each time: a server may have restarted) ----------------

    def nats_credentials(self) -> Path | None:
        return None

    async def bus(self) -> Client:
        return await bus.connect(self.nats_url, "teto-test-inspector", credentials_file=self.nats_credentials(),
                                 attempts=10)

    # -- PostgreSQL, read-only inspection ----------------------------------------------------------------

    async def sql(self, query: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.database_url, timeout=5)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    # -- HTTP through whichever gateway replica answers (a load balancer's job) ------------------------------

    async def http(self, method: str, path: str, **kw: Any) -> httpx.Response:
        last: Exception | None = None
        headers = {"Authorization": f"Bearer {self.token}", **kw.pop("headers", {})}
        for url in self.gateway_urls:
            try:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    return await client.request(method, path, headers=headers, **kw)
            except httpx.TransportError as exc:  # that replica is down: try the next
                last = exc
        raise ConnectionError(f"no gateway replica answered {method} {path}: {last}")

    def spec(self, name: str, *, steps: int = 30, step_seconds: float = 0.05, every: int = 10,
             max_attempts: int = 3, **env: str) -> dict[str, Any]:
        wl_env = {"RUNS_DIR": str(self.runs_dir), "STEPS": str(steps), "STEP_SECONDS": str(step_seconds), **env}
        return {"name": name, "workload": {"kind": "command", "command": [sys.executable, WORKLOAD], "env": wl_env},
                "checkpoint_every_steps": every, "max_attempts": max_attempts}

    async def submit(self, spec: dict[str, Any], *, timeout: float = 60) -> str:
        """Submit with an idempotency key, retrying through outages until a replica accepts (201/202)."""
        key = uuid.uuid4().hex

        async def attempt() -> Submitted | None:
            try:
                r = await self.http("POST", "/v1/jobs", json=spec, headers={"Idempotency-Key": key})
            except ConnectionError:
                return None
            if r.status_code in (201, 202):
                body = r.json()  # 201: the job; 202: pending, naming the (actor-scoped) job id
                return Submitted(body.get("id") or body["job_id"], time.monotonic(), r.status_code)
            assert r.status_code >= 500, f"submit refused: {r.status_code} {r.text}"
            return None  # the gateway could not reach its dependencies: retry the same key
        sub = await eventually(attempt, timeout, f"submit {spec.get('name')} to be accepted", every=0.5)
        self.accepted.append(sub)
        return sub.job_id

    async def job(self, job_id: str) -> dict[str, Any] | None:
        try:
            r = await self.http("GET", f"/v1/jobs/{job_id}")
        except ConnectionError:
            return None
        return r.json() if r.status_code == 200 else None

    async def events(self, job_id: str) -> list[dict[str, Any]]:
        r = await self.http("GET", f"/v1/jobs/{job_id}/events")
        assert r.status_code == 200, r.text
        return r.json()

    async def wait_job(self, job_id: str, check, timeout: float, what: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            job = await self.job(job_id)
            return job if job is not None and check(job) else None
        return await eventually(probe, timeout, f"job {job_id}: {what}", every=0.25)

    async def wait_done(self, job_id: str, timeout: float = 90) -> dict[str, Any]:
        return await self.wait_job(job_id, lambda j: j["state"] in TERMINAL, timeout, "a terminal state")

    def runs(self, job_id: str) -> list[dict[str, Any]]:
        return read_runs(self.runs_dir, job_id)
