"""No English on a pt-BR page: every page of the panel, on a real stack with the data a first week leaves (a job
whose executor died: lease expired, requeued for transport loss, run again; a job interrupted at its ceiling and
requeued; a refused requeue and a submitter's forbidden one in the audit log; a job that failed with its output's
end marker; a queued job the queue says why it waits; the join checks' figures), read in Chromium and checked word
by word against the English catalogue and the control plane's own English words. Identifiers, ids, numbers and
what people or programs wrote (job names, actors, a job's output) are not the panel's words and are left out."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from services.gateway.panel import i18n
from tests.e2e.stack import JOB_PYTHON
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .conftest import open_as, shoot, stack_for_module, submit, token_for, untranslated, visit

pytestmark = pytest.mark.panel

TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_script.py")
SLEEPER = "import time\nwhile True:\n    time.sleep(0.5)\n"
FAILING = "import sys\nprint('linha 1', flush=True)\nsys.exit(3)\n"

# The control plane's English that reaches pages (words.py's sentences before translation, logviews' markers,
# the checks' figure names), beside every word of the English catalogue.
SERVER_ENGLISH = """lease expired stopped by executor abandoned transport lost handed back node failed undeliverable
every worker lost peer waiting behind jobs higher priority fair share free worker now ready has quota organisation
holds devices group nominal borrowing needs cohort shared reclaiming preemption borrowed capacity role lacks
permission belongs cancelling requeued interrupted below consumed ceiling only this is already cancelled operator
training failed exit code attempt rank ended status killed signal shipped truncated output rest reached relative
error max rtt peers tested errors bytes seconds temperature power clock the of and for with by not no such""".split()
# Words both languages write (borrowed into Portuguese, or a proper name) and the language switch.
SHARED = {"English", "Teto", "GPU", "GPUs", "job", "jobs", "checkpoint", "checkpoints", "rank", "ranks", "loss",
          "executor", "executores", "workers", "worker", "status", "stdout", "stderr", "float", "bfloat", "matmul",
          "membw", "memtest", "allreduce", "nvml", "ms", "MB", "GB", "TFLOP", "ECC", "SM", "CSRF", "API", "UTC"}


def english_words() -> set[str]:
    """Words of the English catalogue and of the control plane's sentences that Portuguese never writes."""
    split = re.compile(r"[A-Za-zÀ-ÿ]+")
    english = {w.lower() for text in i18n.catalogue("en").values() for w in split.findall(re.sub(r"\{\w+\}", "", text))}
    english |= set(SERVER_ENGLISH)
    portuguese = {w.lower() for text in i18n.catalogue("pt-BR").values() for w in split.findall(text)}
    return {w for w in english - portuguese - {s.lower() for s in SHARED} if len(w) >= 2}


def panel_words(page) -> str:
    """The page's visible text less what is not the panel's: a job's output lines (its markers stay), ids and
    identifiers (tokens with a digit, ``_``, ``-``, ``:``, ``/``, ``@`` or ``.`` inside), and the people's names."""
    text = page.locator("body").inner_text()
    for shown in page.locator(".log-lines .log-text, pre.log-lines").all_inner_texts():
        if shown.strip() and not shown.startswith("[teto"):
            text = text.replace(shown, " ")
    tokens = [t for t in text.split() if not re.search(r"\w[\d_\-:/@.]|[\d_\-:/@]\w|\d", t)]
    return " ".join(tokens)


IDENTIFIERS = """() => {
    const out = new Set();
    for (const el of document.querySelectorAll('*')) {
        for (const a of el.attributes) {
            const value = a.name.startsWith('data-') ? a.value
                : a.name === 'href' && a.value.includes('?') ? a.value.split('?')[1] : '';
            value.split(/[^A-Za-z0-9]+/).concat(value.split(/[^A-Za-z0-9_]+/)).forEach(w => w && out.add(w));
        }
    }
    return [...out];
}"""


def english_on(page, vocabulary: set[str], people: set[str]) -> list[str]:
    """English words on the page, with a few characters around each; identifiers are what the page carries as
    data for its scripts and links (data-service="budget", data-stream="PROGRESS", ?service=audit)."""
    text = panel_words(page)
    identifiers = page.evaluate(IDENTIFIERS)
    skip = people | {w.lower() for w in identifiers}
    found = {f"{w.group()} «{text[max(0, w.start() - 30):w.end() + 30]}»"
             for w in re.finditer(r"[A-Za-zÀ-ÿ]+", text)
             if w.group().lower() in vocabulary and w.group().lower() not in skip}
    # A code shown raw (``transport_lost``, ``rel_error_bfloat16``, ``max_rtt_ms``): English words joined by "_",
    # unless the page carries it as an identifier (a durable's name).
    raw = page.locator("body").inner_text()
    for shown in page.locator(".log-lines .log-text, pre.log-lines").all_inner_texts():
        raw = raw.replace(shown, " ")
    for code in set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", raw)):
        parts = [p for p in code.split("_") if p.isalpha()]
        if code not in identifiers and any(p in vocabulary or p in ("rel", "rtt", "max") for p in parts):
            found.add(f"{code} (a code shown raw)")
    return sorted(found)


