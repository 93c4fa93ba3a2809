"""The four ways a submitter's job took the platform over, tried by a real job against the real stack.

``teto up`` (embedded NATS with the generated authorization, embedded PostgreSQL with per-service logins, executors
running jobs as unprivileged users) runs a victim training that leaves checkpoints, then a hostile ``command``
workload (tests/security/attacker.py) that tries: the admin token in the stack file and the tokens file (attack 1),
the bus without credentials (attack 2), the database without a password (attack 3), another job's checkpoints
(attack 4), the agent's environment, and processes that outlive the run. Every attempt must come back empty
handed, and the bus refusal must be visible in the NATS server's log.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.stack import JOB_PYTHON, start_stack
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ATTACKER = str(ROOT / "tests" / "security" / "attacker.py")
TRAIN_SCRIPT = str(ROOT / "examples" / "train_script.py")


def _attack_output(data_dir: Path, job_id: str) -> dict:
    for log in data_dir.rglob("*.log"):
        if job_id in str(log):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("ATTACK-RESULTS "):
                    return json.loads(line.split(" ", 1)[1])
    return {}


def _processes_with(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "attacker.py" not in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="job isolation is enforced when the agent runs as root")
def test_a_hostile_job_cannot_take_the_platform_over(stack_dir: Path) -> None:
    stack = start_stack(stack_dir, executors=2)
    try:
        victim = stack.post("/v1/jobs", {"name": "victim", "checkpoint_every_steps": 5, "workload": {
            "kind": "command", "command": [JOB_PYTHON, TRAIN_SCRIPT], "env": {"STEPS": "20"}}})
        assert victim.status_code in (200, 201, 202), victim.text
        victim_id = victim.json()["id"]
        assert stack.wait_state(victim_id, {"succeeded", "failed"}, 120)["state"] == "succeeded", stack.log_tail()
        victim_ckpts = stack_dir / "checkpoints" / victim_id
        before = sorted(p.name for p in victim_ckpts.iterdir())
        assert before, "the victim left no checkpoint to steal"

        info = json.loads((stack_dir / "stack.json").read_text())
        pg = urlsplit(info["database_url"])
        tokens_file = stack_dir / "tokens.json"
        tokens_before = tokens_file.read_bytes()
        marker = f"teto-leftover-{uuid.uuid4().hex[:8]}"
        cfg = {"stack_file": str(stack_dir / "stack.json"), "tokens_file": str(tokens_file),
               "nats_url": info["nats_url"], "pg_host": pg.hostname, "pg_port": pg.port,
               "victim_checkpoint_dir": str(victim_ckpts), "marker": marker}
        attack = stack.post("/v1/jobs", {"name": "attacker", "workload": {
            "kind": "command", "command": [JOB_PYTHON, ATTACKER, json.dumps(cfg)]}})
        assert attack.status_code in (200, 201, 202), attack.text
        attack_id = attack.json()["id"]
        assert stack.wait_state(attack_id, {"succeeded", "failed"}, 120)["state"] == "succeeded", stack.log_tail()

        results = eventually(lambda: _attack_output(stack_dir, attack_id), 30, "the attacker's report")
        breaches = {name: r["detail"] for name, r in results.items() if r["obtained"]}
        assert not breaches, f"attacks that worked: {breaches}"
        assert set(results) >= {"read_stack_file", "read_tokens_file", "append_tokens_file", "nats_publish_command",
                                "pg_login", "list_victim_checkpoints", "plant_victim_checkpoint"}
        # Refused, not merely absent: the files exist and the servers answered.
        for name in ("read_stack_file", "read_tokens_file", "list_victim_checkpoints"):
            assert "PermissionError" in results[name]["detail"], results[name]
        assert "authorization" in results["nats_publish_command"]["detail"].lower(), results["nats_publish_command"]
        assert tokens_file.read_bytes() == tokens_before
        assert sorted(p.name for p in victim_ckpts.iterdir()) == before
        # Nothing the run started outlives it.
        eventually(lambda: not _processes_with(marker), 15, f"the attacker's leftovers to be gone: "
                   f"{_processes_with(marker)}")
        # The bus refusal is visible to an operator.
        nats_logs = "".join(p.read_text(errors="replace") for p in stack_dir.rglob("nats*.log"))
        assert "authentication error" in nats_logs.lower() or "authorization violation" in nats_logs.lower()
        # And no part of the platform itself was refused anything: least privilege still lets each do its work.
        assert "violation" not in nats_logs.lower().replace("authorization violation", ""), nats_logs[-3000:]
    finally:
        stack.stop()
