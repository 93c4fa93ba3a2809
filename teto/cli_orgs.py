"""``teto orgs`` (organisations, projects, cohorts: list, and set with ``policy:admin``; every change is an audited
command) and ``teto usage`` (GPU time and jobs per organisation, project or user; ``--csv`` for a spreadsheet)."""

from __future__ import annotations

import argparse
from typing import Any

from .cli_common import CliError, _print, gib_to_bytes, table
from .cli_http import call

ORG_COLUMNS = [("org", "name"), ("cohort", "cohort"), ("weight", "weight"), ("quotas", "quotas"),
               ("budget GPU-h", "budget"), ("period", "period")]
USAGE_COLUMNS = [("key", "key"), ("GPU-h", "gpu_hours"), ("jobs", "jobs"), ("interruptions", "interruptions"),
                 ("lost GPU-h", "lost_gpu_hours"), ("mean wait s", "mean_queue_wait_seconds"),
                 ("ckpt cadence", "checkpoint_cadence_met")]


def parse_quota(text: str) -> tuple[str, dict[str, int | None]]:
    """``GROUP=NOMINAL[:BORROWING[:LENDING]]``; an empty or ``-`` limit is unlimited (``a100=4:2``, ``cpu=8:-:2``)."""
    group, sep, numbers = text.partition("=")
    parts = numbers.split(":")
    if not sep or not group or not 1 <= len(parts) <= 3:
        raise CliError(f"--quota {text!r}: expected GROUP=NOMINAL[:BORROWING[:LENDING]]", 2)
    try:
        values = [None if p in ("", "-") else int(p) for p in parts] + [None] * (3 - len(parts))
    except ValueError:
        raise CliError(f"--quota {text!r}: limits are whole numbers of devices", 2) from None
    if values[0] is None:
        raise CliError(f"--quota {text!r}: the nominal share is required", 2)
    return group, {"nominal": values[0], "borrowing_limit": values[1], "lending_limit": values[2]}


def org_spec(args: argparse.Namespace) -> dict[str, Any]:
    quotas = None if args.unmetered else dict(parse_quota(q) for q in args.quota or [])
    limits = {"memory_mb": getattr(args, "run_memory_mb", None), "pids": getattr(args, "run_pids", None),
              "disk_mb": getattr(args, "run_disk_mb", None)}
    return {"cohort": args.cohort, "weight": args.weight, "quotas": quotas, "period": args.period,
            "budget_gpu_seconds": None if args.budget_gpu_hours is None else args.budget_gpu_hours * 3600.0,
            "checkpoint_quota_bytes": None if getattr(args, "checkpoint_quota_gib", None) is None
            else gib_to_bytes("--checkpoint-quota-gib", args.checkpoint_quota_gib),
            "run_limits": limits if any(v is not None for v in limits.values()) else None,
            "description": args.description}



def _quota_text(quotas: dict[str, Any] | None) -> str:
    if quotas is None:
        return "unmetered"
    dash = lambda v: "-" if v is None else str(v)  # noqa: E731
    return " ".join(f"{g}={q['nominal']}:{dash(q.get('borrowing_limit'))}:{dash(q.get('lending_limit'))}"
                    for g, q in sorted(quotas.items())) or "none"


