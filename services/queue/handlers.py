"""The queue's consumer declarations: commands, progress, heartbeats, budget and node events from JetStream
(durable pull consumers shared by replicas), and the lease-renewal responder on core NATS (a queue group,
answered by any replica). What happens to a malformed, failing or poison message is the edge's business
(libs/runtime/edge.py); these declarations say only what to read and whom to hand it to.

Submits are decided a fetched batch per transaction (``submits``; a batch that fails is applied one message at a
time by the edge); cancel and requeue one command per transaction. Run reports (started, steps, checkpoints,
finished) are applied a fetched batch per transaction too (``Runs.progress_all``), each in arrival order, so a
job's reports keep their order (a checkpoint before the finish that follows it); a batch that fails is applied
one report at a time by the edge.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from libs.contracts import senders
from libs.contracts.budget import BudgetEvent
from libs.contracts.commands import (CancelJob, Command, RequeueJob, SetCohort, SetGangPolicy, SetOrganisation,
                                     SetProject, SubmitJob)
from libs.contracts.envelope import ContractError, schema_of
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import PROGRESS_TYPES, Heartbeat, ProgressBase
from libs.runtime import tracing
from libs.runtime.edge import Consumer, from_sender, stamped
from libs.runtime.edge_reply import Responder
from libs.runtime.service import Runtime

from .commands import Commands
from .policy import Policies
from .runs import Runs
from .tenancy_edge import Tenancy

log = logging.getLogger(__name__)


def consumers(runtime: Runtime, commands: Commands, runs: Runs, policies: Policies | None = None,
              tenancy: Tenancy | None = None) -> list[Consumer]:
    s = runtime.subjects

    def command(model: type[Command], act: Callable[[Any], Awaitable[Any]],
                batch: Callable[[list[Any]], Awaitable[Any]] | None = None) -> Consumer:
        async def handle(cmds: list[Command]) -> None:
            if batch is not None:  # the whole batch in one transaction, each command in its sender's trace
                await batch(cmds)
                return
            for cmd in cmds:  # each its own transaction, decided once per command id, in the sender's trace
                with tracing.continued(tracing.of(cmd), f"queue {model.KIND}", command_id=cmd.command_id):
                    await act(cmd)

        async def malformed(body: bytes, reason: str) -> None:
            await commands.refuse_malformed(model.KIND, body, reason)

        return Consumer(s.cmd(model.KIND), "CMD", f"queue-{model.KIND}", model.decode, handle, batch=50,
                        on_malformed=malformed)

    async def on_progress(reports: list[ProgressBase]) -> None:
        await runs.progress_all(reports)  # one transaction, each report in its run's trace and in order

    async def on_budget(events: list[BudgetEvent]) -> None:
        for event in events:
            await runs.budget(event)

    async def on_node_events(events: list[NodeEvent]) -> None:
        for event in events:
            await runs.node_event(event)

    # The node stream also carries registrations and check reports, which are not for the queue.
    def node_events_only(body: bytes) -> bool:
        return schema_of(body) == NodeEvent.SCHEMA

    declared = [
        command(SubmitJob, commands.submit, batch=commands.submit_all),  # submits: a batch per transaction
        command(CancelJob, commands.cancel),
        command(RequeueJob, commands.requeue),
        Consumer(s.progress_all, "PROGRESS", "queue-progress", None, on_progress, batch=200,
                 read=from_sender(decode_progress)),
        Consumer(s.budget_all, "BUDGET", "queue-budget", BudgetEvent.decode, on_budget, batch=50),
        # Placement needs only each executor's newest heartbeat: one upsert per batch.
        Consumer(s.heartbeat_all, "HB", "queue-heartbeats", None, runs.heartbeats, batch=500,
                 read=stamped(from_sender(Heartbeat.decode))),
        Consumer(s.node_all, "NODE", "queue-nodes", NodeEvent.decode, on_node_events, batch=100,
                 accepts=node_events_only),
    ]
    if policies is not None:
        declared.append(command(SetGangPolicy, policies.set))
    if tenancy is not None:
        declared += [command(SetOrganisation, tenancy.set_org), command(SetProject, tenancy.set_project),
                     command(SetCohort, tenancy.set_cohort)]
    return declared


def responders(runtime: Runtime, runs: Runs) -> list[Responder]:
    return [Responder(runtime.subjects.rpc_lease_renew, "queue", LeaseRenewRequest.decode, runs.renew,
                      lambda reason: LeaseRenewReply(ok=False, reason=f"malformed renewal request: {reason}"),
                      bind=lambda subject, req: senders.check_sender(subject, req.executor_id, req.SCHEMA))]


def decode_progress(body: bytes) -> ProgressBase:
    """Progress messages share a subject; the ``kind`` field says which contract to read them with."""
    try:
        kind = json.loads(body).get("kind")
        model = PROGRESS_TYPES[kind]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise ContractError("teto.progress", "progress message without a known 'kind'") from None
    return model.decode(body)
