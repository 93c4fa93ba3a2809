"""Attack: a submitter runs arbitrary code on the nodes by submitting a ``command`` workload. Refused (403,
naming ``finetune:command``), audited under the submitter's name, and no job exists; an operator may. With an
installation allow-list, a command outside it is refused even for an operator, including look-alike argv."""

from __future__ import annotations

import sys

import pytest

from tests.security.gateway_stack import gateway_stack
from tests.support.services import eventually

pytestmark = pytest.mark.security

EVIL = {"workload": {"kind": "command", "command": ["sh", "-c", "cat /etc/shadow > /tmp/x"]}}


async def test_a_submitter_cannot_submit_a_command_workload_and_the_attempt_is_audited(env, tmp_path):
    async with gateway_stack(env, tmp_path / "s") as s:
        r = await s.as_("alice").post("/v1/jobs", json={**EVIL, "name": "evil"})
        assert r.status_code == 403, r.text
        assert r.json()["permission"] == "finetune:command"
        # The refusal is in the audit log, under the attacker's name, and no job was made.
        refused = await eventually(lambda: s.audit_rows(actor="alice", kind="submit", outcome="refused"), 20,
                                   "the refusal in the audit log")
        assert "finetune:command" in refused[0]["reason"]
        assert await s.db.fetchval("SELECT count(*) FROM queue.jobs") == 0
        # The built-in fine-tune is still the submitter's to run; the operator may run a command.
        assert (await s.as_("alice").post("/v1/jobs", json={"workload": {"kind": "finetune"}})).status_code == 201
        r = await s.as_("olga").post("/v1/jobs", json={"workload": {"kind": "command", "command": ["true"]}})
        assert r.status_code == 201, r.text
        assert (await s.as_("olga").get("/v1/whoami")).json()["permissions"].count("finetune:command") == 1


@pytest.mark.parametrize("argv", [["sh", "-c", "id"], [sys.executable, "-m", "trainer_evil"],
                                  [sys.executable, "-c", "import os"], [sys.executable]],
                         ids=["shell", "look-alike module", "python -c", "prefix cut short"])
async def test_the_allow_list_refuses_commands_outside_it_even_for_an_operator(env, tmp_path, argv):
    allow = f'[["{sys.executable}", "-m", "trainer"], "true"]'
    async with gateway_stack(env, tmp_path / "s", command_allow=allow) as s:
        r = await s.as_("olga").post("/v1/jobs", json={"workload": {"kind": "command", "command": argv}})
        assert r.status_code == 403, r.text
        assert "does not start with a prefix this installation allows" in r.json()["reason"]
        await eventually(lambda: s.audit_rows(actor="olga", kind="submit", outcome="refused"), 20, "audited")
        for ok in ([sys.executable, "-m", "trainer", "--lr", "1"], ["true"]):
            r = await s.as_("olga").post("/v1/jobs", json={"workload": {"kind": "command", "command": ok}})
            assert r.status_code == 201, r.text
        assert await s.db.fetchval("SELECT count(*) FROM queue.jobs") == 2
