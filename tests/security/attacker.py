"""A hostile ``command`` workload: everything a submitter's job could try against the platform that runs it.

Run by Teto as a job (tests/security/test_attacker_job.py), it tries each attack and prints one line
``ATTACK-RESULTS {json}``: for every attack, whether it got what it wanted (``"obtained": true`` is a breach)
and what stopped it. It never fails on purpose: the job must succeed so that its output is read.

argv[1] is a JSON object: ``stack_file``, ``tokens_file``, ``nats_url``, ``pg_host``, ``pg_port``,
``victim_checkpoint_dir``, ``marker`` (a word put in the command line of the processes left behind).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path


def _attempt(action) -> dict:
    try:
        got = action()
        return {"obtained": True, "detail": str(got)[:200]}
    except Exception as exc:  # noqa: BLE001 - every refusal is a result
        return {"obtained": False, "detail": f"{type(exc).__name__}: {exc}"[:300]}


def read_file(path: str) -> str:
    return Path(path).read_text()[:100]


def append_admin(path: str) -> str:
    with open(path, "a") as f:  # an admin token hash appended to the gateway's tokens file
        f.write('{"planted": true}')
    return "appended"


def listdir(path: str) -> list[str]:
    return os.listdir(path)


def plant(path: str) -> str:
    target = Path(path) / "step-99999999.pt"
    target.write_bytes(b"poisoned")
    return str(target)


def agent_environ() -> str:
    """The environment of every ancestor process (the guard, the agent): credentials live there."""
    found = []
    pid = os.getppid()
    while pid > 1:
        env = Path(f"/proc/{pid}/environ").read_bytes()
        found.append(env[:80])
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return repr(found)


def credentials_in_env() -> str:
    leaked = {k: v for k, v in os.environ.items()
              if any(w in k.upper() for w in ("NATS", "DATABASE", "PASSWORD", "TOKEN", "SECRET", "KEY"))}
    if leaked:
        return json.dumps(leaked)
    raise LookupError("no credential in the job's environment")


def nats_publish(url: str) -> str:
    import nats

    async def go() -> str:
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3,
                                error_cb=on_error)
        try:
            js = nc.jetstream()
            # A forged command under another actor's name.
            ack = await js.publish("teto.cmd.cancel", b'{"actor": "admin"}', timeout=3)
            return f"published: {ack}"
        finally:
            await nc.close()

    return asyncio.run(go())


def pg_login(host: str, port: int) -> str:
    import asyncpg

    async def go() -> str:
        tried = []
        for user in ("teto", "postgres", "teto_queue", "teto_budget", "teto_audit", "teto_gateway"):
            try:
                conn = await asyncpg.connect(host=host, port=port, user=user, database="teto", timeout=3)
            except Exception as exc:  # noqa: BLE001
                tried.append(f"{user}: {type(exc).__name__}")
                continue
            await conn.close()
            return f"logged in as {user}"
        raise PermissionError("; ".join(tried))

    return asyncio.run(go())


def leave_behind(marker: str) -> str:
    # Two classic escapes: a background child of a shell that exits at once, and a new session.
    subprocess.run(["sh", "-c", f"sleep 1000 {marker}-bg >/dev/null 2>&1 & exit 0"], check=True)
    subprocess.Popen(["setsid", "sh", "-c", f"exec sleep 1000 {marker}-setsid"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    raise RuntimeError("left behind (judged by the test after the run)")


def main() -> int:
    cfg = json.loads(sys.argv[1])
    results = {
        "read_stack_file": _attempt(lambda: read_file(cfg["stack_file"])),
        "read_tokens_file": _attempt(lambda: read_file(cfg["tokens_file"])),
        "append_tokens_file": _attempt(lambda: append_admin(cfg["tokens_file"])),
        "read_agent_environ": _attempt(agent_environ),
        "credentials_in_env": _attempt(credentials_in_env),
        "nats_publish_command": _attempt(lambda: nats_publish(cfg["nats_url"])),
        "pg_login": _attempt(lambda: pg_login(cfg["pg_host"], cfg["pg_port"])),
        "list_victim_checkpoints": _attempt(lambda: listdir(cfg["victim_checkpoint_dir"])),
        "plant_victim_checkpoint": _attempt(lambda: plant(cfg["victim_checkpoint_dir"])),
        "leave_processes": _attempt(lambda: leave_behind(cfg["marker"])),
    }
    print("ATTACK-RESULTS " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
