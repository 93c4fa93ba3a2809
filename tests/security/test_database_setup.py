"""No trust, anywhere: the embedded PostgreSQL refuses a connection without the password (including a cluster an
older Teto made with trust authentication, upgraded at its next start), and a deployment's ``teto db provision``
hands each service a URL file of its own that works, keeps its passwords across runs, and is readable by its
owner alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from libs.runtime.settings import CommonSettings
from teto.stack.embedded import EmbeddedPostgres

pytestmark = pytest.mark.security

OLD_TRUST_HBA = "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"


async def _refused_without_password(port: int, user: str = "teto") -> None:
    with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        await asyncpg.connect(f"postgresql://{user}@127.0.0.1:{port}/postgres", timeout=10)


async def test_a_cluster_made_with_trust_requires_a_password_after_its_next_start(stack_dir: Path):
    pg = EmbeddedPostgres(stack_dir / "postgres").start()
    try:
        await _refused_without_password(pg.port)
        pgdata = pg._pgdata()
        hba = pgdata / "pg_hba.conf"
        assert "trust" not in [line.split()[-1] for line in hba.read_text().splitlines() if line and line[0] != "#"]
        conn = await asyncpg.connect(pg.url)
        await conn.execute('ALTER ROLE "teto" PASSWORD NULL')  # what an older Teto's cluster looked like
        await conn.close()
    finally:
        pg.stop()
    owner = (hba.stat().st_uid, hba.stat().st_gid)
    hba.write_text(OLD_TRUST_HBA)
    os.chown(hba, *owner)
    pg.password_file.unlink()

    old = EmbeddedPostgres(stack_dir / "postgres", port=pg.port).start()
    try:
        assert old.password_file.stat().st_mode & 0o077 == 0
        await _refused_without_password(old.port)
        conn = await asyncpg.connect(old.url)
        assert await conn.fetchval("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid"
                                   " WHERE rolname = 'teto'")
        await conn.close()
    finally:
        old.stop()


def _teto(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "teto.cli", *args], capture_output=True, text=True, timeout=120)


async def test_a_deployment_provisions_one_url_file_per_service(env, tmp_path: Path):
    out = tmp_path / "out"
    admin = env.database_url
    first = _teto("db", "provision", "--admin-url", admin, "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    services = ("queue", "budget", "health", "audit", "gateway")
    urls = {s: (out / s / "database.url").read_text().strip() for s in services}
    for service, url in urls.items():
        assert (out / service / "database.url").stat().st_mode & 0o077 == 0
        settings = CommonSettings.from_env(env={"TETO_DATABASE_URL_FILE": str(out / service / "database.url")})
        conn = await asyncpg.connect(settings.database_url)
        assert (await conn.fetchval("SELECT current_user")).endswith(f"_{service}")
        await conn.close()
    again = _teto("db", "provision", "--admin-url", admin, "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert {s: (out / s / "database.url").read_text().strip() for s in urls} == urls  # same passwords

    password = tmp_path / "admin.password"
    assert _teto("db", "password", str(password)).returncode == 0
    made = password.read_text()
    assert password.stat().st_mode & 0o077 == 0 and len(made.strip()) >= 40
    assert _teto("db", "password", str(password)).returncode == 0 and password.read_text() == made  # kept

    # A login that is no superuser cannot provision (nor take over the others).
    refused = _teto("db", "provision", "--admin-url", urls["queue"], "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "no superuser" in refused.stderr
    assert all(u.split("@")[0].split(":")[-1] not in first.stdout for u in urls.values())
