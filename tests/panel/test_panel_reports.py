"""Browser story on a real stack (issue 27): a command job names its Python environment (made by ``teto env
create``, offered by the executors' TETO_ENVIRONMENTS) and writes directory checkpoints; the job's page shows its
loss and learning rate and each accepted checkpoint's kind and size, in pt-BR and English. A job naming an
environment no node offers is refused at submit, with its name."""

from __future__ import annotations

import re

import httpx
import pytest

from services.gateway.panel import fmt
from tests.support.environments import shared_environment

from .conftest import open_as, shoot, stack_for_module, submit, token_for, untranslated, visit
from .test_panel_signals import TRAIN_SCRIPT, words

pytestmark = pytest.mark.panel

@pytest.fixture(scope="module")
def environment():
    return shared_environment()


@pytest.fixture(scope="module")
def stack(environment):
    yield from stack_for_module(executors=1, lease=30, heartbeat=1,
                                extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": "0.5",
                                           "TETO_ENVIRONMENTS": str(environment)})


def spec(environment: str) -> dict:
    return {"name": "diretórios", "checkpoint_every_steps": 10, "environment": environment,
            "workload": {"kind": "command", "command": ["python", TRAIN_SCRIPT],
                         "env": {"STEPS": "30", "STEP_SECONDS": "0.05", "CHECKPOINT_KIND": "directory"}}}


def rows(page) -> list[str]:
    """Step, kind, size, files and run of each accepted checkpoint (its time left out)."""
    return [" ".join(words(cell) for cell in row.locator("td").all()[:5])
            for row in page.locator("#ckpt-table tbody tr").all()]


@pytest.mark.timeout(420)
def test_the_job_page_shows_loss_learning_rate_and_directory_checkpoints(stack, chromium, environment):
    from tests.support.services import eventually_blocking as eventually

    eventually(lambda: any(n["state"] == "ready" for n in stack.get("/v1/nodes").json()), 240, "the node ready")
    refused = httpx.post(f"{stack.url}/v1/jobs", json=spec("/opt/nowhere"), headers=stack.headers, timeout=60)
    assert refused.status_code >= 400 and "no node offers the Python environment /opt/nowhere" in refused.text, \
        refused.text
    job_id = submit(stack, spec(str(environment)))
    job = stack.wait_state(job_id, {"succeeded"}, 180)
    assert job["reported"]["learning_rate"] == 0.1 and job["reported"]["step"] == 30, job["reported"]
    assert [(c["step"], c["kind"], c["files"]) for c in job["checkpoints"]] == [(s, "directory", 2) for s in (30, 20, 10)]
    assert all(c["bytes"] > 4096 for c in job["checkpoints"]) and job["checkpoint"]["last_kind"] == "directory"
    newest = job["checkpoints"][0]["bytes"]

    page = open_as(chromium, stack, token_for(stack, "olga", "operator"), "pt-BR")
    visit(page, f"{stack.url}/jobs/{job_id}")
    loss = words(page.locator("#job-loss"))
    assert re.fullmatch(r"\d+(,\d+)?(e-\d+)? no passo 30", loss), loss
    assert words(page.locator("#job-lr")) == "0,1"
    assert rows(page)[0] == f"30 diretório {fmt.size(newest, 'pt-BR')} 2 1", rows(page)
    assert len(rows(page)) == 3 and "(diretório," in words(page.locator("#ckpt-last"))
    assert not untranslated(page)
    shoot(page, "job-reports", "pt-BR")
    page.get_by_role("link", name="English").click()
    page.wait_for_url(f"{stack.url}/jobs/{job_id}")
    assert words(page.locator("#job-lr")) == "0.1" and words(page.locator("#job-loss")).endswith("at step 30")
    assert rows(page)[0] == f"30 directory {fmt.size(newest, 'en')} 2 1" and "(directory," in words(page.locator("#ckpt-last"))
    assert not untranslated(page)
    shoot(page, "job-reports", "en")
