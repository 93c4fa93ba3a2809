"""WCAG AA contrast of the panel's stylesheet: every rule that sets both a text colour and a background (custom
properties resolved) reaches 4.5:1, and so do text colours on the page backgrounds they are used on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.gateway import panel

pytestmark = pytest.mark.unit

CSS = (Path(panel.__file__).parent / "static" / "panel.css").read_text()
_HEX = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b")


def variables() -> dict[str, str]:
    root = re.search(r":root\s*\{([^}]*)\}", CSS).group(1)
    return dict(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{3,6})", root))


def resolve(value: str, names: dict[str, str]) -> str | None:
    value = value.strip()
    var = re.fullmatch(r"var\((--[\w-]+)\)", value)
    if var:
        return names.get(var.group(1))
    found = _HEX.search(value)
    return found.group(0) if found else ("#ffffff" if value == "#fff" else None)


def luminance(colour: str) -> float:
    colour = colour.lstrip("#")
    if len(colour) == 3:
        colour = "".join(c * 2 for c in colour)
    channels = [int(colour[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def pairs() -> list[tuple[str, str, str]]:
    names = variables()
    out = []
    for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", CSS):
        props = dict((k.strip(), v) for k, v in re.findall(r"(?:^|;)\s*([\w-]+)\s*:\s*([^;]+)", body))
        if "color" in props and "background" in props:
            fg, bg = resolve(props["color"], names), resolve(props["background"], names)
            if fg and bg:
                out.append((selector.strip(), fg, bg))
    return out


def test_the_check_finds_the_badges_and_the_header():
    selectors = " ".join(s for s, _, _ in pairs())
    assert ".state-failed" in selectors and ".badge.alert" in selectors and "header.top" in selectors


@pytest.mark.parametrize(("selector", "fg", "bg"), pairs(), ids=lambda v: v if isinstance(v, str) else None)
def test_text_on_its_background_meets_wcag_aa(selector, fg, bg):
    assert contrast(fg, bg) >= 4.5, f"{selector}: {fg} on {bg} is {contrast(fg, bg):.2f}:1"


@pytest.mark.parametrize("text", ["--ink", "--muted", "--link"])
@pytest.mark.parametrize("background", ["--bg", "--panel"])
def test_page_text_on_page_backgrounds_meets_wcag_aa(text, background):
    names = variables()
    assert contrast(names[text], names[background]) >= 4.5
