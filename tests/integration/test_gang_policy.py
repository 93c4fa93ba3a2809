"""The gang policy command against the real queue and audit services: the queue stores the policy and answers
with it, a redelivered command acts once, and the audit log holds the command with its actor and outcome."""

from __future__ import annotations

import pytest

from libs.contracts.commands import SetGangPolicy
from libs.contracts.envelope import new_id
from libs.contracts.policies import GangPolicy
from services.audit.app import serve as audit_serve
from services.audit.settings import AuditSettings
from services.queue.settings import QueueSettings
from tests.integration.helpers_hba import running
from tests.integration.helpers_queue import client, eventually, queue_service

pytestmark = pytest.mark.integration


async def test_set_policy_is_stored_once_answered_and_audited(env):
    settings = env.settings(QueueSettings, require_checked_nodes=False)
    policy = GangPolicy(ready_timeout_seconds=45, backoff_base_seconds=2, backoff_max_seconds=8, backoff_limit=None,
                        sequential_admission=False, node_failure_strategy="fail_job")
    cmd = SetGangPolicy(actor="root-admin", policy=policy)
    async with queue_service(settings), running(audit_serve, env.settings(AuditSettings)), client(settings) as c:
        assert await c.db.fetchval("SELECT count(*) FROM queue.gang_policy_public") == 0  # defaults until set
        outcome = await c.command(cmd)
        assert outcome.accepted and outcome.detail["policy"] == policy.model_dump(mode="json")
        row = await c.db.fetchrow("SELECT * FROM queue.gang_policy_public")
        assert GangPolicy.model_validate({k: row[k] for k in GangPolicy.model_fields}) == policy
        assert row["updated_by"] == "root-admin"
        # The same command again (a retried PUT) acts once and is answered with the same outcome.
        again = await c.command(cmd.model_copy(update={"policy": GangPolicy(), "id": new_id()}))
        assert again.accepted and again.detail == outcome.detail
        assert (await c.db.fetchrow("SELECT * FROM queue.gang_policy_public"))["backoff_limit"] is None

        async def audited() -> list:
            rows = await c.db.fetch("SELECT * FROM audit.log_public WHERE kind = 'set_policy' ORDER BY seq")
            return rows if {r["outcome"] for r in rows} >= {"received", "accepted"} else []

        rows = await eventually(audited, 20)
        assert {r["actor"] for r in rows} == {"root-admin"} and {r["command_id"] for r in rows} == {cmd.command_id}
