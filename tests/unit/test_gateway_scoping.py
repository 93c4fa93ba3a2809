"""Scoping rules (pure) and the routes that apply them, with fake reads: who sees which job, idempotency keys
per actor, the command permission and allow-list, and secrets redacted in every job answer."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from libs.contracts.commands import CommandOutcome
from libs.runtime.sealing import new_key
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.auth import Principal, Role
from services.gateway.commands import Sent
from services.gateway.scoping import (AllowListError, command_refusal, hide_other_jobs, job_id_for_key,
                                      load_allow_list, may_see, owner_filter, parse_allow_list)
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit


def who(actor: str, role: Role) -> Principal:
    return Principal(token_id="t", actor=actor, role=role)


@pytest.mark.parametrize("role", list(Role), ids=str)
def test_who_sees_another_owners_job(role):
    sees_all = role in (Role.OPERATOR, Role.AUDITOR, Role.ADMIN)
    assert may_see(who("bob", role), "alice") is sees_all
    assert may_see(who("alice", role), "alice")
    assert owner_filter(who("bob", role), None) == (None if sees_all else "bob", False)
    assert owner_filter(who("bob", role), "alice") == ("alice", False) if sees_all else ("bob", True)


def test_command_permission_is_the_operators_and_admins():
    assert {r for r in Role if auth.allows(r, "finetune:command")} == {Role.OPERATOR, Role.ADMIN}


def test_idempotency_ids_are_per_actor_stable_and_valid():
    a, b = job_id_for_key("alice", "k1"), job_id_for_key("bob", "k1")
    assert a != b and a == job_id_for_key("alice", "k1") and a != job_id_for_key("alice", "k2")
    assert job_id_for_key("a", "b\0c") != job_id_for_key("a\0b", "c")
    from libs.contracts.bounds import ID_PATTERN
    import re
    assert re.fullmatch(ID_PATTERN, a)


def test_fleet_rows_hide_only_other_owners_jobs():
    rows = [{"executor_id": "e1", "job_id": "j1", "epoch": 3, "step": 9}, {"executor_id": "e2", "job_id": "j2",
                                                                           "epoch": 1, "step": 2},
            {"executor_id": "e3", "job_id": None}]
    shown = hide_other_jobs(rows, {"j1": "alice", "j2": "bob"}, who("alice", Role.SUBMITTER))
    assert shown[0] == rows[0] and shown[1] == {"executor_id": "e2", "job_id": None, "epoch": None, "step": None}
    assert hide_other_jobs(rows, {}, who("olga", Role.OPERATOR)) == rows


def test_allow_list_parsing_and_matching(tmp_path):
    prefixes = parse_allow_list('[["python3", "-m", "trainer"], "torchrun"]')
    assert prefixes == (("python3", "-m", "trainer"), ("torchrun",))
    assert command_refusal(["python3", "-m", "trainer", "--x"], prefixes) is None
    assert command_refusal(["torchrun", "a.py"], prefixes) is None
    for bad in (["python3", "-m", "trainer_x"], ["python3", "-m"], ["sh", "-c", "torchrun"]):
        assert "does not start with" in command_refusal(bad, prefixes)
    assert command_refusal(["anything"], None) is None
    assert command_refusal(["anything"], ()) is not None  # an empty list allows nothing
    f = tmp_path / "allow"
    f.write_text("# allowed\npython3 -m 'my trainer'\n\n")
    assert load_allow_list(None, f) == (("python3", "-m", "my trainer"),)
    assert load_allow_list('["a"]', f) == (("a",), ("python3", "-m", "my trainer"))
    assert load_allow_list(None, None) is None
    for bad in ("[1]", "[[]]", "[not json"):
        with pytest.raises(AllowListError):
            parse_allow_list(bad)


# -- the routes, with fakes ---------------------------------------------------------------------------------

SEALED_JOB = {"id": "j1", "name": "x", "owner": "alice", "state": "queued",
              "spec": {"workload": {"kind": "command", "command": ["t"],
                                    "env": {"A": "plain", "S": {"sealed": "v1.CIPHER"}}}}}


class Reads:
    async def job_row(self, job_id: str) -> dict[str, Any] | None:
        return dict(SEALED_JOB) if job_id == "j1" else None

    async def get_job(self, job_id: str, **_: Any) -> dict[str, Any] | None:
        return {**SEALED_JOB, "events": [{"event": "submitted", "detail": {"spec": SEALED_JOB["spec"]}}]} \
            if job_id == "j1" else None

    async def job_reports(self, job_id: str, checkpoints: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return None, []

    async def list_jobs(self, *, owner: str | None, **_: Any) -> list[dict[str, Any]]:
        return [dict(SEALED_JOB)] if owner in (None, "alice") else []

    async def jobs_page(self, **kw: Any) -> tuple[list[dict[str, Any]], str | None]:
        return await self.list_jobs(**kw), None

    async def job_events(self, job_id: str, **_: Any) -> list[dict[str, Any]]:
        return [{"event": "submitted", "detail": {"spec": SEALED_JOB["spec"]}}]

    async def executors(self) -> list[dict[str, Any]]:
        return [{"executor_id": "e1", "job_id": "j1", "epoch": 1, "step": 5}]

    async def job_owners(self, ids: list[str]) -> dict[str, str]:
        return {"j1": "alice"}


class Commands:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.refused: list[str] = []

    async def send(self, cmd: Any) -> Sent:
        self.sent.append(cmd)
        return Sent(cmd.command_id, CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=True,
                                                   by="queue", job_id=cmd.job_id))

    async def refuse(self, kind: str, actor: str | None, reason: str, **_: Any) -> str:
        self.refused.append(reason)
        return "x"


@pytest.fixture
def api(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path, secrets_key=new_key(),
                                        command_allow='["t", "true"]')
    tokens = {a: auth.create_token(settings.effective_tokens_file, a, r)
              for a, r in (("alice", "submitter"), ("bob", "submitter"), ("olga", "operator"))}
    commands = Commands()
    with TestClient(create_app(settings, reads=Reads(), commands=commands)) as client:
        yield client, {a: {"Authorization": f"Bearer {t}"} for a, t in tokens.items()}, commands


def test_every_job_answer_redacts_secrets_and_scopes_the_owner(api):
    client, h, _ = api
    for path in ("/v1/jobs/j1", "/v1/jobs", "/v1/jobs/j1/events"):
        text = client.get(path, headers=h["alice"]).text
        assert "CIPHER" not in text and '"redacted"' in text and '"plain"' in text
        assert client.get(path, headers=h["olga"]).status_code == 200
    assert client.get("/v1/jobs/j1", headers=h["bob"]).status_code == 404
    assert client.get("/v1/jobs/j1/events", headers=h["bob"]).status_code == 404
    assert client.get("/v1/jobs", headers=h["bob"]).json() == []
    assert client.get("/v1/executors", headers=h["bob"]).json()[0]["job_id"] is None
    assert client.get("/v1/executors", headers=h["alice"]).json()[0]["job_id"] == "j1"


def test_submit_checks_permission_and_allow_list_then_seals(api):
    client, h, commands = api
    spec = {"workload": {"kind": "command", "command": ["t"], "env": {"S": {"secret": "PLAINTEXT"}}}}
    r = client.post("/v1/jobs", json=spec, headers=h["alice"])
    assert r.status_code == 403 and r.json()["permission"] == "finetune:command" and commands.sent == []
    r = client.post("/v1/jobs", json={"workload": {"kind": "command", "command": ["sh"]}}, headers=h["olga"])
    assert r.status_code == 403 and "TETO_COMMAND_ALLOW" in r.json()["reason"]
    r = client.post("/v1/jobs", json=spec, headers={**h["olga"], "Idempotency-Key": "k"})
    assert r.status_code == 201, r.text
    (cmd,) = commands.sent
    assert cmd.job_id == job_id_for_key("olga", "k") and "PLAINTEXT" not in cmd.model_dump_json()
    assert cmd.spec.workload.env["S"].sealed.startswith("v1.")


def test_a_dead_letter_quoting_a_sealed_secret_is_shown_redacted(tmp_path):
    from libs.contracts.dead import DeadCause, dead_letter

    letter = dead_letter(service="queue", consumer="queue-commands", cause=DeadCause.PERMANENT, reason="x",
                         subject="teto.cmd.submit", payload=b'{"env": {"S": {"sealed": "v1.CIPHER"}}}')

    class Letters:
        prefix = "teto"

        async def list(self, **_: Any) -> list[tuple[int, Any]]:
            return [(1, letter)]

        async def get(self, seq: int) -> Any:
            return letter

        async def counts(self) -> dict[str, int]:
            return {"queue": 1}

    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    token = auth.create_token(settings.effective_tokens_file, "olga", "operator")
    with TestClient(create_app(settings, reads=Reads(), commands=Commands(), dead_letters=Letters())) as client:
        for path in ("/v1/dead-letters", "/v1/dead-letters/1"):
            text = client.get(path, headers={"Authorization": f"Bearer {token}"}).text
            assert "CIPHER" not in text and "redacted" in text


def test_a_jobs_output_is_its_owners_and_read_alls_only(tmp_path):
    from libs.contracts.logs import LogChunk, LogStream
    from services.gateway.logs import Page

    chunk = LogChunk(job_id="j1", epoch=1, attempt=1, rank=0, executor_id="e1", stream=LogStream.STDOUT, offset=0,
                     text="hello\n")

    class Logs:
        async def page(self, q: Any, granted: Any, *, after_seq: int, limit: int) -> Page:
            return Page([(3, chunk)], 3, False)

    class GrantedReads(Reads):
        async def job_grants(self, job_id: str) -> dict[tuple[int, int], str]:
            return {(1, 0): "e1"}

    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    tokens = {a: auth.create_token(settings.effective_tokens_file, a, r)
              for a, r in (("alice", "submitter"), ("bob", "submitter"), ("vic", "viewer"), ("ada", "auditor"))}
    with TestClient(create_app(settings, reads=GrantedReads(), commands=Commands(), job_logs=Logs())) as client:
        def get(who: str, **params: str):
            return client.get("/v1/jobs/j1/logs", params=params, headers={"Authorization": f"Bearer {tokens[who]}"})

        for who in ("alice", "ada"):  # the owner, and read:all
            body = get(who).json()
            assert [c["text"] for c in body["chunks"]] == ["hello\n"] and body["next_after_seq"] == 3
        for who in ("bob", "vic"):  # another submitter, a viewer: the job does not exist for them
            for params in ({}, {"follow": "true"}):
                resp = get(who, **params)
                assert resp.status_code == 404 and resp.json()["reason"] == "no such job: j1"
        assert client.get("/v1/jobs/j2/logs", headers={"Authorization": f"Bearer {tokens['ada']}"}).status_code == 404
