"""Generated hostile messages for every subject in the contract catalogue (libs/contracts/registry.py).

For each message type a minimal valid body is derived from its JSON Schema; the hostile ones are that body
broken in one way each: not a body at all (empty, not JSON, a JSON array), the wrong schema, a field missing,
null or of the wrong type, integers past 2**63 and 2**31, a float that parses as infinity, a NUL inside a
string, a dot inside an id (a subject separator), the same inside a nested object (a heartbeat's usage
sample), and one string padded to just under the server's max payload. The base body itself is never sent: a forged but valid grant is an authorisation question, not a
robustness one. Deterministic (no randomness beyond fresh ids), bounded, and pure: the test publishes.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from libs.contracts.envelope import Envelope
from libs.contracts.registry import CATALOGUE, Entry

INF = "__inf__"  # replaced by a bare 1e999 in the JSON text: valid JSON that every parser reads as infinity


@dataclass(frozen=True)
class Hostile:
    subject: str
    data: bytes
    kind: str  # what is wrong with it, for the report
    core: bool  # core NATS (request/reply subjects), not a stream


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        return _resolve(options[0], defs) if options else {"type": "null"}
    if "oneOf" in schema:
        return _resolve(schema["oneOf"][0], defs)
    return schema


def _value(name: str, schema: dict[str, Any], defs: dict[str, Any], ids: dict[str, str]) -> Any:
    s = _resolve(schema, defs)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return s["enum"][0]
    kind = s.get("type")
    if kind == "string":
        if s.get("format") == "date-time":
            return datetime.now(UTC).isoformat()
        return ids.get(name, "hostile")
    if kind == "integer":
        return max(1, int(s.get("minimum", 1)))
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {k: _value(k, v, defs, ids) for k, v in s.get("properties", {}).items()
                if k in s.get("required", [])}
    return None


def minimal_body(model: type[Envelope], ids: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The smallest body its schema allows (required fields only), and the resolved property schemas."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    props = {k: _resolve(v, defs) for k, v in schema.get("properties", {}).items()}
    body = {k: _value(k, v, defs, ids) for k, v in schema.get("properties", {}).items()
            if k in schema.get("required", [])}
    body["schema"] = model.SCHEMA
    return body, props


def _mutations(name: str, prop: dict[str, Any]) -> list[tuple[str, Any]]:
    kind = prop.get("type")
    if kind in ("integer", "number"):
        return [("int 2**63", 2**63), ("int 2**31", 2**31), ("inf", INF), ("wrong type", "12")]
    if kind == "string":
        found = [("NUL in string", "a\u0000b"), ("wrong type", 12345)]
        if name.endswith("_id"):
            found.insert(0, ("dot in id", "a.b"))
        return found
    if kind == "object":
        return [("wrong type", [1, 2]), ("null", None)]
    if kind == "array":
        return [("wrong type", {"a": 1}), ("array of junk", [None, 2**63, "\u0000"])]
    return [("wrong type", [])]


# A job spec or policy broken inside could still be a valid one (a real job the matrix did not ask for).
NOT_NESTED = {"spec", "policy"}


def _nested(subject: str, body: dict[str, Any], name: str, prop: dict[str, Any], defs: dict[str, Any],
            ids: dict[str, str], core: bool) -> list[Hostile]:
    """One level down: an object field (a heartbeat's usage sample, say) present and broken inside."""
    if prop.get("type") != "object" or not prop.get("properties") or name in NOT_NESTED:
        return []
    inner = {k: _value(k, v, defs, ids) for k, v in prop["properties"].items() if k in prop.get("required", [])}
    # Each kind of damage applied to every field it fits at once (seq, epoch and wall_seconds of a usage
    # sample together): one message per kind keeps the burst small and reaches every column.
    damaged: dict[str, dict[str, Any]] = {}
    for field, schema in prop["properties"].items():
        for kind, value in _mutations(field, _resolve(schema, defs)):
            damaged.setdefault(kind, dict(inner))[field] = value
    return [Hostile(subject, _encode({**body, name: obj}), f"{kind} in {name}.*", core)
            for kind, obj in damaged.items()]


def _encode(body: Any) -> bytes:
    return json.dumps(body).replace(json.dumps(INF), "1e999").encode()


def _subject(entry: Entry, prefix: str, executor_id: str, job_id: str) -> str | None:
    if entry.subject.startswith("("):  # a reply inbox: no subject of its own
        return None
    fill = {"kind": getattr(entry.model, "KIND", "") or "submit", "command_id": uuid.uuid4().hex,
            "job_id": job_id, "executor_id": executor_id, "node_id": f"node-{executor_id}",
            "run_id": uuid.uuid4().hex, "event": "hostile", "status": "result", "service": "hostile"}
    subject = re.sub(r"<(\w+)>", lambda m: fill.get(m.group(1), "hostile"), entry.subject)
    return prefix + subject.removeprefix("teto")


STRUCTURAL = ("empty", "not JSON", "JSON array", "wrong schema")
# The damage that reaches storage and arithmetic first: what a limit must not cut.
PRIORITY = ("int 2**63", "NUL", "inf", "dot", "near max payload", "int 2**31", "missing",
            "wrong type", "null", "array of junk")


def _damage(kind: str) -> str:
    head = kind.split(" in ")[0]
    return "missing" if head.startswith("missing ") else head


def _interleave(msgs: list[Hostile]) -> list[Hostile]:
    """Every kind of damage early in the list, the worst first (a limit then keeps the variety, not the first
    fields); damage inside a nested object alternates with damage at the top, so a limit keeps some of both."""
    top: dict[str, list[Hostile]] = {}
    nested: dict[str, list[Hostile]] = {}
    for m in msgs:
        into = nested if "." in m.kind.rsplit(" in ", 1)[-1] else top
        into.setdefault(_damage(m.kind), []).append(m)

    def ranked(classes: dict[str, list[Hostile]]) -> list[list[Hostile]]:
        order = [*STRUCTURAL, *PRIORITY]
        return [classes[k] for k in sorted(classes, key=lambda k: order.index(k) if k in order else len(order))]
    first, rest_top, rest_nested = ranked(top)[:len(STRUCTURAL)], ranked(top)[len(STRUCTURAL):], ranked(nested)
    classes = list(first)
    for i in range(max(len(rest_top), len(rest_nested))):
        classes += [c[i] for c in (rest_top, rest_nested) if i < len(c)]
    out: list[Hostile] = []
    for i in range(max(len(c) for c in classes)):
        out.extend(c[i] for c in classes if i < len(c))
    return out


def hostile_messages(prefix: str, *, executor_ids: list[str], max_payload: int,
                     limit: int = 480) -> list[Hostile]:
    """Hostile messages on every subject of the catalogue, at most ``limit`` (spread over all subjects)."""
    per_subject: list[list[Hostile]] = []
    for n, entry in enumerate(CATALOGUE):
        executor_id = executor_ids[n % len(executor_ids)]
        job_id = f"hostile{uuid.uuid4().hex[:12]}"
        subject = _subject(entry, prefix, executor_id, job_id)
        if subject is None:
            continue
        core = entry.stream is None
        ids = {"job_id": job_id, "executor_id": executor_id, "node_id": f"node-{executor_id}",
               "command_id": uuid.uuid4().hex, "run_id": uuid.uuid4().hex, "id": uuid.uuid4().hex}
        body, props = minimal_body(entry.model, ids)
        defs = entry.model.model_json_schema(by_alias=True).get("$defs", {})
        out = [Hostile(subject, data, kind, core) for kind, data in (
            ("empty", b""), ("not JSON", b"not json \xff\xfe"), ("JSON array", b"[1, 2, 3]"),
            ("wrong schema", _encode({**body, "schema": "teto.hostile/9"})))]
        padded = False
        for name, prop in props.items():
            if name == "schema":
                continue
            if name in body:
                out.append(Hostile(subject, _encode({k: v for k, v in body.items() if k != name}),
                                   f"missing {name}", core))
            for kind, value in _mutations(name, prop):
                out.append(Hostile(subject, _encode({**body, name: value}), f"{kind} in {name}", core))
            out.extend(_nested(subject, body, name, prop, defs, ids, core))
            if prop.get("type") == "string" and not padded and not name.endswith("_id"):
                padded = True  # one near-max payload per subject: bounded bytes on the bus
                filler = "x" * (max_payload - len(_encode(body)) - 256)
                out.append(Hostile(subject, _encode({**body, name: filler}), f"near max payload in {name}", core))
        per_subject.append(_interleave(out))
    # Round-robin across subjects so a limit cuts evenly rather than dropping the last subjects entirely.
    picked: list[Hostile] = []
    for i in range(max(len(s) for s in per_subject)):
        for msgs in per_subject:
            if i < len(msgs) and len(picked) < limit:
                picked.append(msgs[i])
    return picked
