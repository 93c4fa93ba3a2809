"""Browser stories of the operations pages on a real stack (two executors): an on-demand check of a group followed
live per node and per test to completion with its figures, then of one selected node, drain and undrain; a hung training shows "Travado" on its executor's row
(and on its job's badge), a killed executor "Sem sinal"; the gang policy checked as typed and saved with the
admin's name; every page of the panel walked in both languages; a viewer sees no action and a forged POST with
its session gets 403. Screenshots of each operations page in both languages go to docs/panel/."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from libs.contracts.dead import DeadCause, dead_letter
from libs.contracts.subjects import Subjects
from libs.runtime import bus
from services.gateway.panel import i18n
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .conftest import Dialogs, open_as, shoot, stack_for_module, token_for, untranslated
from .test_panel_signals import HANG_SCRIPT, TRAIN_SCRIPT, command, signal_of, submit, words

pytestmark = pytest.mark.panel

GROUP = "local"  # teto up's executors' group
FOUND: dict[str, str] = {}


@pytest.fixture(scope="module")
def stack():
    yield from stack_for_module(executors=2, lease=30, heartbeat=1,
                                extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": "1", "TETO_STUCK_AFTER_SECONDS": "3",
                                           # figures on a loaded 2-core machine move 2x between runs
                                           "TETO_MIN_RATIO": "0.05"})


@pytest.fixture(scope="module")
def tokens(stack):
    # Names that are no catalogue word in either language (the language walk looks for those).
    return {role: token_for(stack, actor, role) for actor, role in (("olga", "operator"), ("vera", "viewer"),
                                                                     ("adm", "admin"))}


def node_state(stack, node_id: str) -> str | None:
    return next((n["state"] for n in stack.get("/v1/nodes").json() if n["node_id"] == node_id), None)


def ready_nodes(stack) -> int:
    return sum(n["state"] == "ready" for n in stack.get("/v1/nodes").json())


def test_an_on_demand_check_of_a_group_shows_each_node_and_test_to_completion_with_figures(stack, chromium, tokens):
    eventually(lambda: ready_nodes(stack) == 2, 180, "both nodes to pass their join check")
    page = open_as(chromium, stack, tokens["operator"], "pt-BR")
    page.goto(f"{stack.url}/nodes")
    group_row = page.locator(f"tr[data-group='{GROUP}']")
    assert "Pronto" in group_row.inner_text()
    page.get_by_role("button", name=f"Verificar o grupo {GROUP}").click()
    page.wait_for_url(re.compile(r"/nodes\?run="))
    FOUND["run"] = page.url.split("run=", 1)[1].split("#")[0]
    # Live: the run part is refreshed from the check reports until the run is done, without a reload.
    status = page.locator("#run-status")
    seen_running = status.get_attribute("data-done") == "false"
    page.wait_for_selector("#run-status[data-done='true']", timeout=240_000)
    assert seen_running or "Concluída" in status.inner_text()
    text = words(page.locator("#run"))
    assert "nós 2 de 2 concluídos" in text and "2 aprovados, 0 reprovados" in text, text
    nodes = page.locator("[data-run-node]")
    assert nodes.count() == 2
    for i in range(2):
        node = nodes.nth(i)
        assert "Aprovado" in node.locator("h3").inner_text()
        tests = set(node.locator("tr[data-test]").evaluate_all("rows => rows.map(r => r.dataset.test)"))
        assert {"matmul", "membw", "memtest", "allreduce", "connectivity", "nvml"} <= tests, tests
        matmul = " ".join(node.locator("tr[data-test='matmul']").all_inner_texts()).split()
        matmul = " ".join(matmul)
        assert re.search(r"Vazão \(float32\) [\d.,]+ TFLOP/s [\d.,]+ \((mediana|referência)", matmul), matmul
        assert not re.search(r" 0,0+ TFLOP/s", matmul), matmul  # three significant digits, however small
        assert re.search(r"\d+ %", matmul), matmul
        allreduce = " ".join(" ".join(node.locator("tr[data-test='allreduce']").all_inner_texts()).split())
        assert re.search(r"Banda de barramento do all-reduce [\d.,]+ GB/s", allreduce), allreduce
        assert "Não se aplica" in node.locator("tr[data-test='nvml']").first.inner_text()  # CPU-only: said, not a silent pass
    shoot(page, "nodes-check", "pt-BR")
    page.get_by_role("link", name="English").click()
    page.wait_for_selector("#run-status[data-done='true']")
    assert "Throughput (float32)" in page.locator("#run").inner_text() and not untranslated(page)
    shoot(page, "nodes-check", "en")
    page.context.close()


@pytest.mark.timeout(480)
def test_a_selected_node_is_checked_alone_then_drained_and_undrained(stack, chromium, tokens):
    page = open_as(chromium, stack, tokens["operator"], "en")
    page.goto(f"{stack.url}/nodes")
    pick = page.locator("input.node-pick").first
    picked = pick.get_attribute("value")
    pick.check()
    page.get_by_role("button", name="Check selected nodes").click()
    page.wait_for_url(lambda url: "run=" in url and FOUND.get("run", "-") not in url)
    page.wait_for_selector("#run-status[data-done='true']", timeout=240_000)
    assert page.locator("[data-run-node]").evaluate_all("ns => ns.map(n => n.dataset.runNode)") == [picked]
    # Drain and undrain: the row follows live (node events); an undrained node is checked before it is ready.
    row = page.locator(f"tr[data-node-id='{picked}']")
    row.get_by_role("button", name="Drain").click()
    eventually(lambda: "Drained" in row.inner_text() and "No" in row.inner_text(), 60, "the node to show Drained")
    row.get_by_role("button", name="Undrain").click()
    eventually(lambda: node_state(stack, picked) == "ready", 240, "the undrained node to be checked and ready")
    eventually(lambda: "Ready" in row.inner_text(), 20, "the row to show Ready without a reload")
    page.context.close()


def test_executor_rows_show_stuck_and_no_signal_like_their_jobs(stack, chromium, tokens):
    eventually(lambda: ready_nodes(stack) == 2, 180, "both nodes ready")
    hung = submit(stack, command("trava", HANG_SCRIPT))
    eventually(lambda: signal_of(stack, hung) == "stuck", 90, "the hung training to be stuck")
    hung_executor = stack.job(hung)["executor_id"]
    lost = submit(stack, command("perdido", TRAIN_SCRIPT, env={"STEPS": "100000", "STEP_SECONDS": "0.2"}))
    lost_executor = stack.wait_state(lost, {"running"}, 90)["executor_id"]
    FOUND["job"] = hung
    page = open_as(chromium, stack, tokens["operator"], "pt-BR")
    page.goto(f"{stack.url}/executors")
    row = page.locator(f"tr[data-executor-id='{lost_executor}']")
    # The job it runs, a link by its name, the id beside it (issue 26: names beside ids).
    assert row.get_by_role("link", name="perdido", exact=True).get_attribute("href") == f"/jobs/{lost}"
    assert lost in row.inner_text()
    (victim,) = [p for p in stack.processes() if p.get("executor_id") == lost_executor]
    os.kill(victim["pid"], signal.SIGKILL)
    # Live: the rows change without a reload.
    hung_row = page.locator(f"tr[data-executor-id='{hung_executor}']")
    eventually(lambda: "Travado" in hung_row.inner_text(), 60, "the hung training's executor row to say Travado")
    badge = hung_row.locator(".badge.alert")
    assert words(badge).startswith("⚠ Travado")
    badge.focus()
    tip = hung_row.get_by_role("tooltip")
    assert tip.is_visible() and re.fullmatch(r"Passo parado há \d+ s \(limite \d+ s\)", tip.inner_text())
    # A live refresh replaces the rows (an age on them has changed a second later): the focused badge keeps the
    # keyboard focus, so its tooltip stays up instead of vanishing under a keyboard user every second.
    page.wait_for_timeout(1100)
    page.evaluate("() => new Promise(done => { TetoPanel.on('fragment', () => done()); TetoPanel.emit('signal', {}); })")
    assert page.evaluate("() => document.activeElement.classList.contains('signal-stuck')")
    assert hung_row.get_by_role("tooltip").is_visible()
    assert hung_row.get_by_role("link", name="trava", exact=True).get_attribute("href") == f"/jobs/{hung}"
    eventually(lambda: "Sem sinal" in row.inner_text(), 60, "the killed executor's row to say Sem sinal")
    assert words(row.locator(".badge.alert")).startswith("✕ Sem sinal")
    assert re.search(r"há \d+", row.locator("td").nth(7).inner_text())
    assert not untranslated(page)
    shoot(page, "executors", "pt-BR")
    # The job and its executor agree: the same word on the job's badge.
    page.goto(f"{stack.url}/jobs")
    assert "Travado" in page.locator(f"tr[data-job-id='{hung}']").inner_text()
    assert "Sem sinal" in page.locator(f"tr[data-job-id='{lost}']").inner_text()
    page.get_by_role("link", name="English").click()
    page.goto(f"{stack.url}/executors")
    assert "Stuck" in page.locator(f"tr[data-executor-id='{hung_executor}']").inner_text()
    assert "No signal" in page.locator(f"tr[data-executor-id='{lost_executor}']").inner_text()
    shoot(page, "executors", "en")
    page.context.close()


def test_the_gang_policy_is_checked_as_typed_and_saved_with_the_admins_name(stack, chromium, tokens):
    page = open_as(chromium, stack, tokens["admin"], "pt-BR")
    page.goto(f"{stack.url}/policy")
    assert "Os valores padrão estão em vigor" in page.locator("main").inner_text()
    field = page.get_by_label("Prazo de prontidão (segundos)")
    field.fill("0")
    assert page.locator("#e-ready_timeout_seconds").inner_text() == "Deve ser maior que 0."
    assert field.get_attribute("aria-invalid") == "true" and page.locator("#policy-save").is_disabled()
    field.fill("1.5")  # read in pt-BR: an English decimal or a mistyped thousand? refused, with the reason
    assert "digite 1,5" in page.locator("#e-ready_timeout_seconds").inner_text()
    assert page.locator("#policy-save").is_disabled()
    field.fill("1.000")  # one thousand
    assert page.locator("#e-ready_timeout_seconds").inner_text() == ""
    field.fill("90")
    page.get_by_label("Espera inicial (segundos)").fill("30")
    page.get_by_label("Espera máxima (segundos)").fill("20")
    assert "menor que a inicial" in page.locator("#e-backoff_max_seconds").inner_text()
    page.get_by_label("Espera máxima (segundos)").fill("1.200")  # 1200, above the base
    assert page.locator("#e-backoff_max_seconds").inner_text() == ""
    page.get_by_label("Espera máxima (segundos)").fill("300")
    page.get_by_label("Limite de esperas").fill("")  # empty: unlimited
    page.get_by_label("Quando um nó falha").select_option("fail_job")
    assert not page.locator("#policy-save").is_disabled()
    page.get_by_role("button", name="Salvar a política").click()
    page.wait_for_url(re.compile(r"/policy\?saved=1"))
    assert "Política salva" in page.locator("#policy-saved").inner_text()
    assert "Alterada por último por adm em" in page.locator("#policy-changed").inner_text()
    policy = stack.get("/v1/policies/gang").json()
    assert (policy["ready_timeout_seconds"], policy["backoff_max_seconds"], policy["backoff_limit"],
            policy["node_failure_strategy"]) == (90, 300, None, "fail_job")
    shoot(page, "policy", "pt-BR")
    page.context.close()


def catalogue_words(locale: str, other: str) -> list[str]:
    """Whole messages of ``locale`` (no placeholders) that the other locale never uses: on a page in ``other``
    they can only be untranslated text."""
    mine, theirs = i18n.catalogue(locale), set(i18n.catalogue(other).values())
    return sorted({v for v in mine.values() if "{" not in v and len(v) >= 5 and v not in theirs
                   and not any(v in t for t in theirs)})


def test_every_page_in_both_languages_has_no_untranslated_string(stack, chromium, tokens):
    # The audit log has entries by now (the checks, the policy, the submits).
    for locale, other in (("pt-BR", "en"), ("en", "pt-BR")):
        page = open_as(chromium, stack, tokens["admin"], locale)
        foreign = catalogue_words(other, locale)
        job = FOUND.get("job") or page.locator("tbody tr[data-job-id]").first.get_attribute("data-job-id")
        urls = ["/jobs", f"/jobs/{job}", "/executors", "/nodes", f"/nodes?run={FOUND.get('run', '')}", "/policy",
                "/audit"]
        nav = page.locator("header nav a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
        assert {"/jobs", "/executors", "/nodes", "/policy", "/audit"} <= set(nav), nav
        for url in urls:
            page.goto(f"{stack.url}{url}")
            page.wait_for_load_state()
            assert page.locator("html").get_attribute("lang") == locale
            assert not untranslated(page), (url, untranslated(page))
            text = page.locator("body").inner_text()
            leaked = [w for w in foreign if re.search(r"(?<!\w)" + re.escape(w) + r"(?!\w)", text)]
            assert not leaked, (locale, url, leaked)
        page.goto(f"{stack.url}/audit")
        assert page.locator("#verify-badge").get_attribute("data-ok") == "true"
        assert page.locator("table.audit tbody tr[data-seq]").count() > 0
        shoot(page, "audit", locale)
        page.goto(f"{stack.url}/policy")
        shoot(page, "policy", locale)
        page.goto(f"{stack.url}/nodes")
        shoot(page, "nodes", locale)
        page.context.close()


def test_the_status_page_shows_the_control_planes_health_as_the_api_and_refreshes_itself(stack, chromium, tokens):
    for locale in ("pt-BR", "en"):
        page = open_as(chromium, stack, tokens["admin"], locale)
        seen: dict = {}

        def same_as_the_api() -> bool:  # two gatherings a moment apart: a passing change may tell them apart once
            page.goto(f"{stack.url}/status")
            seen["api"] = stack.get("/v1/status").json()
            shown = page.locator("#status-problems li").all_inner_texts()
            return (page.locator("#status-badge").get_attribute("data-ok") == ("1" if seen["api"]["ok"] else "0")
                    and len(shown) == len(seen["api"]["problems"]))

        eventually(same_as_the_api, timeout=60, what="the page's verdict and problems as the API's")
        api = seen["api"]
        assert not untranslated(page), untranslated(page)
        text = page.locator("body").inner_text()
        for problem in page.locator("#status-problems li").all_inner_texts():  # the services' own words
            text = text.replace(problem, "")
        other = "en" if locale == "pt-BR" else "pt-BR"
        leaked = [w for w in catalogue_words(other, locale) if re.search(r"(?<!\w)" + re.escape(w) + r"(?!\w)", text)]
        assert not leaked, (locale, leaked)
        # Every service teto up runs has its replica row, and every singleton a holder.
        for service, view in api["services"].items():
            assert page.locator(f'tr[data-service="{service}"]').count() == max(1, len(view["replicas"])), service
        assert page.locator("tr[data-singleton]").count() == sum(len(v["singletons"]) for v in api["services"].values())
        holders = page.locator("table.singletons tbody td:nth-child(3)").all_inner_texts()
        assert holders and all(h.strip() for h in holders), holders
        assert page.locator("tr[data-stream]").count() == len(api["nats"]["streams"]) > 0
        reachable = "Acessível" if locale == "pt-BR" else "Reachable"
        assert reachable in page.locator("#status-database").inner_text()
        assert page.locator("#status-dead a[href='/dead-letters']").count() == 1  # the count, a link to them
        shoot(page, "status", locale)
        # Asked again every 10 s with no event to prompt it: the time it was gathered moves on by itself.
        before = page.locator("#status-verdict small").inner_text()
        eventually(lambda: page.locator("#status-verdict small").inner_text() != before, timeout=30,
                   what="the status view refreshed by itself")
        page.context.close()


async def _bury(info: dict, service: str, *letters) -> None:
    """Publishes ``letters`` as the edge library does when a consumer gives up (libs/runtime/edge.py), as the
    stack's NATS admin: the page must show them as it shows any."""
    nc = await bus.connect(info["nats_url"], "test-dead-letter", credentials_file=info["nats_credentials_file"])
    try:
        for letter in letters:
            await nc.jetstream(timeout=10).publish(Subjects().dead(service), letter.encode())
    finally:
        await nc.close()


