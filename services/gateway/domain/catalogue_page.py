"""The AsyncAPI document as one plain HTML page (``GET /asyncapi``): its channels with their address, what each
is for (the stream that stores it), who sends and who receives on it, and each message's fields. Rendered here
from the document alone, with no script and nothing fetched from elsewhere, so it reads the same offline."""

from __future__ import annotations

from html import escape
from typing import Any


def render(doc: dict[str, Any]) -> str:
    """The page for ``doc`` (an AsyncAPI 3 document as FastStream writes it)."""
    info = doc.get("info", {})
    ops_by_channel: dict[str, list[tuple[str, str]]] = {}
    for name, op in sorted(doc.get("operations", {}).items()):
        channel = op["channel"]["$ref"].rsplit("/", 1)[-1]
        ops_by_channel.setdefault(channel, []).append((op["action"], name))
    rows = []
    for key, channel in sorted(doc.get("channels", {}).items(), key=lambda kv: (kv[1]["address"], kv[0])):
        messages = [_ref_name(m) for m in channel.get("messages", {}).values()]
        payloads = [_payload_names(doc, name) for name in messages]
        ops = ", ".join(f"{action} ({escape(name)})" for action, name in ops_by_channel.get(key, []))
        rows.append(f"<tr id=\"{escape(key, quote=True)}\"><td><code>{escape(channel['address'])}</code></td>"
                    f"<td>{ops}</td><td>{', '.join(_links(names) for names in payloads)}</td>"
                    f"<td>{escape(channel.get('description', ''))}</td></tr>")
    schemas = doc.get("components", {}).get("schemas", {})
    sections = [_schema_section(name, schema) for name, schema in sorted(schemas.items()) if "properties" in schema]
    return "\n".join([
        "<!doctype html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{escape(info.get('title', 'AsyncAPI'))}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}code{white-space:nowrap}"
        "</style></head><body>",
        f"<h1>{escape(info.get('title', ''))} <small>AsyncAPI {escape(doc.get('asyncapi', ''))}, version "
        f"{escape(info.get('version', ''))}</small></h1>",
        f"<p>{escape(info.get('description', ''))}</p>",
        "<p>The document itself: <a href=\"/asyncapi.json\">/asyncapi.json</a>.</p>",
        f"<h2>Channels ({len(rows)})</h2>",
        "<table><thead><tr><th>address</th><th>operations</th><th>messages</th><th>about</th></tr></thead><tbody>",
        *rows, "</tbody></table>",
        f"<h2>Messages and types ({len(sections)})</h2>", *sections, "</body></html>", ""])


def _ref_name(node: dict[str, Any]) -> str:
    return node["$ref"].rsplit("/", 1)[-1]


def _payload_names(doc: dict[str, Any], message: str) -> list[str]:
    """The schema names a message's payload is (a union's members each)."""
    components = doc.get("components", {})
    payload = components.get("messages", {}).get(message, {}).get("payload", {})
    if "$ref" not in payload:
        return []
    name = _ref_name(payload)
    target = components.get("schemas", {}).get(name, {})
    members = target.get("anyOf", target.get("oneOf"))
    return [name] if members is None else [_ref_name(m) for m in members if "$ref" in m]


def _links(names: list[str]) -> str:
    return " | ".join(f"<a href=\"#schema-{escape(n, quote=True)}\">{escape(n)}</a>" for n in names)


def _schema_section(name: str, schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    rows = [f"<tr><td><code>{escape(field)}</code></td><td>{escape(_type(prop))}</td>"
            f"<td>{'yes' if field in required else ''}</td><td>{escape(str(prop.get('description', '')))}</td></tr>"
            for field, prop in schema.get("properties", {}).items()]
    return "\n".join([f"<h3 id=\"schema-{escape(name, quote=True)}\">{escape(name)}</h3>",
                      f"<p>{escape(str(schema.get('description', '')).split(chr(10) * 2)[0])}</p>",
                      "<table><thead><tr><th>field</th><th>type</th><th>required</th><th>description</th></tr>"
                      "</thead><tbody>", *rows, "</tbody></table>"])


def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return _ref_name(prop)
    for key in ("anyOf", "oneOf"):
        if key in prop:
            return " | ".join(_type(p) for p in prop[key])
    if prop.get("type") == "array":
        return f"list[{_type(prop.get('items', {}))}]"
    if "const" in prop:
        return repr(prop["const"])
    if "enum" in prop:
        return " | ".join(str(v) for v in prop["enum"])
    return str(prop.get("format", prop.get("type", "any")))
