"""The bus permission table (libs/runtime/natsauth.py): who may publish and subscribe what, as pure data.

The same table is enforced by a real nats-server in tests/security/test_bus_authorization.py.
"""

from __future__ import annotations

import json

import pytest

from libs.contracts import senders
from libs.contracts.commands import COMMANDS
from libs.contracts.envelope import ContractError
from libs.contracts.subjects import Subjects
from libs.runtime import natsauth
from libs.runtime.natsauth import allows, matches, permissions
from teto.stack import busauth

S = Subjects("teto")
EX, NODE = "local-1-aaaaaa", "host-aaaaaa"
OTHER = "local-2-bbbbbb"


def perms(role: str) -> natsauth.Permissions:
    if role == "executor":
        return permissions("executor", executor_id=EX, node_id=NODE)
    return permissions(role)


NON_ADMIN = [r for r in natsauth.ROLES if r != "admin"]


def publishers(subject: str) -> set[str]:
    return {r for r in NON_ADMIN if allows(perms(r).publish, subject)}


@pytest.mark.parametrize("pattern, subject, expected", [
    ("teto.cmd.*", "teto.cmd.submit", True), ("teto.cmd.*", "teto.cmd.a.b", False),
    ("teto.agent.x.>", "teto.agent.x.run", True), ("teto.agent.x.>", "teto.agent.x", False),
    ("teto.progress.*.ex", "teto.progress.j1.ex", True), ("teto.progress.*.ex", "teto.progress.j1.other", False),
    (">", "anything.at.all", True), ("a.b", "a.b.c", False),
])
def test_subject_matching_follows_nats(pattern, subject, expected):
    assert matches(pattern, subject) is expected


def test_every_command_kind_has_exactly_one_deciding_service():
    assert set(natsauth.QUEUE_COMMANDS) | set(natsauth.HEALTH_COMMANDS) == set(COMMANDS)
    assert not set(natsauth.QUEUE_COMMANDS) & set(natsauth.HEALTH_COMMANDS)


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_only_the_gateway_publishes_commands(kind):
    assert publishers(S.cmd(kind)) == {"gateway"}


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_an_outcome_comes_only_from_the_gateway_or_the_service_that_decides_it(kind):
    decider = "queue" if kind in natsauth.QUEUE_COMMANDS else "health"
    assert publishers(S.outcome(kind, "c1")) == {"gateway", decider}


@pytest.mark.parametrize("directive, role", [("run", "queue"), ("stop", "queue"), ("check", "health"),
                                             ("reboot", "health")])
def test_directives_to_an_agent_come_from_one_service(directive, role):
    assert publishers(S.agent(EX, directive)) == {role}


def test_the_queue_alone_answers_lease_renewals_and_the_budget_alone_budget_status():
    assert {r for r in NON_ADMIN if allows(perms(r).subscribe, S.rpc_lease_renew_of(EX))} == {"queue"}
    assert publishers(S.rpc_lease_renew_of(EX)) == {"executor"} and not publishers(S.rpc_lease_renew_of(OTHER))
    assert {r for r in NON_ADMIN if allows(perms(r).subscribe, S.rpc_budget_status)} == {"budget"}
    # Every service answers the status request (teto status); an executor answers nothing.
    assert {r for r in NON_ADMIN if perms(r).allow_responses} == set(natsauth.SERVICES)


def test_every_service_answers_status_and_the_gateway_alone_asks():
    assert {r for r in NON_ADMIN if allows(perms(r).subscribe, S.rpc_status)} == set(natsauth.SERVICES)
    assert publishers(S.rpc_status) == {"gateway"}
    # The gateway reads every stream's info (replicas, leader); consumers' state only on the streams the panel
    # tails with its ephemeral consumers (their names are the server's, so any name there), none elsewhere.
    gateway = perms("gateway").publish
    assert all(allows(gateway, f"$JS.API.STREAM.INFO.{spec.name}") for spec in S.streams())
    assert not allows(gateway, "$JS.API.CONSUMER.INFO.TETO_CMD.queue-commands")
    assert not allows(gateway, "$JS.API.CONSUMER.INFO.TETO_USAGE.budget-usage-reports")


