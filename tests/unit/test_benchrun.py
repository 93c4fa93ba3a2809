"""The rules of ``teto bench`` (teto/benchrun.py): which benchmarks exist, which run, what a row holds, the table."""

from __future__ import annotations

import math

import pytest

from bench._drain import row
from teto import benchrun

pytestmark = pytest.mark.unit


def test_discovery_finds_bench_modules_only_sorted(tmp_path):
    for name in ("bench_zeta.py", "bench_alpha.py", "_servers.py", "__init__.py", "bench_.py", "notes.md"):
        (tmp_path / name).write_text("")
    assert benchrun.discover(tmp_path) == ["alpha", "zeta"]


def test_the_repository_benchmarks_are_discovered():
    found = benchrun.discover(benchrun.bench_dir())
    assert {"ingest", "outbox", "audit"} <= set(found)


def test_selection_keeps_order_drops_repeats_and_names_unknown_ones():
    assert benchrun.select(["a", "b", "c"], []) == ["a", "b", "c"]
    assert benchrun.select(["a", "b", "c"], ["c", "a", "c"]) == ["c", "a"]
    with pytest.raises(ValueError, match="unknown benchmark\\(s\\) x; known: a, b"):
        benchrun.select(["a", "b"], ["a", "x"])


def test_a_result_becomes_rows_with_every_key():
    (one,) = benchrun.normalize("audit", {"figure": 3.0, "passed": True})
    assert set(one) == {*benchrun.KEYS, "bench"}
    assert one["name"] == "audit" and one["bench"] == "audit" and one["ratio"] is None and one["passed"] is True
    two = benchrun.normalize("ingest", [{"name": "a"}, {"name": "b"}])
    assert [r["name"] for r in two] == ["a", "b"]
    with pytest.raises(TypeError, match="bench_x.main returned int"):
        benchrun.normalize("x", [1])


def test_the_table_shows_every_row_its_verdict_and_notes():
    rows = benchrun.normalize("x", [
        {"name": "fast", "figure": 16743.2, "reference": 47867.0, "ratio": 0.35, "target": 0.5, "unit": "msg/s",
         "passed": False, "note": "short here"},
        {"name": "slow", "figure": 2.5, "passed": True},
        {"name": "info", "figure": math.inf}])
    text = benchrun.table(rows).splitlines()
    assert text[0].split() == ["benchmark", "figure", "reference", "ratio", "target", "unit", "result"]
    assert text[2].split() == ["fast", "16,743", "47,867", "0.35", "0.50", "msg/s", "short"]
    assert text[3].split() == ["slow", "2.50", "-", "-", "-", "pass"]
    assert text[4].split() == ["info", "inf", "-", "-", "-", "-"]
    assert text[-1].strip() == "fast: short here"


def test_a_failed_benchmark_reads_as_short_with_its_reason():
    assert benchrun.failure("noise\nTraceback (most recent call last):\n  x\nValueError: bad spec\nTask destroyed") \
        == "ValueError: bad spec"
    assert benchrun.failure("just a line\nlast") == "last"
    assert benchrun.failure("") == "no output"


def test_a_failure_while_handling_another_names_the_first_as_the_cause():
    chained = ("Traceback (most recent call last):\n  File x\nAttributeError: module 'store' has no attribute 'X'\n\n"
               "During handling of the above exception, another exception occurred:\n\nTraceback (most recent call"
               " last):\n  File y\nConnectionRefusedError: [Errno 111] Connect call failed\n")
    assert benchrun.failure(chained) == ("AttributeError: module 'store' has no attribute 'X' (then, while handling"
                                         " it: ConnectionRefusedError: [Errno 111] Connect call failed)")
    # "raise B from A": B is the message the code chose to give; it stays the one shown
    caused = ("ValueError: raw\n\nThe above exception was the direct cause of the following exception:\n\n"
              "RuntimeError: the spec is invalid\n")
    assert benchrun.failure(caused) == "RuntimeError: the spec is invalid"
    failed = benchrun.failed_row("audit", "timed out after 5 s")
    assert failed["passed"] is False and failed["figure"] is None and failed["note"] == "timed out after 5 s"


def test_a_measured_row_is_a_ratio_against_the_reference_and_its_target():
    r = row("queue", 1000, 2.0, 0.5)  # 500/s against 2000/s
    assert (r["figure"], r["reference"], r["ratio"], r["passed"]) == (500.0, 2000.0, 0.25, False)
    assert row("queue", 1000, 1.0, 0.5)["passed"] is True  # exactly 0.5x passes
    assert row("x", 10, 1.0, 1.0, target=None)["passed"] is None
