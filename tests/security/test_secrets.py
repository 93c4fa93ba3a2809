"""Attack: read a job's secret (an HF token) from anywhere but the run. A real executor runs a ``command``
workload whose ``HF_TOKEN`` is marked secret; the script proves it got the value (it writes the value's SHA-256)
while the value appears in none of: any message on any stream of the bus (commands, grants, events), any row of
any table or view in the database (queue, audit, budget, health), the API's job, list, events and audit
answers (which show it redacted, without ciphertext either), or any file the executor wrote (its log, the
run's log). Without a key the gateway refuses the secret, naming the setting, and audits the refusal."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from pathlib import Path

import nats
import pytest

from libs.contracts.secrets import REDACTED
from libs.contracts.subjects import Subjects
from libs.runtime.sealing import write_key_file
from tests.security.gateway_stack import Stack, gateway_stack
from tests.support.services import eventually

pytestmark = pytest.mark.security

SCRIPT = """
import hashlib, os, pathlib, sys
value = os.environ["HF_TOKEN"]
digest = hashlib.sha256(value.encode()).hexdigest()
pathlib.Path(os.environ["RESULT"]).write_text(digest)
print("token sha256", digest, "plain", os.environ["PLAIN"], flush=True)
"""


async def bus_bytes(s: Stack) -> bytes:
    """Every message of every stream of this test's prefix, concatenated (data and headers)."""
    nc = await nats.connect(s.env.infra.nats_url)
    try:
        js = nc.jetstream()
        out = bytearray()
        # This prefix's streams by name (listing every stream of the shared server pages past a few hundred).
        for spec in Subjects(s.env.prefix).streams():
            try:
                info = await js.stream_info(spec.name)
            except Exception:  # noqa: BLE001 - a stream this test's parts never declared
                continue
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(info.config.name, seq)
                except Exception:  # noqa: BLE001 - a deleted or expired message
                    continue
                out += msg.data or b""
                out += json.dumps(msg.headers or {}).encode()
        return bytes(out)
    finally:
        await nc.close()


async def database_text(s: Stack) -> str:
    """Every row of every table and view of the test's database, as text."""
    names = await s.db.fetch("SELECT table_schema, table_name FROM information_schema.tables"
                             " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')")
    parts = []
    for n in names:
        rows = await s.db.fetch(f'SELECT t::text AS row FROM "{n["table_schema"]}"."{n["table_name"]}" t')
        parts.extend(r["row"] for r in rows)
    return "\n".join(parts)


def files_text(root: Path, skip: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and p != skip)


async def test_a_secret_reaches_the_run_and_nothing_else(env, tmp_path):
    key = write_key_file(tmp_path / "keys" / "secrets.key")
    secret = f"hf_{uuid.uuid4().hex}{uuid.uuid4().hex}"
    async with gateway_stack(env, tmp_path / "s", health=True, secrets_key=str(key)) as s:
        s.start_executor("sec-1", TETO_SECRETS_KEY=str(key))
        await s.wait_executors("sec-1")
        result = s.root / "result.txt"
        spec = {"name": "with-secret", "workload": {"kind": "command", "command": [sys.executable, "-c", SCRIPT],
                                                    "env": {"HF_TOKEN": {"secret": secret}, "RESULT": str(result),
                                                            "PLAIN": "visible-to-owner"}}}
        r = await s.as_("olga").post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert r.json()["spec"]["workload"]["env"]["HF_TOKEN"] == REDACTED

        async def done() -> dict | None:
            job = (await s.as_("olga").get(f"/v1/jobs/{job_id}")).json()
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None
        job = await eventually(done, 90, "the job to end")
        assert job["state"] == "succeeded", job
        # The run had the value.
        assert result.read_text() == hashlib.sha256(secret.encode()).hexdigest()

        # The API: the job, the list, the events, the audit log show it redacted, with no ciphertext.
        shown = [job, (await s.as_("olga").get("/v1/jobs")).json(),
                 (await s.as_("olga").get(f"/v1/jobs/{job_id}/events")).json()]
        await eventually(lambda: s.audit_rows(kind="submit", outcome="received"), 20, "the audited submit")
        shown.append((await s.as_("aude").get("/v1/audit", params={"job_id": job_id})).json())
        api = json.dumps(shown)
        assert secret not in api and '"v1.' not in api
        assert job["spec"]["workload"]["env"] == {"HF_TOKEN": REDACTED, "RESULT": str(result),
                                                  "PLAIN": "visible-to-owner"}
        submitted = next(e for e in shown[2] if e["event"] == "submitted")
        assert submitted["detail"]["spec"]["workload"]["env"]["HF_TOKEN"] == REDACTED

        # Storage and transport: only ciphertext, and only where the job must be able to run again.
        bus = await bus_bytes(s)
        assert secret.encode() not in bus
        assert job_id.encode() in bus and b'"sealed":"v1.' in bus.replace(b" ", b"")  # it did read the streams
        stored = await database_text(s)
        assert secret not in stored and job_id in stored
        assert "v1." in (await s.db.fetchval("SELECT spec::text FROM queue.jobs WHERE id = $1", job_id))
        audited = "\n".join(r["payload_text"] for r in await s.audit_rows())
        assert "v1." not in audited and secret not in audited
        # The executor's files: its own log, the run's log (which has the script's output: only the digest).
        assert secret.encode() not in files_text(s.root, skip=result)
        assert b"token sha256" in files_text(s.root / "executors", skip=result)


async def test_without_a_key_a_secret_is_refused_naming_the_setting(env, tmp_path):
    secret = f"hf_{uuid.uuid4().hex}"
    async with gateway_stack(env, tmp_path / "s") as s:
        spec = {"workload": {"kind": "command", "command": ["true"], "env": {"HF_TOKEN": {"secret": secret}}}}
        r = await s.as_("olga").post("/v1/jobs", json=spec)
        assert r.status_code == 422, r.text
        assert "TETO_SECRETS_KEY" in r.json()["reason"] and secret not in r.text
        refused = await eventually(lambda: s.audit_rows(actor="olga", kind="submit", outcome="refused"), 20, "audit")
        assert "TETO_SECRETS_KEY" in refused[0]["reason"]
        assert secret not in await database_text(s)
        # A sealed value is never accepted from a user (a copy of a redacted view, or a forged ciphertext).
        spec["workload"]["env"] = {"HF_TOKEN": {"sealed": "redacted"}}
        r = await s.as_("olga").post("/v1/jobs", json=spec)
        assert r.status_code == 422 and "sealed value cannot be submitted" in r.json()["reason"]
        assert await s.db.fetchval("SELECT count(*) FROM queue.jobs") == 0
