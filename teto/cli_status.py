"""``teto status``: the control plane's own health (``GET /v1/status``, needs fleet:manage): each service's
replicas and singleton holders, NATS members and stream replicas, consumer lag, the database, executors by
state. Exits 1 when it names a problem, so a script can wait for recovery."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from .cli_http import call


def render(status: Mapping[str, Any]) -> str:
    """The status as an operator reads it: the verdict and problems first, then each part."""
    problems = status.get("problems") or []
    lines = ["control plane: OK" if status.get("ok") else f"control plane: {len(problems)} problem(s)"]
    lines += [f"  ! {p}" for p in problems]
    lines.append("services:")
    for name, svc in (status.get("services") or {}).items():
        replicas = svc.get("replicas") or []
        lines.append(f"  {name:<8} {len(replicas)} replica(s): "
                     + (", ".join(r["instance"] for r in replicas) or "none"))
        for lock, holder in (svc.get("singletons") or {}).items():
            shown = holder if isinstance(holder, str) else (", ".join(holder) if holder else "NOBODY")
            lines.append(f"           singleton {lock}: {shown}")
    nats = status.get("nats") or {}
    lines.append(f"NATS: connected to {nats.get('connected_to') or '?'}"
                 + (f" (cluster {nats['cluster']})" if nats.get("cluster") else ""))
    for m in nats.get("members") or []:
        lines.append(f"  member {m['name']}: {'online' if m['online'] else 'OFFLINE'}, leads {len(m['leads'])} "
                     "stream(s)" + (f" ({m['url']})" if m.get("url") else ""))
    for s in nats.get("streams") or []:
        if s.get("error"):
            lines.append(f"  stream {s['name']}: NO INFO: {s['error']}")
            continue
        peers = ", ".join(f"{p['name']}{' OFFLINE' if p['offline'] else '' if p['current'] else ' behind'}"
                          for p in s["peers"])
        lines.append(f"  stream {s['name']}: R{s['replicas']}, leader {s['leader'] or 'NONE'}"
                     + (f", followers {peers}" if peers else "") + f", {s['messages']} message(s)")
    lines.append("consumers (pending / unacknowledged):")
    for c in status.get("consumers") or []:
        lines.append(f"  {c['service']:<8} {c['durable']:<28} {c['pending']} / {c['ack_pending']}")
    db = status.get("database") or {}
    lines.append(f"database: reachable ({db.get('latency_ms')} ms)" if db.get("reachable")
                 else f"database: UNREACHABLE: {db.get('error')}")
    ex = status.get("executors") or {}
    states = ", ".join(f"{k} {v}" for k, v in (ex.get("by_state") or {}).items())
    if ex.get("error"):
        lines.append(f"executors: UNREADABLE: {ex['error']}")
    else:
        lines.append(f"executors: {ex.get('total', 0)}" + (f" ({states})" if states else ""))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", "/v1/status")
    print(json.dumps(body, indent=2) if args.json else render(body))
    return 0 if body.get("ok") else 1


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard) -> None:
    p = sub.add_parser("status", help="the control plane's own health: replicas, singletons, NATS, lag, database "
                       "(needs fleet:manage; exits 1 on a problem)", parents=[common])
    p.set_defaults(func=guard(cmd_status))