@pytest.mark.parametrize("subject", [S.heartbeat(EX), S.usage(EX), S.progress("j1", EX), S.check("r1", "passed", EX),
                                     S.node(NODE, "registered"), S.logs("j1", 2, 0, EX)])
def test_an_executor_publishes_its_own_reports(subject):
    assert "executor" in publishers(subject)


@pytest.mark.parametrize("subject", [S.heartbeat(OTHER), S.usage(OTHER), S.progress("j1", OTHER),
                                     S.check("r1", "passed", OTHER), S.node("host-bbbbbb", "registered"),
                                     S.logs("j1", 1, 0, OTHER),
                                     S.cmd("submit"), S.agent(EX, "stop"), S.agent(OTHER, "run"),
                                     S.outcome("submit", "c1"), S.job_event("j1", "succeeded"),
                                     S.lease("j1", "granted"), S.budget("j1", "exhausted"), S.node(NODE, "ready"),
                                     "_INBOX.queue.abc.1", "_INBOX.executor-" + OTHER + ".x"])
def test_an_executor_publishes_nothing_under_another_identity(subject):
    assert "executor" not in publishers(subject)


def test_an_executor_receives_only_its_own_directives_and_replies():
    p = perms("executor")
    assert p.subscribe == (f"_INBOX.executor-{EX}.>",)
    stream = S.stream_name("AGENT")
    assert allows(p.publish, f"$JS.API.CONSUMER.CREATE.{stream}.agent-{EX}.teto.agent.{EX}.>")
    assert allows(p.publish, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.agent-{EX}")
    for forbidden in (f"$JS.API.CONSUMER.CREATE.{stream}.agent-{EX}.teto.agent.{OTHER}.>",
                      f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.agent-{EX}",
                      f"$JS.API.CONSUMER.MSG.NEXT.{stream}.agent-{OTHER}", f"$JS.API.CONSUMER.CREATE.{stream}",
                      f"$JS.API.CONSUMER.MSG.NEXT.{S.stream_name('CMD')}.queue-submit"):
        assert not allows(p.publish, forbidden), forbidden


@pytest.mark.parametrize("role", NON_ADMIN)
def test_no_part_but_the_admin_declares_or_deletes_streams_or_uses_the_legacy_durable_create(role):
    for api in ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE",
                "CONSUMER.DURABLE.CREATE", "CONSUMER.DELETE"):
        assert not allows(perms(role).publish, f"$JS.API.{api}.{S.stream_name('CMD')}.x"), api
        assert not allows(perms(role).publish, f"$JS.API.{api}.{S.stream_name('CMD')}"), api


@pytest.mark.parametrize("role", NON_ADMIN)
def test_each_part_reads_only_its_own_inbox(role):
    mine = natsauth.user(role, executor_id=EX, node_id=NODE)
    for other in NON_ADMIN:
        theirs = natsauth.user(other, executor_id=OTHER, node_id="host-bbbbbb")
        if theirs.name != mine.name:
            assert not allows(mine.permissions.subscribe, f"{theirs.inbox_prefix}.abc.1")
            assert not allows(mine.permissions.publish, f"{theirs.inbox_prefix}.abc.1")