def cmd_orgs(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", "/v1/orgs")
    rows = []
    for org in body["orgs"]:
        spec = org["spec"] or {}
        budget = spec.get("budget_gpu_seconds")
        rows.append({"name": org["name"], "cohort": spec.get("cohort") or "-", "weight": spec.get("weight", 1.0),
                     "quotas": _quota_text(spec.get("quotas")), "period": spec.get("period", "month"),
                     "budget": "-" if budget is None else f"{budget / 3600:.1f}"})
    projects = ", ".join(f"{p['org']}/{p['name']}" for p in body["projects"])
    cohorts = ", ".join(f"{c['name']} ({c['preemption']})" for c in body["cohorts"]) or "none"
    _print(args, body, f"{table(rows, ORG_COLUMNS)}\nprojects: {projects}\ncohorts: {cohorts}")
    return 0


def cmd_org_set(args: argparse.Namespace) -> int:
    _, body = call(args, "PUT", f"/v1/orgs/{args.name}", json=org_spec(args))
    _print(args, body, f"organisation {args.name} set: {_quota_text((body.get('spec') or {}).get('quotas'))}")
    return 0


def cmd_project_set(args: argparse.Namespace) -> int:
    _, body = call(args, "PUT", f"/v1/orgs/{args.org}/projects/{args.name}",
                   json={"description": args.description})
    _print(args, body, f"project {args.org}/{args.name} set")
    return 0


def cmd_cohort_set(args: argparse.Namespace) -> int:
    _, body = call(args, "PUT", f"/v1/cohorts/{args.name}", json={"preemption": args.preemption})
    _print(args, body, f"cohort {args.name}: preemption {args.preemption}")
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("org", args.org), ("period", args.period), ("group_by", args.group_by)) if v}
    if args.csv:
        _, body = call(args, "GET", "/v1/usage", params={**params, "format": "csv"})
        print(body, end="")
        return 0
    _, body = call(args, "GET", "/v1/usage", params=params)
    rows = [{**r, "jobs": " ".join(f"{k}={v}" for k, v in r["jobs"].items() if v),
             "lost_gpu_hours": round(float(r.get("lost_gpu_seconds") or 0.0) / 3600.0, 4)} for r in body["rows"]]
    head = (f"{body['start'][:10]} to {body['end'][:10]}: {body['total_gpu_hours']:.4f} GPU-h in total"
            f" ({body['total_gpu_seconds']:.1f} GPU-s, the ledger's sum)")
    _print(args, body, f"{head}\n{table(rows, USAGE_COLUMNS)}" if rows else f"{head}\nno usage")
    return 0


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard) -> None:
    orgs = sub.add_parser("orgs", help="organisations, projects and cohorts (changes need policy:admin)",
                          parents=[common])
    orgs.set_defaults(func=guard(cmd_orgs))
    osub = orgs.add_subparsers(dest="orgs_command")
    p = osub.add_parser("set", help="create or replace an organisation", parents=[common])
    p.add_argument("name")
    p.add_argument("--cohort")
    p.add_argument("--weight", type=float, default=1.0)
    p.add_argument("--quota", action="append", metavar="GROUP=NOMINAL[:BORROW[:LEND]]",
                   help="devices per node group (repeatable); '-' is unlimited")
    p.add_argument("--unmetered", action="store_true", help="no quotas at all (bounded by the fleet only)")
    p.add_argument("--budget-gpu-hours", type=float, help="GPU-hours per period")
    p.add_argument("--period", choices=["month", "day"], default="month")
    p.add_argument("--checkpoint-quota-gib", type=float,
                   help="most GiB one checkpoint of any of its jobs may have (caps each job's checkpoint_quota_bytes)")
    p.add_argument("--run-memory-mb", type=int, help="most memory (MiB) per run of its jobs, and their default")
    p.add_argument("--run-pids", type=int, help="most processes and threads per run, and their default")
    p.add_argument("--run-disk-mb", type=int, help="most disk (MiB) a run may write, and their default")
    p.add_argument("--description", default="")
    p.set_defaults(func=guard(cmd_org_set))
    p = osub.add_parser("project", help="create or replace a project of an organisation", parents=[common])
    p.add_argument("org")
    p.add_argument("name")
    p.add_argument("--description", default="")
    p.set_defaults(func=guard(cmd_project_set))
    p = osub.add_parser("cohort", help="set a cohort's preemption policy", parents=[common])
    p.add_argument("name")
    p.add_argument("--preemption", required=True, choices=["never", "reclaim_borrowed", "by_priority"])
    p.set_defaults(func=guard(cmd_cohort_set))

    p = sub.add_parser("usage", help="GPU time and jobs per organisation, project or user", parents=[common])
    p.add_argument("--org")
    p.add_argument("--period", help="YYYY-MM or YYYY-MM-DD (UTC); default this month")
    p.add_argument("--group-by", choices=["org", "project", "user"], default="org")
    p.add_argument("--csv", action="store_true", help="CSV on stdout")
    p.set_defaults(func=guard(cmd_usage))
