"""Running one part as a process: ``teto service <name>`` and ``teto executor``.

SIGTERM and SIGINT cancel the part's ``serve()`` task so it closes its connections cleanly (drains NATS, closes
the pool) instead of dying mid-transaction.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
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


async def _until_signalled(serve: Callable[..., Awaitable[None]], name: str | None = None) -> None:
    """Run ``serve`` until SIGTERM/SIGINT; with a service ``name``, log ``<name> ready`` once it says it is (its
    consumers bound, its singletons running: what a supervisor or a test waits for)."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    task = asyncio.create_task(serve(ready=ready) if name else serve())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    announce = asyncio.create_task(_announce(ready, name)) if name else None
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        if announce is not None:
            announce.cancel()


async def _announce(ready: asyncio.Event, name: str) -> None:
    await ready.wait()
    logging.getLogger("teto.service").info("%s ready", name)


def run_service(name: str) -> int:
    if name not in SERVICES:
        raise SystemExit(f"unknown service {name!r}; one of {', '.join(SERVICES)}")
    module = importlib.import_module(f"services.{name}.app")
    asyncio.run(_until_signalled(module.serve, name))
    return 0


def run_executor(overrides: dict) -> int:
    """``teto executor``: the agent's own entry point (the agent package never imports this one)."""
    from agents.executor.main import run

    return run(overrides)
