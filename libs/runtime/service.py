"""What every service does at start and stop, in one place: connect to PostgreSQL and NATS, apply its
migrations, declare the streams, run its singleton loops, and refuse malformed messages visibly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg
from faststream.nats.message import NatsMessage
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from libs.contracts.envelope import ContractError, Envelope, RejectedMessage
from libs.contracts.subjects import Subjects

from . import bus, db
from .clock import Clock
from .settings import CommonSettings
from .singleton import SingletonLoop

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Envelope)


@dataclass
class Runtime:
    name: str
    settings: CommonSettings
    pool: asyncpg.Pool
    nc: Client
    js: JetStreamContext
    clock: Clock = field(default_factory=Clock)
    tasks: list[asyncio.Task] = field(default_factory=list)
    rejected: int = 0

    @property
    def subjects(self) -> Subjects:
        return self.settings.subjects

    @classmethod
    async def open(cls, name: str, settings: CommonSettings, *, schema: str | None, package: str | None,
                   pool_size: int = 10) -> Runtime:
        pool = await db.create_pool(settings.database_url, max_size=pool_size)
        if schema and package:
            await db.migrate(pool, schema, package)
        nc = await bus.connect(settings.nats_url, f"teto-{name}")
        js = nc.jetstream(timeout=15.0)
        await bus.ensure_streams(js, settings.subjects)
        return cls(name=name, settings=settings, pool=pool, nc=nc, js=js)

    def singleton(self, lock_name: str, body: Callable[[], Awaitable[None]], retry_seconds: float = 1.0) -> None:
        loop = SingletonLoop(self.settings.database_url, f"{self.settings.subject_prefix}:{lock_name}", body,
                             retry_seconds=retry_seconds)
        self.tasks.append(asyncio.create_task(loop.run(), name=lock_name))

    def background(self, coro: Awaitable[None], name: str) -> None:
        self.tasks.append(asyncio.create_task(coro, name=name))

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):
            await self.nc.drain()
        with contextlib.suppress(Exception):
            await self.pool.close()

    async def decode(self, model: type[M], raw: NatsMessage | bytes, subject: str = "") -> M | None:
        """Decode a message; a malformed or hostile one is terminated (never redelivered), logged with the
        reason, and published on ``teto.rejected.<service>`` where the audit log and operators see it."""
        body = raw.body if isinstance(raw, NatsMessage) else raw
        subject = subject or (raw.raw_message.subject if isinstance(raw, NatsMessage) else "")
        try:
            return model.decode(body)
        except ContractError as exc:
            await self.reject(subject, body, exc.reason, raw if isinstance(raw, NatsMessage) else None)
            return None

    async def decode_batch(self, model: type[M], msgs: list[Msg]) -> list[M]:
        """Decode a batch from a BatchConsumer; malformed messages are refused visibly and terminated."""
        good = []
        for m in msgs:
            decoded = await self.decode(model, m.data, m.subject)
            if decoded is None:
                await m.term()
            else:
                good.append(decoded)
        return good

    async def reject(self, subject: str, body: bytes, reason: str, raw: NatsMessage | None = None) -> None:
        self.rejected += 1
        log.error("%s refused a message on %s: %s", self.name, subject, reason)
        note = RejectedMessage(service=self.name, subject=subject, reason=reason[:4000],
                               payload_excerpt=body[:1000].decode("utf-8", "replace"), payload_bytes=len(body))
        with contextlib.suppress(Exception):
            await bus.publish(self.js, self.subjects.rejected(self.name), note)
        if raw is not None:
            # reject() terminates the JetStream message: a malformed message is never redelivered.
            with contextlib.suppress(Exception):
                await raw.reject()


async def wait_forever() -> None:
    await asyncio.Event().wait()
