"""Seeing into a real ``teto up`` (JSON logs on): every process's metrics endpoint is scraped during and after a
fine-tune and shows the named series with plausible values (GPU-seconds charged equal to what the budget
ledger holds), ``GET /v1/status`` and ``teto status`` show each service's replica and singleton holders, the NATS
server and its streams, consumer lag, the database and the executors, and the parts' log lines are JSON objects
that carry the job, executor and command they are about."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import Stack, start_stack

# A whole `teto up`, two checked nodes and a fine-tune: minutes on 2 shared cores, past the suite's 300 s default.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SERVICES = ("audit", "budget", "gateway", "health", "queue")


def scrape(url: str) -> dict[str, list]:
    """{sample name: [samples]} of one endpoint."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def total(found: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def endpoints(stack: Stack) -> dict[str, str]:
    return json.loads((stack.data_dir / "metrics.json").read_text())


def consumed(stack: Stack) -> float:
    return sum(float((j.get("budget") or {}).get("consumed_seconds") or 0.0)
               for j in stack.get("/v1/jobs").json())


def test_metrics_status_and_json_logs_on_a_real_stack(stack_dir: Path):
    stack = start_stack(stack_dir, extra_env={"TETO_LOG_FORMAT": "json", "TETO_METRICS_SAMPLE_SECONDS": "1"})
    try:
        urls = endpoints(stack)
        assert set(SERVICES) | {"executor-1", "executor-2"} <= set(urls), urls
        r = stack.post("/v1/jobs", {"name": "observed", "checkpoint_every_steps": 10, "workload": {
            "kind": "finetune", "params": {"steps": 30, "batch_size": 8, "seq_len": 32, "step_delay_seconds": 0.1}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        # 1. While it runs, the queue's endpoint shows it running (jobs by state is sampled every second here).
        eventually(lambda: total(scrape(urls["queue"]), "teto_jobs", state="running") >= 1
                   or stack.job(job_id)["state"] == "succeeded", 120, "the running job in teto_jobs")
        done = stack.wait_state(job_id, {"succeeded", "failed"}, 180)
        assert done["state"] == "succeeded", (done, stack.log_tail())

        # 2. GPU-seconds charged, summed over the budget's instances, equal what the ledger holds.
        def charged_matches_ledger() -> bool:
            charged = total(scrape(urls["budget"]), "teto_gpu_seconds_charged_total")
            return charged > 0 and abs(charged - consumed(stack)) < 1e-6

        eventually(charged_matches_ledger, 60, "teto_gpu_seconds_charged_total to equal the ledger's sum")

        # 3. Every endpoint answers, each sample labelled with its instance; each part shows its own series.
        found = {part: scrape(url) for part, url in urls.items()}
        for part, series in found.items():
            assert all(s.labels.get("instance") for samples in series.values() for s in samples), part
        for name in SERVICES:
            assert total(found[name], "teto_replica", service=name) == 1
        queue = found["queue"]
        eventually(lambda: total(scrape(urls["queue"]), "teto_jobs", state="succeeded") >= 1, 30,
                   "the succeeded job in teto_jobs")
        assert total(queue, "teto_lease_grants_total") >= 1
        assert total(queue, "teto_placement_latency_seconds_count") >= 1
        assert total(queue, "teto_lease_renewals_total", outcome="ok") >= 1
        assert total(queue, "teto_singleton_leader", singleton="queue-placement") == 1
        assert {s.labels["durable"] for s in queue["teto_consumer_pending_messages"]} >= {"queue-heartbeats",
                                                                                          "queue-submit"}
        assert total(queue, "teto_edge_messages_total", durable="queue-submit", outcome="handled") >= 1
        health = found["health"]
        assert total(health, "teto_edge_messages_total", stream="HB", outcome="handled") > 0  # heartbeats ingested
        assert total(health, "teto_check_results_total", status="passed") >= 1  # the new nodes were checked
        assert health.get("teto_check_figure"), "no check figure"
        assert total(health, "teto_signal_changes_total") >= 1
        assert total(found["gateway"], "teto_http_request_duration_seconds_count", route="/v1/jobs/{job_id}",
                     method="GET", status="200") >= 1
        executors = [found[p] for p in urls if p.startswith("executor-")]
        assert all(total(e, "teto_executor_heartbeats_sent_total") > 0 for e in executors)
        assert sum(total(e, "teto_executor_runs_finished_total", outcome="succeeded") for e in executors) == 1
        assert sum(total(e, "teto_executor_lease_renewals_total", outcome="ok") for e in executors) >= 1

        # 4. Status: one replica of each service, every singleton held, the server and its streams, lag, the
        # database and both executors.
        seen: list[dict] = []

        def healthy() -> dict | None:
            seen.append(stack.get("/v1/status").json())
            return seen[-1] if seen[-1].get("ok") else None

        try:
            status = eventually(healthy, 60, "GET /v1/status to be ok", every=1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its problems: {seen[-1].get('problems') if seen else None}") from None
        assert {name: len(svc["replicas"]) for name, svc in status["services"].items()} == dict.fromkeys(SERVICES, 1)
        queue_replica = status["services"]["queue"]["replicas"][0]["instance"]
        assert status["services"]["queue"]["singletons"]["queue-placement"] == queue_replica
        assert {"queue-lease-scanner", "queue-outbox"} <= set(status["services"]["queue"]["singletons"])
        (member,) = status["nats"]["members"]
        assert member["online"] and status["nats"]["connected_to"] == member["name"]
        assert {s["name"] for s in status["nats"]["streams"]} >= {"TETO_CMD", "TETO_JOB", "TETO_HB"}
        assert all(s["replicas"] == 1 and s["leader"] == member["name"] for s in status["nats"]["streams"])
        assert "queue-heartbeats" in {c["durable"] for c in status["consumers"]}
        assert status["database"]["reachable"] is True
        assert status["executors"]["total"] == 2
        out = stack.cli("status")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("control plane: OK") and "singleton queue-placement" in out.stdout

        # Operators only: a viewer is refused.
        made = stack.cli("tokens", "create", "--actor", "watcher", "--role", "viewer", "--json")
        viewer = json.loads(made.stdout)["secret"]
        r = httpx.get(stack.url + "/v1/status", headers={"Authorization": f"Bearer {viewer}"}, timeout=15)
        assert r.status_code == 403 and r.json()["permission"] == "fleet:manage"
    finally:
        assert stack.stop() == 0

    # 5. JSON logs: the queue's line about the submit names the command and the job; the executor's about the
    # run names the job and itself.
    def lines(part: str) -> list[dict]:
        text = (stack.data_dir / "logs" / f"{part}.log").read_text(errors="replace")
        return [json.loads(raw) for raw in text.splitlines() if raw.startswith("{")]

    queue_lines = lines("queue")
    assert queue_lines and all({"time", "level", "logger", "message"} <= q.keys() for q in queue_lines)
    assert any(q.get("job_id") == job_id and q.get("command_id") for q in queue_lines), queue_lines[-20:]
    ran = [e for p in ("executor-1", "executor-2") for e in lines(p) if e.get("job_id") == job_id]
    assert ran and all(e.get("executor_id") == done["executor_id"] for e in ran)
