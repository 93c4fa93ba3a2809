"""deploy/grafana/teto-dashboard.json: every query names only series Teto exports (libs/runtime/metrics.py), every
Teto series is on some panel, and the JSON is a dashboard Grafana imports (unique ids, a datasource variable)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from libs.runtime import metrics

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "teto-dashboard.json"
SERIES = re.compile(r"\b((?:teto|process)_[a-z0-9_]+)\b")
LABEL_VALUES = re.compile(r'"[^"]*"')  # label values are not series names


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def named(expr: str) -> set[str]:
    return set(SERIES.findall(LABEL_VALUES.sub('""', expr)))


def test_every_query_names_a_series_that_exists():
    exported = metrics.series_names()
    assert queries()
    for expr in queries():
        assert named(expr), f"no series in {expr!r}"
        assert named(expr) <= exported, f"{expr!r} names {named(expr) - exported}"


def test_every_teto_series_is_on_a_panel():
    families = {f.name for f in metrics.REGISTRY.collect() if f.name.startswith("teto_")}
    used = {name for expr in queries() for name in named(expr)}
    shown = {family for family in families if any(u == family or u.startswith(family + "_") for u in used)}
    assert families - shown == set()


def test_panels_have_unique_ids_a_position_and_the_datasource_variable():
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert all({"h", "w", "x", "y"} <= p["gridPos"].keys() and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
               for p in d["panels"])
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]
    assert all(t["datasource"]["uid"] == "${datasource}" for p in d["panels"] for t in p.get("targets", []))
    assert d["uid"] and d["title"]
