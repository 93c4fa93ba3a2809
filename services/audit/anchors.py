"""Anchoring the audit chain outside the database, and verifying the log against the anchors (the audit service's
I/O around domain/anchoring.py).

- ``Anchorer``: a singleton loop publishes the chain head to ``teto.audit.anchor`` (stream ``AUDIT_ANCHOR``: no
  message delete, no purge, no age or count limit) every ``anchor_seconds`` when it moved, and once at shutdown.
  Replicas do not duplicate it (one leader); a duplicate at shutdown is dropped by the message id.
- ``verify_log``: reads every anchor, checks them against the table, then recomputes the chain and every mac. It
  needs the key, so it runs here and answers ``teto.rpc.audit.verify`` (the gateway and ``teto audit verify``
  ask it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from faststream import Context
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from libs.contracts.audit import AuditAnchor, AuditVerifyReply, AuditVerifyRequest
from libs.contracts.envelope import ContractError
from libs.contracts.subjects import Subjects
from libs.runtime import bus
from libs.runtime.edge_reply import Responder
from libs.runtime.service import Runtime

from . import store
from .domain import anchoring

log = logging.getLogger(__name__)

ANCHOR_STREAM = "AUDIT_ANCHOR"
READ_TIMEOUT = 10.0


class Anchorer:
    def __init__(self, runtime: Runtime, key: bytes | None) -> None:
        self.runtime = runtime
        self.key = key
        self.last_seq: int | None = None
        self.published = 0

    @property
    def stream(self) -> str:
        return self.runtime.subjects.stream_name(ANCHOR_STREAM)

    async def _last_anchored(self) -> int | None:
        try:
            msg = await self.runtime.js.get_last_msg(self.stream, self.runtime.subjects.audit_anchor)
        except NotFoundError:
            return None
        try:
            return AuditAnchor.decode(msg.data).seq
        except ContractError:  # junk published after the last anchor: verify names it; anchor the head anew
            return None

    async def anchor(self) -> AuditAnchor | None:
        """Publish the chain head if it moved since the last anchor; returns the anchor published, if any."""
        if self.last_seq is None:
            self.last_seq = await self._last_anchored() or 0
        async with self.runtime.pool.acquire() as conn:
            head = await store.head(conn)
        if not anchoring.worth_anchoring(head and head["seq"], self.last_seq):
            if head is not None and head["seq"] < self.last_seq:
                log.error("the audit log ends at seq %d but seq %d was anchored: rows were removed (verify names it)",
                          head["seq"], self.last_seq)
            return None
        anchor = AuditAnchor(**anchoring.make_anchor(head, self.key))
        await bus.publish(self.runtime.js, self.runtime.subjects.audit_anchor, anchor,
                          msg_id=f"audit-anchor-{anchor.seq}-{anchor.hash[:16]}")
        self.last_seq = anchor.seq
        self.published += 1
        log.info("audit chain anchored at seq %d", anchor.seq)
        return anchor

    async def loop(self, every: float) -> None:
        """Anchor every ``every`` seconds, the first time one period after taking over (a clean stop anchored
        the head already; after a crash the first period's rows are covered by their macs meanwhile)."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.anchor()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next tick anchors the head then
                log.warning("audit anchor not published (%r); next try in %.0fs", exc, every)


async def read_anchors(runtime: Runtime) -> tuple[list[dict[str, Any]], list[str]]:
    """Every anchor in stream order (with ``stream_seq``), and what is wrong with the stream's configuration (a
    weakened stream no longer keeps the anchors)."""
    js, name = runtime.js, runtime.subjects.stream_name(ANCHOR_STREAM)
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        return [], [f"the anchor stream {name} does not exist (deleted)"]
    cfg, state = info.config, info.state
    weak = [f"{what} is off" for what, on in (("deny_delete", cfg.deny_delete), ("deny_purge", cfg.deny_purge))
            if not on]
    weak += [f"{what} is {value}" for what, value in (("max_age", cfg.max_age), ("max_msgs", cfg.max_msgs),
                                                      ("max_bytes", cfg.max_bytes)) if value and value > 0]
    if cfg.allow_rollup_hdrs:
        weak.append("rollup headers are allowed (a rollup purges)")
    anchors: list[dict[str, Any]] = []
    if not state.messages:
        return anchors, weak
    sub = await js.subscribe(runtime.subjects.audit_anchor, stream=name, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=READ_TIMEOUT)
            except (NatsTimeout, asyncio.TimeoutError):
                raise TimeoutError(f"reading the anchor stream stopped after {len(anchors)} of {state.messages}")
            seq = msg.metadata.sequence.stream
            try:
                anchors.append({**AuditAnchor.decode(msg.data).model_dump(), "stream_seq": seq})
            except ContractError as exc:
                log.error("anchor stream message %d is not an anchor (%s): who may publish on %s?", seq, exc.reason,
                          msg.subject)
                anchors.append({"stream_seq": seq, "malformed": exc.reason})
            if seq >= state.last_seq:
                return anchors, weak
    finally:
        await sub.unsubscribe()


async def verify_log(runtime: Runtime, key: bytes | None) -> AuditVerifyReply:
    """The anchors against the table first (what they say is where macs begin), then every row's chain and mac."""
    anchors, weak = await read_anchors(runtime)
    async with runtime.pool.acquire() as conn:
        stored, head_seq = await store.hashes_at(conn, [a["seq"] for a in anchors if not a.get("malformed")])
    # Anchors are never deleted, so they run from stream sequence 1: a later start is a removal too.
    found = anchoring.check_anchors(anchors, stored, head_seq, key)
    rows = await store.verify(runtime.pool, key, keyed_from=found.keyed_from)
    first_bad_seq, reason = anchoring.verdict(rows.first_bad_seq, rows.reason, found, weak)
    ok = reason is None
    return AuditVerifyReply(
        ok=ok, checked=rows.checked, first_bad_seq=first_bad_seq, reason=reason, keyed=key is not None,
        macs_checked=rows.macs_checked, pre_key_rows=rows.pre_key_rows, anchors_checked=found.checked,
        unsigned_anchors=found.unsigned, malformed_anchors=found.malformed,
        first_bad_anchor=found.first_bad_anchor, last_anchor_seq=found.last_seq, last_anchor_time=found.last_time,
        head_seq=head_seq)


async def on_verify(_: AuditVerifyRequest, anchorer: Anchorer = Context()) -> AuditVerifyReply:
    """Answers ``teto.rpc.audit.verify`` with the service's anchorer (its runtime and key), from the broker's
    context."""
    reply = await verify_log(anchorer.runtime, anchorer.key)
    if not reply.ok:
        log.error("audit verify: NOT OK at seq %s (anchor %s): %s", reply.first_bad_seq, reply.first_bad_anchor,
                  reply.reason)
    return reply


def responders(subjects: Subjects, queue: str) -> list[Responder]:
    return [Responder(subjects.rpc_audit_verify, queue, AuditVerifyRequest.decode, on_verify,
                      lambda reason: AuditVerifyReply(ok=False, reason=f"malformed verify request: {reason}"))]
