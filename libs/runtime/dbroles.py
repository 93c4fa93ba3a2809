"""PostgreSQL least privilege: one login per service, each owning only its own schema.

Who may do what is decided here, as SQL built by pure functions of role and schema names, and applied by
``provision`` (connected as the database administrator, before the services start):

- ``<db>_queue``, ``<db>_budget``, ``<db>_health``: a login each, owning its schema (and so everything its
  migrations create there); it can touch nothing in another service's schema.
- ``<db>_gateway``: USAGE on the service schemas and SELECT on their ``*_public`` views; in its own schema, the
  identity tables (tokens, sessions, role bindings, pending sign-ins) and nothing else.
- ``<db>_audit``: a login that owns nothing: through ``<db>_audit_writer`` it may INSERT and SELECT the audit log.
  The log, its sequence, triggers and functions belong to ``<db>_audit_owner``, a NOLOGIN role no service is a
  member of, so no service can disable the append-only triggers, drop or rewrite the table.
- PUBLIC loses CONNECT and TEMPORARY on the database and CREATE on the ``public`` schema; each login gets
  CONNECT back. Passwords are stored as SCRAM-SHA-256 verifiers computed here (the plain password never
  reaches the server or its logs).

Role names carry the database name because roles are cluster-wide: installations (and test databases) that
share a cluster stay apart, and ``teto up``'s database ``teto`` gives ``teto_queue`` and so on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

SERVICES = ("queue", "budget", "health", "audit", "gateway")
OWNING = ("queue", "budget", "health")  # services whose login owns its own schema
READ_SCHEMAS = ("queue", "budget", "health", "audit")  # schemas whose *_public views the gateway reads
# Tables the gateway reads besides the views: none (``/v1/audit/verify`` asks the audit service, which alone holds
# the audit key).
GATEWAY_TABLE_READS: tuple[tuple[str, str], ...] = ()
# The gateway's own identity tables (services/gateway/migrations/002_identity.sql): what it may do to each. Tokens
# and sessions are never deleted (revocation and sign-out keep the record), so DELETE is not among them.
GATEWAY_OWN_TABLES: tuple[tuple[str, str], ...] = (
    ("tokens", "SELECT, INSERT, UPDATE"), ("sessions", "SELECT, INSERT, UPDATE"),
    ("role_bindings", "SELECT, INSERT, DELETE"), ("oidc_logins", "SELECT, INSERT, DELETE"))
SCRAM_ITERATIONS = 4096


@dataclass(frozen=True)
class Roles:
    """The role names of one installation (one database)."""

    database: str

    def login(self, service: str) -> str:
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}")
        return f"{self.database}_{service}"

    @property
    def audit_owner(self) -> str:
        return f"{self.database}_audit_owner"

    @property
    def audit_writer(self) -> str:
        """The name services/audit/migrations/001_log.sql grants INSERT/SELECT on the log to."""
        return f"{self.database}_audit_writer"

    def owner(self, schema: str) -> str | None:
        """The role that owns ``schema`` (None: the administrator, for the gateway's bookkeeping schema)."""
        if schema in OWNING:
            return self.login(schema)
        if schema == "audit":
            return self.audit_owner
        return None

    @property
    def logins(self) -> list[str]:
        return [self.login(s) for s in SERVICES]


def ident(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def new_password() -> str:
    """URL-safe (it goes into DSNs unescaped), 256 bits."""
    return secrets.token_urlsafe(32)


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5803 / 7677 format)."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def login_url(admin_url: str, user: str, password: str) -> str:
    """The administrator's DSN with another user and password (same host, port, database, options)."""
    parts = urlsplit(admin_url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_url(url: str) -> str:
    """A DSN safe to print: the password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# -- SQL, as pure functions of names -------------------------------------------------------------------------

_NO_POWERS = "NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"


def role_sql(name: str, *, exists: bool, verifier: str | None) -> list[str]:
    """Create or reset one role: a login with this SCRAM verifier, or (verifier None) a NOLOGIN role with none."""
    attrs = (f"LOGIN INHERIT {_NO_POWERS} PASSWORD {literal(verifier)}" if verifier is not None
             else f"NOLOGIN NOINHERIT {_NO_POWERS} PASSWORD NULL")
    return [f"{'ALTER' if exists else 'CREATE'} ROLE {ident(name)} {'WITH ' if exists else ''}{attrs}"]


def membership_sql(roles: Roles) -> list[str]:
    """The only memberships among Teto's roles: the audit login (and the owner, whose migration checks it) in
    the writer. Any other is revoked, so no login can SET ROLE to an owner or to another service."""
    out = [f"GRANT {ident(roles.audit_writer)} TO {ident(roles.audit_owner)}",
           f"GRANT {ident(roles.audit_writer)} TO {ident(roles.login('audit'))}"]
    for login in roles.logins:
        out.append(f"REVOKE {ident(roles.audit_owner)} FROM {ident(login)}")
        for other in roles.logins:
            if other != login:
                out.append(f"REVOKE {ident(other)} FROM {ident(login)}")
        if login != roles.login("audit"):
            out.append(f"REVOKE {ident(roles.audit_writer)} FROM {ident(login)}")
    return out


def database_sql(roles: Roles) -> list[str]:
    """PUBLIC may neither connect, nor create temporary objects, nor create in ``public``; logins connect."""
    db = ident(roles.database)
    return [f"REVOKE ALL ON DATABASE {db} FROM PUBLIC",
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
            *(f"REVOKE CREATE ON SCHEMA public FROM {ident(login)}" for login in roles.logins),
            f"GRANT CONNECT ON DATABASE {db} TO {', '.join(ident(x) for x in roles.logins)}"]


def other_database_sql(database: str) -> list[str]:
    """For a cluster Teto alone uses (the embedded one): nobody but the administrator connects elsewhere."""
    return [f"REVOKE CONNECT, TEMPORARY ON DATABASE {ident(database)} FROM PUBLIC"]


def schema_sql(schema: str, owner: str | None, *, exists: bool) -> list[str]:
    """Create the schema owned by ``owner``, or hand an existing one (and all it holds) over to it: an
    installation made before per-service logins had everything owned by the one login it used."""
    if not exists:
        return [f"CREATE SCHEMA {ident(schema)}" + (f" AUTHORIZATION {ident(owner)}" if owner else "")]
    if owner is None:
        return []
    return [f"ALTER SCHEMA {ident(schema)} OWNER TO {ident(owner)}", reown_sql(schema, owner)]


def reown_sql(schema: str, owner: str) -> str:
    """One DO block giving every table, view, sequence and function in ``schema`` to ``owner``."""
    return f"""DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS obj, CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                    WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END AS kind
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = {literal(schema)} AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
               AND pg_get_userbyid(c.relowner) <> {literal(owner)} LOOP
        EXECUTE format('ALTER %s %s OWNER TO %I', r.kind, r.obj, {literal(owner)});
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS obj FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = {literal(schema)} AND c.relkind = 'S' AND pg_get_userbyid(c.relowner) <> {literal(owner)}
               AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')) LOOP
        EXECUTE format('ALTER SEQUENCE %s OWNER TO %I', r.obj, {literal(owner)});
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS obj FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = {literal(schema)} AND pg_get_userbyid(p.proowner) <> {literal(owner)} LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.obj, {literal(owner)});
    END LOOP;
END $$"""


def audit_grants_sql(roles: Roles) -> list[str]:
    """What the audit login may do, and nothing more: append and read through the writer, read its migrations.

    (services/audit/migrations/001_log.sql grants the writer the same when run as the owner; repeated here
    so an installation upgraded from one login ends in the same place.)"""
    writer, login = ident(roles.audit_writer), ident(roles.login("audit"))
    return [f"REVOKE ALL ON ALL TABLES IN SCHEMA audit FROM {login}",
            f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA audit FROM {login}",
            f"GRANT USAGE ON SCHEMA audit TO {writer}, {login}",
            f"GRANT SELECT, INSERT ON audit.log TO {writer}",
            f"GRANT USAGE ON SEQUENCE audit.log_seq_seq TO {writer}",
            f"GRANT SELECT ON audit.schema_migrations TO {login}"]


def gateway_grants_sql(roles: Roles, views: Mapping[str, list[str]]) -> list[str]:
    """The gateway: USAGE on the schemas, SELECT on each ``*_public`` view (``views``: schema -> names) and on
    GATEWAY_TABLE_READS, and its own schema's migration record (so it can check it is up to date); anything
    granted before is revoked."""
    gw = ident(roles.login("gateway"))
    out = []
    for schema in (*READ_SCHEMAS, "gateway"):
        out += [f"REVOKE ALL ON ALL TABLES IN SCHEMA {ident(schema)} FROM {gw}",
                f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {ident(schema)} FROM {gw}",
                f"GRANT USAGE ON SCHEMA {ident(schema)} TO {gw}"]
    for schema in READ_SCHEMAS:
        for view in views.get(schema, []):
            if not view.endswith("_public"):
                raise ValueError(f"{schema}.{view} is not a public view")
            out.append(f"GRANT SELECT ON {ident(schema)}.{ident(view)} TO {gw}")
    for schema, table in GATEWAY_TABLE_READS:
        out.append(f"GRANT SELECT ON {ident(schema)}.{ident(table)} TO {gw}")
    out.append(f"GRANT SELECT ON gateway.schema_migrations TO {gw}")
    out += [f"GRANT {rights} ON gateway.{ident(table)} TO {gw}" for table, rights in GATEWAY_OWN_TABLES]
    return out


def public_view_grants_sql(schema: str, views: list[str], reader: str) -> list[str]:
    """An owner giving the gateway its new public views (after a migration it applied itself)."""
    return [f"GRANT USAGE ON SCHEMA {ident(schema)} TO {ident(reader)}",
            *(f"GRANT SELECT ON {ident(schema)}.{ident(v)} TO {ident(reader)}" for v in views if v.endswith("_public"))]


# -- I/O at the edge -----------------------------------------------------------------------------------------

PUBLIC_VIEWS = ("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = $1 AND c.relkind IN ('v', 'm') AND c.relname LIKE '%\\_public' ORDER BY 1")


async def _run(conn: asyncpg.Connection, statements: list[str]) -> None:
    for sql in statements:
        await conn.execute(sql)


async def provision_roles(conn: asyncpg.Connection, passwords: Mapping[str, str], *,
                          other_databases: bool = False) -> Roles:
    """Before migrations, as the administrator connected to the installation's database: the roles (logins
    with ``passwords[service]``), their memberships, the database's privileges and the schemas with their
    owners. Idempotent: run at every start, it resets passwords and takes back anything granted since."""
    roles = Roles(await conn.fetchval("SELECT current_database()"))
    # Two installers of one database at once would race on CREATE ROLE: serialize them.
    await conn.execute("SELECT pg_advisory_lock(hashtext('teto:provision'))")
    try:
        existing = {r["rolname"] for r in await conn.fetch("SELECT rolname FROM pg_roles")}
        for service in SERVICES:
            name = roles.login(service)
            await _run(conn, role_sql(name, exists=name in existing, verifier=scram_verifier(passwords[service])))
        for name in (roles.audit_owner, roles.audit_writer):
            await _run(conn, role_sql(name, exists=name in existing, verifier=None))
        await _run(conn, membership_sql(roles))
        await _run(conn, database_sql(roles))
        if other_databases:
            for name in await conn.fetch("SELECT datname FROM pg_database WHERE datname <> current_database()"
                                         " AND datallowconn"):
                await _run(conn, other_database_sql(name["datname"]))
        present = {r["nspname"] for r in await conn.fetch("SELECT nspname FROM pg_namespace")}
        for schema in SERVICES:
            await _run(conn, schema_sql(schema, roles.owner(schema), exists=schema in present))
    finally:
        await conn.execute("SELECT pg_advisory_unlock(hashtext('teto:provision'))")
    return roles


async def grant_reads(conn: asyncpg.Connection, roles: Roles) -> None:
    """After migrations: the audit login's and the gateway's grants on what the migrations created."""
    await _run(conn, audit_grants_sql(roles))
    views = {s: [r["relname"] for r in await conn.fetch(PUBLIC_VIEWS, s)] for s in READ_SCHEMAS}
    await _run(conn, gateway_grants_sql(roles, views))


async def share_public_views(conn: asyncpg.Connection, schema: str) -> None:
    """Called by ``db.migrate`` after it applied migrations as a schema's owner: if this installation has a
    gateway login, give it the schema's public views (a new one would otherwise be unreadable until the
    administrator provisions again)."""
    reader = f"{await conn.fetchval('SELECT current_database()')}_gateway"
    if schema not in READ_SCHEMAS or not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", reader):
        return
    views = [r["relname"] for r in await conn.fetch(PUBLIC_VIEWS, schema)]
    await _run(conn, public_view_grants_sql(schema, views, reader))
