"""The agent's side of deep checks: a ``check`` directive runs the suite (in a child process, so heartbeats go
on) and reports every test's progress and result on ``teto.check.<run_id>.<status>``; a ``reboot`` directive
ends the agent so it comes back as a new boot (see ``Reboot``).

While checking the agent takes no job. A check that arrives while a job runs is answered ``busy`` (the health
service cordons the node and asks again when the job ends), unless it is forced: then the job is asked to
checkpoint and stop first, which the queue treats as a free requeue (no attempt spent).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from libs.contracts.agents import StopJob
from libs.contracts.nodes import CheckReport, CheckStatus, RebootNode, RunChecks

from . import faults
from .runner import run_suite
from .suite import Spec

if TYPE_CHECKING:
    from ..agent import Agent

log = logging.getLogger(__name__)
FORCED_STOP_REASON = "stopped for a forced health check"


class Reboot(Exception):
    """The control plane asked this agent to reboot: ``serve`` ends with it, and the process runner restarts
    the agent in place (or runs the configured reboot hook)."""

    def __init__(self, directive: RebootNode) -> None:
        super().__init__(directive.reason)
        self.directive = directive


class NodeChecks:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.task: asyncio.Task | None = None
        self.current: RunChecks | None = None
        self.reboot: RebootNode | None = None
        self.rebooting = asyncio.Event()

    @property
    def active(self) -> bool:
        return self.current is not None

    def on_check(self, directive: RunChecks) -> None:
        if self.current is not None:
            if (self.current.run_id, self.current.attempt) != (directive.run_id, directive.attempt):
                log.info("still finishing check run %s: run %s (attempt %d) starts after it",
                         self.current.run_id, directive.run_id, directive.attempt)
                asyncio.create_task(self._after_current(directive))
            return
        self.current = directive  # set before any await: a grant arriving now sees the node checking
        self.task = asyncio.create_task(self._serve(directive), name=f"check-{directive.run_id}")

    async def _after_current(self, directive: RunChecks) -> None:
        while self.task is not None and not self.task.done():
            await asyncio.shield(self.task)
        self.on_check(directive)

    def on_reboot(self, directive: RebootNode) -> None:
        log.warning("node %s told to reboot (%d): %s", directive.node_id, directive.reboots, directive.reason)
        self.reboot = directive
        self.rebooting.set()

    def _report(self, d: RunChecks, status: str, test: str | None = None, **fields: Any) -> asyncio.Future:
        a = self.agent
        report = CheckReport(run_id=d.run_id, node_id=a.settings.node_id, executor_id=a.id, test=test,
                             attempt=d.attempt, status=status, **fields)
        return a.publisher.send(a.subjects.check(d.run_id, status), report)

    async def _serve(self, d: RunChecks) -> None:
        a = self.agent
        try:
            if a.run is not None:
                if not d.force:
                    log.info("check run %s: busy with job %s; the node stays cordoned until it ends", d.run_id,
                             a.run.grant.job_id)
                    await self._report(d, "busy", detail={"job_id": a.run.grant.job_id})
                    return
                await self._stop_job_first(d)
            await self._run(d)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - never leave the run without an answer
            log.exception("check run %s failed to run", d.run_id)
            for test in d.tests:
                await self._report(d, CheckStatus.FAILED, test, error=f"the agent could not run the check: {exc}")
        finally:
            self.current = None

    async def _stop_job_first(self, d: RunChecks) -> None:
        a = self.agent
        run = a.run
        job_task = a.job_task
        log.warning("check run %s is forced: stopping job %s with a checkpoint first", d.run_id, run.grant.job_id)
        a.on_stop(StopJob(job_id=run.grant.job_id, epoch=run.grant.epoch, reason=FORCED_STOP_REASON,
                          checkpoint_first=True, grace_seconds=a.settings.stop_grace_seconds))
        if job_task is not None:
            await asyncio.wait({job_task})

    async def _run(self, d: RunChecks) -> None:
        s = self.agent.settings
        spec = Spec(tests=[t.value for t in d.tests], fault=faults.parse(s.test_fault),
                    memtest_fraction=s.check_memtest_fraction, peers=[p.model_dump() for p in d.peers],
                    rank=d.rank, world_size=d.world_size, rendezvous=d.rendezvous,
                    collective_timeout_seconds=min(60.0, s.check_timeout_seconds / 2))
        started = time.monotonic()

        async def on_record(record: dict[str, Any]) -> None:
            status = record["status"]
            self._report(d, status, record["test"], figures=_floats(record.get("figures")),
                         detail=record.get("detail") or {}, error=(record.get("error") or None) and
                         str(record["error"])[:4000], seconds=record.get("seconds"))

        env = {"TETO_TORCH_THREADS": str(s.torch_threads)} if s.torch_threads else None
        await run_suite(spec, on_record, timeout=s.check_timeout_seconds, env=env)
        log.info("check run %s (attempt %d) of %s finished in %.1fs", d.run_id, d.attempt,
                 ", ".join(spec.tests), time.monotonic() - started)


def _floats(figures: Any) -> dict[str, float]:
    if not isinstance(figures, dict):
        return {}
    # Only finite figures travel (the contract refuses inf/nan; abs() < 1e300 is False for both).
    return {str(k)[:200]: float(v) for k, v in figures.items() if isinstance(v, int | float) and abs(v) < 1e300}

