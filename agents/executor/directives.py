"""The agent's directives (``teto.agent.<executor_id>.<run|stop|check|reboot>``) as the one subscriber of the
agent's FastStream app: its own durable ``agent-<executor_id>`` on the agents' stream, one directive per fetch.

Every directive is acknowledged on receipt by the agent (``Agent.on_directive``) and then acted on in this process,
so only a crash between fetch and ack redelivers one; the delivery limit bounds even that. A directive the agent
cannot handle at all, however hostile, is terminated and never stops the agent. The fetch loop keeps trying while
the server is away (``DirectiveSubscriber``): FastStream's own loop would end its task on an unexpected fetch error
and restart it at once, without a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.subscriber.usecases.stream_pull_subscriber import PullStreamSubscriber
from nats.aio.msg import Msg
from nats.js.api import AckPolicy as JsAckPolicy, ConsumerConfig

from libs.contracts.agents import RunJob, StopJob
from libs.contracts.nodes import RebootNode, RunChecks
from libs.contracts.subjects import Subjects
from libs.runtime.edge_stream import injected, provide, raw_decoder, raw_parser

log = logging.getLogger(__name__)

FETCH_TIMEOUT_SECONDS = 1.0  # one waiting pull: no probe, no status reply a job
RETRY_SECONDS = 0.5


class DirectiveSubscriber(PullStreamSubscriber):
    """FastStream's pull subscriber, one message per fetch, whose loop pauses and goes on after any fetch error."""

    __slots__ = ()

    async def _consume_pull(self, cb: Callable[[Msg], Awaitable[Any]]) -> None:
        while self.running:
            try:
                msgs = await self.subscription.fetch(1, timeout=FETCH_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:  # nats.errors.TimeoutError is one too
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - server gone for a while: keep trying
                log.debug("directive fetch failed: %r", exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            for msg in msgs:
                await cb(msg)


class Directed(Protocol):
    """What takes the directives: the agent (``agent`` in its broker's context)."""

    async def on_directive(self, msg: Msg) -> None: ...


async def on_directive(msg: Msg, agent: Directed = Context()) -> None:
    """The agent's directive handler: the agent it is addressed to comes from the broker's context."""
    await agent.on_directive(msg)


def declare(broker: NatsBroker, subjects: Subjects, subject: str, durable: str,
            on_directive: Callable[..., Awaitable[None]] | None, **context: Any) -> Any:
    """The directive subscriber on ``broker`` (``on_directive`` None: declared for the AsyncAPI document only); the
    handler gets its dependencies from the broker's context, where ``context`` is put (the agent: ``agent=``;
    libs/runtime/edge_stream.py)."""
    provide(broker, **context)
    stream = subjects.stream_name("AGENT")
    sub = broker.subscriber(subject, stream=JStream(stream, declare=False), durable=durable,
                            config=ConsumerConfig(ack_policy=JsAckPolicy.EXPLICIT, max_deliver=5, ack_wait=30.0),
                            pull_sub=PullSub(1, FETCH_TIMEOUT_SECONDS), ack_policy=AckPolicy.MANUAL,
                            # None: nats-py's pull requests use the connection's own inbox prefix (the per-user
                            # ``_INBOX.<user>`` the bus allows this agent, docs/security/bus.md); FastStream's
                            # default names the shared ``_INBOX.``, which the bus refuses an executor.
                            inbox_prefix=None,  # type: ignore[arg-type]
                            parser=raw_parser, decoder=raw_decoder, no_reply=True, title="agent-directives",
                            description=f"executor: durable `{durable}` on stream `{stream}`, one directive at "
                                        "a time")
    sub.__class__ = DirectiveSubscriber  # FastStream's pull subscriber with the loop above (no new state)

    call = injected(broker, on_directive) if on_directive is not None else None

    async def directive(msg: Any) -> None:
        if call is None:
            return
        try:
            await call(msg)
        except Exception:  # noqa: BLE001 - one directive, however hostile, never stops the agent
            log.exception("directive on %s could not be handled; dropped", msg.subject)
            with contextlib.suppress(Exception):
                await msg.term()

    directive.__annotations__ = {"msg": RunJob | StopJob | RunChecks | RebootNode}
    sub(directive)
    return sub
