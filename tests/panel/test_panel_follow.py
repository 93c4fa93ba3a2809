"""Browser stories on a real stack: an operator follows a running training live (pt-BR and English), a job
named like a script renders as text under a CSP, and a job interrupted at a tiny ceiling is requeued from the
page (inline refusal with the numbers, the server's refusal, a valid ceiling) while a submitter sees no requeue
control and a forged POST with the submitter's session is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.stack import JOB_PYTHON
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .conftest import visit, submit, Dialogs, open_as, shoot, stack_for_module, token_for, untranslated

pytestmark = pytest.mark.panel

TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_script.py")
HOSTILE = "<script>alert(1)</script>"
CEILING = 30.0


@pytest.fixture(scope="module")
def stack():
    yield from stack_for_module(executors=2, lease=6, heartbeat=1,
                                extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": "1", "TETO_STOP_GRACE_SECONDS": "5"})


def step_shown(page) -> int:
    text = page.locator("#job-step").inner_text().split("/")[0]
    digits = re.sub(r"\D", "", text)
    return int(digits) if digits else 0


def test_an_operator_follows_a_running_training_live(stack, chromium):
    job_id = submit(stack, {"name": HOSTILE, "checkpoint_every_steps": 25,
                            "workload": {"kind": "command", "command": [JOB_PYTHON, TRAIN_SCRIPT],
                                         "env": {"STEPS": "100000", "STEP_SECONDS": "0.25"}}})
    stack.wait_state(job_id, {"running"}, 90)
    olga = token_for(stack, "olga", "operator")
    page = open_as(chromium, stack, olga, "pt-BR")
    dialogs = Dialogs(page)

    # The jobs list: the hostile name is text, the page carries a CSP without inline scripts.
    answer = visit(page, f"{stack.url}/jobs")
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    row = page.locator(f"tr[data-job-id='{job_id}']")
    assert row.get_by_role("link", name=HOSTILE).is_visible()
    assert row.get_by_text("Executando").is_visible()
    assert not untranslated(page)
    shoot(page, "jobs", "pt-BR")

    # Its page: the step advances without a reload, the loss curve fills, the ETA and the cost are shown.
    row.get_by_role("link", name=HOSTILE).click()
    page.wait_for_url(f"{stack.url}/jobs/{job_id}")
    assert page.locator("h1").inner_text().startswith(HOSTILE)
    page.evaluate("window.__sameDocument = true")
    # Locators and evaluate, never wait_for_function with a string: under the page's CSP (no unsafe-eval)
    # Playwright's polls after the first one eval the predicate and fail when it was not true at once.
    page.locator("#live-state[data-state='on']").wait_for(state="attached")
    first = step_shown(page)
    eventually(lambda: step_shown(page) > first + 2, 60, "the step to advance on the page")
    assert page.evaluate("window.__sameDocument === true")  # live, not reloaded
    eventually(lambda: int(page.locator("#plot-loss").get_attribute("data-points") or 0) >= 3, 20,
               "three points on the loss curve")
    eta = page.locator("#ckpt-eta").inner_text()
    assert re.search(r"\d+(,\d+)? (ms|s|min)", eta), eta
    # Right after a checkpoint the page rightly says no step is at risk yet ("Nada: ..."): the steps since it
    # show once the next step report lands (the agent forwards one per progress interval).
    cost = lambda: page.locator("#interruption-cost").inner_text()  # noqa: E731
    eventually(lambda: re.search(r"\d+ passos e [\d,.]+ GPU-(s|min)", cost()), 60,
               "the cost of an interruption to name its steps and GPU time")
    assert not untranslated(page)
    shoot(page, "job", "pt-BR")

    # The English switch changes every visible string.
    page.get_by_role("link", name="English").click()
    page.wait_for_url(f"{stack.url}/jobs/{job_id}")
    assert page.get_by_text("Time to next checkpoint").is_visible()
    assert "Executando" not in page.locator("body").inner_text()
    assert not untranslated(page)
    shoot(page, "job", "en")
    visit(page, f"{stack.url}/jobs")
    assert page.locator(f"tr[data-job-id='{job_id}']").get_by_text("Running").is_visible()
    shoot(page, "jobs", "en")
    assert not dialogs.seen

    # Sign-out ends the session: the next page is the sign-in form, in the language chosen.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{stack.url}/signin")
    assert page.get_by_role("heading", name="Sign in").is_visible() and not untranslated(page)
    shoot(page, "signin", "en")
    visit(page, f"{stack.url}/jobs/{job_id}")
    assert "/signin" in page.url
    assert stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "story done"}).status_code == 200
    page.context.close()


def test_a_tiny_ceiling_job_is_requeued_from_the_page(stack, chromium):
    sam = token_for(stack, "sam", "submitter")
    # The built-in fine-tune, charged from its process start (loading torch included): 30 GPU-s leave it a few
    # steps on a busy 2-core machine, with a checkpoint every 2 of them.
    spec = {"name": "teto-pequeno", "gpu_ceiling_seconds": CEILING, "checkpoint_every_steps": 2,
            "workload": {"kind": "finetune", "params": {"steps": 100000, "batch_size": 4, "seq_len": 16}}}
    job_id = submit(stack, spec, sam)
    stopped = stack.wait_state(job_id, {"interrupted", "failed", "succeeded"}, 240)
    assert stopped["state"] == "interrupted", (stopped, stack.log_tail())
    assert stopped["last_checkpoint"], stopped
    k = stopped["last_checkpoint"]["step"]
    consumed = eventually(lambda: (b := stack.job(job_id)["budget"]) and b["consumed_seconds"] >= CEILING and b, 30,
                          "the last usage sample")["consumed_seconds"]

    # The submitter's own page: no requeue control; a forged POST with the session is refused by the server.
    sams = open_as(chromium, stack, sam, "pt-BR")
    visit(sams, f"{stack.url}/jobs/{job_id}")
    assert sams.get_by_text("Interrompido").first.is_visible()
    assert sams.locator("#requeue").count() == 0
    assert sams.get_by_role("button", name="Recolocar na fila").count() == 0
    forged = sams.evaluate("""async (id) => {
        const csrf = document.querySelector('meta[name=csrf-token]').content;
        const r = await fetch('/v1/jobs/' + id + '/requeue', {method: 'POST', credentials: 'same-origin',
            headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf},
            body: JSON.stringify({gpu_ceiling_seconds: 100000})});
        return [r.status, await r.json()];
    }""", job_id)
    assert forged[0] == 403 and forged[1]["permission"] == "finetune:manage"
    shoot(sams, "job-submitter", "pt-BR")
    sams.context.close()

    # The operator: a ceiling below consumed + 60 is refused as it is typed, with the numbers.
    olga = open_as(chromium, stack, token_for(stack, "olga2", "operator"), "pt-BR")
    visit(olga, f"{stack.url}/jobs/{job_id}")
    field = olga.get_by_label("Novo teto total de GPU (GPU-segundos)")
    pt = lambda value: str(value).replace(".", ",")  # noqa: E731 - as a Brazilian types it (fewer than 1000)
    field.fill(pt(round(consumed + 30, 1)))
    check = olga.locator("#requeue-check")
    assert "abaixo do mínimo" in check.inner_text()
    assert re.search(r"mínimo de \d+(,\d)? GPU-s \(consumido \d+(,\d)? \+ 60 s\)", check.inner_text()), check.inner_text()
    assert olga.get_by_role("button", name="Recolocar na fila").is_disabled()
    shoot(olga, "requeue", "pt-BR")

    # A page whose figures were stale lets it through: the server refuses, and the page shows its numbers.
    olga.evaluate("document.getElementById('requeue-ceiling').dataset.minimum = '0'")
    field.fill(pt(round(consumed + 30, 1)))
    olga.get_by_role("button", name="Recolocar na fila").click()
    refusal = olga.locator("#requeue-result")
    refusal.wait_for(state="visible")
    assert "O servidor recusou" in refusal.inner_text() and "mínimo" in refusal.inner_text()
    assert re.search(r"Consumido [\d,]+ GPU-s, mínimo [\d,]+ GPU-s, informado [\d,]+ GPU-s", refusal.inner_text())

    # A valid ceiling: accepted; the history shows it with the operator's name, live; the job resumes from k.
    olga.evaluate(f"document.getElementById('requeue-ceiling').dataset.minimum = '{consumed + 60}'")
    field.fill(str(round(consumed + 600)))
    assert "é suficiente" in check.inner_text()
    olga.get_by_role("button", name="Recolocar na fila").click()
    olga.locator("#action-status").get_by_text("Recolocado na fila com teto de").wait_for()
    olga.locator("#ceiling-history").get_by_text("olga2").wait_for(timeout=30_000)
    # Every page of its events: ~1,100 steps checkpointed every 2 fill more than one on a fast machine.
    # The run after the operator's requeue: a later epoch than the one stopped at the ceiling (on a loaded machine
    # an earlier run may also have been requeued for a late lease renewal, which is not this one).
    started = eventually(lambda: [e for e in stack.events(job_id) if e["event"] == "started"
                                  and e["epoch"] > stopped["lease_epoch"]], 120,
                         "the second run")
    assert (started[0]["detail"]["resumed_from_step"] or 0) >= k, (k, stack.job(job_id).get("last_checkpoint"), [
        (e["event"], e["epoch"], e.get("reason"), (e.get("detail") or {}).get("path", "")[-24:])
        for e in stack.events(job_id) if e["event"] in ("checkpoint_skipped", "stop_requested", "interrupted")][-8:])
    olga.locator("#job-state").get_by_text("Executando").wait_for(timeout=30_000)
    assert olga.locator("#requeue").is_hidden()
    # Hundreds of checkpoints are one row a run in the timeline: the stop and the requeue stay in sight.
    timeline = olga.locator("#timeline")
    folded = timeline.locator("li.folded").first
    assert re.search(r"Checkpoint salvo × [\d.]+, passos [\d.]+–[\d.]+", folded.inner_text()), folded.inner_text()
    assert int(folded.get_attribute("data-count")) >= 2
    assert timeline.get_by_text("Interrompido").first.is_visible()
    assert timeline.get_by_text("Recolocado na fila").first.is_visible()  # a lease requeue too
    assert timeline.locator("li").count() < 20
    shoot(olga, "job-requeued", "pt-BR")
    assert stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "story done"}).status_code == 200
    olga.context.close()


SLEEPER = "import time\nwhile True:\n    time.sleep(0.5)\n"

# (typed, what the page says as it is typed, whether the button is enabled), per locale.
TYPED = {
    "pt-BR": [("1.000", "1.000 GPU-s é suficiente", True), ("100,5", "100,5 GPU-s é suficiente", True),
              ("1.5", "Se queria dizer 1,5, digite 1,5", False), ("1,000", "é ambíguo: 1 ou 1.000?", False),
              ("1.000,5,3", "mais de uma vírgula decimal", False), ("1,00.0", "ponto de milhar depois da vírgula", False),
              ("1.0.0", "de três em três", False), ("1e3", "não é um número", False)],
    "en": [("1,000", "1,000 GPU-s is enough", True), ("100.5", "100.5 GPU-s is enough", True),
           ("100,5", "If you meant 100.5, type 100.5", False), ("1.000", "is ambiguous: 1 or 1,000?", False),
           ("1,000.5.3", "more than one decimal point", False), ("1,00.0", "every three digits", False)],
}
SUBMITTED = {"pt-BR": ("1.000,5", "Recolocado na fila com teto de 1.000,5 GPU-s"),
             "en": ("1,000.5", "Requeued with a ceiling of 1,000.5 GPU-s")}
UNREADABLE = {"pt-BR": ("1.5", "digite 1,5"), "en": ("100,5", "type 100.5")}


def test_the_requeue_ceiling_is_read_in_the_pages_locale(stack, chromium):
    """pt-BR "100,5" is 100.5 and "1.000" is 1000, English "1,000" is 1000: each said back as typed, and the
    ceiling the queue records is exactly the number meant; ambiguous or malformed text is refused with the reason,
    on the page as typed and by the server when posted anyway."""
    spec = {"gpu_ceiling_seconds": 3, "workload": {"kind": "command", "command": [JOB_PYTHON, "-c", SLEEPER]}}
    jobs = {locale: submit(stack, {**spec, "name": f"teto-numero-{locale}"}) for locale in TYPED}
    for job_id in jobs.values():
        assert stack.wait_state(job_id, {"interrupted", "failed", "succeeded"}, 180)["state"] == "interrupted"
    for locale, job_id in jobs.items():
        page = open_as(chromium, stack, token_for(stack, f"olga-{locale.lower()}", "operator"), locale)
        visit(page, f"{stack.url}/jobs/{job_id}")
        field, check = page.locator("#requeue-ceiling"), page.locator("#requeue-check")
        button = page.locator("#requeue-submit")
        for typed, said, enabled in TYPED[locale]:
            field.fill(typed)
            assert said in check.inner_text(), (locale, typed, check.inner_text())
            assert button.is_enabled() is enabled, (locale, typed)
            assert (field.get_attribute("aria-invalid") == "true") is not enabled, (locale, typed)
            if typed == "1,00.0":
                shoot(page, "requeue-number", locale)
        assert not untranslated(page)
        # The server is the judge: the same text posted past the page's check is refused, in the page's words.
        text, words = UNREADABLE[locale]
        answer = page.evaluate("""async (typed) => {
            const form = document.getElementById('requeue-form');
            const r = await fetch(form.dataset.action, {method: 'POST', credentials: 'same-origin',
                headers: {'Content-Type': 'application/json',
                          'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content},
                body: JSON.stringify({ceiling: typed})});
            return [r.status, await r.json()];
        }""", text)
        assert answer[0] == 422 and answer[1]["error"] == "unreadable_number" and words in answer[1]["reason"], answer
        assert stack.job(job_id)["state"] == "interrupted"
        # A readable ceiling: the queue records exactly the number meant.
        typed, done = SUBMITTED[locale]
        field.fill(typed)
        button.click()
        page.locator("#action-status").get_by_text(done).wait_for()
        assert eventually(lambda: stack.job(job_id)["budget"]["ceiling_seconds"] == 1000.5 or None, 30,
                          "the new ceiling in the job's budget")
        assert stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "story done"}).status_code == 200
        page.context.close()


CHATTY = """
import sys, time
for i in range(6):
    print(f"out {i}", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(1.0)
print("<script>alert(3)</script> boom", file=sys.stderr, flush=True)
sys.exit(3)
"""


def test_the_output_is_followed_live_a_failure_shows_its_tail_and_usage_has_its_page(stack, chromium):
    job_id = submit(stack, {"name": "falante", "max_attempts": 1,
                            "workload": {"kind": "command", "command": [JOB_PYTHON, "-c", CHATTY]}})
    olga = open_as(chromium, stack, token_for(stack, "olga3", "operator"), "pt-BR")
    dialogs = Dialogs(olga)
    visit(olga, f"{stack.url}/jobs/{job_id}")
    # The output arrives while the job runs, a line per line, with its rank and stream; text only.
    olga.locator("#logs-text .log-line").first.wait_for(timeout=90_000)
    olga.locator("#logs-text").get_by_text("out 1").wait_for(timeout=60_000)
    assert "rank 0 · stderr" in olga.locator("#logs-text").inner_text()
    # It fails: the tail of the failed attempt appears in the live part, and the output says it has ended.
    olga.locator("#log-tail").wait_for(timeout=90_000)
    assert "<script>alert(3)</script> boom" in olga.locator("#log-tail").inner_text()
    olga.locator("#logs-status").get_by_text("O job terminou").wait_for(timeout=60_000)
    text = olga.locator("#logs-text").inner_text()
    assert "out 5" in text and "<script>alert(3)</script> boom" in text
    assert not untranslated(olga)
    shoot(olga, "job-output", "pt-BR")

    # The usage page: this month's report with the GPU-hours column, in both languages, and its CSV.
    visit(olga, f"{stack.url}/usage")
    table = olga.locator("#usage-table")
    assert table.is_visible() and "GPU-horas" in table.inner_text() and table.locator("tbody tr").count() >= 1
    csv = olga.evaluate("async () => (await fetch(document.getElementById('usage-csv').href)).text()")
    assert csv.splitlines()[0].startswith("org,gpu_seconds,gpu_hours"), csv
    assert not untranslated(olga)
    shoot(olga, "usage", "pt-BR")
    olga.get_by_role("link", name="English").click()
    olga.locator("#usage-table").wait_for()
    assert "GPU-hours" in olga.locator("#usage-table").inner_text() and not untranslated(olga)
    shoot(olga, "usage", "en")
    assert not dialogs.seen
    olga.context.close()
