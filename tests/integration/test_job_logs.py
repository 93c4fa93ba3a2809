"""A job's output through the real parts: the queue grants it to a real agent, whose process prints to stdout and
stderr; the agent ships the chunks on real NATS; the gateway reads them back (pages in order, the stream filter,
follow until the job ends, the tail of a failed job), to the job's owner and ``read:all`` only. Apart, against
real NATS: a run's limit truncates with its markers, and a chunk from an executor never granted the run is not
shown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
import nats
import pytest

from agents.executor.logsender import RunLog
from agents.executor.logship import LogLimits
from agents.executor.main import serve as agent_serve
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.logs import LogChunk, LogStream
from libs.runtime import bus
from libs.runtime.service import Runtime
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.logs import JobLogs, Query
from services.gateway.settings import GatewaySettings
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import client, queue_service
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.integration

CHATTY = """
import sys, time
for i in range(5):
    print(f"out {i}", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.05)
print("Traceback (most recent call last): ValueError: boom", file=sys.stderr)
sys.exit(3)
"""
TICKING = """
import time
for i in range(8):
    print(f"tick {i}", flush=True)
    time.sleep(0.3)
"""


class Stack(SimpleNamespace):
    http: httpx.AsyncClient
    tokens: dict[str, str]

    def as_(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    async def submit(self, code: str, **spec) -> str:
        body = {"name": "logs", "workload": {"kind": "command", "command": [sys.executable, "-c", code]},
                "max_attempts": 1, **spec}
        resp = await self.http.post("/v1/jobs", json=body, headers=self.as_("operator"))
        assert resp.status_code == 201, resp.text
        return resp.json()["id"]

    async def wait_state(self, job_id: str, state: str, timeout: float = 90.0) -> dict:
        async def reached() -> dict | None:
            job = (await self.http.get(f"/v1/jobs/{job_id}", headers=self.as_("operator"))).json()
            return job if job["state"] == state else None
        return await eventually(reached, timeout, f"job {job_id} {state}", every=0.2)


@contextlib.asynccontextmanager
async def stack(env) -> AsyncIterator[Stack]:
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.1, scan_interval_seconds=0.2,
                      require_checked_nodes=False)
    es = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", progress_interval_seconds=0.5,
                      torch_threads=1, log_flush_seconds=0.2)
    gs = env.settings(GatewaySettings, command_timeout_seconds=10.0)
    ready = asyncio.Event()
    async with queue_service(qs), client(qs):
        agent = asyncio.create_task(agent_serve(es, ready=ready))
        rt = await Runtime.open("gateway", gs, schema="gateway", package="services.gateway")
        try:
            await asyncio.wait_for(ready.wait(), 30)
            tokens = {r.value: auth.create_token(gs.effective_tokens_file, f"{r.value}-actor", r) for r in auth.Role}
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(gs, rt)),
                                         base_url="http://gw", timeout=120) as http:
                yield Stack(http=http, tokens=tokens, rt=rt, executor_id=es.executor_id)
        finally:
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await agent
            await rt.close()


def texts(chunks: list[dict], stream: str) -> str:
    return "".join(c["text"] for c in chunks if c["stream"] == stream)


async def test_a_jobs_output_reaches_its_owner_in_order_and_a_failed_job_carries_its_tail(env):
    async with stack(env) as s:
        job_id = await s.submit(CHATTY)
        job = await s.wait_state(job_id, "failed")

        tail = job["log_tail"]
        assert tail["attempt"] == 1 and tail["rank"] == 0 and tail["exit_code"] == 3 and tail["complete"]
        assert tail["lines"][-1] == {"stream": "stderr", "text": "Traceback (most recent call last): ValueError: boom"}
        assert {"stream": "stdout", "text": "out 4"} in tail["lines"]

        page = (await s.http.get(f"/v1/jobs/{job_id}/logs", headers=s.as_("operator"))).json()
        chunks = page["chunks"]
        assert page["state"] == "failed" and page["more"] is False
        assert texts(chunks, "stdout") == "".join(f"out {i}\n" for i in range(5))
        assert texts(chunks, "stderr") == "".join(f"err {i}\n" for i in range(5)) + \
            "Traceback (most recent call last): ValueError: boom\n"
        assert [c["seq"] for c in chunks] == sorted(c["seq"] for c in chunks)
        assert chunks[-1]["final"] and chunks[-1]["notice"] == "[teto: attempt 1 rank 0 ended: exit status 3]"
        assert {(c["attempt"], c["rank"], c["executor_id"]) for c in chunks} == {(1, 0, s.executor_id)}

        # Pages of one chunk, by the cursor, read the same chunks.
        paged, after = [], 0
        while True:
            p = (await s.http.get(f"/v1/jobs/{job_id}/logs", params={"after_seq": after, "limit": 1},
                                  headers=s.as_("operator"))).json()
            paged += p["chunks"]
            after = p["next_after_seq"]
            if not p["more"]:
                break
        assert paged == chunks

        errs = (await s.http.get(f"/v1/jobs/{job_id}/logs", params={"stream": "stderr", "attempt": 1, "rank": 0},
                                 headers=s.as_("operator"))).json()["chunks"]
        assert texts(errs, "stdout") == "" and texts(errs, "stderr") == texts(chunks, "stderr")
        assert (await s.http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 2},
                                 headers=s.as_("operator"))).json()["chunks"] == []

        # Scoping: read:all reads it; another submitter or a viewer gets the 404 of a job that does not exist.
        assert (await s.http.get(f"/v1/jobs/{job_id}/logs", headers=s.as_("auditor"))).status_code == 200
        for role in ("submitter", "viewer"):
            for params in ({}, {"follow": "true"}):
                resp = await s.http.get(f"/v1/jobs/{job_id}/logs", params=params, headers=s.as_(role))
                assert resp.status_code == 404, (role, params, resp.text)
        assert (await s.http.get(f"/v1/jobs/{job_id}/logs")).status_code == 401

        # A job that succeeds has no tail; following it from before it runs streams its lines and ends with it.
        ticking = await s.submit(TICKING)
        resp = await s.http.get(f"/v1/jobs/{ticking}/logs", params={"follow": "true"}, headers=s.as_("operator"))
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/x-ndjson")
        items = [json.loads(line) for line in resp.text.splitlines()]
        assert items[-1]["type"] == "end" and items[-1]["state"] == "succeeded"
        assert texts([i for i in items if i["type"] == "chunk"], "stdout") == "".join(f"tick {i}\n" for i in range(8))
        done = (await s.http.get(f"/v1/jobs/{ticking}", headers=s.as_("operator"))).json()
        assert done["state"] == "succeeded" and done["log_tail"] is None
        # Following a job that has ended returns what it wrote and ends at once.
        again = await s.http.get(f"/v1/jobs/{ticking}/logs", params={"follow": "true", "stream": "stdout"},
                                 headers=s.as_("auditor"))
        assert [json.loads(line)["type"] for line in again.text.splitlines()][-1] == "end"


def grant(job_id: str, executor_id: str, attempt: int = 1) -> RunJob:
    return builders.grant(job_id=job_id, executor_id=executor_id, attempt=attempt)


async def test_the_run_limit_truncates_with_markers_and_an_ungranted_executors_chunks_are_not_shown(env):
    settings = env.settings()
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        subjects = settings.subjects
        await bus.ensure_streams(js, subjects)
        reader = JobLogs(SimpleNamespace(js=js, subjects=subjects))
        job_id = uuid.uuid4().hex
        run = RunLog(js, subjects, grant(job_id, "ex-a"), "ex-a",
                     LogLimits(chunk_bytes=256, flush_seconds=0.1, max_bytes=1024, buffer_bytes=65536))
        for i in range(100):
            run.write(LogStream.STDOUT, f"line {i:04d} ".encode() + b"." * 39 + b"\n")  # 50 bytes a line
        run.write(LogStream.STDERR, b"late error\n")
        assert await run.close(exit_code=0, timeout=10)
        # An executor the queue never granted this job publishes under its own id: not the job's output.
        await bus.publish(js, subjects.logs(job_id, 1, 0, "ex-z"),
                          LogChunk(job_id=job_id, epoch=1, attempt=1, rank=0, executor_id="ex-z",
                                   stream=LogStream.STDOUT, offset=0, text="forged\n"))

        page = await reader.page(Query(job_id), {(1, 0): "ex-a"}, after_seq=0, limit=1000)
        chunks = [c for _, c in page.chunks]
        shipped = "".join(c.text for c in chunks)
        assert len(shipped.encode()) == 1024 and shipped.startswith("line 0000 ") and "forged" not in shipped
        cut = [c for c in chunks if c.truncated and c.text]
        assert len(cut) == 1 and cut[0].stream is LogStream.STDOUT
        markers = {c.stream: c.dropped_bytes for c in chunks if c.truncated and not c.text and not c.final}
        assert markers == {LogStream.STDOUT: 100 * 50 - 1024, LogStream.STDERR: 11}
        final = chunks[-1]
        assert final.final and final.truncated and final.exit_code == 0
        assert [t.text for t in final.tail][-2:] == ["line 0099 " + "." * 39, "late error"]
        # The tail a failed job would show is read from the granted executor's subject.
        last = await reader.last(job_id, 1, 0, {(1, 0): "ex-a"})
        assert last is not None and last.final
        assert await reader.last(job_id, 1, 0, {}) is None
    finally:
        await nc.close()


async def test_a_process_output_reaches_both_the_local_log_file_and_the_shipping(tmp_path):
    from agents.executor.process import Launch
    from agents.executor.runner import Child

    got: list[tuple[LogStream, bytes]] = []
    code = "import sys\nfor i in range(3000): print('o' * 99)\nsys.stderr.write('bad\\n')\nsys.exit(2)"
    launch = Launch(argv=[sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "run.log")
    child = await Child.start(launch, lambda record: None, on_output=lambda s, b: got.append((s, b)))
    assert await child.wait() == 2
    out = b"".join(b for s, b in got if s is LogStream.STDOUT)
    assert out == (b"o" * 99 + b"\n") * 3000
    assert b"".join(b for s, b in got if s is LogStream.STDERR) == b"bad\n"
    written = (tmp_path / "run.log").read_bytes()
    # Both streams in one file, interleaved as read (a read of one may fall inside a line of the other).
    assert written.count(b"bad\n") == 1 and written.replace(b"bad\n", b"", 1) == out
    assert child.stderr_tail() == "bad\n"
