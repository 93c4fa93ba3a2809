"""Dead letters as operators read and replay them: a reader over the DEAD stream (``teto.dead.<service>``).

The stream is the store: the edge publishes each dead letter there with the original subject, headers and
payload. Listing pages by stream sequence; replay republishes the original payload to its original subject
with a fresh message id (so JetStream does not drop it as a duplicate of the first delivery) and the original
headers otherwise, once the cause has been fixed.

The gateway replays as itself, so only what it may publish (commands, and the refusals it decides at the edge:
libs/runtime/natsauth.py): a heartbeat, a job event or usage is published only by its own part (an executor, the
queue, ...), and the bus would refuse the gateway's copy. Such a letter says why it cannot be replayed (``view``,
``refusal``) instead of the replay waiting for an acknowledgement that never comes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from nats.js.errors import NotFoundError

from libs.contracts.dead import DeadLetter
from libs.contracts.envelope import ContractError, new_id
from libs.contracts.subjects import DEFAULT_PREFIX
from libs.runtime import natsauth
from libs.runtime.service import Runtime


@dataclass(frozen=True)
class Replayed:
    seq: int
    subject: str
    msg_id: str


@functools.cache
def _gateway_publishes(prefix: str) -> tuple[str, ...]:
    return natsauth.permissions("gateway", prefix).publish


def refusal(seq: int, letter: DeadLetter, prefix: str = DEFAULT_PREFIX) -> str | None:
    """Why the gateway cannot publish ``letter`` again (None: it can). Pure."""
    if letter.truncated:
        return (f"dead letter {seq} kept only the first {len(letter.payload)} of {letter.payload_bytes} bytes; it "
                "cannot be replayed")
    if not natsauth.allows(_gateway_publishes(prefix), letter.subject):
        return (f"dead letter {seq} came on {letter.subject}, which only the part that sent it may publish (the "
                "gateway publishes commands): that part must send it again")
    return None


def view(seq: int, letter: DeadLetter, prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """A dead letter as the API shows it: the payload as text when it is text (hostile bytes stay escaped), and
    whether it can be replayed, with why not."""
    payload = letter.payload
    try:
        text: str | None = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    refused = refusal(seq, letter, prefix)
    return {"seq": seq, "time": letter.time, "service": letter.service, "consumer": letter.consumer,
            "cause": letter.cause.value, "reason": letter.reason, "subject": letter.subject,
            "deliveries": letter.deliveries, "stream_seq": letter.stream_seq, "headers": letter.headers,
            "payload_bytes": letter.payload_bytes, "truncated": letter.truncated,
            "payload": text[:4096].replace("\x00", "\\u0000") if text is not None else None,
            "payload_b64": None if text is not None else letter.payload_b64[:8192],
            "replayable": refused is None, "not_replayable": refused}


class DeadLetters:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.stream = runtime.subjects.stream_name("DEAD")
        self.prefix = runtime.subjects.prefix

    async def list(self, *, service: str | None, after_seq: int, limit: int) -> list[tuple[int, DeadLetter]]:
        subject = self.runtime.subjects.dead(service) if service else self.runtime.subjects.dead_all
        found: list[tuple[int, DeadLetter]] = []
        seq = after_seq + 1
        while len(found) < limit:
            try:
                raw = await self.runtime.js.get_msg(self.stream, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            try:
                found.append((raw.seq, DeadLetter.decode(raw.data or b"")))
            except ContractError:
                pass  # not ours to show (the stream only takes the edge's dead letters)
            seq = raw.seq + 1
        return found

    async def counts(self) -> dict[str, int]:
        """Dead letters kept, per service (the stream's per-subject counts: no message is read)."""
        info = await self.runtime.js.stream_info(self.stream, subjects_filter=self.runtime.subjects.dead_all)
        return {subject.rsplit(".", 1)[-1]: n for subject, n in sorted((info.state.subjects or {}).items())}

    async def get(self, seq: int) -> DeadLetter | None:
        try:
            raw = await self.runtime.js.get_msg(self.stream, seq=seq)
        except NotFoundError:
            return None
        try:
            return DeadLetter.decode(raw.data or b"")
        except ContractError:
            return None

    async def replay(self, seq: int, letter: DeadLetter) -> Replayed:
        headers = {k: v for k, v in letter.headers.items() if not k.lower().startswith("nats-")}
        msg_id = f"replay-{seq}-{new_id()}"
        headers["Nats-Msg-Id"] = msg_id
        headers["Teto-Replay-Of"] = str(seq)
        await self.runtime.js.publish(letter.subject, letter.payload, headers=headers, timeout=15.0)
        return Replayed(seq, letter.subject, msg_id)
