"""One run's output on its way to the bus (agents/executor/logsender.py), with a stand-in JetStream: writing never
waits, whatever the bus does; a bus that stalls costs output (bounded, the gap marked on the next chunk), never
the process; a refused chunk is retried, then dropped; the final chunk goes out last, with the exit status."""

from __future__ import annotations

import asyncio
import json

import pytest

from agents.executor import logsender
from agents.executor.logsender import RunLog
from agents.executor.logship import LogLimits
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.logs import LogStream
from libs.contracts.subjects import Subjects
from tests.support.services import eventually

pytestmark = pytest.mark.unit

GRANT = RunJob(job_id="j1", epoch=2, executor_id="ex-a", attempt=3, rank=1, world_size=2, lease_seconds=6,
               heartbeat_seconds=1, spec=JobSpec(workload=CommandWorkload(command=["true"])))


class Bus:
    """Acknowledges what it is sent, while ``open``; ``refuse`` makes the next publishes fail."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.refuse = 0
        self.sent: list[tuple[str, dict]] = []

    async def publish(self, subject: str, data: bytes, headers=None, timeout=None) -> None:
        await self.open.wait()
        if self.refuse:
            self.refuse -= 1
            raise TimeoutError("no ack")
        self.sent.append((subject, json.loads(data)))


def limits(**kw) -> LogLimits:
    return LogLimits(**{"chunk_bytes": 1024, "flush_seconds": 0.05, "max_bytes": 10**9, "buffer_bytes": 65536, **kw})


async def test_chunks_go_to_the_runs_subject_with_the_grant_and_the_final_one_last():
    bus = Bus()
    run = RunLog(bus, Subjects("teto"), GRANT, "ex-a", limits())
    run.write(LogStream.STDOUT, b"hello\n")
    run.write(LogStream.STDERR, b"oops\n")
    assert await run.close(exit_code=3, timeout=5)
    subjects = {s for s, _ in bus.sent}
    assert subjects == {"teto.logs.j1.3.1.ex-a"}
    bodies = [b for _, b in bus.sent]
    assert {(b["stream"], b["text"]) for b in bodies[:-1]} == {("stdout", "hello\n"), ("stderr", "oops\n")}
    final = bodies[-1]
    assert final["final"] and final["exit_code"] == 3 and (final["attempt"], final["rank"], final["epoch"]) == (3, 1, 2)
    assert [t["text"] for t in final["tail"]] == ["hello", "oops"]


async def test_output_waits_at_most_the_flush_time():
    bus = Bus()
    run = RunLog(bus, Subjects("teto"), GRANT, "ex-a", limits(flush_seconds=0.1))
    run.write(LogStream.STDOUT, b"partial line without newline")
    await eventually(lambda: bus.sent, timeout=2.0, what="the partial line to be sent", every=0.01)
    assert bus.sent[0][1]["text"] == "partial line without newline"
    await run.close(exit_code=0, timeout=5)


async def test_a_stalled_bus_never_holds_the_writer_and_the_lost_output_is_marked_when_it_returns():
    bus = Bus()
    bus.open.clear()  # every publish waits
    run = RunLog(bus, Subjects("teto"), GRANT, "ex-a", limits(chunk_bytes=1000, buffer_bytes=65536))
    line = b"x" * 999 + b"\n"
    for _ in range(1000):  # 1 MB, far more than the backlog holds; write() returns at once every time
        run.write(LogStream.STDOUT, line)
    assert run.backlog.bytes <= 65536 and run.backlog.dropped > 900_000
    bus.open.set()
    assert await run.close(exit_code=0, timeout=10)
    bodies = [b for _, b in bus.sent if b["stream"] == "stdout"]  # the final chunk included: the gap before it
    shipped = sum(len(b["text"]) for b in bodies)
    gaps = sum(b["dropped_bytes"] for b in bodies)
    assert gaps > 0 and shipped + gaps == 1_000_000  # every byte either shipped or counted as missing
    assert bodies[-1]["final"] and bodies[-1]["dropped_bytes"] > 0


async def test_a_refused_chunk_is_retried_then_dropped_and_the_next_one_says_so(monkeypatch):
    monkeypatch.setattr(logsender, "SEND_TRIES", 2)
    bus = Bus()
    run = RunLog(bus, Subjects("teto"), GRANT, "ex-a", limits(flush_seconds=0.01))
    bus.refuse = 1
    run.write(LogStream.STDOUT, b"first\n")  # refused once, then sent
    await eventually(lambda: bus.sent, timeout=3.0, what="the first chunk to be sent", every=0.01)
    assert bus.sent[-1][1]["text"] == "first\n"
    bus.refuse = 2
    run.write(LogStream.STDOUT, b"lost\n")  # refused twice: dropped
    await eventually(lambda: run.lost, timeout=3.0, what="the refused chunk to be dropped", every=0.01)
    run.write(LogStream.STDOUT, b"after\n")
    assert await run.close(exit_code=0, timeout=5)
    after = next(b for _, b in bus.sent if b["text"] == "after\n")
    assert after["dropped_bytes"] == len(b"lost\n") and run.lost == 1


async def test_close_gives_up_after_its_timeout_when_the_bus_is_gone():
    bus = Bus()
    bus.open.clear()
    run = RunLog(bus, Subjects("teto"), GRANT, "ex-a", limits())
    run.write(LogStream.STDOUT, b"never shipped\n")
    assert await run.close(exit_code=1, timeout=0.2) is False
