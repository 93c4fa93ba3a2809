"""Commands decided exactly once: the de-duplication every command-handling service shares.

Each service keeps ``<schema>.processed_commands`` (command_id, kind, outcome). ``decide_once`` claims the
command inside the caller's transaction; the first claimer decides, stores the outcome and writes it to the
outbox in the same transaction as the change it made. A redelivered command (or a replica racing on it, which
waits on the claim until the first commits) changes nothing and is answered again with the stored outcome, as a
new message so a client that missed the first answer still hears one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from libs.contracts.commands import Command, CommandOutcome
from libs.contracts.subjects import Subjects

from . import outbox


@dataclass(frozen=True)
class Answer:
    outcome: CommandOutcome
    again: bool  # True: seen before; the stored outcome was answered again


async def decide_once(conn: asyncpg.Connection, schema: str, subjects: Subjects, cmd: Command,
                      decide: Callable[[], Awaitable[CommandOutcome]], *, job_id: str | None = None) -> Answer:
    """Decide ``cmd`` once per command id; call inside a transaction (the caller commits both together)."""
    claimed = await conn.fetchval(
        f'INSERT INTO "{schema}".processed_commands (command_id, kind) VALUES ($1, $2)'
        " ON CONFLICT (command_id) DO NOTHING RETURNING command_id", cmd.command_id, cmd.KIND)
    if claimed is None:
        prior = await conn.fetchval(f'SELECT outcome FROM "{schema}".processed_commands WHERE command_id = $1',
                                    cmd.command_id)
        stored = json.loads(prior) if isinstance(prior, str) else (prior or {})
        again = CommandOutcome.model_validate(
            {k: v for k, v in stored.items() if k not in ("id", "time")}
            or {"command_id": cmd.command_id, "kind": cmd.KIND, "accepted": True, "by": "unknown"})
        await outbox.add(conn, schema, [(subjects.outcome(cmd.KIND, cmd.command_id), again)])
        return Answer(again, again=True)
    outcome = await decide()
    await record(conn, schema, cmd.command_id, outcome, job_id=job_id)
    await outbox.add(conn, schema, [(subjects.outcome(cmd.KIND, cmd.command_id), outcome)])
    return Answer(outcome, again=False)


async def record(conn: asyncpg.Connection, schema: str, command_id: str, outcome: CommandOutcome, *,
                 job_id: str | None = None) -> None:
    body = outcome.model_dump_json(by_alias=True)
    if job_id is None:
        await conn.execute(f'UPDATE "{schema}".processed_commands SET outcome = $2::jsonb WHERE command_id = $1',
                           command_id, body)
    else:
        await conn.execute(
            f'UPDATE "{schema}".processed_commands SET outcome = $2::jsonb, job_id = $3 WHERE command_id = $1',
            command_id, body, job_id)


async def claim(conn: asyncpg.Connection, schema: str, command_id: str, kind: str) -> bool:
    """Claim without deciding (a command answered on its own path, such as a malformed one)."""
    got = await conn.fetchval(
        f'INSERT INTO "{schema}".processed_commands (command_id, kind) VALUES ($1, $2)'
        " ON CONFLICT (command_id) DO NOTHING RETURNING command_id", command_id, kind)
    return got is not None
