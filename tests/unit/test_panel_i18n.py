"""The panel's catalogues: both locales hold the same keys, every key a template or script uses exists, and the
locale is chosen from the switch's cookie, then Accept-Language."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.gateway.panel import i18n

pytestmark = pytest.mark.unit

PANEL = Path(i18n.__file__).parent
_USED = re.compile(r"""\bt\(\s*["']([a-z_]+\.[A-Za-z0-9_-]+)["']\s*[,)]""")


def test_every_locale_has_the_same_files_and_keys():
    files = {loc: sorted(p.name for p in (i18n.CATALOGUE_DIR / loc).glob("*.json")) for loc in i18n.LOCALES}
    assert files["pt-BR"] == files["en"]
    assert set(i18n.catalogue("pt-BR")) == set(i18n.catalogue("en"))
    for locale in i18n.LOCALES:
        for path in (i18n.CATALOGUE_DIR / locale).glob("*.json"):
            for key, text in json.loads(path.read_text()).items():
                assert text.strip(), f"{locale}/{path.name}: {key} is empty"


def test_every_key_used_in_templates_and_scripts_exists():
    sources = [*PANEL.glob("templates/*.html"), *PANEL.glob("static/*.js")]
    used = {key for path in sources for key in _USED.findall(path.read_text())}
    assert used, "no t(...) found: the pattern is out of date"
    missing = sorted(used - set(i18n.catalogue("en")))
    assert not missing


def test_placeholders_agree_between_locales():
    names = re.compile(r"\{(\w+)\}")
    pt, en = i18n.catalogue("pt-BR"), i18n.catalogue("en")
    for key in en:
        assert set(names.findall(pt[key])) == set(names.findall(en[key])), key


@pytest.mark.parametrize(("cookie", "header", "expected"), [
    ("en", "pt-BR,pt;q=0.9", "en"), ("pt-BR", "en", "pt-BR"), (None, "pt-BR,pt;q=0.9,en;q=0.8", "pt-BR"),
    (None, "pt", "pt-BR"), (None, "pt-PT", "pt-BR"), (None, "en-US,en;q=0.9", "en"), (None, "de,pt;q=0.5", "pt-BR"),
    (None, "en;q=0.2,pt-BR;q=0.9", "pt-BR"), (None, "de,fr", "en"), (None, None, "en"), ("xx", "", "en"),
    (None, "pt;q=abc,en", "en")], ids=str)
def test_the_locale_is_the_switch_then_accept_language_then_english(cookie, header, expected):
    assert i18n.negotiate(cookie, header) == expected


def test_translate_fills_placeholders_and_shows_unknown_keys_as_themselves():
    assert i18n.translate("pt-BR", "common.signal_stuck") == "Travado"
    assert i18n.translate("en", "common.signal_no_signal") == "No signal"
    assert i18n.translate("en", "common.signed_in_as", actor="ana", role="operator") == "ana (operator)"
    assert i18n.translate("en", "nope.missing") == "nope.missing"
    assert set(i18n.client_messages("en", ("jobs.",))) <= {k for k in i18n.catalogue("en") if k.startswith("jobs.")}


def test_every_state_signal_role_and_locale_has_its_words():
    from libs.contracts.jobs import JobState
    from services.gateway.auth import Role

    keys = set(i18n.catalogue("en"))
    wanted = ({f"common.state_{s.value}" for s in JobState} | {f"common.role_{r.value}" for r in Role}
              | {"common.signal_stuck", "common.signal_no_signal"} | {f"common.locale_{loc}" for loc in i18n.LOCALES})
    assert wanted <= keys, sorted(wanted - keys)


def test_every_waiting_reason_attempt_cause_usage_grouping_and_outcome_has_its_words():
    from libs.contracts.jobs import AttemptCause
    from services.gateway.domain.usage import OUTCOMES, GroupBy
    from services.queue.tenancy.placement_types import WaitCode

    for locale in i18n.LOCALES:
        keys = set(i18n.catalogue(locale))
        wanted = ({f"common.wait_{c.value}" for c in WaitCode} | {f"usage.group_{g.value}" for g in GroupBy}
                  | {f"usage.outcome_{o}" for o in OUTCOMES} | {f"job.cause_{c.value}" for c in AttemptCause})
        assert wanted <= keys, (locale, sorted(wanted - keys))
