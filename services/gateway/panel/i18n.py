"""The panel's message catalogues and the choice of locale.

Every visible string lives in ``i18n/<locale>/<page>.json`` (``common.json`` for the layout); a key is used as
``<page>.<name>`` (``jobs.title``), so a new page brings its own files and edits no one else's. Catalogues are
read once per process. The locale comes from the ``teto_lang`` cookie (the visible switch), else the best match
of ``Accept-Language``, else English. Pure: no request objects here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

LOCALES = ("pt-BR", "en")
DEFAULT_LOCALE = "en"
LANG_COOKIE = "teto_lang"
CATALOGUE_DIR = Path(__file__).parent / "i18n"


@lru_cache(maxsize=None)
def catalogue(locale: str, root: Path = CATALOGUE_DIR) -> Mapping[str, str]:
    """Every message of ``locale`` as ``{"<page>.<name>": text}``."""
    out: dict[str, str] = {}
    for path in sorted((root / locale).glob("*.json")):
        for name, text in json.loads(path.read_text(encoding="utf-8")).items():
            out[f"{path.stem}.{name}"] = str(text)
    return out


def translate(locale: str, key: str, **values: object) -> str:
    """The message, with ``{name}`` placeholders filled; an unknown key is shown as itself (tests find those)."""
    text = catalogue(locale).get(key)
    if text is None:
        return key
    return text.format(**values) if values else text


def negotiate(cookie: str | None, accept_language: str | None) -> str:
    """The locale to show: the switch's cookie, else Accept-Language by quality, else the default."""
    if cookie in LOCALES:
        return cookie
    ranked: list[tuple[float, int, str]] = []
    for index, part in enumerate((accept_language or "").split(",")):
        tag, _, params = part.strip().partition(";")
        quality = 1.0
        if params.strip().startswith("q="):
            try:
                quality = float(params.strip()[2:])
            except ValueError:
                quality = 0.0
        if tag:
            ranked.append((-quality, index, tag.strip()))
    for _, _, tag in sorted(ranked):
        if tag.lower() == "*":
            return DEFAULT_LOCALE
        for locale in LOCALES:
            if tag.lower() == locale.lower() or tag.split("-")[0].lower() == locale.split("-")[0].lower():
                return locale
    return DEFAULT_LOCALE


def client_messages(locale: str, prefixes: tuple[str, ...]) -> dict[str, str]:
    """The messages a page's script needs (keys under these prefixes), embedded as JSON data in the page."""
    return {k: v for k, v in catalogue(locale).items() if k.startswith(prefixes)}
