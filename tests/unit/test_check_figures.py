"""The check suite never produces a figure it cannot send: a non-finite figure fails the test with the reason
and no figures (agents/executor/checks/suite.py ``sendable``, applied by the runner to every record)."""

from __future__ import annotations

import math

import pytest

from libs.contracts.nodes import CheckReport
from agents.executor.checks.suite import sendable
from tests.support import builders

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_a_non_finite_figure_fails_the_test_with_the_reason_and_no_figures(value):
    record = {"test": "matmul", "status": "passed", "figures": {"tflops_float32": value, "n": 512.0},
              "detail": {"n": 512}, "error": None, "seconds": 0.0}
    out = sendable(record)
    assert out["status"] == "failed" and out["figures"] == {}
    assert "tflops_float32" in out["error"] and "not finite" in out["error"]
    assert out["detail"]["n"] == 512 and "tflops_float32" in out["detail"]["refused_figures"]
    # What the agent sends from it is a report the bus can carry and the service can decode.
    rep = builders.check_report(out["status"], "matmul", figures=out["figures"], detail=out["detail"],
                                error=out["error"])
    assert CheckReport.decode(rep.encode()).status == "failed"


def test_a_failed_test_keeps_its_own_error_first():
    out = sendable({"test": "allreduce", "status": "failed", "figures": {"busbw_gbps": math.inf},
                    "error": "all-reduce result wrong"})
    assert out["error"].startswith("all-reduce result wrong; ") and out["figures"] == {}


@pytest.mark.parametrize("figures", [{}, {"tflops_float32": 1.5, "errors": 0}, {"copy_gbps": 0.0}],
                         ids=["none", "finite", "zero"])
def test_finite_figures_pass_through_untouched(figures):
    record = {"test": "membw", "status": "passed", "figures": figures, "error": None}
    assert sendable(record) is record


def test_a_running_record_without_figures_passes_through():
    record = {"test": "membw", "status": "running"}
    assert sendable(record) is record


async def test_the_runner_sends_a_failure_not_an_infinite_figure(tmp_path, monkeypatch):
    """A suite child printing a throughput of Infinity (JSON's spelling): the agent gets a failed record."""
    from agents.executor.checks import runner
    from agents.executor.checks.spec import Spec

    child = tmp_path / "child"
    child.write_text('#!/bin/sh\ncat > /dev/null\n'
                     'echo \'{"test": "matmul", "status": "running"}\'\n'
                     'echo \'{"test": "matmul", "status": "passed", "figures": {"tflops_float32": Infinity},'
                     ' "detail": {}, "error": null, "seconds": 0.0}\'\n')
    child.chmod(0o755)
    monkeypatch.setattr(runner.sys, "executable", str(child))
    records: list[dict] = []

    async def on_record(record: dict) -> None:
        records.append(record)

    await runner.run_suite(Spec(tests=["matmul"]), on_record, timeout=30)
    assert [r["status"] for r in records] == ["running", "failed"]
    assert records[1]["figures"] == {} and "tflops_float32=inf" in records[1]["error"]
