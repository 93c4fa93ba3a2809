"""Attack 2 (job -> the bus), against a real nats-server running the authorization ``teto up`` generates.

Without credentials nothing connects; with a part's credentials, what its role does not need is refused by the
server: an executor cannot submit commands with a forged actor, report progress or heartbeats as another
executor, stop an agent, answer or read another part's replies, or read another executor's directives; the
gateway cannot grant runs; no part but the queue and health can publish command outcomes of their kinds. What
each part needs still works.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from libs.contracts.subjects import Subjects
from agents.executor import directives
from libs.runtime import bus
from libs.runtime.edge_stream import EdgeBroker
from teto.stack.busauth import LocalBus
from teto.stack.embedded import EmbeddedNats
from tests.support.services import eventually

from .busprobe import Probe, api, publish_is_refused, subscribe_is_refused

S = Subjects("teto")
EX, OTHER = "local-1-aaaaaa", "local-2-bbbbbb"


@dataclass
class AuthBus:
    auth: LocalBus
    server: EmbeddedNats
    executor: Path  # EX's credentials file
    other: Path  # OTHER's

    @property
    def url(self) -> str:
        return self.server.url

    def creds(self, role: str) -> Path:
        return self.auth.creds_file(role)


@pytest.fixture(scope="module")
def authbus(tmp_path_factory) -> Iterator[AuthBus]:
    root = tmp_path_factory.mktemp("authbus")
    auth = LocalBus(root / "nats", "teto")
    server = EmbeddedNats(root / "nats", config=auth.config_path).start()
    auth.server_pid = lambda: server.proc.pid
    auth.monitor_url = server.monitor_url
    mine = auth.executor_env(EX, [])
    theirs = auth.executor_env(OTHER, [EX])
    try:
        yield AuthBus(auth, server, Path(mine["TETO_NATS_CREDENTIALS_FILE"]), Path(theirs["TETO_NATS_CREDENTIALS_FILE"]))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def admin(authbus: AuthBus) -> AsyncIterator[nats.aio.client.Client]:
    nc = await bus.connect(authbus.url, "admin", credentials_file=authbus.creds("admin"))
    await bus.ensure_streams(nc.jetstream(), S)  # the admin alone declares the streams
    yield nc
    await nc.close()


async def probe(authbus: AuthBus, role: str) -> Probe:
    path = {"executor": authbus.executor, "other": authbus.other}.get(role) or authbus.creds(role)
    return await Probe.connect(authbus.url, path)


async def test_without_credentials_or_with_a_wrong_password_nothing_connects(authbus: AuthBus):
    logging.getLogger("nats.aio.client").disabled = True  # nats-py logs every refused connect with a traceback
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(authbus.url, allow_reconnect=False, connect_timeout=5)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(authbus.url, user="admin", password="guess", allow_reconnect=False, connect_timeout=5)
    creds = json.loads(authbus.executor.read_text())
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):  # one executor's password is not another's
        await nats.connect(authbus.url, user=f"executor-{OTHER}", password=creds["password"], allow_reconnect=False)


def test_the_config_and_every_credentials_file_are_private(authbus: AuthBus):
    files = [authbus.auth.config_path, *authbus.auth.creds_dir.glob("*.json")]
    assert len(files) == 1 + 6 + 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert authbus.auth.nats_dir.stat().st_mode & 0o777 == 0o700
    text = authbus.auth.config_path.read_text()
    assert json.loads(authbus.executor.read_text())["password"] not in text and "no_auth_user" not in text


FORGED_SUBMIT = json.dumps({"schema": "teto.cmd.submit/1", "id": "x", "time": "2026-01-01T00:00:00Z",
                            "command_id": "forged-1", "actor": "admin", "issued_at": "2026-01-01T00:00:00Z",
                            "spec": {"workload": {"kind": "command", "command": ["sh", "-c", "id"]}}}).encode()

# (role, subject it must not publish): the attacks of issue 11, each as the part an attacker would hold.
REFUSED_PUBLISH = [
    ("executor", S.cmd("submit")),  # a command with a forged actor
    ("executor", S.cmd("cancel")),
    ("executor", S.progress("someone-elses-job", OTHER)),  # "finished" for another tenant's job, as another agent
    ("executor", S.heartbeat(OTHER)),  # heartbeats (and usage) charged to another executor
    ("executor", S.logs("someone-elses-job", 1, 0, OTHER)),  # a job's output, as another agent
    ("executor", S.usage(OTHER)),
    ("executor", S.check("run-1", "failed", OTHER)),
    ("executor", S.node("host-bbbbbb", "registered")),
    ("executor", S.agent(OTHER, "stop")),
    ("executor", S.rpc_lease_renew_of(OTHER)),  # renewing another executor's lease (keeping a zombie alive)
    ("executor", S.agent(EX, "reboot")),
    ("executor", S.outcome("submit", "c1")),  # a forged command outcome
    ("executor", S.lease("j1", "granted")),
    ("executor", S.job_event("j1", "succeeded")),
    ("executor", S.budget("j1", "exhausted")),
    ("executor", f"_INBOX.executor-{OTHER}.abc.1"),  # a forged lease-renewal reply on another's inbox
    ("executor", "_INBOX.queue.abc.1"),
    ("gateway", S.agent(EX, "run")),  # the gateway grants no run
    ("gateway", S.agent(EX, "stop")),
    ("gateway", S.lease("j1", "granted")),
    ("gateway", S.job_event("j1", "succeeded")),
    ("budget", S.outcome("submit", "c1")),
    ("audit", S.outcome("submit", "c1")),
    ("audit", S.cmd("submit")),
    ("health", S.outcome("submit", "c1")),
    ("health", S.agent(EX, "run")),
    ("queue", S.agent(EX, "reboot")),
    ("queue", S.outcome("drain_node", "c1")),
    ("queue", S.cmd("submit")),
]
SENTINEL = {"executor": S.heartbeat(EX), "gateway": S.cmd("submit"), "budget": S.budget("j1", "warning"),
            "audit": S.rejected("audit"), "health": S.node("n1", "ready"), "queue": S.lease("j1", "renewed")}


@pytest.mark.parametrize("role, subject", REFUSED_PUBLISH, ids=[f"{r} -> {s}" for r, s in REFUSED_PUBLISH])
async def test_a_part_cannot_publish_what_its_role_does_not_need(authbus: AuthBus, admin, role: str, subject: str):
    client = await probe(authbus, role)
    try:
        assert await publish_is_refused(client, admin, subject, SENTINEL[role], FORGED_SUBMIT)
    finally:
        await client.close()


REFUSED_SUBSCRIBE = [
    ("executor", S.agent_all_of(OTHER)),  # another agent's directives (grants carry the job's environment)
    ("executor", S.agent_all),
    ("executor", S.cmd_all),
    ("executor", ">"),
    ("executor", "_INBOX.>"),  # everybody's replies
    ("executor", "_INBOX.queue.>"),
    ("executor", S.rpc_lease_renew),  # answering renewals in the queue's place
    ("gateway", S.agent_all),
    ("budget", S.rpc_lease_renew),
    ("audit", "_INBOX.gateway.>"),
]


@pytest.mark.parametrize("role, subject", REFUSED_SUBSCRIBE, ids=[f"{r} <- {s}" for r, s in REFUSED_SUBSCRIBE])
async def test_a_part_cannot_subscribe_to_what_is_not_its_own(authbus: AuthBus, role: str, subject: str):
    client = await probe(authbus, role)
    try:
        assert await subscribe_is_refused(client, subject)
    finally:
        await client.close()


async def test_an_executor_cannot_read_another_executors_directives_through_jetstream(authbus: AuthBus, admin):
    client = await probe(authbus, "executor")
    stream = S.stream_name("AGENT")
    try:
        # Its own durable with another agent's filter: the subject it may use binds the filter, the server
        # refuses a body that differs from it.
        answer = await api(client, f"$JS.API.CONSUMER.CREATE.{stream}.agent-{EX}.{S.agent_all_of(EX)}",
                           {"stream_name": stream, "config": {"name": f"agent-{EX}", "durable_name": f"agent-{EX}",
                                                              "filter_subject": S.agent_all_of(OTHER),
                                                              "ack_policy": "explicit"}})
        assert "filter" in answer.get("error", {}).get("description", ""), answer
        # The legacy create (any filter) and another agent's durable are not its to use.
        for subject in (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.agent-{EX}",
                        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.agent-{OTHER}", f"$JS.API.STREAM.PURGE.{stream}",
                        f"$JS.API.STREAM.DELETE.{S.stream_name('CMD')}",
                        f"$JS.API.STREAM.MSG.GET.{S.stream_name('AGENT')}",
                        f"$JS.API.STREAM.MSG.GET.{S.stream_name('LOGS')}"):  # others' jobs' output
            await client.nc.publish(subject, b"{}", reply=client.nc.new_inbox())
            await client.nc.flush()
            assert await client.refused("publish", subject), subject
    finally:
        await client.close()


async def test_what_each_part_needs_still_works(authbus: AuthBus, admin):
    """The executor consumes its own directives and publishes its reports; a renewal is answered by the queue
    on the executor's inbox; the gateway publishes a command and hears its outcome from the queue."""
    ex, queue, gateway = [await probe(authbus, r) for r in ("executor", "queue", "gateway")]
    try:
        ex_js, q_js, gw_js = ex.nc.jetstream(), queue.nc.jetstream(), gateway.nc.jetstream()
        await bus.check_streams(ex_js, [S.stream_name("AGENT"), S.stream_name("HB")])
        sub = await ex_js.pull_subscribe(S.agent_all_of(EX), durable=f"agent-{EX}", stream=S.stream_name("AGENT"))
        await q_js.publish(S.agent(EX, "run"), b'{"grant": 1}')
        (msg,) = await sub.fetch(1, timeout=5)
        assert msg.data == b'{"grant": 1}'
        await msg.ack()
        for subject in (S.heartbeat(EX), S.usage(EX), S.progress("j1", EX), S.check("r1", "passed", EX),
                        S.logs("j1", 1, 0, EX)):
            await ex_js.publish(subject, b"{}")
        # The gateway reads a job's output (one message at a time, by sequence).
        shipped = await gw_js.get_msg(S.stream_name("LOGS"), seq=1, subject=S.logs_of("j1"), next=True)
        assert shipped.subject == S.logs("j1", 1, 0, EX)

        async def renew(m) -> None:
            await m.respond(b'{"ok": true}')

        await queue.nc.subscribe(S.rpc_lease_renew, queue="queue", cb=renew)
        await queue.nc.flush()
        reply = await eventually(lambda: _request_or_none(ex.nc, S.rpc_lease_renew_of(EX)), 10,
                                 "the queue's lease-renew responder to answer")
        assert reply.data == b'{"ok": true}' and reply.subject.startswith(f"_INBOX.executor-{EX}.")

        outcome = await gateway.nc.subscribe(S.outcome_of("c1"))
        await gw_js.publish(S.cmd("submit"), b"{}")
        await q_js.publish(S.outcome("submit", "c1"), b'{"accepted": true}')
        assert (await outcome.next_msg(timeout=5)).data == b'{"accepted": true}'
        assert not ex.errors and not queue.errors and not gateway.errors
    finally:
        for p in (ex, queue, gateway):
            await p.close()


