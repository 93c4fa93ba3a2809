"""Browser story on a real stack: an operator's forced health check stops a running training (checkpoint first);
the job is requeued under its own cause, not "transport loss", its attempts against ``max_attempts`` and its free
interruptions are shown apart (never "Attempt 4 / 3"), and the timeline says which step the next run resumed
from (issue 26, the panel in pt-BR)."""

from __future__ import annotations

import re

import pytest

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .conftest import Dialogs, open_as, shoot, stack_for_module, submit, token_for, untranslated, visit
from .test_panel_signals import TRAIN_SCRIPT, command, words

pytestmark = pytest.mark.panel


@pytest.fixture(scope="module")
def stack():
    # One executor: the job stopped by the check resumes on the same node once the check has passed.
    yield from stack_for_module(executors=1, lease=30, heartbeat=1,
                                extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": "1", "TETO_MIN_RATIO": "0.05"})


def started_from(stack, job_id: str) -> list:
    events = stack.get(f"/v1/jobs/{job_id}/events").json()
    events = events.get("events", events) if isinstance(events, dict) else events
    return [(e.get("detail") or {}).get("resumed_from_step") for e in events if e["event"] == "started"]


@pytest.mark.timeout(480)
def test_a_forced_health_check_stop_is_its_own_cause_and_the_next_run_resumes_from_its_checkpoint(stack, chromium):
    eventually(lambda: any(n["state"] == "ready" for n in stack.get("/v1/nodes").json()), 240, "the node ready")
    job_id = submit(stack, command("verificado", TRAIN_SCRIPT, max_attempts=3,
                                   env={"STEPS": "100000", "STEP_SECONDS": "0.1"}))
    stack.wait_state(job_id, {"running"}, 90)
    eventually(lambda: ((stack.job(job_id).get("checkpoint") or {}).get("last_step") or 0) >= 10, 90,
               "a first checkpoint")
    r = stack.post("/v1/health-checks", {"group": "local", "tests": ["nvml"], "force": True})
    assert r.status_code in (200, 201, 202), r.text
    eventually(lambda: (stack.job(job_id).get("attempts") or {}).get("health_check") == 1, 120,
               "the forced check to requeue the job under its own cause")
    eventually(lambda: any(step for step in started_from(stack, job_id)[1:]), 240,
               "the job to run again from its checkpoint once the check has passed")
    job = stack.job(job_id)
    assert job["attempts"]["transport_lost"] == 0 and job["attempts"]["training_error"] == 0, job["attempts"]
    resumed = next(step for step in started_from(stack, job_id)[1:] if step)

    page = open_as(chromium, stack, token_for(stack, "olga", "operator"), "pt-BR")
    visit(page, f"{stack.url}/jobs/{job_id}")
    assert words(page.locator("#attempts-spent")) == "0 de 3"  # training errors only, against max_attempts
    assert words(page.locator("#interruptions")) == "1"
    free = words(page.locator("#attempts-free"))
    assert "Parado para verificação de saúde forçada 1" in free and "Perda de transporte 0" in free, free
    timeline = words(page.locator("#timeline"))
    assert f"retomado do passo {resumed}" in timeline, timeline
    assert "parado por uma verificação de saúde forçada pelo operador" in timeline, timeline
    assert "Perda de transporte" not in timeline and "transport" not in timeline
    assert not untranslated(page)
    shoot(page, "job-attempts", "pt-BR")
    page.get_by_role("link", name="English").click()
    page.wait_for_url(f"{stack.url}/jobs/{job_id}")
    assert words(page.locator("#attempts-spent")) == "0 of 3"
    assert re.search(rf"resumed from step {resumed}\b", words(page.locator("#timeline")))
    assert not untranslated(page)
    shoot(page, "job-attempts", "en")

    # Cancel asks first, in the page (no browser dialog): "No" keeps the job, "Yes" cancels it.
    dialogs = Dialogs(page)
    page.get_by_role("button", name="Cancel job").click()
    question = page.locator("#cancel-confirm")
    assert question.is_visible() and words(question).startswith("Cancel verificado?"), words(question)
    assert page.locator("#cancel-submit").is_hidden()
    shoot(page, "job-cancel-confirm", "en")
    page.get_by_role("button", name="No, keep it running").click()
    assert question.is_hidden() and page.locator("#cancel-submit").is_visible()
    assert stack.job(job_id)["state"] == "running"
    page.get_by_role("button", name="Cancel job").click()
    page.get_by_role("button", name="Yes, cancel it").click()
    eventually(lambda: stack.job(job_id)["state"] == "cancelled", 60, "the job to be cancelled")
    assert not dialogs.seen
    page.context.close()
