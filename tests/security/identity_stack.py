"""A real Teto for the identity tests: queue and audit services, two gateway replicas on one database (their
``serve()`` as tasks, on real NATS and PostgreSQL), and a real OpenID Provider (tests/support/oidc.py) that
trusts both replicas' callbacks. The tokens file is written before the gateways start, as a data directory made
before tokens moved into the database would hold it.
"""

from __future__ import annotations

import contextlib
import json
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
from services.budget.settings import BudgetSettings
from services.gateway.settings import GatewaySettings
from services.queue.settings import QueueSettings
from tests.support.fleet import stop_processes
from tests.support.oidc import Provider, oidc_provider
from tests.support.services import eventually, running


@dataclass
class IdentityStack:
    urls: list[str]  # the two gateway replicas
    provider: Provider
    db: asyncpg.Connection
    tokens_file: Path
    root: Path
    env: Any = None
    executors: list[subprocess.Popen] = field(default_factory=list)

    def start_executor(self, executor_id: str) -> subprocess.Popen:
        """A real executor (``teto executor``) that runs jobs on this machine's CPU."""
        env = self.env.env_vars(TETO_PROGRESS_INTERVAL_SECONDS="0.5", TETO_STOP_GRACE_SECONDS="2",
                                TETO_NODE_ID=f"node-{executor_id}",
                                TETO_WORK_DIR=str(self.root / "executors" / executor_id))
        log = open(self.root / f"{executor_id}.log", "ab")  # noqa: SIM115 - handed to the process
        proc = subprocess.Popen([sys.executable, "-m", "teto.cli", "executor", "--executor-id", executor_id,
                                 "--group", "identity"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.executors.append(proc)
        return proc

    async def audit_rows(self, kind: str) -> list[dict[str, Any]]:
        rows = await self.db.fetch("SELECT *, payload::text AS payload_text FROM audit.log_public WHERE kind = $1"
                                   " ORDER BY seq", kind)
        return [dict(r) for r in rows]

    async def audited(self, kind: str, *needles: str, outcome: str | None = None,
                      actor: str | None = None) -> list[dict[str, Any]]:
        """Waits until the audit log holds a row of ``kind`` containing each needle (in its payload or reason)."""
        async def found() -> list[dict[str, Any]]:
            rows = await self.audit_rows(kind)
            return [r for r in rows if (outcome is None or r["outcome"] == outcome)
                    and (actor is None or r["actor"] == actor)
                    and all(n in (r["payload_text"] or "") + (r.get("reason") or "") for n in needles)]
        return await eventually(found, 30, f"an audit row {kind} with {needles}")


@contextlib.asynccontextmanager
async def identity_stack(env: Any, root: Path, *, old_tokens: list[dict[str, Any]] | None = None,
                         budget: bool = False, **gateway: Any) -> AsyncIterator[IdentityStack]:
    """``budget``: the budget service too (jobs interrupted at their ceiling)."""
    from services.audit.app import serve as audit_serve
    from services.budget.app import serve as budget_serve
    from services.gateway.app import serve as gateway_serve
    from services.queue.app import serve as queue_serve

    root.mkdir(parents=True, exist_ok=True)
    tokens_file = root / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": old_tokens or []}, indent=2))
    ports = [free_port_block(1), free_port_block(1)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with oidc_provider(root / "oidc", gateway_urls=urls) as provider:
        providers = json.dumps([provider.config()])
        qs = env.settings(QueueSettings, schedule_interval_seconds=0.2, scan_interval_seconds=0.5,
                          stop_grace_seconds=2.0, require_checked_nodes=False)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(running(queue_serve, qs))
            await stack.enter_async_context(running(audit_serve, env.settings(AuditSettings)))
            if budget:
                await stack.enter_async_context(running(budget_serve, env.settings(BudgetSettings)))
            for port in ports:
                gs = env.settings(GatewaySettings, http_port=port, tokens_file=tokens_file, oidc_providers=providers,
                                  **gateway)
                await stack.enter_async_context(running(gateway_serve, gs))
            db = await asyncpg.connect(env.database_url)
            stack.push_async_callback(db.close)
            s = IdentityStack(urls=urls, provider=provider, db=db, tokens_file=tokens_file, root=root, env=env)
            try:
                yield s
            finally:
                stop_processes(s.executors)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def get(url: str, path: str, secret: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.get(path, headers=bearer(secret))
