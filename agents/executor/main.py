"""The executor's entry point: ``serve`` runs one agent until it is cancelled (or told to reboot), ``run`` is
what ``teto executor`` and ``python -m agents.executor.main`` call: the agent until SIGTERM/SIGINT, then a clean
shutdown, or a reboot (the configured hook, else the agent restarts itself in place with a new boot id).

It lives in the agent package so that nothing here imports the launcher on top (``teto``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from libs.runtime import bus, logs, metrics, tracing

from .agent import Agent
from .supervision import SHUTDOWN_GRACE_SECONDS
from .checks import reach
from .checks.handler import Reboot
from . import cgroup, pilot, sandbox
from .gpu import detect_gpus
from .settings import ExecutorSettings

log = logging.getLogger(__name__)


async def serve(settings: ExecutorSettings | None = None, *, ready: asyncio.Event | None = None,
                leave: asyncio.Future | None = None) -> None:
    """``leave``: resolved with a reason when the agent must go (its Slurm allocation ends): the run checkpoints
    and stops first (Agent.leave), then the agent shuts down as when cancelled."""
    settings = settings or ExecutorSettings.from_env()
    tracing.setup("executor")  # spans exported as the OTEL_* variables say (nothing when none is set)
    logs.bind_here(executor_id=settings.executor_id)  # every line of this agent (its tasks inherit it)
    metrics.Endpoint.start(settings.metrics_port, settings.metrics_host, settings.instance or settings.executor_id)
    gpus = await asyncio.to_thread(detect_gpus)
    creds = settings.nats_credentials_file
    nc = await bus.connect(settings.nats_url, f"teto-executor-{settings.executor_id}", credentials_file=creds)
    js = nc.jetstream(timeout=15.0)
    agent = Agent(settings, nc, js, gpus)
    for line in await asyncio.to_thread(sandbox.describe_limits, settings):
        log.warning("job isolation: %s", line)
    tasks: list[asyncio.Task] = []
    listener = None
    try:
        await bus.prepare_streams(js, settings.subjects, authenticated=creds is not None, role="executor",
                                  executor_id=settings.executor_id, node_id=settings.node_id,
                                  replicas=settings.stream_replicas)
        listener, port = await reach.start_listener(reach.bind_host(settings))  # that address only, not 0.0.0.0
        agent.address = f"{agent.host}:{port}"
        agent.collective_port = reach.free_port()
        tasks.append(asyncio.create_task(agent.publisher.run(), name="publisher"))
        await agent.register()
        tasks.append(asyncio.create_task(agent.heartbeats(), name="heartbeats"))
        tasks.append(asyncio.create_task(agent.usage.run(), name="usage"))
        tasks.append(asyncio.create_task(agent.directives(), name="directives"))
        if ready is not None:
            ready.set()
        reboot = asyncio.create_task(agent.checks.rebooting.wait(), name="reboot")
        tasks.append(reboot)
        leaving = asyncio.ensure_future(leave) if leave is not None else None
        await asyncio.wait([*tasks, *([leaving] if leaving else [])], return_when=asyncio.FIRST_COMPLETED)
        if leaving is not None and leaving.done():
            await agent.leave(leaving.result())
            return
        if reboot.done() and agent.checks.reboot is not None:
            raise Reboot(agent.checks.reboot)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception():
                raise t.exception()
    finally:
        if listener is not None:
            listener.close()
        await agent.goodbye()  # takes no new work from here, and tells placement so
        # The job task stops its process within a bounded grace and reports; then the loops. Every wait is
        # bounded: nothing may hold the agent's shutdown forever.
        work = [t for t in (agent.checks.task, agent.job_task) if t is not None and not t.done()]
        for t in work:
            t.cancel()
        await _settle(work, 3 * SHUTDOWN_GRACE_SECONDS)
        await agent.guard.close()  # after the runs: it kills whatever of theirs is still alive
        await asyncio.to_thread(cgroup.remove_agent_cgroup, settings.executor_id)
        for t in tasks:
            t.cancel()
        await _settle(tasks, SHUTDOWN_GRACE_SECONDS)
        # The stopped process's last usage record: one bounded try (what the server did not take is lost
        # with this process's memory, at most the stretch since the last report).
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent.usage.send(), 2.0)
        # Close rather than drain: every directive is acknowledged on receipt and every publish awaited, so
        # there is nothing to drain, and draining an interrupted pull fetch waits out its whole timeout.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.flush(), 2.0)
        with contextlib.suppress(Exception):
            await nc.close()


async def _settle(tasks: list[asyncio.Task], timeout: float) -> None:
    """Wait for cancelled tasks to finish, at most ``timeout``; name any that did not."""
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.warning("task %s ended with %r at shutdown", t.get_name(), t.exception())
    for t in pending:
        log.error("task %s did not stop within %.0fs of shutdown; leaving it", t.get_name(), timeout)


async def _until_signalled(serve: Callable[[asyncio.Future | None], Awaitable[None]], *,
                           as_pilot: bool = False) -> None:
    """SIGTERM and SIGINT cancel ``serve`` so it stops its process, reports and closes its connection. A Slurm
    pilot's SIGUSR1 (the --signal lead before its time limit) and SIGTERM (scancel, preemption, the limit) make
    it leave instead: checkpoint and stop the run, then shut down (a SIGTERM while leaving cancels at once)."""
    loop = asyncio.get_running_loop()
    leave: asyncio.Future | None = loop.create_future() if as_pilot else None
    task = asyncio.create_task(serve(leave))

    def on_leave(signum: int) -> None:
        if leave is not None and not leave.done():
            leave.set_result(f"Slurm sent {signal.Signals(signum).name}: the allocation ends")
        elif signum == signal.SIGTERM:
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    if as_pilot:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            loop.add_signal_handler(sig, on_leave, sig)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run(overrides: dict[str, Any]) -> int:
    """Run an agent configured from the environment and ``overrides`` (None values ignored) until signalled."""
    settings = ExecutorSettings.from_env(**{k: v for k, v in overrides.items() if v is not None})
    try:
        asyncio.run(_until_signalled(lambda leave: serve(settings, leave=leave),
                                     as_pilot=pilot.of(os.environ) is not None))
    except Reboot as reboot:
        return reboot_executor(settings, reboot)
    return 0


def reboot_executor(settings: ExecutorSettings, reboot: Reboot, *, execv: Callable[..., Any] = os.execve,
                    run_hook: Callable[..., Any] = subprocess.run) -> int:
    """A reboot directive: run the configured reboot hook (which may reboot the machine), else restart this
    agent in place (same pid, same executor and node ids, a new boot id) so the node is checked again."""
    if settings.reboot_command:
        log.warning("reboot (%s): running the reboot hook", reboot)
        return run_hook(settings.reboot_command, shell=True, check=False).returncode
    log.warning("reboot (%s): restarting the agent process", reboot)
    env = {**os.environ, "TETO_EXECUTOR_ID": settings.executor_id, "TETO_NODE_ID": settings.node_id}
    argv = [sys.executable, *sys.orig_argv[1:]] if hasattr(sys, "orig_argv") else [sys.executable, *sys.argv]
    logging.shutdown()
    execv(sys.executable, argv, env)
    return 0  # not reached: execve replaces this process


def main() -> None:
    logs.configure(os.environ.get("TETO_LOG_LEVEL", "INFO"))
    raise SystemExit(run({}))


if __name__ == "__main__":
    main()
