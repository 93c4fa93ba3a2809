"""Helpers for the health, budget and audit integration tests: collect what arrives on a subject, and a
JetStream context on a server. (Waiting and serving: ``tests.support.services``, ``eventually`` and ``running``.)"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
from nats.aio.msg import Msg


class Collector:
    """Core-NATS subscription that keeps every message on a subject pattern."""

    def __init__(self) -> None:
        self.msgs: list[Msg] = []

    async def cb(self, msg: Msg) -> None:
        self.msgs.append(msg)


@contextlib.asynccontextmanager
async def collect(url: str, subject: str) -> AsyncIterator[Collector]:
    nc = await nats.connect(url)
    col = Collector()
    await nc.subscribe(subject, cb=col.cb)
    await nc.flush()
    try:
        yield col
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def jetstream(url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(url)
    try:
        yield nc, nc.jetstream(timeout=10)
    finally:
        await nc.close()
