"""Tokens, sign-in sessions, role bindings and pending OpenID Connect sign-ins in the gateway's schema
(migrations/002_identity.sql): what every gateway replica reads, so a token revoked or a session ended through
one replica is refused by all of them on the next request (each request looks its secret up; nothing is cached).

``DbIdentity`` is the gateway's when it has a database. An installation upgraded from the tokens file keeps
every token: the file is imported at start and again whenever it changes (``teto up`` and ``teto tokens create
--tokens-file`` still write it), by id, never deleting, and a revocation in the database is never undone by the
file. ``FileIdentity`` is the tokens file alone, for a gateway without a database (tests of the HTTP layer).
Rules (a record's state, the file's records, claims to roles) are pure, in domain/tokens.py and domain/grants.py.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from libs.runtime.db import lock_key

from .auth import (Principal, Role, TokenStore, check_actor, read_tokens_file, hash_secret, issue_token, list_tokens,
                   revoke_token, token_org)
from .domain import pending
from .domain import tokens as records
from .domain.grants import Binding, Grant, Identity, Source, token_grants

_PENDING_LOCK = lock_key("gateway:oidc-logins")  # counting and storing a pending sign-in, one replica at a time


def _now() -> datetime:
    return datetime.now(UTC)


class FileIdentity:
    """The tokens file as the identity of a gateway without a database: tokens, and role bindings held in this
    process only; no sign-in sessions (those need the database every replica shares)."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store
        self._bindings: list[tuple[str, Binding]] = []

    async def authenticate(self, secret: str) -> Principal | None:
        found = self.store.authenticate(secret)
        if found is None:
            return None
        return Principal(token_id=found.token_id, actor=found.actor, role=found.role, org=found.org,
                         grants=token_grants(found.token_id, found.role.value, found.org))

    async def revoked_actor(self, secret: str) -> str | None:
        return self.store.revoked_actor(secret)

    async def issue(self, actor: str, role: Role | str, *, org: str | None = None, created_by: str | None = None,
                    **_: Any) -> NewSecret:
        token_id, secret = issue_token(self.store.path, actor, role, org=org)
        return NewSecret(token_id, secret)

    async def revoke(self, token_id: str, *, by: str, actor: str | None = None) -> bool:
        if actor is not None and not any(t.get("id") == token_id and t.get("actor") == actor
                                         for t in list_tokens(self.store.path)):
            return False
        return revoke_token(self.store.path, token_id)

    async def tokens(self, *, actor: str | None = None) -> list[dict[str, Any]]:
        return [t for t in list_tokens(self.store.path) if actor is None or t.get("actor") == actor]

    async def end_sessions_of(self, actor: str, reason: str) -> int:
        return 0  # no sessions without a database

    async def sessions(self, *, actor: str | None = None) -> list[dict[str, Any]]:
        return []

    async def bindings(self, provider: str) -> list[Binding]:
        return [b for p, b in self._bindings if provider == "*" or p in (provider, "*")]

    async def bind(self, *, provider: str, subject: str, role: Role | str, org: str | None, by: str) -> str:
        binding = Binding("b-" + secrets.token_hex(6), subject, Role(role).value, org, by)
        self._bindings.append((provider, binding))
        return binding.id

    async def unbind(self, binding_id: str) -> bool:
        before = len(self._bindings)
        self._bindings = [(p, b) for p, b in self._bindings if b.id != binding_id]
        return len(self._bindings) < before


@dataclass(frozen=True)
class NewSecret:
    id: str
    secret: str


_TOKEN_COLUMNS = ("id, actor, role, org, project, description, created_at, created_by, expires_at, last_used_at, "
                  "revoked_at, revoked_by, source")


