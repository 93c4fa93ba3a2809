"""Issue 30 follow-up, on the real servers: with no shared volume for a tokens file, a deployment's first admin
token is written into the gateway's database from the gateway's own container (`teto tokens create
--in-database`, its database login from the environment); both gateway replicas accept it at once, as who it
says, and it is an ordinary token of the database (listed, revocable everywhere)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.security.identity_stack import get, identity_stack

pytestmark = pytest.mark.security


async def test_the_first_admin_token_written_into_the_database_works_on_every_replica_at_once(env, tmp_path):
    async with identity_stack(env, tmp_path / "s") as s:
        cli = [sys.executable, "-m", "teto.cli", "tokens", "create", "--in-database", "--json"]
        done = subprocess.run([*cli, "--actor", "first-admin", "--role", "admin"], capture_output=True, text=True,
                              timeout=60, env=env.env_vars(TETO_DATA_DIR=str(tmp_path / "elsewhere")))
        assert done.returncode == 0, done.stderr
        made = json.loads(done.stdout)
        assert not (tmp_path / "elsewhere" / "tokens.json").exists()  # the database, not a file
        for url in s.urls:
            who = await get(url, "/v1/whoami", made["secret"])
            assert who.status_code == 200, who.text
            assert (who.json()["actor"], who.json()["role"], who.json()["token_id"]) == (
                "first-admin", "admin", made["id"])
        listed = await get(s.urls[1], "/v1/tokens", made["secret"])
        assert {t["id"]: t["created_by"] for t in listed.json()}[made["id"]] == "teto tokens create --in-database"
        # An actor the bus would refuse (a control character) is refused before anything is written.
        refused = subprocess.run([*cli, "--actor", "bad\x07actor", "--role", "admin"], capture_output=True,
                                 text=True, timeout=60, env=env.env_vars())
        assert refused.returncode == 2 and "control characters" in refused.stderr, (refused.stdout, refused.stderr)
        assert await s.db.fetchval("SELECT count(*) FROM gateway.tokens WHERE actor LIKE 'bad%'") == 0
