"""``teto budget reconcile``: prove each job's GPU-second total equals the sum of its ledger rows. It reads the
budget service's PostgreSQL directly (like ``teto tokens`` reads its local file), not through the gateway."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .cli_common import EXIT_REFUSED, EXIT_UNREACHABLE, CliError, _print, table


def cmd_budget_reconcile(args: argparse.Namespace) -> int:
    """Every job's GPU-second total against the sum of its ledger rows; exits 1 naming any job that differs."""
    import asyncio

    import asyncpg

    from services.budget.store import reconcile

    url = args.database_url or os.environ.get("TETO_DATABASE_URL")
    stack = args.data_dir / "stack.json"
    if not url and stack.exists():
        url = json.loads(stack.read_text()).get("database_url")
    if not url:
        raise CliError(f"no database: pass --database-url, set TETO_DATABASE_URL, or run `teto up` (no {stack})",
                       EXIT_UNREACHABLE)

    async def run() -> list[Any]:
        conn = await asyncpg.connect(url, timeout=args.timeout)
        try:
            return await reconcile(conn, args.job or None)
        finally:
            await conn.close()

    try:
        results = asyncio.run(run())
    except (OSError, asyncpg.PostgresError) as exc:
        raise CliError(f"cannot read the budget ledger: {exc}", EXIT_UNREACHABLE) from None
    bad = [r for r in results if not r.ok]
    rows = [{**r.as_dict(), "difference": f"{r.difference:+g}"} for r in bad]
    human = (f"{len(results)} job(s): every total equals the sum of its ledger" if not bad else
             f"{len(bad)} of {len(results)} job(s) differ from their ledger:\n" + table(rows, RECONCILE_COLUMNS))
    gaps = [f"{r.job_id} ({r.missing})" for r in results if r.missing]
    if gaps:  # not a failure by itself: a redelivered batch fills its gap within seconds; run again to see
        human += "\nusage records missing inside a run (in flight, or lost if it persists): " + ", ".join(gaps)
    _print(args, {"ok": not bad, "jobs": [r.as_dict() for r in results]}, human)
    return EXIT_REFUSED if bad else 0


RECONCILE_COLUMNS = [("job", "job_id"), ("total", "consumed_seconds"), ("ledger sum", "ledger_seconds"),
                     ("rows", "rows"), ("difference", "difference")]


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard) -> None:
    budget = sub.add_parser("budget", help="the GPU-second ledger")
    bsub = budget.add_subparsers(dest="budget_command", required=True)
    p = bsub.add_parser("reconcile", parents=[common],
                        help="prove each job's total equals the sum of its ledger (exit 1 naming any that differs)")
    p.add_argument("--database-url", help="the budget service's PostgreSQL (TETO_DATABASE_URL; default from "
                   "<data-dir>/stack.json)")
    p.add_argument("--job", action="append", help="only this job (repeatable)")
    p.set_defaults(func=guard(cmd_budget_reconcile))
