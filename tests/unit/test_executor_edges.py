"""The executor's edges, without a server: a message that can never be sent is dropped and the ones behind it go
out; a grant whose environment cannot be used is refused by name; the agent package stands below the launcher;
the checks see the agent only through their narrow ``Jobs`` interface."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from nats.errors import MaxPayloadError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import BadRequestError

from agents.executor import launch
from agents.executor.publisher import Publisher, can_never_send
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.envelope import ContractError
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.telemetry import CheckpointReport, RunFinished, RunOutcome
from tests.support import builders

ROOT = Path(__file__).resolve().parents[2]
MAX_PAYLOAD = 1 << 20


class FakeJetStream:
    """Acks what fits the server's max payload; refuses the rest the way nats-py does, before sending."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.acked: list[tuple[str, bytes]] = []
        self.fail_first = fail_first

    async def publish(self, subject, data, headers=None, timeout=None):  # noqa: ANN001 - nats-py's signature
        if len(data) > MAX_PAYLOAD:
            raise MaxPayloadError
        if self.fail_first:
            self.fail_first -= 1
            raise NatsTimeout
        self.acked.append((subject, data))


@pytest.mark.parametrize("exc, never", [
    (MaxPayloadError(), True), (BadRequestError(), True), (ContractError("s/1", "bad"), True),
    (ValueError("cannot serialise"), True), (NatsTimeout(), False), (ConnectionError(), False),
    (OSError("unreachable"), False)], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_only_errors_that_a_retry_would_meet_again_make_a_message_undeliverable(exc, never):
    assert can_never_send(exc) is never


async def test_a_message_over_the_max_payload_is_dropped_and_the_ones_behind_it_still_go_out():
    js = FakeJetStream()
    pub = Publisher(js, timeout=1.0, retry_seconds=0.01)
    task = asyncio.create_task(pub.run())
    try:
        # The contracts now bound a path to 4 KiB; built unchecked, this stands for any message over the limit.
        oversized = builders.checkpoint_report(5, path="/ckpt/a").model_copy(
            update={"path": "/ckpt/" + "x" * MAX_PAYLOAD})
        huge = pub.send("p.j1", oversized)
        finished = pub.send("p.j1", RunFinished(job_id="j1", epoch=1, executor_id="ex-1",
                                                outcome=RunOutcome.SUCCEEDED, exit_code=0))
        assert await asyncio.wait_for(huge, 5) is False
        assert await asyncio.wait_for(finished, 5) is True
    finally:
        task.cancel()
    assert pub.undeliverable == 1 and pub.dropped == 0
    assert [RunFinished.decode(data).outcome for _, data in js.acked] == [RunOutcome.SUCCEEDED]


async def test_a_message_that_fails_for_now_is_retried_in_order_not_dropped():
    js = FakeJetStream(fail_first=3)
    pub = Publisher(js, timeout=1.0, retry_seconds=0.01)
    task = asyncio.create_task(pub.run())
    try:
        first = pub.send("p.j1", builders.checkpoint_report(5, path="/ckpt/a"))
        second = pub.send("p.j1", builders.checkpoint_report(5, path="/ckpt/b"))
        assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [True, True]
    finally:
        task.cancel()
    assert pub.undeliverable == 0 and pub.failures == 3
    assert [CheckpointReport.decode(data).path for _, data in js.acked] == ["/ckpt/a", "/ckpt/b"]


def _grant(env: dict[str, str]) -> RunJob:
    # The env is set without validation: the wire contract may refuse such names, the agent must not rely on it.
    valid = CommandWorkload(command=["true"])
    grant = RunJob(job_id="j1", epoch=1, executor_id="ex-1", attempt=1, lease_seconds=6, heartbeat_seconds=1,
                   spec=JobSpec(workload=valid))
    spec = grant.spec.model_copy(update={"workload": valid.model_copy(update={"env": env})})
    return grant.model_copy(update={"spec": spec})


@pytest.mark.parametrize("env, says", [
    ({"A=B": "1"}, "'A=B' is not valid"), ({"": "1"}, "'' is not valid"), ({"1X": "1"}, "'1X' is not valid"),
    ({"GOOD": "a\0b"}, "GOOD' contains a NUL")], ids=["equals", "empty", "digit-first", "nul-value"])
def test_an_environment_execve_would_refuse_is_refused_by_name(tmp_path, env, says):
    settings = ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1")
    grant = _grant(env)
    with pytest.raises(launch.CannotStart) as caught:
        launch.build(grant, settings, [], resume_from=None, base_env={})
    assert says in launch.cannot_start(grant, caught.value)


def test_a_program_that_cannot_run_is_named_in_the_error():
    grant = _grant({})
    text = launch.cannot_start(grant, PermissionError(13, "Permission denied"))
    assert text.startswith("cannot start 'true': PermissionError") and "Permission denied" in text


def test_agents_services_and_libs_never_import_the_launcher():
    out = subprocess.run(["grep", "-rlE", "import teto|from teto", "agents", "services", "libs"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.stdout == ""


def test_the_sdk_keeps_its_public_name_and_is_the_agent_packages_module():
    code = ("import teto.sdk, agents.executor.sdk as impl; from teto import sdk\n"
            "assert sdk.report_step is impl.report_step and teto.sdk.EXIT_PEER_LOST == 76\n"
            "import sys; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_agent_and_its_checks_do_not_import_each_other():
    agent_src = (ROOT / "agents/executor/agent.py").read_text()
    handler_src = (ROOT / "agents/executor/checks/handler.py").read_text()
    assert "agent import" not in handler_src and ".agent" not in handler_src
    assert "checks.handler import NodeChecks\n" in agent_src  # one direction only, and only the class
