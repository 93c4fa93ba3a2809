"""Issue 4 end to end on the real stack (``teto up``: embedded NATS and PostgreSQL, five services, one executor):
a training script with a small GPU ceiling is interrupted at the ceiling with a checkpoint at step k and a bounded,
reported overshoot; a requeue with consumed+30 is refused 422 with the numbers; a submitter's token (made with
POST /v1/tokens) is refused 403; ``teto requeue --gpu-ceiling consumed+120`` is accepted and the job resumes at
step >= k, never 0, while its consumption only grows; the audit log holds the three requeue commands with their
outcomes; verify passes, names the row a superuser changed behind the trigger's back, and the database refuses
UPDATE and DELETE through the audit service's writer role and for the superuser too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
import pytest

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.contracts.subjects import Subjects
from libs.runtime.bus import Credentials
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import JOB_PYTHON, Stack, start_stack

pytestmark = pytest.mark.e2e

HEARTBEAT = 1.0  # the usage-report interval: every heartbeat carries one usage sample
GRACE = 10.0  # TETO_STOP_GRACE_SECONDS: time an executor gets to checkpoint and stop at the ceiling
CEILING = 12.0  # GPU-seconds: a CPU worker counts as one device, so about 12 s of training
TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_script.py")


def _spec() -> dict[str, Any]:
    # The example training script (standard library only, so it is stepping within a second of its start even
    # on a busy machine): far more steps than the ceiling allows, ~0.2 s each, a checkpoint every 5 steps.
    return {"name": "ceiling-e2e", "gpu_ceiling_seconds": CEILING, "checkpoint_every_steps": 5,
            "workload": {"kind": "command", "command": [JOB_PYTHON, TRAIN_SCRIPT],
                         "env": {"STEPS": "100000", "STEP_SECONDS": "0.2"}}}


class Consumption:
    """Every consumed_seconds the job showed, in the order seen: it must never go down."""

    def __init__(self, stack: Stack, job_id: str) -> None:
        self.stack, self.job_id, self.seen = stack, job_id, []

    def job(self) -> dict[str, Any]:
        job = self.stack.job(self.job_id)
        if job["budget"] is not None:
            self.seen.append(job["budget"]["consumed_seconds"])
        return job

    def settled(self) -> dict[str, Any] | None:
        """The job once its consumption stopped changing (the last usage sample of a stopped run arrived)."""
        before = self.job()["budget"]["consumed_seconds"]
        time.sleep(3 * HEARTBEAT)
        job = self.job()
        return job if job["budget"]["consumed_seconds"] == before else None

    def assert_never_decreased(self) -> None:
        assert self.seen == sorted(self.seen), self.seen


def _budget_status(nats_url: str, prefix: str, job_id: str, creds: str | None = None) -> BudgetStatusReply | None:
    """The budget service's answer to its status request (what the queue asks before a requeue), or None.
    Asked as the stack's NATS admin (``teto up`` refuses connections without credentials)."""

    async def go() -> BudgetStatusReply | None:
        nc = await nats.connect(nats_url, **(Credentials.load(creds).options() if creds else {}))
        try:
            msg = await nc.request(Subjects(prefix).rpc_budget_status, BudgetStatusRequest(job_id=job_id).encode(),
                                   timeout=1.0)
            return BudgetStatusReply.decode(msg.data)
        except Exception:  # noqa: BLE001 - no responder yet (NoRespondersError) or no answer in time
            return None
        finally:
            await nc.close()

    return asyncio.run(go())


def _sql(database_url: str, *statements: str) -> list[Any]:
    """Run statements on one connection (the embedded cluster's superuser); each result or the error raised."""

    async def go() -> list[Any]:
        conn = await asyncpg.connect(database_url)
        out: list[Any] = []
        try:
            for sql in statements:
                try:
                    out.append(await conn.fetch(sql))
                except asyncpg.PostgresError as exc:
                    out.append(exc)
        finally:
            await conn.close()
        return out

    return asyncio.run(go())


