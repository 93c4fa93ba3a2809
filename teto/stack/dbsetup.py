"""``teto up``'s database step: one login per service, every schema migrated by the administrator as its owner,
and each part handed only its own URL (executors none).

The administrator (the embedded cluster's superuser, or the ``TETO_DATABASE_URL`` given to ``teto up``) creates
the roles (libs/runtime/dbroles.py), applies every service's migrations as the schema's owner role, then grants
the audit login and the gateway what they read. Services start afterwards: the queue, budget and health find
their migrations applied (they could apply new ones themselves, they own their schema); the audit service and
the gateway own nothing and only check. The logins' passwords are kept in ``<data-dir>/db-logins.json`` (0600)
and reset at every start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from libs.runtime import db, dbroles

log = logging.getLogger("teto.up")

LOGINS_FILE = "db-logins.json"
ORDER = ["audit", "budget", "health", "queue", "gateway"]


@dataclass(frozen=True)
class DatabaseLogins:
    admin_url: str
    urls: dict[str, str]  # service -> its own DSN
    roles: dbroles.Roles


def passwords(data_dir: Path) -> dict[str, str]:
    """The logins' passwords of an earlier run, or new ones (written 0600 before any role uses them)."""
    path = data_dir / LOGINS_FILE
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    out = {s: known[s] if isinstance(known.get(s), str) and known[s] else dbroles.new_password()
           for s in dbroles.SERVICES}
    if out != known:
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        os.chmod(tmp, 0o600)
        tmp.write_text(json.dumps(out, indent=2))
        os.replace(tmp, path)
    return out


async def _may_provision(conn) -> bool:
    return bool(await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))


async def provision(admin_url: str, secrets: dict[str, str], *, own_cluster: bool) -> DatabaseLogins | None:
    """Roles (with ``secrets[service]`` as passwords), migrations as owners, grants. None (nothing changed) when
    the administrator is no superuser."""
    pool = await db.create_pool(admin_url, max_size=2)
    try:
        async with pool.acquire() as conn:
            if not await _may_provision(conn):
                return None
            roles = await dbroles.provision_roles(conn, secrets, other_databases=own_cluster)
        for schema in ORDER:
            await db.migrate(pool, schema, f"services.{schema}", as_role=roles.owner(schema))
        async with pool.acquire() as conn:
            await dbroles.grant_reads(conn, roles)
    finally:
        await db.close_pool(pool)
    urls = {s: dbroles.login_url(admin_url, roles.login(s), secrets[s]) for s in dbroles.SERVICES}
    return DatabaseLogins(admin_url, urls, roles)


def setup(admin_url: str, data_dir: Path, own: dict[str, dict[str, str | None]], *, own_cluster: bool) -> bool:
    """Provision, and put each service's URL in its own environment and none in the executors'. Returns whether
    least privilege is in force (False: every service shares ``admin_url``, as a warning says)."""
    own.setdefault("executor", {})["TETO_DATABASE_URL"] = None  # an agent never touches the database
    logins = asyncio.run(provision(admin_url, passwords(data_dir), own_cluster=own_cluster))
    if logins is None:
        log.warning("database least privilege NOT enforced: %s is no superuser, so it cannot create one login "
                    "per service; every service uses it", dbroles.redact_url(admin_url))
        return False
    for service, url in logins.urls.items():
        own.setdefault(service, {})["TETO_DATABASE_URL"] = url
    log.info("PostgreSQL: one login per service (%s), executors have no database URL",
             ", ".join(logins.roles.logins))
    if os.geteuid() != 0:
        log.warning("not root: the database passwords in %s are protected by file mode only, so processes "
                    "running as this same user (jobs included) can read them", data_dir)
    return True
