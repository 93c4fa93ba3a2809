"""Browser story on a real stack: an executor agent frozen with SIGSTOP (a hung agent) loses its job's lease and
the job runs on the other executor. The frozen executor's row says the job left it, never "Training" with the
job; once the agent is woken it stops that run and its row is an idle one, no zombie for good (issue 26)."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .conftest import open_as, shoot, stack_for_module, submit, token_for, untranslated, visit
from .test_panel_signals import TRAIN_SCRIPT, command, words

pytestmark = pytest.mark.panel


@pytest.fixture(scope="module")
def stack():
    yield from stack_for_module(executors=2, lease=6, heartbeat=1,
                                extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": "1", "TETO_MIN_RATIO": "0.05"})


def executor(stack, executor_id: str) -> dict:
    return next(e for e in stack.get("/v1/executors").json() if e["executor_id"] == executor_id)


@pytest.mark.timeout(480)
def test_a_frozen_executors_row_says_its_job_left_and_clears_once_the_agent_stops_that_run(stack, chromium):
    eventually(lambda: sum(n["state"] == "ready" for n in stack.get("/v1/nodes").json()) == 2, 240,
               "both nodes ready")
    job_id = submit(stack, command("congelado", TRAIN_SCRIPT, env={"STEPS": "100000", "STEP_SECONDS": "0.1"}))
    first = stack.wait_state(job_id, {"running"}, 90)
    frozen_id = first["executor_id"]
    eventually(lambda: executor(stack, frozen_id)["phase"] == "training", 60, "the agent to say training")
    (agent,) = [p for p in stack.processes() if p.get("executor_id") == frozen_id]
    os.kill(agent["pid"], signal.SIGSTOP)
    try:
        moved = eventually(lambda: (lambda j: j if j["state"] == "running" and j["lease_epoch"] > first["lease_epoch"]
                                    and j["executor_id"] != frozen_id else None)(stack.job(job_id)), 120,
                           "the job to run on the other executor")
        row_api = executor(stack, frozen_id)
        assert row_api["job_id"] is None and row_api["phase"] is None and row_api["job_source"] == "left"
        assert row_api["left_job"]["job_id"] == job_id

        page = open_as(chromium, stack, token_for(stack, "olga", "operator"), "pt-BR")
        visit(page, f"{stack.url}/executors")
        row = page.locator(f"tr[data-executor-id='{frozen_id}']")
        text = words(row)
        assert "Treinando" not in text and "saiu dele" in text, text
        if stack.job(job_id)["executor_id"] == moved["executor_id"]:
            assert f"agora roda em {moved['executor_id']}" in text, text
        assert row.get_by_role("link", name="congelado", exact=True).get_attribute("href") == f"/jobs/{job_id}"
        assert not untranslated(page)
        shoot(page, "executors-frozen", "pt-BR")
    finally:
        os.kill(agent["pid"], signal.SIGCONT)
    # Woken, the agent finds its lease lost and stops that run: the row is an idle executor again, the stale
    # messages it sent meanwhile are history, not a zombie badge that stays for good.
    eventually(lambda: (lambda e: e["phase"] == "idle" and e["left_job"] is None and not e["zombie"])(
        executor(stack, frozen_id)), 120, "the woken agent's row to be idle, no zombie")
    visit(page, f"{stack.url}/executors")
    row = page.locator(f"tr[data-executor-id='{frozen_id}']")
    assert row.locator(".zombie-badge").count() == 0 and "Zumbi" not in words(row)
    page.get_by_role("link", name="English").click()
    page.wait_for_url(f"{stack.url}/executors")
    assert not untranslated(page)
    page.context.close()
    stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "fim do teste"})
