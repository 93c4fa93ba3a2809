"""Hand-made JetStream messages, a reporter that records refusals and dead letters, and a handler that records
its batches: what the edge's unit tests (tests/unit/test_edge_*.py) drive ``ConsumerLoop`` with."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from libs.contracts.dead import DeadLetter
from libs.contracts.envelope import ContractError
from libs.contracts.subjects import Subjects
from libs.runtime.edge import Consumer
from libs.runtime.edge_loop import ConsumerLoop


@dataclass
class FakeMsg:
    data: bytes
    subject: str = "teto.hb.x"
    delivered: int = 1
    seq: int = 1
    headers: dict[str, str] | None = None
    settled: list[tuple[str, float | None]] = field(default_factory=list)
    extended: int = 0

    @property
    def metadata(self):
        return SimpleNamespace(num_delivered=self.delivered, sequence=SimpleNamespace(stream=self.seq))

    @property
    def reply(self) -> str:
        """The ack subject JetStream gives a delivery (its count and stream sequence in it, as the edge reads)."""
        return f"$JS.ACK.TEST.durable.{self.delivered}.{self.seq}.{self.seq}.1764590000000000000.0"

    async def ack(self):
        self.settled.append(("ack", None))

    async def nak(self, delay=None):
        self.settled.append(("nak", delay))

    async def term(self):
        self.settled.append(("term", None))

    async def in_progress(self):
        self.extended += 1

    @property
    def outcome(self) -> str:
        (what, _), = self.settled
        return what


@dataclass
class FakeReporter:
    name: str = "svc"
    rejected: list[tuple[str, bytes, str]] = field(default_factory=list)
    buried: list[DeadLetter] = field(default_factory=list)
    bury_fails: bool = False

    async def reject(self, subject: str, body: bytes, reason: str) -> None:
        self.rejected.append((subject, body, reason))

    async def bury(self, letter: DeadLetter) -> None:
        if self.bury_fails:
            raise ConnectionError("bus away")
        self.buried.append(letter)


def decode(body: bytes) -> str:
    text = body.decode()
    if text.startswith("malformed"):
        raise ContractError("t/1", "value: not a number")
    return text


def loop(handle, **kw) -> tuple[ConsumerLoop, FakeReporter]:
    reporter = FakeReporter()
    consumer = Consumer("teto.hb.*", "HB", "svc-test", decode, handle, **kw)
    return ConsumerLoop(js=None, subjects=Subjects(), consumer=consumer, reporter=reporter), reporter  # type: ignore[arg-type]


class Recorder:
    def __init__(self, fail_on: dict[str, BaseException] | None = None, fail_batches: BaseException | None = None):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on or {}
        self.fail_batches = fail_batches

    async def __call__(self, items: list[str]) -> None:
        self.calls.append(list(items))
        if self.fail_batches is not None and len(items) > 1:
            raise self.fail_batches
        for item in items:
            if item in self.fail_on:
                raise self.fail_on[item]


def started(broker, sub):
    """What FastStream's ``start`` prepares for handling a declared subscriber of ``broker``, without subscribing (no
    server here): its handler then runs through ``process_message`` with the broker's context."""
    from faststream._internal.endpoint.subscriber.utils import MultiLock

    broker._setup_logger()
    sub._build_fastdepends_model()
    sub.lock = MultiLock()
    return sub
