"""The gang policy's store and its command: one row (absent means the defaults), read by placement, the gang
scanner and the submit check; replaced by ``set_policy`` (audited like every command, answered with an outcome
that carries the policy now in force)."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from libs.contracts.commands import CommandOutcome, SetGangPolicy
from libs.contracts.policies import GangPolicy
from libs.runtime.fencing import StaleCounter
from libs.runtime.service import Runtime
from libs.runtime.unit import Units

from . import store

log = logging.getLogger(__name__)
SERVICE = "queue"
_FIELDS = ("ready_timeout_seconds", "backoff_base_seconds", "backoff_max_seconds", "backoff_limit",
           "sequential_admission", "node_failure_strategy")


async def load(conn: asyncpg.Connection | asyncpg.Pool) -> GangPolicy:
    row = await conn.fetchrow(f"SELECT {', '.join(_FIELDS)} FROM {store.T}.gang_policy WHERE id")
    return GangPolicy() if row is None else GangPolicy.model_validate(dict(row))


async def save(conn: asyncpg.Connection, policy: GangPolicy, actor: str, now: datetime) -> None:
    values = [getattr(policy, f) for f in _FIELDS]
    values[-1] = policy.node_failure_strategy.value
    await conn.execute(
        f"INSERT INTO {store.T}.gang_policy (id, {', '.join(_FIELDS)}, updated_by, updated_at)"
        " VALUES (true, $1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO UPDATE SET "
        + ", ".join(f"{f} = EXCLUDED.{f}" for f in (*_FIELDS, "updated_by", "updated_at")),
        *values, actor, now)


class Policies:
    def __init__(self, runtime: Runtime, units: Units | None = None) -> None:
        self.runtime = runtime
        self.units = units or Units(runtime.pool, store.SCHEMA, runtime.subjects, StaleCounter("queue"))

    async def set(self, cmd: SetGangPolicy) -> CommandOutcome:
        """Replace the policy once per command id; a redelivered command is answered with the stored outcome."""
        now = self.runtime.clock.now()

        async def decide() -> CommandOutcome:
            await save(conn, cmd.policy, cmd.actor, now)
            log.info("gang policy set by %s: %s", cmd.actor, cmd.policy.model_dump(mode="json"))
            return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=True, by=SERVICE,
                                  detail={"policy": cmd.policy.model_dump(mode="json")})

        async with self.units.begin() as unit:
            conn = unit.conn
            outcome = (await unit.once(cmd, decide)).outcome
        return outcome
