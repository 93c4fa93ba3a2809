"""Running one part as a process: ``teto service <name>`` and ``teto executor``.

SIGTERM and SIGINT cancel the part's ``serve()`` task so it closes its connections cleanly (drains NATS, closes
the pool) instead of dying mid-transaction.
"""

from __future__ import annotations

import asyncio
import importlib
import signal
from collections.abc import Awaitable, Callable

from libs.runtime.settings import SettingsError

SERVICES = ("queue", "budget", "health", "audit", "gateway")


def configure_logging(level: str = "INFO") -> None:
    """Text lines by default; TETO_LOG_FORMAT=json writes one JSON object a line (libs/runtime/logs.py)."""
    from libs.runtime import logs

    try:
        logs.configure(level)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


async def _until_signalled(serve: Callable[[], Awaitable[None]]) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(serve())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass


def run_service(name: str) -> int:
    if name not in SERVICES:
        raise SystemExit(f"unknown service {name!r}; one of {', '.join(SERVICES)}")
    module = importlib.import_module(f"services.{name}.app")
    asyncio.run(_until_signalled(module.serve))
    return 0


def run_executor(overrides: dict) -> int:
    """``teto executor``: the agent's own entry point (the agent package never imports this one)."""
    from agents.executor.main import run

    return run(overrides)
