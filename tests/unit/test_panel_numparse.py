"""Numbers typed in the panel, read in the page's locale (services/gateway/panel/numparse.py, and its mirror
static/numparse.js): pt-BR ``100,5`` is 100.5 and ``1.000`` is 1000, English the other way round; anything the page's
convention cannot read exactly once is refused with its reason; the requeue form's server route reads the text as
typed and refuses it in the page's words."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess

import pytest

from services.gateway.panel import fmt, i18n
from services.gateway.panel.numparse import parse_number, written
from services.gateway.panel.pages.job import number_refusal
from fastapi.testclient import TestClient

from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings
from tests.unit.test_panel_web import FakeCommands, FakeReads, sign_in

pytestmark = pytest.mark.unit

SCRIPT = i18n.CATALOGUE_DIR.parent / "static" / "numparse.js"


@pytest.fixture
def panel(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    secrets = {actor: auth.create_token(settings.effective_tokens_file, actor, role)
               for actor, role in (("olga", "operator"), ("ana", "submitter"))}
    commands = FakeCommands()
    with TestClient(create_app(settings, reads=FakeReads(), commands=commands), base_url="https://panel.test") as client:
        yield client, secrets, commands

# (typed, locale, value or refusal code)
CASES = [
    ("100,5", "pt-BR", 100.5), ("1.000", "pt-BR", 1000.0), ("1.234,5", "pt-BR", 1234.5), ("0,125", "pt-BR", 0.125),
    ("1.000.000", "pt-BR", 1e6), ("1234", "pt-BR", 1234.0), ("1234,567", "pt-BR", 1234.567),
    ("  7 ", "pt-BR", 7.0),
    ("-5", "pt-BR", -5.0), ("+3", "pt-BR", 3.0), ("-0", "pt-BR", 0.0), ("007", "pt-BR", 7.0),
    ("1.000,000", "pt-BR", 1000.0), ("10,25", "pt-BR", 10.25),
    ("1,000", "en", 1000.0), ("100.5", "en", 100.5), ("1,234.5", "en", 1234.5), ("0.125", "en", 0.125),
    ("1.5", "en", 1.5), ("1,000,000", "en", 1e6), ("2,500", "en", 2500.0), ("-1,000.25", "en", -1000.25),
    # another locale reads as English
    ("1,000", "de", 1000.0),
    # refused: ambiguous
    ("1.5", "pt-BR", "other_convention"), ("100.5", "pt-BR", "other_convention"), ("0.5", "pt-BR", "other_convention"),
    ("1,234.5", "pt-BR", "other_convention"), ("100,5", "en", "other_convention"),
    ("1.234,5", "en", "other_convention"),
    ("1.000.000", "en", "other_convention"), ("0.500", "pt-BR", "other_convention"),
    ("1,000", "pt-BR", "ambiguous"), ("2,500", "pt-BR", "ambiguous"), ("1.000", "en", "ambiguous"),
    ("-1.000", "en", "ambiguous"),
    # refused: malformed
    ("1.000,5,3", "pt-BR", "several_points"), ("1,00.0", "pt-BR", "group_after_point"),
    ("1,00.0", "en", "bad_grouping"), ("1.000,5,3", "en", "group_after_point"),
    ("1.2.3", "en", "several_points"),
    ("12.34.567", "pt-BR", "bad_grouping"), ("1.000.00", "pt-BR", "bad_grouping"),
    ("0.000.000", "pt-BR", "bad_grouping"),
    ("1,000,00", "en", "bad_grouping"), ("1234,567,000", "en", "bad_grouping"),
    ("1.0000", "pt-BR", "other_convention"), ("0.000", "pt-BR", "other_convention"),
    ("1,0000", "en", "other_convention"),
    ("1234,567", "en", "other_convention"),
    (",5", "pt-BR", "misplaced_separator"), ("5,", "pt-BR", "misplaced_separator"), (".5", "en", "misplaced_separator"),
    ("1..0", "pt-BR", "misplaced_separator"), ("1.,0", "pt-BR", "misplaced_separator"),
    ("1,.0", "en", "misplaced_separator"),
    ("", "pt-BR", "empty"), ("   ", "en", "empty"), (None, "en", "empty"),
    ("abc", "pt-BR", "not_a_number"), ("1e3", "en", "not_a_number"), ("1 000", "pt-BR", "not_a_number"),
    ("--1", "en", "not_a_number"), ("-", "en", "not_a_number"), ("+", "pt-BR", "not_a_number"),
    (".", "en", "not_a_number"),
    ("1_000", "en", "not_a_number"), ("١٢", "en", "not_a_number"), ("NaN", "en", "not_a_number"),
    ("inf", "pt-BR", "not_a_number"), ("1" * 41, "en", "not_a_number"), ("12-3", "en", "not_a_number"),
]


@pytest.mark.parametrize(("typed", "locale", "expected"), CASES, ids=lambda v: repr(v))
def test_a_typed_number_is_read_in_the_pages_locale_or_refused_with_its_reason(typed, locale, expected):
    reading = parse_number(typed, locale)
    if isinstance(expected, str):
        assert (reading.value, reading.problem) == (None, expected)
    else:
        assert reading.ok and reading.value == expected and reading.problem is None


def test_what_was_refused_says_what_the_other_reading_would_be():
    assert parse_number("1.5", "pt-BR").other == 1.5
    assert parse_number("100,5", "en").other == 100.5
    ambiguous = parse_number("2,500", "pt-BR")
    assert (ambiguous.mine, ambiguous.other) == (2.5, 2500.0)
    assert parse_number("1,00.0", "en").other is None


@pytest.mark.parametrize("locale", ["pt-BR", "en"])
def test_what_the_panel_writes_it_reads_back(locale):
    """Every number fmt.number writes (0 to 2 decimals, grouped) reads back as itself; three decimals after a
    whole part of up to three digits are ambiguous (the other convention reads a thousands group), never misread."""
    values = [0, 1, 7, 60.5, 99.99, 100, 999, 1000, 1000.5, 12345.67, 999999, 1234567.8, 10**9]
    for value, decimals in itertools.product(values, (0, 1, 2)):
        text = fmt.number(value, locale, decimals)
        assert parse_number(text, locale).value == round(value, decimals), text
        assert parse_number(written(value, locale), locale).value == value
    for value in (1.125, 999.001, 0.5):
        text = fmt.number(value, locale, 3)
        reading = parse_number(text, locale)
        assert reading.value == value if value < 1 else reading.problem == "ambiguous", text


def _strings(alphabet: str, longest: int):
    for n in range(longest + 1):
        yield from ("".join(p) for p in itertools.product(alphabet, repeat=n))


@pytest.mark.skipif(shutil.which("node") is None, reason="the script's rule is checked with Node.js, not installed here")
def test_the_pages_script_reads_every_short_text_as_the_server_does():
    """Every text of up to 5 characters from digits, both separators, a sign, a space and a letter, in both
    locales: the page's script (static/numparse.js, run in Node) answers what numparse.py answers."""
    texts = list(_strings("01.,- x", 5))
    program = (f"require({json.dumps(str(SCRIPT))});"
               "const texts = JSON.parse(require('fs').readFileSync(0)); const out = {};"
               "for (const loc of ['pt-BR', 'en']) out[loc] = texts.map(t => TetoNumbers.parse(t, loc));"
               "process.stdout.write(JSON.stringify(out));")
    done = subprocess.run(["node", "-e", program], input=json.dumps(texts), capture_output=True, text=True,
                          check=True, timeout=120)
    script = json.loads(done.stdout)
    differ = []
    for locale in ("pt-BR", "en"):
        for text, js in zip(texts, script[locale]):
            py = parse_number(text, locale)
            mine = {"value": py.value} if py.ok else {"problem": py.problem, "other": py.other}
            theirs = ({"value": js["value"]} if "value" in js
                      else {"problem": js["problem"], "other": js.get("other")})
            if mine != theirs:
                differ.append((locale, text, mine, theirs))
    assert len(texts) > 19_000 and not differ, differ[:10]


