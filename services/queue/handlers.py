"""The queue's FastStream router: commands, progress, heartbeats and budget events from JetStream (durable pull
consumers shared by replicas), and the lease-renewal RPC on core NATS (a queue group, answered by any replica).

Handlers take the raw message and decode it themselves, so malformed or hostile input is refused visibly
(``teto.rejected.queue``) and never redelivered. A transient failure (database away) is nacked with a delay, so
the message comes back later instead of spinning.

Every pull subscriber fetches one message at a time: with faststream 0.7.8 and nats-py 2.16 a multi-message
fetch can end in a plain ``asyncio.TimeoutError`` that FastStream does not catch (it catches
``nats.errors.TimeoutError``), which silently kills the consuming task and strands the fetched message until its
ack wait. A single-message fetch only raises the nats error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsMessage

from libs.contracts.budget import BudgetEvent
from libs.contracts.commands import CancelJob, Command, RequeueJob, SetGangPolicy, SubmitJob
from libs.contracts.envelope import ContractError, schema_of
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import PROGRESS_TYPES, Heartbeat, ProgressBase
from libs.runtime.service import Runtime

from .commands import Commands
from .policy import Policies
from .runs import Runs

log = logging.getLogger(__name__)
RETRY_DELAY_SECONDS = 1.0


def build_router(runtime: Runtime, commands: Commands, runs: Runs, policies: Policies | None = None) -> NatsRouter:
    s = runtime.subjects
    router = NatsRouter()

    def stream(base: str) -> JStream:
        return JStream(s.stream_name(base), declare=False)

    async def guarded(msg: NatsMessage, work: Callable[[], Awaitable[Any]]) -> None:
        try:
            await work()
        except Exception:  # noqa: BLE001 - transient by default: the message is kept and retried later
            log.exception("queue handler failed on %s; retrying in %.0fs", msg.raw_message.subject,
                          RETRY_DELAY_SECONDS)
            await msg.nack(delay=RETRY_DELAY_SECONDS)

    async def command(msg: NatsMessage, model: type[Command], act: Callable[[Any], Awaitable[Any]]) -> None:
        body = msg.body
        try:
            cmd = model.decode(body)
        except ContractError as exc:
            reason = exc.reason
            await guarded(msg, lambda: commands.refuse_malformed(model.KIND, body, reason))
            await runtime.reject(msg.raw_message.subject, body, reason, msg)
            return
        await guarded(msg, lambda: act(cmd))

    def command_subscriber(model: type[Command], act: Callable[[Any], Awaitable[Any]]) -> None:
        @router.subscriber(s.cmd(model.KIND), stream=stream("CMD"), durable=f"queue-{model.KIND}",
                           pull_sub=PullSub(batch_size=1, timeout=1.0), ack_policy=AckPolicy.NACK_ON_ERROR)
        async def on_command(msg: NatsMessage = Context("message")) -> None:
            await command(msg, model, act)

    command_subscriber(SubmitJob, commands.submit)
    command_subscriber(CancelJob, commands.cancel)
    command_subscriber(RequeueJob, commands.requeue)
    if policies is not None:
        command_subscriber(SetGangPolicy, policies.set)

    # One message per fetch: a job's reports are applied in the order they were sent (a checkpoint before the
    # finish that follows it), which FastStream's concurrent handling of a multi-message fetch would not keep.
    @router.subscriber(s.progress_all, stream=stream("PROGRESS"), durable="queue-progress",
                       pull_sub=PullSub(batch_size=1, timeout=1.0), ack_policy=AckPolicy.NACK_ON_ERROR)
    async def on_progress(msg: NatsMessage = Context("message")) -> None:
        report = await decode_progress(runtime, msg.body, msg.raw_message.subject)
        if report is not None:
            await guarded(msg, lambda: runs.progress(report))

    @router.subscriber(s.budget_all, stream=stream("BUDGET"), durable="queue-budget",
                       pull_sub=PullSub(batch_size=1, timeout=1.0), ack_policy=AckPolicy.NACK_ON_ERROR)
    async def on_budget(msg: NatsMessage = Context("message")) -> None:
        event = await runtime.decode(BudgetEvent, msg)
        if event is not None:
            await guarded(msg, lambda: runs.budget(event))

    @router.subscriber(s.heartbeat_all, stream=stream("HB"), durable="queue-heartbeats",
                       pull_sub=PullSub(batch_size=1, timeout=1.0), ack_policy=AckPolicy.NACK_ON_ERROR)
    async def on_heartbeat(msg: NatsMessage = Context("message")) -> None:
        beat = await runtime.decode(Heartbeat, msg)
        if beat is not None:
            await guarded(msg, lambda: runs.heartbeats([beat]))

    # Node events from the health service: which executors' nodes are schedulable. The stream also carries
    # registrations and check reports, which are not for the queue: acknowledged unread.
    @router.subscriber(s.node_all, stream=stream("NODE"), durable="queue-nodes",
                       pull_sub=PullSub(batch_size=1, timeout=1.0), ack_policy=AckPolicy.NACK_ON_ERROR)
    async def on_node_event(msg: NatsMessage = Context("message")) -> None:
        if schema_of(msg.body) != NodeEvent.SCHEMA:
            return
        event = await runtime.decode(NodeEvent, msg)
        if event is not None:
            await guarded(msg, lambda: runs.node_event(event))

    @router.subscriber(s.rpc_lease_renew, queue="queue")
    async def on_renew(msg: NatsMessage = Context("message")) -> bytes:
        request = await runtime.decode(LeaseRenewRequest, msg)
        if request is None:
            return LeaseRenewReply(ok=False, reason="malformed renewal request").encode()
        return (await runs.renew(request)).encode()

    return router


async def decode_progress(runtime: Runtime, body: bytes, subject: str) -> ProgressBase | None:
    """Progress messages share a subject; the ``kind`` field says which contract to read them with."""
    try:
        kind = json.loads(body).get("kind")
        model = PROGRESS_TYPES[kind]
    except (ValueError, AttributeError, KeyError, TypeError):
        await runtime.reject(subject, body, "progress message without a known 'kind'")
        return None
    return await runtime.decode(model, body, subject)
