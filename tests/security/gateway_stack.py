"""A real Teto for the gateway's security tests: queue, health, audit and gateway services in this process
(their ``serve()`` as tasks, on real NATS and PostgreSQL), executors as real subprocesses, and one API token per
person of the attacks (``alice`` and ``bob`` submitters, ``vic`` viewer, ``olga`` operator, ``aude`` auditor).
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from libs.runtime.ports import free_port_block
from services.audit.settings import AuditSettings
from services.gateway.auth import create_token
from services.gateway.settings import GatewaySettings
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings
from tests.support.fleet import stop_processes
from tests.support.services import eventually, running

PEOPLE = {"alice": "submitter", "bob": "submitter", "vic": "viewer", "olga": "operator", "aude": "auditor"}


@dataclass
class Stack:
    env: Any  # tests.conftest.TestEnv
    root: Path
    url: str
    tokens: dict[str, str]
    db: asyncpg.Connection
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)
    executors: dict[str, subprocess.Popen] = field(default_factory=dict)

    def as_(self, person: str) -> httpx.AsyncClient:
        return self.clients[person]

    def start_executor(self, executor_id: str, **extra: str) -> subprocess.Popen:
        env = self.env.env_vars(TETO_PROGRESS_INTERVAL_SECONDS="0.5", TETO_STOP_GRACE_SECONDS="2",
                                TETO_NODE_ID=f"node-{executor_id}",
                                TETO_WORK_DIR=str(self.root / "executors" / executor_id), **extra)
        log = open(self.root / f"{executor_id}.log", "ab")  # noqa: SIM115 - handed to the process
        proc = subprocess.Popen([sys.executable, "-m", "teto.cli", "executor", "--executor-id", executor_id,
                                 "--group", "security"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.executors[executor_id] = proc
        return proc

    async def wait_executors(self, *ids: str, timeout: float = 90) -> None:
        async def seen() -> bool:
            rows = await self.db.fetch("SELECT executor_id FROM queue.executors WHERE accepting"
                                       " AND last_seen > now() - interval '3 seconds'")
            return set(ids) <= {r["executor_id"] for r in rows}
        await eventually(seen, timeout, f"executors {ids} to heartbeat")

    async def audit_rows(self, **where: str) -> list[dict[str, Any]]:
        rows = await self.db.fetch("SELECT *, payload::text AS payload_text FROM audit.log_public ORDER BY seq")
        return [dict(r) for r in rows if all(r[k] == v for k, v in where.items())]


@contextlib.asynccontextmanager
async def gateway_stack(env: Any, root: Path, *, audit: bool = True, health: bool = False,
                        ca_file: Path | None = None, **gateway: Any) -> AsyncIterator[Stack]:
    """The services, with ``gateway`` overriding the gateway's settings (secrets_key, command_allow, ...)."""
    from services.audit.app import serve as audit_serve
    from services.gateway.app import serve as gateway_serve
    from services.health.app import serve as health_serve
    from services.queue.app import serve as queue_serve

    root.mkdir(parents=True, exist_ok=True)
    tokens_file = root / "tokens.json"
    tokens = {person: create_token(tokens_file, person, role) for person, role in PEOPLE.items()}
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.2, scan_interval_seconds=0.5,
                      stop_grace_seconds=2.0, require_checked_nodes=False)
    gs = env.settings(GatewaySettings, http_port=free_port_block(1), tokens_file=tokens_file, **gateway)
    scheme = "https" if gs.tls_cert_file else "http"
    url = f"{scheme}://127.0.0.1:{gs.http_port}"
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running(queue_serve, qs))
        if audit:
            await stack.enter_async_context(running(audit_serve, env.settings(AuditSettings)))
        if health:
            hs = env.settings(HealthSettings, evaluate_interval_seconds=0.25, join_batch_seconds=3600)
            await stack.enter_async_context(running(health_serve, hs))
        await stack.enter_async_context(running(gateway_serve, gs))
        db = await asyncpg.connect(env.database_url)
        stack.push_async_callback(db.close)
        s = Stack(env=env, root=root, url=url, tokens=tokens, db=db)
        for person, secret in tokens.items():
            s.clients[person] = await stack.enter_async_context(httpx.AsyncClient(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {secret}"},
                verify=ssl.create_default_context(cafile=str(ca_file)) if ca_file else True))
        try:
            yield s
        finally:
            stop_processes(s.executors.values())