class DbIdentity:
    def __init__(self, pool: asyncpg.Pool, tokens_file: Path | None = None) -> None:
        self.pool = pool
        self.tokens_file = tokens_file
        self._file_stamp: tuple[int, int, int] | None = None

    # -- the tokens file (the upgrade) ----------------------------------------------------------------------

    async def import_file(self, *, now: datetime | None = None) -> int:
        """Import the tokens file's records; returns how many were new. Revocations only ever add up."""
        if self.tokens_file is None or not self.tokens_file.exists():
            return 0
        now = now or _now()
        rows = [r for r in (records.from_file(raw, now=now) for raw in read_tokens_file(self.tokens_file)) if r is not None]
        if not rows:
            return 0
        async with self.pool.acquire() as conn:
            added = await conn.fetchval(
                """WITH incoming AS (
                       SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                                            $6::timestamptz[], $7::timestamptz[])
                              AS t(id, sha256, actor, role, org, created_at, revoked_at)),
                   done AS (
                       INSERT INTO gateway.tokens AS cur (id, sha256, actor, role, org, created_at, revoked_at,
                                                          revoked_by, source, description)
                       SELECT id, sha256, actor, role, org, created_at, revoked_at,
                              CASE WHEN revoked_at IS NULL THEN NULL ELSE 'tokens file' END, 'file',
                              'imported from the tokens file'
                       FROM incoming
                       ON CONFLICT (id) DO UPDATE
                           SET revoked_at = COALESCE(cur.revoked_at, EXCLUDED.revoked_at),
                               revoked_by = COALESCE(cur.revoked_by, EXCLUDED.revoked_by)
                       RETURNING (xmax = 0) AS inserted)
                   SELECT count(*) FILTER (WHERE inserted) FROM done""",
                [r.id for r in rows], [r.sha256 for r in rows], [r.actor for r in rows], [r.role for r in rows],
                [r.org for r in rows], [r.created_at for r in rows], [r.revoked_at for r in rows])
        return int(added or 0)

    async def _import_if_changed(self) -> None:
        if self.tokens_file is None:
            return
        try:
            st = self.tokens_file.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            return
        if stamp != self._file_stamp:
            try:
                await self.import_file()
            except (OSError, ValueError):
                return  # a broken edit of the file is not imported; the database's tokens stay
            self._file_stamp = stamp

    # -- authentication -------------------------------------------------------------------------------------

    async def authenticate(self, secret: str) -> Principal | None:
        now = _now()
        digest = hash_secret(secret)
        if secret.startswith(records.SESSION_PREFIX):
            return await self._session(digest, now)
        await self._import_if_changed()
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow("SELECT id, actor, role, org, project, expires_at, revoked_at, last_used_at "
                                      "FROM gateway.tokens WHERE sha256 = $1", digest)
            if row is None or records.state_of(revoked_at=row["revoked_at"], expires_at=row["expires_at"],
                                               now=now) is not records.State.ACTIVE:
                return None
            try:
                role, actor = Role(row["role"]), check_actor(row["actor"])
            except ValueError:
                return None  # a role or actor the file had that the contracts refuse: no access
            if records.touch_due(row["last_used_at"], now):
                await conn.execute("UPDATE gateway.tokens SET last_used_at = $2 WHERE id = $1", row["id"], now)
        org = token_org(role, row["org"])
        return Principal(token_id=row["id"], actor=actor, role=role, org=org, project=row["project"],
                         grants=token_grants(row["id"], role.value, org))

    async def _session(self, digest: str, now: datetime) -> Principal | None:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow("SELECT id, actor, roles, org, grants, expires_at, ended_at, last_used_at "
                                      "FROM gateway.sessions WHERE sha256 = $1", digest)
            if row is None or records.state_of(revoked_at=row["ended_at"], expires_at=row["expires_at"],
                                               now=now) is not records.State.ACTIVE:
                return None
            if records.touch_due(row["last_used_at"], now):
                await conn.execute("UPDATE gateway.sessions SET last_used_at = $2 WHERE id = $1", row["id"], now)
        roles = tuple(Role(r) for r in row["roles"] if r in Role._value2member_map_)
        if not roles:
            return None
        grants = tuple(Grant(g["kind"], g["value"], Source(g["source"]), g["because"])
                       for g in json.loads(row["grants"]))
        return Principal(token_id=row["id"], actor=row["actor"], role=roles[0], roles=roles, org=row["org"],
                         grants=grants, kind="session")

    async def revoked_actor(self, secret: str) -> str | None:
        """The actor of a revoked or expired token, or of an ended or expired session, with this secret."""
        table = "sessions" if secret.startswith(records.SESSION_PREFIX) else "tokens"
        async with self.pool.acquire() as conn:
            actor = await conn.fetchval(f"SELECT actor FROM gateway.{table} WHERE sha256 = $1", hash_secret(secret))
        return str(actor)[:200] if actor else None

    # -- tokens -------------------------------------------------------------------------------------------------

    async def issue(self, actor: str, role: Role | str, *, org: str | None = None, project: str | None = None,
                    description: str = "", expires_at: datetime | None = None, created_by: str | None = None,
                    now: datetime | None = None) -> NewSecret:
        role, actor = Role(role), check_actor(actor)
        secret = records.TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = secrets.token_hex(6)
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO gateway.tokens (id, sha256, actor, role, org, project, description, created_at, "
                "created_by, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                token_id, hash_secret(secret), actor, role.value, org, project, description, now or _now(),
                created_by, expires_at)
        return NewSecret(token_id, secret)

    async def revoke(self, token_id: str, *, by: str, actor: str | None = None) -> bool:
        """Revoke a token (kept for the record); ``actor``: only if it is that actor's own. False: no such token."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "UPDATE gateway.tokens SET revoked_at = COALESCE(revoked_at, $2), revoked_by = COALESCE(revoked_by, $3)"
                " WHERE id = $1 AND ($4::text IS NULL OR actor = $4) RETURNING id", token_id, _now(), by, actor)
        return row is not None

    async def tokens(self, *, actor: str | None = None) -> list[dict[str, Any]]:
        """Token records (never hashes), newest first; ``actor``: only that actor's."""
        await self._import_if_changed()
        now = _now()
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(f"SELECT {_TOKEN_COLUMNS} FROM gateway.tokens WHERE $1::text IS NULL OR actor = $1"
                                    " ORDER BY created_at DESC, id", actor)
        out = []
        for r in rows:
            item = dict(r)
            item["state"] = records.state_of(revoked_at=r["revoked_at"], expires_at=r["expires_at"], now=now).value
            item["revoked"] = r["revoked_at"] is not None
            out.append(item)
        return out

    # -- sessions -----------------------------------------------------------------------------------------------

    async def open_session(self, who: Identity, *, provider: str, kind: str, lifetime: timedelta,
                           id_token: str | None = None) -> NewSecret:
        secret = records.SESSION_PREFIX + secrets.token_urlsafe(32)
        session_id = "s-" + secrets.token_hex(8)
        now = _now()
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO gateway.sessions (id, sha256, kind, actor, provider, subject, roles, org, grants, "
                "id_token, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                session_id, hash_secret(secret), kind, who.actor, provider, who.subject, list(who.roles), who.org,
                json.dumps([g.as_dict() for g in who.grants]), id_token, now, now + lifetime)
        return NewSecret(session_id, secret)

    async def end_session(self, session_id: str, reason: str) -> dict[str, Any] | None:
        """End a session now; returns its provider and ID token (for the provider's logout), None if unknown."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "UPDATE gateway.sessions SET ended_at = COALESCE(ended_at, $2), ended_reason = COALESCE(ended_reason, $3)"
                " WHERE id = $1 RETURNING provider, id_token, actor", session_id, _now(), reason)
        return dict(row) if row is not None else None

    async def sessions(self, *, actor: str | None = None) -> list[dict[str, Any]]:
        """Live sessions (never their secrets or ID tokens), newest first; ``actor``: only that person's."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, kind, actor, provider, subject, roles, org, grants, created_at, expires_at, last_used_at"
                " FROM gateway.sessions WHERE ended_at IS NULL AND expires_at > $1 AND ($2::text IS NULL OR actor = $2)"
                " ORDER BY created_at DESC, id", _now(), actor)
        return [{**dict(r), "grants": json.loads(r["grants"])} for r in rows]

    async def end_sessions_of(self, actor: str, reason: str) -> int:
        """End every live session of a person now (someone who left); returns how many."""
        async with self.pool.acquire() as conn:
            ended = await conn.fetch("UPDATE gateway.sessions SET ended_at = $2, ended_reason = $3"
                                     " WHERE actor = $1 AND ended_at IS NULL RETURNING id", actor, _now(), reason)
        return len(ended)

    # -- role bindings ------------------------------------------------------------------------------------------

    async def bindings(self, provider: str) -> list[Binding]:
        """The bindings that apply to a provider's people (``*``: every binding)."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, subject, role, org, created_by FROM gateway.role_bindings"
                                    " WHERE $1 = '*' OR provider IN ($1, '*') ORDER BY created_at, id", provider)
        return [Binding(r["id"], r["subject"], r["role"], r["org"], r["created_by"]) for r in rows]

    async def bind(self, *, provider: str, subject: str, role: Role | str, org: str | None, by: str) -> str:
        binding_id = "b-" + secrets.token_hex(6)
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO gateway.role_bindings (id, provider, subject, role, org, created_at, created_by)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7)", binding_id, provider, subject, Role(role).value, org, _now(), by)
        return binding_id

    async def unbind(self, binding_id: str) -> bool:
        async with self.pool.acquire() as conn:
            return (await conn.fetchval("DELETE FROM gateway.role_bindings WHERE id = $1 RETURNING id",
                                        binding_id)) is not None

    # -- pending browser sign-ins -------------------------------------------------------------------------------

    async def save_login(self, *, state: str, provider: str, nonce: str, verifier: str, next_path: str,
                         lifetime: timedelta, cap: int) -> pending.Full | None:
        """Store a pending sign-in unless ``cap`` unexpired ones are stored already (then Full, stored nothing).
        Counted and stored under a transaction lock, so replicas starting sign-ins together stay within the cap."""
        now = _now()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _PENDING_LOCK)
            await conn.execute("DELETE FROM gateway.oidc_logins WHERE expires_at < $1", now)
            row = await conn.fetchrow("SELECT count(*) AS n, min(expires_at) AS oldest FROM gateway.oidc_logins")
            full = pending.admit(int(row["n"]), cap=cap, oldest_expires_at=row["oldest"], now=now)
            if full is not None:
                return full
            await conn.execute(
                "INSERT INTO gateway.oidc_logins (state, provider, nonce, verifier, next_path, created_at, expires_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7)", state, provider, nonce, verifier, next_path, now, now + lifetime)
        return None

    async def take_login(self, state: str) -> dict[str, Any] | None:
        """The pending sign-in of this state, consumed (a second callback with it finds nothing); None if unknown
        or expired."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow("DELETE FROM gateway.oidc_logins WHERE state = $1 RETURNING *", state)
        if row is None or row["expires_at"] <= _now():
            return None
        return dict(row)
