"""The queue's handlers on FastStream's in-memory broker: malformed input is refused visibly and answered where
it can be, and the handler goes on serving; well-formed input reaches the service objects decoded."""

from __future__ import annotations

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from libs.contracts.commands import SubmitJob
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.telemetry import RunStarted
from libs.runtime.service import Runtime
from services.queue.handlers import build_router
from services.queue.settings import QueueSettings

pytestmark = pytest.mark.broker


class Recorder:
    """Stands in for Commands and Runs: records what the handlers hand over."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def __getattr__(self, name: str):
        async def record(*args):
            self.calls.append((name, args[0] if len(args) == 1 else args))
            if name == "renew":
                return LeaseRenewReply(ok=True)
        return record


@pytest.fixture
def parts():
    settings = QueueSettings.from_env(env={})
    runtime = Runtime(name="queue", settings=settings, pool=None, nc=None, js=None)  # type: ignore[arg-type]
    commands, runs = Recorder(), Recorder()
    broker = NatsBroker()
    broker.include_router(build_router(runtime, commands, runs))
    return runtime, commands, runs, broker


async def test_a_malformed_command_is_refused_answered_and_the_next_one_still_served(parts):
    runtime, commands, _, broker = parts
    s = runtime.subjects
    async with TestNatsBroker(broker) as br:
        await br.publish(b'{"schema": "teto.cmd.submit/1", "command_id": "c1", "actor": 7}', s.cmd("submit"))
        assert runtime.rejected == 1
        ((name, args),) = commands.calls
        assert name == "refuse_malformed" and args[0] == "submit" and "actor" in args[2] and "spec" in args[2]
        good = SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}})
        await br.publish(good.encode(), s.cmd("submit"))
        assert commands.calls[-1] == ("submit", good)
        assert runtime.rejected == 1


@pytest.mark.parametrize("body", [b"not json", b'{"kind": "teleport"}', b"[1, 2]", b'{"kind": "started"}'],
                         ids=["not json", "unknown kind", "not an object", "missing fields"])
async def test_malformed_progress_is_refused_and_never_applied(parts, body):
    runtime, _, runs, broker = parts
    async with TestNatsBroker(broker) as br:
        await br.publish(body, runtime.subjects.progress("j1"))
        assert runtime.rejected == 1 and runs.calls == []
        started = RunStarted(job_id="j1", epoch=1, executor_id="ex")
        await br.publish(started.encode(), runtime.subjects.progress("j1"))
        assert runs.calls == [("progress", started)]


async def test_a_malformed_renewal_gets_a_refusal_not_silence(parts):
    runtime, _, runs, broker = parts
    async with TestNatsBroker(broker) as br:
        bad = await br.request(b'{"job_id": 5}', runtime.subjects.rpc_lease_renew)
        reply = LeaseRenewReply.decode(bad.body)
        assert reply.ok is False and "malformed" in reply.reason and runs.calls == []
        good = LeaseRenewRequest(job_id="j1", epoch=1, executor_id="ex")
        ok = await br.request(good.encode(), runtime.subjects.rpc_lease_renew)
        assert runs.calls == [("renew", good)] and LeaseRenewReply.decode(ok.body).ok is True
