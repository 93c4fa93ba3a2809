"""The agent's side of deep checks: a ``check`` directive runs the suite (in a child process, so heartbeats go
on) and reports every test's progress and result on ``teto.check.<run_id>.<status>``; a ``reboot`` directive
ends the agent so it comes back as a new boot (see ``Reboot``).

While checking the agent takes no job. A check that arrives while a job runs is answered ``busy`` (the health
service cordons the node and asks again when the job ends), unless it is forced: then the job is asked to
checkpoint and stop first, which the queue treats as a free requeue (no attempt spent).

The report that completes a run's tests goes out only after the check process has ended and the agent takes
work again: the health service judges the node from that report, the queue may place a job on it at once, and
a grant that found the agent still checking would only be handed back. The agent is seen through ``Jobs``, the
two things checks need of it, so this module and the agent do not import each other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from libs.contracts.nodes import CheckReport, CheckStatus, RebootNode, RunChecks
from libs.contracts.telemetry import HEALTH_CHECK_STOP

from ..publisher import Publisher
from ..settings import ExecutorSettings
from . import faults, reach
from .runner import Record, run_suite
from .spec import Spec
from .suite import SUITE_VERSION

log = logging.getLogger(__name__)
FORCED_STOP_REASON = HEALTH_CHECK_STOP  # reported as the run's stop_reason: the queue counts it apart


class Reboot(Exception):
    """The control plane asked this agent to reboot: ``serve`` ends with it, and the process runner restarts
    the agent in place (or runs the configured reboot hook)."""

    def __init__(self, directive: RebootNode) -> None:
        super().__init__(directive.reason)
        self.directive = directive


class Jobs(Protocol):
    """What the checks need of the agent's training work."""

    def running_job(self) -> str | None:
        """The id of the job whose process runs here now, if any."""

    async def stop_and_wait(self, reason: str) -> None:
        """Ask the running job to checkpoint and stop, and return once it has ended and been reported."""


class NodeChecks:
    def __init__(self, settings: ExecutorSettings, publisher: Publisher, jobs: Jobs) -> None:
        self.settings = settings
        self.publisher = publisher
        self.jobs = jobs
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
        s = self.settings
        report = CheckReport(run_id=d.run_id, node_id=s.node_id, executor_id=s.executor_id, test=test,
                             attempt=d.attempt, status=status, suite_version=SUITE_VERSION, **fields)
        return self.publisher.send(s.subjects.check(d.run_id, status, s.executor_id), report)

    def _report_record(self, d: RunChecks, record: Record) -> None:
        error = record.get("error")
        self._report(d, record["status"], record["test"], figures=_floats(record.get("figures")),
                     detail=record.get("detail") or {}, error=str(error)[:4000] if error else None,
                     seconds=record.get("seconds"))

    async def _serve(self, d: RunChecks) -> None:
        final: list[Record] = []  # held until the check process has ended and the agent takes work again
        try:
            job_id = self.jobs.running_job()
            if job_id is not None:
                if not d.force:
                    log.info("check run %s: busy with job %s; the node stays cordoned until it ends", d.run_id,
                             job_id)
                    await self._report(d, "busy", detail={"job_id": job_id})
                    return
                log.warning("check run %s is forced: stopping job %s with a checkpoint first", d.run_id, job_id)
                await self.jobs.stop_and_wait(FORCED_STOP_REASON)
            await self._run(d, final)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - never leave the run without an answer
            log.exception("check run %s failed to run", d.run_id)
            final[:] = [{"test": t.value, "status": CheckStatus.FAILED.value,
                         "error": f"the agent could not run the check: {exc}"} for t in d.tests]
        finally:
            self.current = None
        for record in final:
            self._report_record(d, record)

    async def _run(self, d: RunChecks, final: list[Record]) -> None:
        s = self.settings
        fault = faults.parse(faults.spec_of(s.test_fault, s.test_fault_path, s.node_id))
        spec = Spec(tests=[t.value for t in d.tests], fault=fault,
                    memtest_fraction=s.check_memtest_fraction, peers=[p.model_dump() for p in d.peers],
                    rank=d.rank, world_size=d.world_size, rendezvous=d.rendezvous,
                    collective_timeout_seconds=min(60.0, s.check_timeout_seconds / 2),
                    bind_host=reach.bind_host(s))
        started = time.monotonic()
        ended: set[str] = set()

        async def on_record(record: Record) -> None:
            if record["status"] != "running":
                ended.add(record["test"])
            if ended >= set(spec.tests):
                final.append(record)  # the verdict's last piece: sent once the process is gone (see above)
            else:
                self._report_record(d, record)

        env = {"TETO_TORCH_THREADS": str(s.torch_threads)} if s.torch_threads else None
        await run_suite(spec, on_record, timeout=s.check_timeout_seconds, env=env)
        log.info("check run %s (attempt %d) of %s finished in %.1fs", d.run_id, d.attempt,
                 ", ".join(spec.tests), time.monotonic() - started)


def _floats(figures: Any) -> dict[str, float]:
    if not isinstance(figures, dict):
        return {}
    # Only finite figures travel (the contract refuses inf/nan; abs() < 1e300 is False for both).
    return {str(k)[:200]: float(v) for k, v in figures.items() if isinstance(v, int | float) and abs(v) < 1e300}