def test_a_dead_letter_shows_why_and_what_it_carried_and_is_replayed_with_the_operators_name(stack, chromium, tokens):
    info = json.loads((stack.data_dir / "stack.json").read_text())
    command, beat = Subjects().cmd("cancel"), Subjects().heartbeat("ex-ghost")
    hostile = b'{"schema": "teto.cmd.cancel/1", "note": "<img src=x onerror=alert(1)>"}'
    letters = [dead_letter(service="queue", consumer="queue-cancel", cause=DeadCause.PERMANENT,
                           reason="the database refused it: <b>value too long</b>", subject=command, payload=hostile,
                           deliveries=1, stream_seq=7),
               dead_letter(service="queue", consumer="queue-heartbeats", cause=DeadCause.EXHAUSTED,
                           reason="timeout", subject=beat, payload=b"{}", deliveries=5)]
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's event loop
        pool.submit(asyncio.run, _bury(info, "queue", *letters)).result(timeout=60)
    for locale in ("en", "pt-BR"):
        page = open_as(chromium, stack, tokens["admin"], locale)
        asked: list[str] = []
        if locale == "en":
            Dialogs(page).seen = asked  # dismissed and recorded: nothing a letter carried may open one
        else:  # the replay's confirmation, accepted
            page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
        page.goto(f"{stack.url}/dead-letters?service=queue")
        rows = page.locator("table.dead tbody tr[data-seq]")
        row, heartbeat = rows.filter(has_text=command).last, rows.filter(has_text=beat).last
        seq = row.get_attribute("data-seq")
        assert row.get_attribute("data-cause") == "permanent" and "queue-cancel" in row.inner_text()
        assert "<b>value too long</b>" in row.inner_text()  # shown as text, never as markup
        # A heartbeat is its executor's to publish (the gateway publishes commands): no button, and it says so.
        assert heartbeat.locator("button").count() == 0
        assert ("Só quem a enviou" if locale == "pt-BR" else "Only its sender") in heartbeat.inner_text()
        assert not untranslated(page), untranslated(page)
        shoot(page, "dead-letters", locale)
        if locale == "en":
            assert asked == []
        else:  # replayed once, confirmed, answered on its row, audited with the operator's name
            row.get_by_role("button", name="Reenviar").click()
            eventually(lambda: page.locator(f"#replay-{seq}").inner_text() == f"Reenviada em {command}", timeout=30,
                       what="the replay's answer on its row")
            assert len(asked) == 1 and f"mensagem morta {seq} em {command}" in asked[0], asked
            eventually(lambda: [e for e in stack.get("/v1/audit?kind=dead_letter_replay").json()["entries"]
                                if e.get("actor") == "adm"], timeout=30, what="the replay in the audit log")
        page.context.close()