def test_the_written_form_is_the_same_in_the_script():
    if shutil.which("node") is None:
        pytest.skip("Node.js not installed")
    values = [0, 1, 2.5, 1000, -0.5, 1234567.125, 60.000001, 10**9]
    program = (f"require({json.dumps(str(SCRIPT))});"
               f"process.stdout.write(JSON.stringify({json.dumps(values)}.map(v => [TetoNumbers.written(v, 'pt-BR'), "
               "TetoNumbers.written(v, 'en')])));")
    out = json.loads(subprocess.run(["node", "-e", program], capture_output=True, text=True, check=True).stdout)
    assert out == [[written(v, "pt-BR"), written(v, "en")] for v in values]


@pytest.mark.parametrize(("typed", "locale", "words"), [
    ("1.5", "pt-BR", ["“1.5”", "separadores trocados", "digite 1,5"]),
    ("1,000", "pt-BR", ["ambíguo", "1 ou 1.000"]),
    ("100,5", "en", ["swapped", "type 100.5"]),
    ("1.000,5,3", "pt-BR", ["mais de uma vírgula"]),
    ("abc", "en", ["not a number", "“,” for thousands", "“.” for decimals"]),
    ("2.000.000.000", "pt-BR", ["no máximo 1.000.000.000 GPU-s"]),
    ("0", "en", ["above zero"]),
])
def test_a_refusal_is_explained_in_the_pages_words(typed, locale, words):
    text = number_refusal(typed, locale)
    assert text is not None and all(w in text for w in words), text
    assert number_refusal("1.000,5" if locale == "pt-BR" else "1,000.5", locale) is None


