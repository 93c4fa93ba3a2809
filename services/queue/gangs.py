"""Gangs at the queue's edges. ``GangGrants``: what a placement pass needs to admit gangs (the policy, sequential
admission, rendezvous and ready deadline on the grant). ``GangScanner`` (a singleton loop): admitting gangs past
their ready deadline back off (or fail once the policy's limit is used up), and gangs whose back-off is over are
queued again. The jitter of each back-off is drawn from the random source the scanner is given, so a test can
replay it exactly."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime

from libs.contracts.policies import GangPolicy

from libs.runtime.service import Runtime

from . import policy
from . import scans, store
from .domain import lifecycle as lc
from .domain.gang_admission import (PortRange, QueuedJob, admissible, next_backoff, ready_deadline, rendezvous,
                                    rendezvous_port)
from .effects import messages_for
from .settings import QueueSettings

log = logging.getLogger(__name__)


class GangScanner:
    def __init__(self, runtime: Runtime, settings: QueueSettings, *, kick: Callable[[], None] = lambda: None,
                 draw: Callable[[], float] = random.random) -> None:
        self.runtime = runtime
        self.settings = settings
        self.kick = kick  # wakes the outbox relay: stops should reach the workers at once
        self.draw = draw
        self.timeouts = 0
        self.requeued = 0

    async def scan_once(self) -> int:
        n = 0
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            now = await store.db_now(conn)  # ready deadlines are set on the database's clock at placement
            # 1. Gangs that did not form in time release their nodes and back off (or fail at the limit).
            late = await scans.ready_timeouts(conn, now)
            gang_policy = await policy.load(conn) if late else None
            for job in late:
                assert gang_policy is not None
                backoff = next_backoff(gang_policy, job.backoff_count, self.draw())
                n += await self._apply(conn, job, lc.ReadyTimedOut(job.lease_epoch, backoff), now)
                self.timeouts += 1
                not_ready = [w.executor_id for w in job.gang if w.ready_at is None]
                log.warning("gang %s not ready by its deadline (waiting for %s): %s", job.id, ", ".join(not_ready),
                            f"back-off {backoff.n}, {backoff.delay_seconds:.1f}s" if backoff else "failed")
            # 2. Back-offs that are over: queued again, in their original arrival order.
            for job in await scans.backoffs_due(conn, now):
                n += await self._apply(conn, job, lc.AdmissionDue(), now)
                self.requeued += 1
        if n:
            self.kick()
        return n

    async def _apply(self, conn, job: lc.Job, fact: lc.Fact, now) -> int:  # noqa: ANN001 - asyncpg types
        t = lc.decide(job, fact, now)
        if isinstance(t, lc.Transition) and t.changed:
            await store.write(conn, self.settings.subjects, t, now, messages_for(t.job, t, self.settings))
            return 1
        return 0


class GangGrants:
    """What placement needs for gangs in one pass: the policy, which queued jobs it may admit, and a grant that
    carries the rendezvous (rank 0's host, a port no other gang holds), the ready deadline and the strategy."""

    def __init__(self, settings: QueueSettings, policy: GangPolicy, in_use: set[str],
                 addresses: dict[str, str | None]) -> None:
        self.settings = settings
        self.policy = policy
        self.in_use = in_use
        self.addresses = addresses

    @classmethod
    async def snapshot(cls, conn, settings: QueueSettings) -> GangGrants:  # noqa: ANN001 - asyncpg types
        return cls(settings, await policy.load(conn), await scans.rendezvous_in_use(conn), {})

    async def admissible(self, conn, wanted: Sequence[QueuedJob]) -> list[QueuedJob]:  # noqa: ANN001
        sequential = self.policy.sequential_admission
        admitting = await scans.admitting_count(conn) if sequential else 0
        return admissible(wanted, admitting_now=admitting, sequential=sequential)

    async def grant(self, conn, job: lc.Job, workers: tuple[str, ...], expires_at: datetime,  # noqa: ANN001
                    now: datetime) -> lc.Granted | None:
        epoch = job.lease_epoch + 1
        if len(workers) == 1:
            return lc.Granted(workers, epoch, expires_at)
        if workers[0] not in self.addresses:
            self.addresses.update(await scans.executor_addresses(conn, workers[:1]))
        host = self.addresses.get(workers[0]) or "127.0.0.1"
        used = {int(r.rsplit(":", 1)[1]) for r in self.in_use if r.rsplit(":", 1)[0].strip("[]") == host}
        port = rendezvous_port(job.id, epoch, used, PortRange(self.settings.rendezvous_port_first,
                                                              self.settings.rendezvous_port_count))
        if port is None:
            log.error("no free rendezvous port on %s for gang %s: it waits", host, job.id)
            return None
        meet = rendezvous(host, port)
        self.in_use.add(meet)
        return lc.Granted(workers, epoch, expires_at, rendezvous=meet,
                          ready_deadline=ready_deadline(now, job.spec, self.policy),
                          on_node_failure=self.policy.node_failure_strategy.value)