def test_a_viewer_sees_no_action_and_its_forged_posts_are_refused(stack, chromium, tokens):
    page = open_as(chromium, stack, tokens["viewer"], "pt-BR")
    for url in ("/executors", "/nodes", f"/nodes?run={FOUND.get('run', '')}"):
        page.goto(f"{stack.url}{url}")
        assert page.locator("main button, main input[type=checkbox]").count() == 0, url
    for url in ("/policy", "/audit"):
        answer = page.goto(f"{stack.url}{url}")
        assert answer.status == 403 and "Sem permissão" in page.locator("main").inner_text()
    nav = page.locator("header nav a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert "/policy" not in nav and "/audit" not in nav and "/nodes" in nav
    node = stack.get("/v1/nodes").json()[0]["node_id"]
    forged = page.evaluate("""async ([group, node]) => {
        const csrf = document.querySelector('meta[name="csrf-token"]').content;
        const post = (url, body, method) => fetch(url, {method: method || "POST", credentials: "same-origin",
            headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf}, body: JSON.stringify(body)})
            .then(r => r.status);
        return [await post("/v1/health-checks", {group}), await post("/v1/nodes/" + node + "/drain", {}),
                await post("/v1/nodes/" + node + "/undrain", {}), await post("/v1/policies/gang", {}, "PUT")];
    }""", [GROUP, node])
    assert forged == [403, 403, 403, 403]
    assert all(n["state"] != "drained" for n in stack.get("/v1/nodes").json())
    page.context.close()