def test_the_requeue_form_posts_the_text_and_the_server_reads_it_in_the_pages_locale(panel):
    client, secrets, commands = panel
    csrf = sign_in(client, secrets["olga"])
    headers = {"X-CSRF-Token": csrf}
    client.cookies.set(i18n.LANG_COOKIE, "pt-BR")
    read = client.post("/jobs/j1/requeue", json={"ceiling": "1.000,5"}, headers=headers)
    assert read.status_code == 200 and commands.sent[-1].gpu_ceiling_seconds == 1000.5
    assert client.post("/jobs/j1/requeue", json={"ceiling": "100,5"}, headers=headers).status_code == 200
    assert commands.sent[-1].gpu_ceiling_seconds == 100.5 and commands.sent[-1].actor == "olga"
    refused = client.post("/jobs/j1/requeue", json={"ceiling": "1.5"}, headers=headers)
    assert refused.status_code == 422 and refused.json()["error"] == "unreadable_number"
    assert "digite 1,5" in refused.json()["reason"] and len(commands.sent) == 2
    for body in ({"ceiling": 100}, {}, [], {"ceiling": ""}):
        assert client.post("/jobs/j1/requeue", json=body, headers=headers).status_code == 422
    client.cookies.set(i18n.LANG_COOKIE, "en")
    assert client.post("/jobs/j1/requeue", json={"ceiling": "1,000"}, headers=headers).status_code == 200
    assert commands.sent[-1].gpu_ceiling_seconds == 1000.0
    english = client.post("/jobs/j1/requeue", json={"ceiling": "100,5"}, headers=headers)
    assert english.status_code == 422 and "type 100.5" in english.json()["reason"] and len(commands.sent) == 3
    # The same guards as the API: no CSRF token, no requeue; a submitter is refused naming the permission.
    assert client.post("/jobs/j1/requeue", json={"ceiling": "1,000"}).status_code == 403
    client.cookies.clear()
    csrf = sign_in(client, secrets["ana"])
    forged = client.post("/jobs/j1/requeue", json={"ceiling": "1,000"}, headers={"X-CSRF-Token": csrf})
    assert forged.status_code == 403 and forged.json()["permission"] == "finetune:manage" and len(commands.sent) == 3


class PolicyReads(FakeReads):
    async def gang_policy(self) -> dict:
        return {"ready_timeout_seconds": 1000.5, "backoff_base_seconds": 15.0, "backoff_max_seconds": 600.0,
                "backoff_limit": None, "sequential_admission": True, "node_failure_strategy": "requeue_gang"}


def test_the_policy_form_is_filled_and_read_in_the_pages_locale(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    secret = auth.create_token(settings.effective_tokens_file, "adm", "admin")
    commands = FakeCommands()
    with TestClient(create_app(settings, reads=PolicyReads(), commands=commands), base_url="https://panel.test") as client:
        csrf = sign_in(client, secret)
        client.cookies.set(i18n.LANG_COOKIE, "pt-BR")
        assert 'value="1.000,5"' in client.get("/policy").text  # filled as the page's locale writes it
        typed = {"ready_timeout_seconds": "1.000", "backoff_base_seconds": "2,5", "backoff_max_seconds": "1.200",
                 "backoff_limit": ""}
        saved = client.put("/policy", json={"numbers": typed, "node_failure_strategy": "fail_job"},
                           headers={"X-CSRF-Token": csrf})
        assert saved.status_code == 200, saved.text
        policy = commands.sent[-1].policy
        assert (policy.ready_timeout_seconds, policy.backoff_base_seconds, policy.backoff_max_seconds,
                policy.backoff_limit, policy.node_failure_strategy.value) == (1000, 2.5, 1200, None, "fail_job")
        refused = client.put("/policy", json={"numbers": {**typed, "backoff_base_seconds": "1.5"}},
                             headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 422 and "digite 1,5" in refused.json()["fields"]["backoff_base_seconds"]
        invalid = client.put("/policy", json={"numbers": {**typed, "ready_timeout_seconds": "0"}},
                             headers={"X-CSRF-Token": csrf})
        assert invalid.status_code == 422 and invalid.json()["error"] == "invalid" and len(commands.sent) == 1
        client.cookies.set(i18n.LANG_COOKIE, "en")
        assert 'value="1,000.5"' in client.get("/policy").text
        assert client.put("/policy", json={"numbers": {**typed, "ready_timeout_seconds": "1,000"}},
                          headers={"X-CSRF-Token": csrf}).status_code == 422  # "2,5" is no English number
        assert client.put("/policy", json={"numbers": {"ready_timeout_seconds": "1,000", "backoff_base_seconds": "2.5",
                                                       "backoff_max_seconds": "1,200"}},
                          headers={"X-CSRF-Token": csrf}).status_code == 200
        assert commands.sent[-1].policy.ready_timeout_seconds == 1000 and len(commands.sent) == 2
        assert client.put("/policy", json={"numbers": {}}).status_code == 403  # no CSRF token
