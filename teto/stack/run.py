"""Running one part as a process: ``teto service <name>`` and ``teto executor``.

SIGTERM and SIGINT cancel the part's ``serve()`` task so it closes its connections cleanly (drains NATS, closes
the pool) instead of dying mid-transaction.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable

SERVICES = ("queue", "budget", "health", "audit", "gateway")


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
    from agents.executor.agent import serve
    from agents.executor.checks.handler import Reboot
    from agents.executor.settings import ExecutorSettings

    settings = ExecutorSettings.from_env(**{k: v for k, v in overrides.items() if v is not None})
    try:
        asyncio.run(_until_signalled(lambda: serve(settings)))
    except Reboot as reboot:
        return reboot_executor(settings, reboot)
    return 0


def reboot_executor(settings, reboot, *, execv=os.execve, run=subprocess.run) -> int:
    """A reboot directive: run the configured reboot hook (which may reboot the machine), else restart this
    agent in place (same pid, same executor and node ids, a new boot id) so the node is checked again."""
    log = logging.getLogger("teto.executor")
    if settings.reboot_command:
        log.warning("reboot (%s): running the reboot hook", reboot)
        return run(settings.reboot_command, shell=True, check=False).returncode
    log.warning("reboot (%s): restarting the agent process", reboot)
    env = {**os.environ, "TETO_EXECUTOR_ID": settings.executor_id, "TETO_NODE_ID": settings.node_id}
    argv = [sys.executable, *sys.orig_argv[1:]] if hasattr(sys, "orig_argv") else [sys.executable, *sys.argv]
    logging.shutdown()
    execv(sys.executable, argv, env)
    return 0  # not reached: execve replaces this process