async def test_the_agents_faststream_directive_subscriber_pulls_through_its_own_inbox(authbus: AuthBus, admin):
    """The agent's directives are a FastStream pull subscriber (agents/executor/directives.py): its pull requests
    must use the executor's own inbox prefix, the only one the bus lets it subscribe to (FastStream's default,
    the shared ``_INBOX.``, is refused and no directive would ever arrive)."""
    nc = await bus.connect(authbus.url, f"executor-{OTHER}", credentials_file=authbus.other)
    got: list[bytes] = []

    async def on_directive(msg) -> None:
        got.append(msg.data)
        await msg.ack()

    broker = EdgeBroker(nc)
    directives.declare(broker, S, S.agent_all_of(OTHER), f"agent-{OTHER}", on_directive)
    try:
        await broker.start()
        await admin.jetstream().publish(S.agent(OTHER, "stop"), b'{"directive": "stop"}')
        await eventually(lambda: got == [b'{"directive": "stop"}'], 10, "the directive through FastStream")
    finally:
        await broker.stop()
        await nc.close()


async def test_a_stopped_executors_user_is_removed_when_the_next_one_starts(authbus: AuthBus):
    """``teto up`` gives each (re)started agent a new id and user; the users of agents no longer running go."""
    third = "local-3-cccccc"
    env = authbus.auth.executor_env(third, [EX, OTHER])
    client = await Probe.connect(authbus.url, Path(env["TETO_NATS_CREDENTIALS_FILE"]))
    await client.close()
    authbus.auth.executor_env(OTHER, [EX, OTHER])  # the third agent stopped: its user is dropped
    assert not Path(env["TETO_NATS_CREDENTIALS_FILE"]).exists()
    creds = json.loads(authbus.executor.read_text())
    assert creds["user"] == f"executor-{EX}"
    logging.getLogger("nats.aio.client").disabled = True
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(authbus.url, user=f"executor-{third}", password="x", allow_reconnect=False)


async def _request_or_none(nc, subject: str):
    """The reply, or None while the server does not yet route the request to the responder just subscribed (under
    load, seen once as "no responders" right after the responder's flush)."""
    try:
        return await nc.request(subject, b"{}", timeout=5)
    except nats.errors.NoRespondersError:
        return None
