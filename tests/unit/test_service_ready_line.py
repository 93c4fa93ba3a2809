"""``teto service <name>`` logs ``<name> ready`` once the service says it is (what teto up's rehearsal and an
operator wait for), and not before."""

from __future__ import annotations

import asyncio
import logging

from teto.stack import run


async def test_the_ready_line_comes_once_serve_is_ready(caplog):
    lines: list[str] = []

    async def serve(*, ready: asyncio.Event) -> None:
        lines.append(caplog.text)
        ready.set()
        await asyncio.sleep(0.2)  # a service serves on after saying it is ready

    with caplog.at_level(logging.INFO, logger="teto.service"):
        await run._until_signalled(serve, "queue")
    assert "queue ready" not in lines[0]
    assert "queue ready" in caplog.text


async def test_a_service_that_ends_before_it_is_ready_says_nothing(caplog):
    async def serve(*, ready: asyncio.Event) -> None:
        return None

    with caplog.at_level(logging.INFO, logger="teto.service"):
        await run._until_signalled(serve, "audit")
    assert "ready" not in caplog.text
