"""The queue's consumer declarations: commands, progress, heartbeats, budget and node events from JetStream
(durable pull consumers shared by replicas), and the lease-renewal responder on core NATS (a queue group,
answered by any replica). What happens to a malformed, failing or poison message is the edge's business
(libs/runtime/edge.py); these declarations say only what to read and whom to hand it to.

Submits are decided a fetched batch per transaction (``submits``; a batch that fails is applied one message at a
time by the edge); cancel and requeue one command per transaction. Run reports (started, steps, checkpoints,
finished) are applied a fetched batch per transaction too (``Runs.progress_all``), each in arrival order, so a
job's reports keep their order (a checkpoint before the finish that follows it); a batch that fails is applied
one report at a time by the edge.

The handlers are this module's functions; each names what it uses (``commands``, ``runs``, ``policies``,
``tenancy``) as a ``Context()`` parameter, found in the broker's context that the app fills at start
(libs/runtime/edge_stream.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import Context

from libs.contracts import senders
from libs.contracts.budget import BudgetEvent
from libs.contracts.commands import (CancelJob, Command, RequeueJob, SetCohort, SetGangPolicy, SetOrganisation,
                                     SetProject, SubmitJob)
from libs.contracts.envelope import ContractError, schema_of
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import PROGRESS_TYPES, Heartbeat, ProgressBase
from libs.runtime import tracing
from libs.contracts.subjects import Subjects
from libs.runtime.edge import Consumer, Stamped, from_sender, stamped
from libs.runtime.edge_reply import Responder

from .commands import Commands
from .policy import Policies
from .runs import Runs
from .tenancy_edge import Tenancy

log = logging.getLogger(__name__)


async def each(cmds: list[Any], kind: str, act: Callable[[Any], Awaitable[Any]]) -> None:
    """Each command its own transaction, decided once per command id, in its sender's trace."""
    for cmd in cmds:
        with tracing.continued(tracing.of(cmd), f"queue {kind}", command_id=cmd.command_id):
            await act(cmd)


async def on_submits(cmds: list[SubmitJob], commands: Commands = Context()) -> None:
    await commands.submit_all(cmds)  # the whole batch in one transaction, each command in its sender's trace


async def on_cancels(cmds: list[CancelJob], commands: Commands = Context()) -> None:
    await each(cmds, CancelJob.KIND, commands.cancel)


async def on_requeues(cmds: list[RequeueJob], commands: Commands = Context()) -> None:
    await each(cmds, RequeueJob.KIND, commands.requeue)


async def on_gang_policies(cmds: list[SetGangPolicy], policies: Policies = Context()) -> None:
    await each(cmds, SetGangPolicy.KIND, policies.set)


async def on_organisations(cmds: list[SetOrganisation], tenancy: Tenancy = Context()) -> None:
    await each(cmds, SetOrganisation.KIND, tenancy.set_org)


async def on_projects(cmds: list[SetProject], tenancy: Tenancy = Context()) -> None:
    await each(cmds, SetProject.KIND, tenancy.set_project)


async def on_cohorts(cmds: list[SetCohort], tenancy: Tenancy = Context()) -> None:
    await each(cmds, SetCohort.KIND, tenancy.set_cohort)


def refusal(kind: str) -> Callable[..., Awaitable[Any]]:
    """Answers a malformed ``kind`` command (a refused outcome, when it names its command id)."""

    async def malformed(body: bytes, reason: str, commands: Commands = Context()) -> None:
        await commands.refuse_malformed(kind, body, reason)

    return malformed


async def on_progress(reports: list[ProgressBase], runs: Runs = Context()) -> None:
    await runs.progress_all(reports)  # one transaction, each report in its run's trace and in order


async def on_budget(events: list[BudgetEvent], runs: Runs = Context()) -> None:
    for event in events:
        await runs.budget(event)


async def on_heartbeats(beats: list[Stamped[Heartbeat]], runs: Runs = Context()) -> None:
    await runs.heartbeats(beats)


async def on_node_events(events: list[NodeEvent], runs: Runs = Context()) -> None:
    for event in events:
        await runs.node_event(event)


def node_events_only(body: bytes) -> bool:
    """The node stream also carries registrations and check reports, which are not for the queue."""
    return schema_of(body) == NodeEvent.SCHEMA


def consumers(subjects: Subjects) -> list[Consumer]:
    s = subjects

    def command(model: type[Command], handle: Callable[[list[Any]], Awaitable[Any]]) -> Consumer:
        return Consumer(s.cmd(model.KIND), "CMD", f"queue-{model.KIND}", model.decode, handle, batch=50,
                        on_malformed=refusal(model.KIND))

    return [
        command(SubmitJob, on_submits),  # submits: a batch per transaction
        command(CancelJob, on_cancels),
        command(RequeueJob, on_requeues),
        Consumer(s.progress_all, "PROGRESS", "queue-progress", None, on_progress, batch=200,
                 read=from_sender(decode_progress)),
        Consumer(s.budget_all, "BUDGET", "queue-budget", BudgetEvent.decode, on_budget, batch=50),
        # Placement needs only each executor's newest heartbeat: one upsert per batch.
        Consumer(s.heartbeat_all, "HB", "queue-heartbeats", None, on_heartbeats, batch=500,
                 read=stamped(from_sender(Heartbeat.decode))),
        Consumer(s.node_all, "NODE", "queue-nodes", NodeEvent.decode, on_node_events, batch=100,
                 accepts=node_events_only),
        command(SetGangPolicy, on_gang_policies),
        command(SetOrganisation, on_organisations),
        command(SetProject, on_projects),
        command(SetCohort, on_cohorts),
    ]


async def renew(req: LeaseRenewRequest, runs: Runs = Context()) -> LeaseRenewReply:
    return await runs.renew(req)


def responders(subjects: Subjects) -> list[Responder]:
    return [Responder(subjects.rpc_lease_renew, "queue", LeaseRenewRequest.decode, renew,
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
