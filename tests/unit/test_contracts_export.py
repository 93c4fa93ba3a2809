"""The published contracts are generated from the models: every catalogued message has a JSON Schema that
validates what the model writes, and docs/events.md and docs/schemas/ are exactly what the generator makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.contracts.export import export, file_name, index, json_schema, render_events_md
from libs.contracts.registry import CATALOGUE

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
STALE = "is stale: run `teto contracts export` from the repository root and commit the result"


def test_docs_events_md_is_up_to_date():
    assert (ROOT / "docs" / "events.md").read_text() == render_events_md(), f"docs/events.md {STALE}"


def test_docs_schemas_are_up_to_date(tmp_path):
    written = export(tmp_path)
    for path in written:
        committed = ROOT / "docs" / "schemas" / path.name
        assert committed.exists() and committed.read_text() == path.read_text(), f"docs/schemas/{path.name} {STALE}"
    extra = {p.name for p in (ROOT / "docs" / "schemas").iterdir()} - {p.name for p in written}
    assert not extra, f"docs/schemas holds files no message produces: {extra}"


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.model.SCHEMA + " " + e.subject)
def test_every_message_is_documented_with_its_subject_and_fields(entry):
    md = render_events_md()
    assert f"`{entry.model.SCHEMA}`" in md and f"`{entry.subject}`" in md
    for name in entry.model.model_json_schema(by_alias=True).get("properties", {}):
        assert f"| `{name}` |" in md
    schema = json_schema(entry)
    assert schema["$id"] == entry.model.SCHEMA and schema["properties"]["schema"]["const"] == entry.model.SCHEMA
    assert schema["x-teto-subject"] == entry.subject


def test_export_writes_one_schema_per_message_and_an_index(tmp_path):
    md = tmp_path / "events.md"
    written = export(tmp_path / "schemas", md)
    names = {p.name for p in written}
    assert {file_name(e.model) for e in CATALOGUE} | {"index.json", "events.md"} == names
    idx = json.loads((tmp_path / "schemas" / "index.json").read_text())
    assert idx == index() and len(idx) == len(CATALOGUE)
    assert md.read_text().startswith("<!-- Generated")
    submit = json.loads((tmp_path / "schemas" / "teto.cmd.submit.v1.json").read_text())
    assert "spec" in submit["required"] and "JobSpec" in submit["$defs"]


def test_export_is_deterministic(tmp_path):
    a = [p.read_text() for p in export(tmp_path / "a", tmp_path / "a.md")]
    b = [p.read_text() for p in export(tmp_path / "b", tmp_path / "b.md")]
    assert a == b
