"""Publish a command and await its outcome.

The gateway listens on every outcome subject (``teto.outcome.>``, core NATS) with ONE subscription, opened on
the first command and kept for the process's life; each request registers its command id before it publishes
the command to the command stream, so an outcome that comes back quickly cannot be missed (the subscription
was registered with the server before the command was published, on the same connection). An outcome no
request here waits for (another replica's, or a gateway refusal) is dropped unread. A request waits up to
``command_timeout_seconds``; with no answer by then it gets 202: the command is durable in JetStream and will
still be processed. Commands the gateway itself refuses (bad body, missing permission, unknown job) are
answered with a ``CommandOutcome(by="gateway")`` on the outcome subject so the audit log holds them too.

Why one subscription and not one per request: a subscription per request is a SUB and an UNSUB the server
applies to its subject tree (and the client to its own tables), for every submit.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

from faststream import Context
from nats.aio.msg import Msg

from libs.contracts.bounds import ID_PATTERN, defuse
from libs.contracts.commands import Command, CommandOutcome
from libs.contracts.envelope import ContractError, new_id
from libs.contracts.subjects import Subjects
from libs.runtime import bus, edge_stream
from libs.runtime.service import Runtime

log = logging.getLogger(__name__)
_ID = re.compile(ID_PATTERN)


class BusUnavailable(Exception):
    """The command could not be stored in the command stream (NATS down): nothing was done."""


@dataclass(frozen=True)
class Sent:
    command_id: str
    outcome: CommandOutcome | None  # None: no answer in time (still pending)


class Outcomes:
    """The requests waiting for an outcome, by command id, fed by one subscription to every outcome subject."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[CommandOutcome]] = {}
        self.ignored = 0  # outcomes no request here waited for

    def expect(self, command_id: str) -> asyncio.Future[CommandOutcome]:
        """Register before the command is published; ``forget`` when done, answered or not."""
        future = self.waiting.get(command_id)
        if future is None or future.done():
            future = self.waiting[command_id] = asyncio.get_running_loop().create_future()
        return future

    def forget(self, command_id: str, future: asyncio.Future[CommandOutcome]) -> None:
        if self.waiting.get(command_id) is future:
            del self.waiting[command_id]

    def arrived(self, subject: str, data: bytes) -> None:
        """An outcome on ``<prefix>.outcome.<kind>.<command_id>``: the waiting request gets it (decoded only then)."""
        future = self.waiting.get(subject.rpartition(".")[2])
        if future is None or future.done():
            self.ignored += 1
            return
        try:
            future.set_result(CommandOutcome.decode(data))
        except ContractError as exc:  # someone else's garbage on our subject: keep waiting
            log.warning("ignoring a malformed outcome: %s", exc.reason)


async def on_outcome(msg: Msg, outcomes: Outcomes = Context()) -> None:
    """Each outcome heard: the request waiting for it gets it (``outcomes`` from the broker's context)."""
    outcomes.arrived(msg.subject, msg.data)


def outcome_listener(broker: Any, subjects: Subjects, on_outcome: Any) -> Any:
    """The gateway's outcome subscription declared on ``broker`` (``on_outcome`` None: for the AsyncAPI document)."""
    return edge_stream.listen(broker, subjects.outcome_all, on_outcome, title="gateway-outcomes", model=CommandOutcome,
                              description="gateway: command outcomes on core NATS, every replica (the stream "
                                          f"`{subjects.stream_name('OUTCOME')}` keeps them for the audit log)")


class Commands:
    def __init__(self, runtime: Runtime, timeout: float) -> None:
        self.runtime = runtime
        self.timeout = timeout
        self.outcomes = Outcomes()
        self._listening: asyncio.Task[Any] | None = None
        self._subscriber: Any = None

    async def listen(self) -> None:
        """Open the one outcome subscription (once; concurrent first requests share the opening)."""
        if self._listening is None:
            self._listening = asyncio.ensure_future(self._subscribe())
        try:
            await asyncio.shield(self._listening)
        except Exception:
            self._listening = None  # not subscribed (connection trouble): the next request tries again
            raise

    async def _subscribe(self) -> Any:
        """The outcome subscription, a subscriber of the gateway's FastStream app (every replica hears all),
        declared once, its handler finding this gateway's waiting requests in the broker's context; a start that
        failed is tried again by the next request."""
        if self._subscriber is None:
            broker = await self.runtime.faststream()
            edge_stream.provide(broker, outcomes=self.outcomes)
            self._subscriber = outcome_listener(broker, self.runtime.subjects, on_outcome)
        await self._subscriber.start()
        return self._subscriber

    async def send(self, cmd: Command) -> Sent:
        """Publish ``cmd`` to the command stream and await its outcome (None after the timeout)."""
        try:
            await self.listen()
        except Exception as exc:  # noqa: BLE001 - no outcome could be heard: nothing is sent
            raise BusUnavailable(f"could not listen for the outcome: {exc}") from exc
        future = self.outcomes.expect(cmd.command_id)
        try:
            await self.enqueue(cmd)
            try:
                outcome = await asyncio.wait_for(asyncio.shield(future), self.timeout)
            except asyncio.TimeoutError:
                outcome = None
            return Sent(cmd.command_id, outcome)
        finally:
            self.outcomes.forget(cmd.command_id, future)

    async def enqueue(self, cmd: Command) -> Sent:
        """Store ``cmd`` in the command stream, waiting for no outcome (``Prefer: respond-async``: the decision is
        read later, ``GET /v1/commands/{id}``, from the audit log)."""
        try:
            await bus.publish(self.runtime.js, self.runtime.subjects.cmd(cmd.KIND), cmd,
                              timeout=min(self.timeout, 15.0))
        except Exception as exc:  # noqa: BLE001 - any failure to store the command means it was not sent
            raise BusUnavailable(f"could not publish the command: {exc}") from exc
        return Sent(cmd.command_id, None)

    async def refuse(self, kind: str, actor: str | None, reason: str, *, command_id: str | None = None,
                     job_id: str | None = None, detail: dict[str, Any] | None = None) -> str:
        """Record a command refused before it reached its owner; returns the command id used."""
        command_id = command_id or new_id()
        facts = {"actor": actor, **(detail or {})}
        if job_id is not None and not _ID.match(job_id):
            # A refusal quotes what was asked for, even an id no job can have; only a real id is the job_id.
            facts["job_id_given"], job_id = job_id[:200], None
        outcome = CommandOutcome(command_id=command_id, kind=kind, accepted=False, reason=defuse(reason[:2000]),
                                 detail=defuse(facts), job_id=job_id, by="gateway")
        await self.record(outcome)
        return command_id

    async def record(self, outcome: CommandOutcome) -> None:
        """Publish a gateway-decided outcome (audited); a bus failure is logged, never fails the request."""
        try:
            await bus.publish(self.runtime.js, self.runtime.subjects.outcome(outcome.kind, outcome.command_id),
                              outcome, timeout=5.0)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not record gateway outcome %s/%s: %s", outcome.kind, outcome.command_id, exc)
