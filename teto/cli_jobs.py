"""``teto jobs``: the job list, following the gateway's page cursor (``X-Next-Cursor``) until ``--limit`` jobs
are shown or, with ``--all``, every job; and ``teto command``: how a command was decided (what ``teto submit --no-wait`` leaves to learn)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .cli_common import _print, table
from .cli_format import JOB_COLUMNS
from .cli_http import call, exchange

PAGE_MAX = 1000  # the most jobs the gateway returns in one page
DEFAULT_LIMIT = 100

Fetch = Callable[[dict[str, Any]], tuple[list[dict[str, Any]], str | None]]


def collect(fetch: Fetch, params: Mapping[str, Any], limit: int | None) -> tuple[list[dict[str, Any]], str | None]:
    """Pages of jobs until ``limit`` are gathered (None: until the last page), and the cursor to continue from
    (None: nothing is left). Each page asks only for what is still wanted, at most a full page."""
    jobs: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        want = PAGE_MAX if limit is None else min(PAGE_MAX, limit - len(jobs))
        rows, cursor = fetch({**params, "limit": want, **({"cursor": cursor} if cursor else {})})
        jobs += rows
        if cursor is None or (limit is not None and len(jobs) >= limit):
            return jobs, cursor


def cmd_jobs(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("state", args.state), ("owner", args.owner), ("name", args.name),
                                ("signal", args.signal)) if v}
    if args.cursor:
        params["cursor"] = args.cursor

    def fetch(query: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        resp, body = exchange(args, "GET", "/v1/jobs", params=query)
        return body, resp.headers.get("X-Next-Cursor")

    limit = None if args.all else (args.limit or DEFAULT_LIMIT)
    jobs, cursor = collect(fetch, params, limit)
    more = f"(more: --cursor {cursor}, or --all)" if cursor else None
    if args.json:  # the jobs as the server gave them, one list however many pages; the hint goes to stderr
        print(json.dumps(jobs, indent=2))
        if more:
            print(more, file=sys.stderr)
        return 0
    print((table(jobs, JOB_COLUMNS) if jobs else "no jobs") + (f"\n{more}" if more else ""))
    return 0


def add_jobs_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("jobs", cmd_jobs, "list jobs, newest first (follows the gateway's pages)")
    p.add_argument("--state")
    p.add_argument("--owner")
    p.add_argument("--name", help="jobs whose name contains this (any case)")
    p.add_argument("--signal", choices=["ok", "no_signal", "stuck"])
    p.add_argument("--limit", type=int, help=f"show at most this many (default {DEFAULT_LIMIT})")
    p.add_argument("--all", action="store_true", help="every job, however many pages")
    p.add_argument("--cursor", help="continue after a previous listing (its 'more: --cursor' hint)")


def format_command(c: Mapping[str, Any]) -> str:
    """A command's decision as ``teto command`` prints it."""
    head = f"command {c.get('command_id')} ({c.get('kind')}) by {c.get('actor') or '-'}: {c.get('status')}"
    if c.get("status") == "refused":
        head += f" by {c.get('by') or '-'}: {c.get('reason') or '-'}"
    lines = [head, f"job: {c.get('job_id') or '-'}",
             f"received: {c.get('received_at') or '-'}  decided: {c.get('decided_at') or '-'}"]
    if c.get("detail"):
        lines.append("detail: " + ", ".join(f"{k}={v}" for k, v in sorted(c["detail"].items())))
    return "\n".join(lines)


def cmd_command(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", f"/v1/commands/{args.command_id}")
    _print(args, body, format_command(body))
    return 0


def add_command_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    add("command", cmd_command, "how a command was decided (pending, accepted, refused: why)").add_argument(
        "command_id")
