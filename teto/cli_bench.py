"""``teto bench [NAME...] [--quick] [--json FILE]``: run the benchmarks of ``bench/`` (see teto/benchrun.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run the benchmarks (bench/bench_*.py), print a table, write JSON")
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke that the benchmarks still work")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per benchmark before it is killed (default 120 quick, 1800 full)")
    p.add_argument("--dir", type=Path, default=None, help="the benchmarks' folder (default: ./bench)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from teto import benchrun

    directory = (args.dir or benchrun.bench_dir()).resolve()
    available = benchrun.discover(directory)
    if args.list:
        print("\n".join(available))
        return 0
    try:
        names = benchrun.select(available, args.names)
    except ValueError as exc:
        print(f"teto bench: {exc}", file=sys.stderr)
        return 2
    timeout = args.timeout or (120.0 if args.quick else 1800.0)
    rows: list[dict] = []
    for name in names:
        print(f"running {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
        rows += benchrun.run_one(name, directory, quick=args.quick, timeout=timeout)
    print(benchrun.table(rows))
    args.json.write_text(json.dumps(benchrun.report(rows, quick=args.quick), indent=2, default=str) + "\n")
    print(f"results written to {args.json}", file=sys.stderr)
    # A benchmark that did not run is a failure; a figure short of its target is a result, reported, not an error.
    return 1 if any(r["figure"] is None and r["passed"] is False for r in rows) else 0
