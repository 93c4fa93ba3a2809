"""The configuration reference, generated from the typed settings classes (README.md holds its output between
markers; a unit test keeps them in step). Run ``python -m teto.configref --write`` after changing a setting."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from pydantic.fields import FieldInfo

PARTS: list[tuple[str, str, str]] = [
    ("every part", "libs.runtime.settings", "CommonSettings"),
    ("queue", "services.queue.settings", "QueueSettings"),
    ("budget", "services.budget.settings", "BudgetSettings"),
    ("health", "services.health.settings", "HealthSettings"),
    ("audit", "services.audit.settings", "AuditSettings"),
    ("gateway", "services.gateway.settings", "GatewaySettings"),
    ("executor", "agents.executor.settings", "ExecutorSettings"),
]
BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def _number(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _bounds(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sym} {_number(v)}")
        if getattr(m, "pattern", None):
            parts.append(f"`{m.pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "(computed)"
    d = info.default
    return "(derived)" if d is None else f"`{d}`"


def render() -> str:
    common = importlib.import_module(PARTS[0][1]).CommonSettings
    lines = ["| part | variable | default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
    for part, module, cls_name in PARTS:
        cls = getattr(importlib.import_module(module), cls_name)
        for name, info in cls.model_fields.items():
            if cls is not common and name in common.model_fields:
                continue
            desc = (info.description or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {part} | `TETO_{name.upper()}` | {_default(info)} | {_bounds(info)} | {desc} |")
    return "\n".join(lines)


def splice(readme: str) -> str:
    block = f"{BEGIN}\n{render()}\n{END}"
    if BEGIN not in readme:
        raise ValueError("README.md has no config-reference markers")
    return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


if __name__ == "__main__":
    if "--write" in sys.argv:
        path = Path(__file__).resolve().parent.parent / "README.md"
        path.write_text(splice(path.read_text()))
    else:
        print(render())