def test_every_durable_a_part_consumes_is_allowed_its_api_and_nobody_elses():
    for role in ("audit", "budget", "health", "queue"):
        for d in natsauth.durables(role, S):
            stream = S.stream_name(d.stream)
            owners = {r for r in NON_ADMIN if allows(perms(r).publish, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{d.name}")}
            assert owners == {role}, d


def test_jobs_output_is_published_by_executors_under_their_own_id_and_read_by_the_gateway_alone():
    assert publishers(S.logs("j1", 1, 3, EX)) == {"executor"}
    assert not publishers(S.logs("j1", 1, 3, OTHER))
    get = f"$JS.API.STREAM.MSG.GET.{S.stream_name('LOGS')}"
    assert {r for r in NON_ADMIN if allows(perms(r).publish, get)} == {"gateway"}
    assert not {r for r in NON_ADMIN if allows(perms(r).subscribe, S.logs("j1", 1, 0, EX))}


def test_the_server_config_holds_hashes_only_and_no_anonymous_user():
    user = natsauth.user("gateway")
    text = busauth.server_config([(user, busauth.hash_password("secret-pw", rounds=4))])
    config = json.loads(text)
    assert "no_auth_user" not in text and "secret-pw" not in text
    assert config["authorization"]["users"][0]["password"].startswith("$2")
    assert config["authorization"]["users"][0]["permissions"]["publish"]["allow"] == list(user.permissions.publish)


def test_a_report_from_another_executor_is_refused():
    senders.check_sender(S.progress("j1", EX), EX)
    with pytest.raises(ContractError, match="another executor"):
        senders.check_sender(S.progress("j1", EX), OTHER)
    with pytest.raises(ContractError):
        senders.check_sender(S.heartbeat(EX), OTHER)
    senders.check_node(S.node(NODE, "registered"), NODE)
    with pytest.raises(ContractError):
        senders.check_node(S.node(NODE, "registered"), "host-bbbbbb")


def test_a_training_process_gets_no_bus_credentials(tmp_path):
    from agents.executor import launch
    from agents.executor.settings import ExecutorSettings
    from libs.contracts.jobs import CommandWorkload, JobSpec
    from libs.contracts.agents import RunJob

    settings = ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id=EX)
    grant = RunJob(job_id="j1", epoch=1, executor_id=EX, attempt=1, lease_seconds=6, heartbeat_seconds=1,
                   spec=JobSpec(workload=CommandWorkload(command=["train"])))
    env = launch.build(grant, settings, [], resume_from=None,
                       base_env={"TETO_NATS_CREDENTIALS_FILE": "/x/executor.json", "TETO_NATS_URL": "nats://h"}).env
    assert not [k for k in env if k.startswith("TETO_NATS")]


def test_the_audit_service_alone_anchors_and_answers_verify_and_the_gateway_alone_asks():
    assert publishers(S.audit_anchor) == {"audit"}
    assert {r for r in NON_ADMIN if allows(perms(r).subscribe, S.rpc_audit_verify)} == {"audit"}
    assert publishers(S.rpc_audit_verify) == {"gateway"}
    anchors = S.stream_name("AUDIT_ANCHOR")
    for destroy in (f"$JS.API.STREAM.PURGE.{anchors}", f"$JS.API.STREAM.MSG.DELETE.{anchors}",
                    f"$JS.API.STREAM.DELETE.{anchors}", f"$JS.API.STREAM.UPDATE.{anchors}"):
        assert publishers(destroy) == set(), destroy


def test_the_gateway_watches_streams_for_the_panel_only_through_ephemeral_read_only_consumers():
    gateway = perms("gateway").publish
    for base in natsauth.WATCHED_BY_GATEWAY:
        stream = S.stream_name(base)
        assert allows(gateway, f"$JS.API.CONSUMER.CREATE.{stream}")  # an ephemeral consumer: no name
        assert allows(gateway, f"$JS.API.CONSUMER.INFO.{stream}.abc")
        for durable in natsauth.durables("queue", S) + natsauth.durables("health", S):
            # No named consumer: the gateway can neither create, change, pull from nor delete another's durable.
            assert not allows(gateway, f"$JS.API.CONSUMER.CREATE.{stream}.{durable.name}.{durable.filter}")
            assert not allows(gateway, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable.name}")
            assert not allows(gateway, f"$JS.API.CONSUMER.DELETE.{stream}.{durable.name}")
            assert not allows(gateway, f"$JS.ACK.{stream}.{durable.name}.1.1.1.1.1")