def test_ceiling_requeue_and_an_audit_log_nobody_can_rewrite(tmp_path: Path):
    data_dir = tmp_path / "teto"
    stack = start_stack(data_dir, executors=1, lease=6, heartbeat=HEARTBEAT,
                        extra_env={"TETO_STOP_GRACE_SECONDS": str(GRACE)})
    try:
        # 1. Submitted with a small ceiling: the budget block is there at once, nothing consumed yet.
        r = stack.post("/v1/jobs", _spec())
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        usage = Consumption(stack, job_id)
        first = eventually(lambda: (j := usage.job())["budget"] and j, 30, "the budget block")
        assert first["budget"]["ceiling_seconds"] == CEILING
        assert first["checkpoint"]["every_steps"] == 5
        # A job that asks for a GPU waits in the queue on this CPU-only fleet for the whole test. Its user's step
        # estimate says the first checkpoint will not fit its ceiling: the warning is there at submit.
        r = stack.post("/v1/jobs", {**_spec(), "name": "waits", "gpus_per_worker": 1, "gpu_ceiling_seconds": 30,
                                    "estimated_step_seconds": 4, "checkpoint_every_steps": 10})
        assert r.status_code == 201, r.text
        queued_id = r.json()["id"]
        warning = eventually(lambda: (stack.job(queued_id)["budget"] or {}).get("warning"), 30, "the warning")
        assert warning["expected_seconds"] == 40 and warning["ceiling_seconds"] == 30
        assert warning["source"] == "estimate" and "40" in warning["reason"] and "30" in warning["reason"]

        # 2. At the ceiling the run checkpoints and stops: interrupted (gpu_ceiling), checkpoint at step k.
        interrupted = eventually(lambda: (j := usage.job())["state"] in ("interrupted", "failed", "succeeded")
                                 and j, 180, "the job to stop at its ceiling")
        assert interrupted["state"] == "interrupted", (interrupted, stack.log_tail())
        assert interrupted["reason"] == "gpu_ceiling"
        k = interrupted["last_checkpoint"]["step"]
        assert k >= 5 and (data_dir / "checkpoints" / job_id / f"step-{k:08d}.pt").exists()
        assert interrupted["checkpoint"]["last_step"] == k and interrupted["checkpoint"]["next_eta_seconds"] is None
        events = [e["event"] for e in stack.events(job_id)]
        # The executor stops by its own clock at the GPU-seconds its grant carried; the budget's exhaustion
        # (a stop_requested) comes first only when its usage sample beat the run's end.
        assert "stop_requested" not in events or events.index("stop_requested") < events.index("interrupted")
        settled = eventually(usage.settled, 30, "the last usage sample of the stopped run")
        budget = settled["budget"]
        consumed = budget["consumed_seconds"]
        assert consumed >= CEILING and budget["remaining_seconds"] == 0
        # Overshoot is reported on the job and bounded by one usage-report interval plus the grace.
        assert budget["overshoot_seconds"] == pytest.approx(consumed - CEILING, abs=1e-6)
        assert budget["overshoot_seconds"] <= HEARTBEAT + GRACE, budget
        # The closing note's number, in two parts: how far the sample that crossed the ceiling went past it, and
        # what the run consumed between the stop being decided and the process being gone.
        all_events = stack.events(job_id)
        stops = [e for e in all_events if e["event"] == "stop_requested"]
        assert len(stops) <= 1
        at_detection = stops[0]["detail"]["consumed_seconds"] - CEILING if stops else 0.0
        print(f"\nmeasured overshoot past the ceiling: {budget['overshoot_seconds']:.2f} GPU-s = "
              f"{at_detection:.2f} in the crossing sample + {consumed - CEILING - at_detection:.2f} while stopping "
              f"(ceiling {CEILING:g}, heartbeat {HEARTBEAT:g}s, grace {GRACE:g}s)")
        # Time in the queue is never charged: the job no CPU-only executor can take has consumed nothing.
        waiting = stack.job(queued_id)
        assert waiting["state"] == "queued" and waiting["budget"]["consumed_seconds"] == 0
        assert waiting["checkpoint"]["next_eta_seconds"] is None  # no step measured yet

        # The budget service dies (SIGKILL) and is restarted by `teto up`: the totals are where they were, and the
        # requeues below (which ask it for the consumption) and the ledger go on from there.
        (budget_part,) = [p for p in stack.processes() if p["name"] == "budget"]
        os.kill(budget_part["pid"], signal.SIGKILL)
        eventually(lambda: [p for p in stack.processes() if p["name"] == "budget" and p["pid"] != budget_part["pid"]],
                   60, "the budget service to be restarted")
        info = json.loads((data_dir / "stack.json").read_text())
        reply = eventually(lambda: _budget_status(info["nats_url"], info["subject_prefix"], job_id,
                                                  info.get("nats_credentials_file")), 60,
                           "the restarted budget service to answer")
        assert reply.known and reply.consumed_seconds == consumed and reply.ceiling_seconds == CEILING
        assert usage.job()["budget"]["consumed_seconds"] == consumed

        # 3. A requeue leaving less than a minute: 422 with consumed, the minimum and the value given.
        r = stack.post(f"/v1/jobs/{job_id}/requeue", {"gpu_ceiling_seconds": consumed + 30})
        assert r.status_code == 422, r.text
        numbers = r.json()["detail"]
        assert numbers["consumed_seconds"] == pytest.approx(consumed)
        assert numbers["minimum_seconds"] == pytest.approx(consumed + 60)
        assert numbers["given_seconds"] == pytest.approx(consumed + 30)
        assert stack.job(job_id)["state"] == "interrupted"

        # 4. A submitter's token, made through the API, lacks finetune:manage: 403, nothing changes.
        r = stack.post("/v1/tokens", {"actor": "sam", "role": "submitter"})
        assert r.status_code == 201, r.text
        sam = {"Authorization": f"Bearer {r.json()['secret']}"}
        r = httpx.post(f"{stack.url}/v1/jobs/{job_id}/requeue", json={"gpu_ceiling_seconds": consumed + 120},
                       headers=sam, timeout=30)
        assert r.status_code == 403 and r.json()["permission"] == "finetune:manage", r.text
        assert stack.job(job_id)["state"] == "interrupted"

        # 5. `teto requeue --gpu-ceiling consumed+120` is accepted: back in the queue, earlier consumption kept.
        new_ceiling = round(consumed + 120, 3)
        out = stack.cli("requeue", job_id, "--gpu-ceiling", str(new_ceiling), "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["budget"]["ceiling_seconds"] == pytest.approx(new_ceiling)
        history = eventually(lambda: len(h := usage.job()["budget"]["ceiling_history"]) == 2 and h, 20,
                             "the new ceiling in the history")
        assert [h["ceiling_seconds"] for h in history] == [CEILING, pytest.approx(new_ceiling)]
        assert history[0]["actor"] == "local-admin" and history[1]["actor"] == "local-admin"
        assert history[1]["consumed_seconds"] == pytest.approx(consumed) and history[1]["at"]
        shown = stack.cli("job", job_id).stdout
        assert f"overshoot {budget['overshoot_seconds']:.6g}" in shown and "set by local-admin" in shown, shown
        # Its timeline as the CLI prints it: the first run's checkpoints folded, then the stop and the requeue.
        # `teto job` folds the latest events it reads (cli_format.EVENTS_READ): on a fast machine the first run
        # checkpoints more often than that, and the row then starts later and says earlier events exist. So the
        # row is checked against the events its own sequence numbers name: all of them the first run's
        # checkpoints, counted and their steps as printed, ending at the run's last checkpoint.
        every = stack.events(job_id)
        lines = shown.splitlines()
        at = {word: next(i for i, line in enumerate(lines) if f" {word}" in line)
              for word in ("checkpointed", "interrupted", "requeued")}
        assert at["checkpointed"] < at["interrupted"] < at["requeued"], shown
        row = lines[at["checkpointed"]]
        seqs = [int(n) for n in row.split()[0].split("-")]  # "a-b" for a fold, "a" for one checkpoint
        first, last = seqs[0], seqs[-1]
        folded = [e for e in every if first <= e["seq"] <= last]
        assert folded and all(e["event"] == "checkpointed" and e["epoch"] == 1 for e in folded), row
        steps = [e["detail"]["step"] for e in folded]
        assert (f"checkpointed x{len(steps)}" in row and f"steps {steps[0]}-{steps[-1]}" in row) if len(steps) > 1 \
            else f"step {steps[0]}" in row, row
        ran = [e["seq"] for e in every if e["event"] == "checkpointed" and e["epoch"] == 1]
        assert last == ran[-1], (row, ran[-3:])
        assert first == ran[0] or "(earlier events:" in shown, (row, ran[:3])

        # 6. It resumes from its checkpoint (step >= k, never 0) and the ledger continues from where it was.
        def resumed() -> dict | None:
            started = [e for e in stack.events(job_id) if e["event"] == "started"]
            return started[-1] if len(started) == 2 else None

        restart = eventually(resumed, 60, "the second run to start")
        assert restart["detail"]["resumed_from_step"] >= k
        later = eventually(lambda: (j := usage.job())["last_step"] and j["last_step"] > k
                           and j["budget"]["consumed_seconds"] > consumed and j, 60, "training past step k")
        assert later["state"] == "running" and later["budget"]["remaining_seconds"] > 0
        assert later["checkpoint"]["next_eta_seconds"] is not None  # step time measured while it runs
        r = stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "e2e done"})
        assert r.status_code == 200, r.text
        eventually(usage.settled, 30, "the cancelled run's last usage sample")
        usage.assert_never_decreased()
        assert stack.job(queued_id)["budget"]["consumed_seconds"] == 0  # still queued, still nothing charged

        # 7. The audit log holds the three requeue commands with their outcomes, filterable and paged.
        def requeues() -> list[dict] | None:
            r = stack.get("/v1/audit", params={"job_id": job_id, "kind": "requeue"})
            assert r.status_code == 200, r.text
            entries = r.json()["entries"]
            return entries if len([e for e in entries if e["outcome"] != "received"]) == 3 else None

        entries = eventually(requeues, 30, "three requeue outcomes in the audit log")
        by_outcome = {}
        for e in entries:
            by_outcome.setdefault(e["outcome"], []).append(e)
        assert len(by_outcome["received"]) == 2  # the gateway refused one: it never reached the command stream
        (accepted,) = by_outcome["accepted"]
        assert accepted["actor"] == "local-admin" and accepted["payload"]["by"] == "queue"
        too_low, forbidden = sorted(by_outcome["refused"], key=lambda e: e["payload"]["by"] != "queue")
        assert too_low["actor"] == "local-admin" and "consumed" in too_low["reason"]
        assert too_low["payload"]["detail"]["minimum_seconds"] == pytest.approx(consumed + 60)
        assert forbidden["actor"] == "sam" and forbidden["payload"]["by"] == "gateway"
        assert "finetune:manage" in forbidden["reason"]
        assert {e["command_id"] for e in by_outcome["received"]} == {too_low["command_id"], accepted["command_id"]}
        page1 = stack.get("/v1/audit", params={"job_id": job_id, "limit": 2}).json()
        page2 = stack.get("/v1/audit", params={"job_id": job_id, "limit": 2,
                                               "after_seq": page1["next_after_seq"]}).json()
        assert [e["seq"] for e in page1["entries"]][-1] < page2["entries"][0]["seq"]
        sams = stack.get("/v1/audit", params={"actor": "sam"}).json()["entries"]
        assert [e["command_id"] for e in sams] == [forbidden["command_id"]]
        window = {"since": forbidden["time"], "until": accepted["time"], "kind": "requeue", "job_id": job_id}
        assert forbidden["command_id"] in {e["command_id"] for e in stack.get("/v1/audit", params=window).json()
                                           ["entries"]}
        assert httpx.get(f"{stack.url}/v1/audit", headers=sam, timeout=15).status_code == 403
        r = stack.get("/v1/tokens")
        (sam_token,) = [t for t in r.json() if t["actor"] == "sam"]
        assert httpx.delete(f"{stack.url}/v1/tokens/{sam_token['id']}", headers=stack.headers).status_code == 204
        assert httpx.get(f"{stack.url}/v1/jobs", headers=sam, timeout=15).status_code == 401  # revoked at once

        # 8. The chain verifies, through the API and the CLI.
        verdict = stack.get("/v1/audit/verify").json()
        assert verdict["ok"] is True and verdict["first_bad_seq"] is None and verdict["checked"] >= 5
        # teto up gives the audit service (alone) its key: every row's mac is checked too.
        assert verdict["keyed"] is True and verdict["macs_checked"] == verdict["checked"], verdict
        assert (data_dir / "audit.key").stat().st_mode & 0o777 == 0o600
        out = stack.cli("audit", "verify")
        assert out.returncode == 0 and "intact" in out.stdout, out.stdout + out.stderr

        # 9. UPDATE and DELETE are refused through the writer role (no privilege) and for the superuser
        #    (the trigger); a superuser who disables the trigger can change a row, and verify names it.
        url = json.loads((data_dir / "stack.json").read_text())["database_url"]
        writer = f"{url.rsplit('/', 1)[-1]}_audit_writer"
        seq = too_low["seq"]
        (ledger,) = _sql(url, f"SELECT sum(gpu_seconds) AS total FROM budget.ledger WHERE job_id = '{job_id}'")
        assert ledger[0]["total"] == pytest.approx(usage.seen[-1])  # the total is the ledger's sum
        results = _sql(
            url,
            f'SET ROLE "{writer}"',
            f"UPDATE audit.log SET reason = 'nothing' WHERE seq = {seq}",
            f"DELETE FROM audit.log WHERE seq = {seq}",
            "RESET ROLE",
            f"UPDATE audit.log SET reason = 'nothing' WHERE seq = {seq}",
            f"DELETE FROM audit.log WHERE seq = {seq}",
            "ALTER TABLE audit.log DISABLE TRIGGER log_no_update_delete",
            f"UPDATE audit.log SET reason = 'accepted after all' WHERE seq = {seq}",
            "ALTER TABLE audit.log ENABLE TRIGGER log_no_update_delete",
        )
        _, w_update, w_delete, _, su_update, su_delete, *rest = results
        assert isinstance(w_update, asyncpg.InsufficientPrivilegeError), w_update
        assert isinstance(w_delete, asyncpg.InsufficientPrivilegeError), w_delete
        assert "append-only" in str(su_update) and "append-only" in str(su_delete)
        assert not any(isinstance(x, Exception) for x in rest), rest
        verdict = stack.get("/v1/audit/verify").json()
        assert verdict["ok"] is False and verdict["first_bad_seq"] == seq, verdict
        out = stack.cli("audit", "verify")
        assert out.returncode != 0 and f"seq {seq}" in out.stdout, out.stdout + out.stderr
    finally:
        rc = stack.stop()
    assert rc == 0
