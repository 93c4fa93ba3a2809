"""Commands the queue decides: submit, cancel, requeue. Each acts once per ``command_id`` and is answered with a
``CommandOutcome`` written to the outbox in the same transaction as the change it made (so the gateway, which
reads the job right after an accepted outcome, always finds it). A redelivered command changes nothing and is
answered again with the stored outcome."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from libs.contracts.commands import CancelJob, Command, CommandOutcome, RequeueJob, SubmitJob
from libs.runtime import commands as once
from libs.runtime.fencing import StaleCounter
from libs.runtime.service import Runtime
from libs.runtime.unit import Units

from . import budget_client, org_budgets, store, submits
from .domain.lifecycle import Cancel, Fact, Refusal, Requeue
from .effects import answer_of, apply
from .settings import QueueSettings

log = logging.getLogger(__name__)
SERVICE = "queue"
BUDGET_UNAVAILABLE = "budget service unavailable"


class Commands:
    def __init__(self, runtime: Runtime, settings: QueueSettings, units: Units | None = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.units = units or Units(runtime.pool, store.SCHEMA, runtime.subjects, StaleCounter("queue"))

    async def submit(self, cmd: SubmitJob) -> CommandOutcome:
        return (await self.submit_all([cmd]))[0]

    async def submit_all(self, cmds: Sequence[SubmitJob]) -> list[CommandOutcome]:
        """A fetched batch of submits, decided in one transaction (``submits``); the outcome of each."""
        return await submits.decide_submits(self.units, self.settings, cmds, self.runtime.clock.now())

    async def cancel(self, cmd: CancelJob) -> CommandOutcome:
        return await self._decide(cmd, cmd.job_id, Cancel(cmd.reason, cmd.actor))

    async def requeue(self, cmd: RequeueJob) -> CommandOutcome:
        """The consumed GPU-seconds come from the budget service, its single writer (``budget_client``: a job
        it never saw consumed 0), and so does the organisation's consumption this period the new ceiling is
        checked against (``org_budgets``). Asked outside any transaction (never hold row locks across a network
        wait); with no answer the requeue is refused rather than decided on a guess."""
        async with self.runtime.pool.acquire() as conn:
            answered = await store.answered(conn, cmd.command_id) is not None
        if answered:  # no budget question for a command already decided: answered again below
            return await self._decide(cmd, cmd.job_id, Refusal("answered before"))
        consumed = await budget_client.consumed(self.runtime, cmd.job_id, self.settings.budget_rpc_timeout_seconds)
        if consumed is None:
            log.warning("requeue %s of %s: %s", cmd.command_id, cmd.job_id, BUDGET_UNAVAILABLE)
            return await self._decide(cmd, cmd.job_id, Refusal(BUDGET_UNAVAILABLE))
        # The new ceiling against the organisation's budget now, not only at the next admission.
        refused = await org_budgets.requeue_refusal(self.runtime, self.runtime.pool, cmd.job_id,
                                                    cmd.gpu_ceiling_seconds, consumed, self.runtime.clock.now(),
                                                    self.settings.budget_rpc_timeout_seconds)
        if refused is not None:
            return await self._decide(cmd, cmd.job_id, refused)
        return await self._decide(cmd, cmd.job_id, Requeue(cmd.gpu_ceiling_seconds, consumed, cmd.actor))

    async def refuse_malformed(self, kind: str, body: bytes, reason: str) -> CommandOutcome | None:
        """A command that fails its contract is answered too, when its id can be read, so whoever sent it hears
        why instead of waiting for a timeout."""
        try:
            data = json.loads(body)
            command_id = data.get("command_id") if isinstance(data, dict) else None
            job_id = data.get("job_id") if isinstance(data, dict) else None
            if not isinstance(command_id, str) or not _valid_id(command_id):
                return None
            job_id = job_id if isinstance(job_id, str) and _valid_id(job_id) else None
        except (ValueError, UnicodeDecodeError):
            return None
        outcome = CommandOutcome(command_id=command_id, kind=kind, accepted=False,
                                 reason=f"malformed command: {reason}", job_id=job_id, by=SERVICE)
        async with self.units.begin() as unit:
            if not await once.claim(unit.conn, store.SCHEMA, command_id, kind):
                return None
            await once.record(unit.conn, store.SCHEMA, command_id, outcome, job_id=job_id)
            unit.emit((self.runtime.subjects.outcome(kind, command_id), outcome))
        return outcome

    async def _decide(self, cmd: Command, job_id: str, fact: Fact | Refusal) -> CommandOutcome:
        now = self.runtime.clock.now()

        async with self.units.begin() as unit:
            async def decide() -> CommandOutcome:
                result = (fact if isinstance(fact, Refusal)
                          else await apply(unit.conn, self.settings, job_id, fact, now))
                return answer_of(cmd, job_id, result)

            answer = await unit.once(cmd, decide, job_id=job_id)
        outcome = answer.outcome
        if answer.again:
            log.info("%s %s seen again: answered with the stored outcome", cmd.KIND, cmd.command_id)
        else:
            log.info("%s %s for job %s: %s", cmd.KIND, cmd.command_id, job_id,
                     "accepted" if outcome.accepted else f"refused ({outcome.reason})")
        return outcome


def _valid_id(value: str) -> bool:
    return 0 < len(value) <= 64 and all(c.isalnum() or c in "_-" for c in value) and value.isascii()
