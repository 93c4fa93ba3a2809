"""What a service replica shows of itself: its metrics endpoint, the lag of its durables (sampled), which
singleton locks it holds, and its answer to ``teto.rpc.status``.

Every replica answers the status request (no queue group), so the gateway hears each one that is alive; the
reply is built from what this process knows now (leadership is read live, consumer lag from the last sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from libs.contracts.envelope import utcnow
from libs.contracts.status import ConsumerLag, ReplicaStatus
from libs.contracts.subjects import Subjects

from . import metrics
from .loophealth import LoopHealth
from .settings import CommonSettings

log = logging.getLogger(__name__)
SAMPLE_TIMEOUT_SECONDS = 5.0
_seen: dict[str, itertools.count] = {}  # replicas of one service in one process (tests) get distinct names


def instance_name(service: str, configured: str) -> str:
    """The configured name, else ``<host>:<pid>``, suffixed ``/2``, ``/3``... for further replicas of the same
    service in this process."""
    base = configured or metrics.default_instance()
    n = next(_seen.setdefault(f"{service}@{base}", itertools.count(1)))
    return base if n == 1 else f"{base}/{n}"


def singleton_label(lock_name: str) -> str:
    """``teto:queue-placement`` -> ``queue-placement`` (the prefix is the installation's, not the loop's)."""
    return lock_name.split(":", 1)[-1]


class ObservedConsumer(Protocol):
    @property
    def stream(self) -> str: ...

    @property
    def durable(self) -> str: ...


class ObservedLoop(Protocol):
    """A consumer loop (``edge_loop.ConsumerLoop``): its durable's lag is sampled."""

    @property
    def consumer(self) -> ObservedConsumer: ...


class ObservedSingleton(Protocol):
    """A singleton loop (``singleton.SingletonLoop``): its lock name and whether it leads now."""

    @property
    def name(self) -> str: ...

    @property
    def leader(self) -> bool: ...


class Observed(Protocol):
    """What the observer reads of the service it shows (``service.Runtime`` is one): named here so that the
    runtime imports the observer and never the other way round."""

    name: str
    settings: CommonSettings
    nc: Client
    js: JetStreamContext
    loop_health: LoopHealth

    @property
    def subjects(self) -> Subjects: ...

    @property
    def loops(self) -> Sequence[ObservedLoop]: ...

    @property
    def singletons(self) -> Sequence[ObservedSingleton]: ...


class Observer:
    def __init__(self, runtime: Observed) -> None:
        self.runtime = runtime
        self.started_at = utcnow()
        self.instance = instance_name(runtime.name, runtime.settings.instance)
        self.lag: dict[str, ConsumerLag] = {}
        self._sub = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        s = self.runtime.settings
        metrics.Endpoint.start(s.metrics_port, s.metrics_host, self.instance)  # never fails the service
        metrics.REPLICA.labels(self.runtime.name).set(1)
        self._sub = await self.runtime.nc.subscribe(self.runtime.subjects.rpc_status, cb=self._answer)
        self._task = asyncio.create_task(self._sampling(), name=f"{self.runtime.name}-observer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        metrics.REPLICA.labels(self.runtime.name).set(0)

    async def _sampling(self) -> None:
        while True:
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a missed sample is retried next time
                log.debug("sampling failed: %r", exc)
            await asyncio.sleep(self.runtime.settings.metrics_sample_seconds)

    async def sample(self) -> None:
        """Leadership of each singleton, and num_pending / num_ack_pending of each durable this replica runs."""
        name = self.runtime.name
        for loop in self.runtime.singletons:
            metrics.SINGLETON_LEADER.labels(name, singleton_label(loop.name)).set(1 if loop.leader else 0)
        for loop in list(self.runtime.loops):
            c = loop.consumer
            try:
                info = await self.runtime.js.consumer_info(self.runtime.subjects.stream_name(c.stream), c.durable,
                                                           timeout=SAMPLE_TIMEOUT_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a leader election, say: the last sample stays
                log.debug("%s: consumer info failed: %r", c.durable, exc)
                continue
            lag = ConsumerLag(durable=c.durable, stream=c.stream, pending=info.num_pending or 0,
                              ack_pending=info.num_ack_pending or 0, sampled_at=utcnow())
            self.lag[c.durable] = lag
            metrics.CONSUMER_PENDING.labels(name, c.durable, c.stream).set(lag.pending)
            metrics.CONSUMER_ACK_PENDING.labels(name, c.durable, c.stream).set(lag.ack_pending)

    def snapshot(self) -> ReplicaStatus:
        loops = self.runtime.singletons
        server = (getattr(self.runtime.nc, "_server_info", None) or {}).get("server_name")
        return ReplicaStatus(service=self.runtime.name, instance=self.instance, started_at=self.started_at,
                             singletons=sorted(singleton_label(s.name) for s in loops),
                             leading=sorted(singleton_label(s.name) for s in loops if s.leader),
                             consumers=[self.lag[d] for d in sorted(self.lag)], metrics_port=metrics.Endpoint.port,
                             metrics_error=metrics.Endpoint.error,
                             nats_server=server, failing_loops=self.runtime.loop_health.failing())

    async def _answer(self, msg: Msg) -> None:
        if not msg.reply:
            return
        with contextlib.suppress(Exception):  # the asker has gone: nothing to do
            await msg.respond(self.snapshot().encode())
