"""Attack 3 on the real stack (``teto up``): a ``command`` job looks for a way into the database. Its executor
was handed no database URL, the embedded PostgreSQL trusts nobody (no password: refused, for the superuser and
every login), and the services each run under their own login; the job still succeeds and the ledger reconciles.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.stack import JOB_PYTHON, start_stack

pytestmark = pytest.mark.security

# The attacking job: everything in its environment that smells of PostgreSQL, then passwordless logins as the
# superuser and as each service. Exit 0: nothing found and every attempt refused; 3: it got in.
ATTACK = r"""
import asyncio, json, os, sys
import asyncpg
port, db = sys.argv[1], sys.argv[2]
leaks = {k: v for k, v in os.environ.items() if "DATABASE" in k or k.startswith("PG") or "postgresql://" in v}
async def attempt(user):
    try:
        conn = await asyncpg.connect(f"postgresql://{user}@127.0.0.1:{port}/{db}", timeout=10)
    except Exception as exc:
        return f"refused: {type(exc).__name__}"
    await conn.close()
    return "CONNECTED"
got = {u: asyncio.run(attempt(u)) for u in ["teto", "postgres", *(f"{db}_{s}" for s in
       ("queue", "budget", "health", "audit", "gateway"))]}
print(json.dumps({"leaks": sorted(leaks), "attempts": got}))
sys.exit(3 if leaks or "CONNECTED" in got.values() else 0)
"""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            out.append(int(child))
            todo.append(int(child))
    return out


def test_a_job_finds_no_way_into_the_database(stack_dir: Path):
    stack = start_stack(stack_dir, executors=1)
    try:
        info = json.loads((stack_dir / "stack.json").read_text())
        port = info["database_url"].rsplit(":", 1)[1].split("/")[0]
        spec = {"name": "db-attack", "workload": {"kind": "command",
                                                  "command": [JOB_PYTHON, "-c", ATTACK, port, "teto"]}}
        r = stack.post("/v1/jobs", spec)
        assert r.status_code in (201, 202), r.text
        job_id = r.json()["id"]
        done = stack.wait_state(job_id, {"succeeded", "failed"}, 180)
        assert done["state"] == "succeeded", (done, stack.log_tail())

        # The executor (and anything it started) holds no database URL; each service holds its own login only.
        parts = {p["name"]: p["pid"] for p in stack.processes()}
        executors = [pid for name, pid in parts.items() if name.startswith("executor")]
        assert executors
        for pid in executors:
            for proc in [pid, *_descendants(pid)]:
                assert "TETO_DATABASE_URL" not in _environ(proc), proc
        for service in ("queue", "budget", "health", "audit", "gateway"):
            url = _environ(parts[service])["TETO_DATABASE_URL"]
            assert url.startswith(f"postgresql://teto_{service}:"), (service, url.split("@")[0].split(":")[1])

        # The credentials teto up keeps are its own user's alone; the administrator's tools still work.
        for name in ("db-logins.json", "postgres/superuser.password", "stack.json"):
            assert (stack_dir / name).stat().st_mode & 0o077 == 0, name
        # The attempts are visible: the server logged each refused login.
        server_log = (stack_dir / "postgres" / "pgdata" / "server.log").read_text(errors="replace")
        for user in ("teto", "teto_queue", "teto_audit"):
            assert f'password authentication failed for user "{user}"' in server_log \
                or f'no password supplied for user "{user}"' in server_log, user
        out = stack.cli("budget", "reconcile")
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        rc = stack.stop()
    assert rc == 0

    # Running it again on the same data directory: same logins, same passwords, the job still there.
    logins = json.loads((stack_dir / "db-logins.json").read_text())
    stack = start_stack(stack_dir, executors=1)
    try:
        assert stack.job(job_id)["state"] == "succeeded"
        assert json.loads((stack_dir / "db-logins.json").read_text()) == logins
    finally:
        assert stack.stop() == 0
