"""Commands decided exactly once: the de-duplication every command-handling service shares.

Each service keeps ``<schema>.processed_commands`` (command_id, kind, outcome). ``decide_once`` claims the
command inside the caller's transaction; the first claimer decides, stores the outcome and writes it to the
outbox in the same transaction as the change it made. A redelivered command (or a replica racing on it, which
waits on the claim until the first commits) changes nothing and is answered again with the stored outcome, as a
new message so a client that missed the first answer still hears one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
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
        again = again_outcome(prior, cmd.command_id, cmd.KIND)
        await outbox.add(conn, schema, [(subjects.outcome(cmd.KIND, cmd.command_id), again)])
        return Answer(again, again=True)
    outcome = await decide()
    await record(conn, schema, cmd.command_id, outcome, job_id=job_id)
    await outbox.add(conn, schema, [(subjects.outcome(cmd.KIND, cmd.command_id), outcome)])
    return Answer(outcome, again=False)


def again_outcome(stored: str | dict | None, command_id: str, kind: str) -> CommandOutcome:
    """The answer to a command seen before: its stored outcome as a new message (a new id and time), or a bare
    acceptance when none was stored (a claim from before outcomes were kept)."""
    fields = json.loads(stored) if isinstance(stored, str) else (stored or {})
    return CommandOutcome.model_validate(
        {k: v for k, v in fields.items() if k not in ("id", "time")}
        or {"command_id": command_id, "kind": kind, "accepted": True, "by": "unknown"})


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


# -- a batch of commands: one statement each for the claims, the stored outcomes and the records ------------

async def claim_many(conn: asyncpg.Connection, schema: str, claims: Sequence[tuple[str, str]]) -> set[str]:
    """Claim (command_id, kind) pairs (distinct ids) in one statement; returns the ids claimed now. An id claimed
    before is left out; one another transaction holds uncommitted is waited for, as ``decide_once`` does."""
    if not claims:
        return set()
    rows = await conn.fetch(
        f'INSERT INTO "{schema}".processed_commands (command_id, kind)'
        " SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT (command_id) DO NOTHING RETURNING command_id",
        [c for c, _ in claims], [k for _, k in claims])
    return {r["command_id"] for r in rows}


async def stored_outcomes(conn: asyncpg.Connection, schema: str, command_ids: Sequence[str]) -> dict[str, str | None]:
    """The stored outcome (JSON) of each of these commands already processed."""
    if not command_ids:
        return {}
    rows = await conn.fetch(f'SELECT command_id, outcome FROM "{schema}".processed_commands'
                            " WHERE command_id = ANY($1::text[])", list(command_ids))
    return {r["command_id"]: r["outcome"] for r in rows}


async def record_many(conn: asyncpg.Connection, schema: str,
                      records: Sequence[tuple[str, CommandOutcome, str | None]]) -> None:
    """Store (command_id, outcome, job_id) for claimed commands in one statement (``record`` for many)."""
    if not records:
        return
    await conn.execute(
        f'UPDATE "{schema}".processed_commands p SET outcome = r.outcome::jsonb, job_id = COALESCE(r.job_id, p.job_id)'
        " FROM unnest($1::text[], $2::text[], $3::text[]) AS r(command_id, outcome, job_id)"
        " WHERE p.command_id = r.command_id",
        [c for c, _, _ in records], [o.model_dump_json(by_alias=True) for _, o, _ in records],
        [j for _, _, j in records])