@pytest.fixture(scope="module")
def stack():
    yield from stack_for_module(executors=2, lease=6, heartbeat=1,
                                extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": "1", "TETO_STOP_GRACE_SECONDS": "5"})


def sleeper(name: str, ceiling: float) -> dict:
    return {"name": name, "gpu_ceiling_seconds": ceiling,
            "workload": {"kind": "command", "command": [JOB_PYTHON, "-c", SLEEPER]}}


def test_every_page_in_portuguese_has_no_english_word(stack, chromium):
    eventually(lambda: sum(n["state"] == "ready" for n in stack.get("/v1/nodes").json()) == 2, 240,
               "both nodes to pass their join check")
    olga, sam = token_for(stack, "olga", "operator"), token_for(stack, "samuel", "submitter")
    jobs = {"lost": submit(stack, {"name": "perdido", "checkpoint_every_steps": 10, "workload": {
                "kind": "command", "command": [JOB_PYTHON, TRAIN_SCRIPT], "env": {"STEPS": "100000", "STEP_SECONDS": "0.2"}}}),
            "raised": submit(stack, sleeper("pequeno", 3)), "low": submit(stack, sleeper("baixo", 3)),
            "failed": submit(stack, {"name": "falhou", "max_attempts": 1,
                                     "workload": {"kind": "command", "command": [JOB_PYTHON, "-c", FAILING]}}),
            "queued": submit(stack, {"name": "na-fila", "gpus_per_worker": 1, "workload": {
                "kind": "command", "command": [JOB_PYTHON, "-c", SLEEPER]}})}

    # The executor of a running job dies: its lease expires and the job is requeued for transport loss.
    running = stack.wait_state(jobs["lost"], {"running"}, 120)
    (victim,) = [p for p in stack.processes() if p.get("executor_id") == running["executor_id"]]
    os.kill(victim["pid"], signal.SIGKILL)
    eventually(lambda: {"lease_expired", "requeued"} <= {e["event"] for e in stack.events(jobs["lost"])}, 90,
               "the lease to expire and the job to be requeued")
    eventually(lambda: [e for e in stack.events(jobs["lost"]) if e["event"] == "started"][1:], 180,
               "the job to run again")
    assert stack.post(f"/v1/jobs/{jobs['lost']}/cancel").status_code == 200  # frees its executor
    # Interrupted at the ceiling; one requeued by an operator, one refused (too low), one forbidden (a submitter).
    for key in ("raised", "low"):
        assert stack.wait_state(jobs[key], {"interrupted", "failed"}, 120)["state"] == "interrupted"
    def requeue(job: str, ceiling: float, secret: str) -> int:
        return httpx.post(f"{stack.url}/v1/jobs/{job}/requeue", json={"gpu_ceiling_seconds": ceiling}, timeout=30,
                          headers={"Authorization": f"Bearer {secret}"}).status_code

    assert requeue(jobs["raised"], 1000, olga) == 200
    assert requeue(jobs["low"], 10, olga) == 422  # below consumed + 60: refused by the queue
    assert requeue(jobs["low"], 1000, sam) == 403
    assert stack.post(f"/v1/jobs/{jobs['raised']}/cancel").status_code == 200  # "cancelled by operator"
    assert stack.wait_state(jobs["failed"], {"failed"}, 180)
    waiting = eventually(lambda: stack.job(jobs["queued"]).get("waiting"), 60, "the queued job's waiting reason")
    assert waiting["reason"], waiting
    run = next(n["last_check_run_id"] for n in stack.get("/v1/nodes").json() if n.get("last_check_run_id"))

    vocabulary = english_words()
    people = {"olga", "samuel", "local", "admin", "perdido", "pequeno", "baixo", "falhou", "linha"}
    page = open_as(chromium, stack, stack.token, "pt-BR")
    pages = ["/jobs", "/executors", "/nodes", f"/nodes?run={run}", "/status", "/dead-letters", "/usage", "/policy",
             "/audit", *(f"/jobs/{job}" for job in jobs.values())]
    leaks = {}
    for url in pages:
        visit(page, f"{stack.url}{url}")
        page.wait_for_load_state()
        if url == f"/jobs/{jobs['failed']}":
            page.locator("#logs-text .log-notice").first.wait_for(timeout=60_000)
            notice = page.locator("#logs-text .log-notice").first.inner_text()
            assert re.search(r"\[teto: tentativa \d+, rank 0, terminou: código de saída 3\]", notice), notice
        if url == f"/jobs/{jobs['lost']}":
            timeline = page.locator("#timeline").inner_text()
            assert "a concessão expirou" in timeline and "Perda de transporte" in timeline, timeline
            shoot(page, "job-timeline", "pt-BR")
        if url.startswith("/nodes?run="):
            assert "Erro relativo (float32)" in page.locator("#run").inner_text()
        if url == "/audit":
            reasons = page.locator("table.audit td.reason").all_inner_texts()
            assert any("não tem a permissão finetune:manage" in r for r in reasons), reasons
            assert any("abaixo do consumido" in r for r in reasons), reasons
            kinds = set(page.locator("table.audit tbody tr td:nth-child(4)").all_inner_texts())
            assert {"Submissão", "Recolocação na fila", "Cancelamento", "Criação de token"} <= kinds, kinds
            shoot(page, "audit-reasons", "pt-BR")
        assert not untranslated(page), (url, untranslated(page))
        found = english_on(page, vocabulary, people)
        if found:
            leaks[url] = found
    assert not leaks, leaks

    # The English page says the same things in English (the check is not blind: it finds English where it is).
    visit(page, f"{stack.url}/lang/en?next=/jobs/{jobs['lost']}")
    assert "lease expired" in page.locator("#timeline").inner_text()
    assert english_on(page, vocabulary, people)
    page.context.close()
