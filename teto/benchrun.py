"""``teto bench``: discover the benchmarks in ``bench/``, run each in its own process, print a table, write JSON.

A benchmark is a module ``bench/bench_<name>.py`` with ``main(quick: bool = False) -> dict | list[dict]``; each
dict is one result row with the keys of ``KEYS`` (missing ones are filled with None). A new module is picked up
with no change here. Each benchmark runs in a child interpreter (``python -m teto.benchrun NAME OUT [--quick]``)
so one that hangs, crashes or leaks servers cannot take the others down; it is killed after its timeout.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = ("name", "figure", "reference", "ratio", "target", "unit", "passed", "note")
PREFIX = "bench_"


def bench_dir(start: Path | None = None) -> Path:
    """``bench/`` of the working directory when there is one, else the one next to this package (a checkout)."""
    here = (start or Path.cwd()) / "bench"
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "bench"


def discover(directory: Path) -> list[str]:
    """Benchmark names, sorted: ``bench_<name>.py`` files (private helpers start with ``_``)."""
    return sorted(p.stem[len(PREFIX):] for p in directory.glob(f"{PREFIX}*.py") if p.stem != PREFIX)


def select(available: list[str], wanted: list[str]) -> list[str]:
    """The wanted names in the order given (all when none); an unknown name is an error naming the known ones."""
    if not wanted:
        return list(available)
    unknown = [w for w in wanted if w not in available]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(available) or 'none'}")
    return list(dict.fromkeys(wanted))


def normalize(bench: str, result: object) -> list[dict]:
    """A benchmark's return value as rows with every key; the benchmark's name is recorded with each row."""
    rows = result if isinstance(result, list) else [result]
    out = []
    for row in rows:
        if not isinstance(row, dict):
            raise TypeError(f"bench_{bench}.main returned {type(row).__name__}, not a dict")
        full = {k: row.get(k) for k in KEYS}
        full["name"] = full["name"] or bench
        full["bench"] = bench
        out.append(full)
    return out


def failed_row(bench: str, note: str) -> dict:
    """The row of a benchmark that did not finish: no figure, not passed, the reason in the note."""
    return {**{k: None for k in KEYS}, "name": bench, "bench": bench, "passed": False, "note": note}


def failure(output: str) -> str:
    """The line of a child's output that says why it failed: the last exception line, else the last line. When
    that exception was raised while handling another (a cleanup that failed after the real error), the first
    one is the cause and comes first: the cleanup's error alone would send a reader after the wrong fault."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
    if len(errors) > 1 and _DURING in output and errors[0] != errors[-1]:
        return f"{errors[0][:200]} (then, while handling it: {errors[-1][:150]})"
    return ((errors or lines or ["no output"])[-1])[:300]


_DURING = "During handling of the above exception, another exception occurred"


def verdict(passed: object) -> str:
    return "pass" if passed is True else "short" if passed is False else "-"


def _num(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def table(rows: list[dict]) -> str:
    """The results as a fixed-width text table: benchmark, figure, reference, ratio, target, unit, pass/short."""
    head = ("benchmark", "figure", "reference", "ratio", "target", "unit", "result")
    body = [(str(r["name"]), _num(r["figure"]), _num(r["reference"]), _num(r["ratio"]), _num(r["target"]),
             str(r["unit"] or ""), verdict(r["passed"])) for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    fmt = lambda line: "  ".join(c.ljust(w) if i in (0, 5, 6) else c.rjust(w)  # noqa: E731
                                 for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip()
    notes = [f"  {r['name']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, body)]
                     + (["notes:", *notes] if notes else []))


def run_one(name: str, directory: Path, *, quick: bool, timeout: float) -> list[dict]:
    """Run one benchmark in a child interpreter; its rows, or one failed row saying why."""
    with tempfile.TemporaryDirectory(prefix="teto-bench-out-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "teto.benchrun", name, str(out), str(directory)] + (["--quick"] if quick else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(directory.parent), os.environ.get("PYTHONPATH", "")) if p)}
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=directory.parent, env=env, timeout=timeout, capture_output=True,
                                  text=True)
        except subprocess.TimeoutExpired:
            return [failed_row(name, f"timed out after {timeout:.0f} s")]
        seconds = time.monotonic() - t0
        if proc.returncode != 0 or not out.exists():
            return [failed_row(name, f"exit {proc.returncode}: {failure(proc.stderr or proc.stdout)}")]
        rows = normalize(name, json.loads(out.read_text()))
    for row in rows:
        row["seconds"] = round(seconds, 2)
    return rows


def report(rows: list[dict], *, quick: bool) -> dict:
    """The JSON document written by ``teto bench``: when, where, how, and the rows."""
    return {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": quick,
            "machine": {"cpus": os.cpu_count(), "platform": sys.platform, "python": sys.version.split()[0]},
            "results": rows}


def _child(name: str, out: str, directory: str, quick: bool) -> int:
    import importlib

    sys.path.insert(0, str(Path(directory).parent))
    module = importlib.import_module(f"{Path(directory).name}.{PREFIX}{name}")
    result = module.main(quick=quick)
    rows = normalize(name, result)  # refuse a malformed result here, where its traceback is
    Path(out).write_text(json.dumps([{k: r[k] for k in KEYS} for r in rows], default=str))
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--quick"]
    sys.exit(_child(args[0], args[1], args[2], "--quick" in sys.argv[1:]))
