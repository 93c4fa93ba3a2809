"""Publish a command and await its outcome.

The gateway subscribes to ``teto.outcome.*.<command_id>`` (core NATS) BEFORE it publishes the command to the
command stream, so an outcome that comes back quickly cannot be missed. It waits up to
``command_timeout_seconds``; with no answer by then the request gets 202: the command is durable in JetStream
and will still be processed. Commands the gateway itself refuses (bad body, missing permission, unknown job)
are answered with a ``CommandOutcome(by="gateway")`` on the outcome subject so the audit log holds them too.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from nats.errors import TimeoutError as NatsTimeout

from libs.contracts.bounds import ID_PATTERN, defuse
from libs.contracts.commands import Command, CommandOutcome
from libs.contracts.envelope import ContractError, new_id
from libs.runtime import bus
from libs.runtime.service import Runtime

log = logging.getLogger(__name__)
_ID = re.compile(ID_PATTERN)


class BusUnavailable(Exception):
    """The command could not be stored in the command stream (NATS down): nothing was done."""


@dataclass(frozen=True)
class Sent:
    command_id: str
    outcome: CommandOutcome | None  # None: no answer in time (still pending)


class Commands:
    def __init__(self, runtime: Runtime, timeout: float) -> None:
        self.runtime = runtime
        self.timeout = timeout

    async def send(self, cmd: Command) -> Sent:
        subjects = self.runtime.subjects
        sub = await self.runtime.nc.subscribe(subjects.outcome_of(cmd.command_id))
        try:
            try:
                await bus.publish(self.runtime.js, subjects.cmd(cmd.KIND), cmd, timeout=min(self.timeout, 15.0))
            except Exception as exc:  # noqa: BLE001 - any failure to store the command means it was not sent
                raise BusUnavailable(f"could not publish the command: {exc}") from exc
            outcome = await self._await(sub)
            return Sent(cmd.command_id, outcome)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _await(self, sub: Any) -> CommandOutcome | None:
        loop_deadline = self.runtime.clock.monotonic() + self.timeout
        while (left := loop_deadline - self.runtime.clock.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except (NatsTimeout, TimeoutError):
                return None
            try:
                return CommandOutcome.decode(msg.data)
            except ContractError as exc:  # someone else's garbage on our subject: keep waiting
                log.warning("ignoring a malformed outcome: %s", exc.reason)
        return None

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
