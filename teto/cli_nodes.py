"""The fleet's CLI commands: ``teto nodes [--groups]``, ``check``, ``check-status``, ``drain [--undo]`` and
``clear-alert``, each a call to the gateway's node routes."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from .cli_common import CliError, _cell, _print, table
from .cli_http import call


NODE_COLUMNS = [("node", "node_id"), ("group", "group_name"), ("state", "state"), ("schedulable", "schedulable"),
                ("reason", "reason"), ("executor", "executor_id"), ("job", "job_id"), ("reboots", "reboots"),
                ("last check", "last_check_outcome"), ("at", "last_check_at")]
GROUP_COLUMNS = [("group", "group_name"), ("nodes", "nodes"), ("schedulable", "schedulable"), ("states", "states"),
                 ("last check", "last_check_at"), ("alert", "alert.reason")]


def alerts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per group under a systemic-failure alert (replacing stopped, nodes held), first on screen."""
    seen: dict[str, str] = {}
    for r in rows:
        alert = r.get("alert")
        if isinstance(alert, Mapping) and r.get("group_name") not in seen:
            seen[r["group_name"]] = (f"ALERT group {r['group_name']} since {alert.get('since')}: {alert.get('reason')}"
                                     f" (held; clear with: teto clear-alert {r['group_name']})")
    return list(seen.values())


def cmd_nodes(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", "/v1/node-groups" if args.groups else "/v1/nodes")
    human = table(body, GROUP_COLUMNS if args.groups else NODE_COLUMNS) if body else "no nodes"
    _print(args, body, "\n".join([*alerts(body or []), human]))
    return 0


def cmd_clear_alert(args: argparse.Namespace) -> int:
    _, body = call(args, "POST", f"/v1/node-groups/{args.group}/clear-alert", json={"reason": args.reason})
    released = ", ".join(body.get("released") or []) or "no node"
    _print(args, body, f"group {args.group}: alert cleared; released {released}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    if bool(args.group) == bool(args.node):
        raise CliError("name --group G or --node N (repeatable), not both", 2)
    payload = {"group": args.group, "nodes": args.node or [], "tests": args.test or [], "force": args.force}
    _, body = call(args, "POST", "/v1/health-checks", json=payload)
    human = (f"check run {body.get('run_id')} on {', '.join(body.get('nodes') or [])}"
             + (f"; cordoned until their job ends: {', '.join(body['cordoned'])}" if body.get("cordoned") else "")
             + (f"\nskipped: {_cell(body['skipped'])}" if body.get("skipped") else "")
             + f"\nfollow it: teto check-status {body.get('run_id')}")
    _print(args, body, human)
    return 0


def format_check_run(run: Mapping[str, Any]) -> str:
    lines = [f"check run {run.get('run_id')} ({run.get('kind')}, group {_cell(run.get('group_name'))}): "
             f"{run.get('state')}"]
    for node in run.get("nodes") or []:
        lines.append(f"  {node.get('node_id')}: {node.get('status')}"
                     + (f"  ({node['reason']})" if node.get("reason") else ""))
        for t in node.get("tests") or []:
            figures = ", ".join(f"{k}={_cell(v)}" for k, v in sorted((t.get("figures") or {}).items()))
            why = t.get("error") or ""
            lines.append(f"    {t.get('test'):<13} {t.get('status'):<15} {figures} {why}".rstrip())
    return "\n".join(lines)


def cmd_check_status(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", f"/v1/health-checks/{args.run_id}")
    _print(args, body, format_check_run(body))
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    path = f"/v1/nodes/{args.node_id}/{'undrain' if args.undo else 'drain'}"
    _, body = call(args, "POST", path, json=None if args.undo else {"reason": args.reason})
    _print(args, body, f"node {args.node_id}: {body.get('state', 'sent')}")
    return 0


def add_parsers(add: Any) -> None:
    """Register the commands with cli_client's ``add(name, fn, help)``."""
    p = add("nodes", cmd_nodes, "list nodes (state, schedulable, reason, last check)")
    p.add_argument("--groups", action="store_true", help="one line per node group")
    p = add("check", cmd_check, "run deep health checks on a group or nodes")
    p.add_argument("--group")
    p.add_argument("--node", action="append", help="a node id (repeatable)")
    p.add_argument("--test", action="append", help="only these tests (repeatable): matmul, membw, memtest, nvml, "
                   "connectivity, allreduce")
    p.add_argument("--force", action="store_true", help="busy nodes: checkpoint and requeue their job first")
    add("check-status", cmd_check_status, "a check run's progress per node and test").add_argument("run_id")
    p = add("drain", cmd_drain, "take a node out of scheduling (--undo: undrain, it is checked first)")
    p.add_argument("node_id")
    p.add_argument("--reason", default="drained by operator")
    p.add_argument("--undo", action="store_true")
    p = add("clear-alert", cmd_clear_alert, "clear a group's systemic-failure alert (replacing resumes, held "
            "nodes return after a check)")
    p.add_argument("group")
    p.add_argument("--reason", default="cleared by operator")
