"""The operations pages' rules (services/gateway/panel/fleet.py): executor badges and zombies, node counts, check
runs against the group's median, the gang policy's bounds read from its contract, the audit filters."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from libs.contracts.nodes import CheckStatus, CheckTest, NodeState
from libs.contracts.policies import GangPolicy
from libs.contracts.telemetry import Phase
from services.gateway.panel import fleet, i18n

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)


def test_an_executors_badge_is_the_job_badges_block():
    row = {"signal": "stuck", "signal_since": "t", "detail": {"stuck_after_seconds": 3.0,
                                                             "seconds_since_step_change": 7.5}}
    assert fleet.executor_signal(row) == {"signal": "stuck", "signal_since": "t", "stuck_after_seconds": 3.0,
                                          "seconds_since_step_change": 7.5}
    assert fleet.executor_signal({"signal": "ok", "detail": {}}) is None
    assert fleet.executor_signal({"signal": None}) is None
    assert fleet.executor_signal({"signal": "no_signal", "detail": None})["signal"] == "no_signal"


def test_heartbeat_age_is_the_health_views_measure_else_from_the_last_heartbeat():
    assert fleet.heartbeat_age({"detail": {"seconds_since_heartbeat": 4.25}}, NOW) == 4.25
    assert fleet.heartbeat_age({"detail": {"seconds_since_heartbeat": -0.1}}, NOW) == 0.0
    last = (NOW - timedelta(seconds=12)).isoformat()
    assert fleet.heartbeat_age({"detail": {}, "last_heartbeat": last}, NOW) == 12.0
    assert fleet.heartbeat_age({"detail": {"seconds_since_heartbeat": float("nan")}, "last_heartbeat": last},
                               NOW) == 12.0
    assert fleet.heartbeat_age({}, NOW) is None


def test_a_zombie_is_an_executor_with_stale_messages_that_still_names_the_run_it_lost():
    assert not fleet.is_zombie({"stale_reports": 0, "stale_heartbeats": 0, "left_job": {"job_id": "j"}})
    assert fleet.is_zombie({"stale_reports": 0, "stale_heartbeats": 2, "left_job": {"job_id": "j"}})
    assert not fleet.is_zombie({"stale_reports": 0, "stale_heartbeats": 2})  # it stopped that run: history
    assert fleet.stale_count({"stale_reports": 3, "stale_heartbeats": 2}) == 5
    assert fleet.stale_count({}) == 0


def test_group_counts_come_in_lifecycle_order():
    assert fleet.state_counts({"ready": 3, "joining": 1, "weird": 2, "failed": 0}) == [
        ("joining", 1), ("ready", 3), ("weird", 2)]
    assert fleet.state_counts(None) == []
    assert set(fleet.NODE_STATES) == {s.value for s in NodeState}


RUN = {"state": "running", "nodes": [
    {"node_id": "n1", "status": "passed", "tests": [
        {"test": "matmul", "status": "passed", "figures": {"tflops_float32": 2.0},
         "verdict": {"comparisons": [{"metric": "tflops_float32", "value": 2.0, "reference": 4.0,
                                      "source": "group median of 3", "ratio": 0.5, "ok": False}]}},
        {"test": "membw", "status": "passed", "figures": {"copy_gbps": 10.0}, "verdict": {}}]},
    {"node_id": "n2", "status": "running", "tests": [
        {"test": "membw", "status": "passed", "figures": {"copy_gbps": 30.0}, "verdict": {"comparisons": []}},
        {"test": "allreduce", "status": "running", "figures": {}, "verdict": {}}]},
    {"node_id": "n3", "status": "failed", "tests": [
        {"test": "membw", "status": "failed", "figures": {"copy_gbps": 20.0, "note": "x", "a_errors": 0},
         "verdict": None}]}]}


def test_figures_are_shown_against_the_verdicts_reference_else_this_runs_median():
    medians = fleet.run_medians(RUN)
    assert medians == {("matmul", "tflops_float32"): 2.0, ("membw", "copy_gbps"): 20.0}
    (judged,) = fleet.figure_rows(RUN["nodes"][0]["tests"][0], medians)
    assert judged == {"metric": "tflops_float32", "value": 2.0, "reference": 4.0, "source": "group", "peers": 3,
                      "ratio": 0.5, "ok": False, "compared": True, "decimals": 0}
    (first,) = fleet.figure_rows(RUN["nodes"][0]["tests"][1], medians)
    assert (first["reference"], first["source"], first["ratio"], first["ok"]) == (20.0, "run", 0.5, None)
    rows = fleet.figure_rows(RUN["nodes"][2]["tests"][0], medians)
    # compared figures first; a figure that is not a number is left out; one not compared has no reference
    assert [(r["metric"], r["reference"]) for r in rows] == [("copy_gbps", 20.0), ("a_errors", None)]
    assert fleet.figure_rows(RUN["nodes"][1]["tests"][1], medians) == []
    assert fleet.figure_rows({"test": "matmul", "figures": {"tflops_x": 1.0}}, {})[0]["reference"] is None


@pytest.mark.parametrize(("source", "expected"), [
    ("baseline", ("baseline", None)), ("group median of 12", ("group", 12)), ("group median of ?", ("group", None)),
    ("run median", ("run", None)), ("none", (None, None)), (None, (None, None))])
def test_the_reference_source_is_named_for_the_catalogue(source, expected):
    assert fleet.source_kind(source) == expected


@pytest.mark.parametrize(("value", "expected"), [(0.00412, 5), (0.5, 3), (12.3, 1), (700.25, 0), (4194304.0, 0),
                                                 (3.0, 0), (-0.25, 3), (1e-12, 8)])
def test_figures_keep_three_significant_digits(value, expected):
    assert fleet.significant_decimals(value) == expected


@pytest.mark.parametrize(("metric", "expected"), [("tflops_float32", True), ("busbw_gbps", True),
                                                  ("rel_error_float32", False), ("rtt_ms", False)])
def test_only_throughput_and_bandwidth_are_compared(metric, expected):
    assert fleet.compared(metric) is expected


def test_run_progress_counts_final_nodes_and_tests():
    assert fleet.run_progress(RUN) == {"nodes": 3, "nodes_done": 2, "passed": 1, "failed": 1, "tests": 5,
                                       "tests_done": 4, "done": False}
    assert fleet.run_progress({"state": "done", "nodes": []})["done"] is True


@pytest.mark.parametrize(("metric", "expected"), [
    ("tflops_bfloat16", ("tflops", "bfloat16", "tflops")), ("copy_gbps", ("membw", None, "gbps")),
    ("busbw_gbps", ("busbw", None, "gbps")), ("rtt_ms", (None, None, None))])
def test_figures_have_a_name_and_a_unit(metric, expected):
    assert fleet.metric_label(metric) == expected


def test_policy_bounds_are_the_contracts():
    bounds = fleet.policy_bounds()
    assert set(bounds) == set(GangPolicy.model_fields)
    timeout = bounds["ready_timeout_seconds"]
    assert (timeout["min"], timeout["min_exclusive"], timeout["max"], timeout["kind"]) == (0, True, 86_400, "number")
    assert bounds["backoff_limit"]["kind"] == "int" and bounds["backoff_limit"]["nullable"]
    assert bounds["backoff_limit"]["min_exclusive"] is False
    assert bounds["sequential_admission"]["kind"] == "bool"
    assert bounds["node_failure_strategy"]["choices"] == ["requeue_gang", "fail_job"]
    json.dumps(bounds)  # embedded in the page as JSON


@pytest.mark.parametrize("text", ["0", "-1", "0.5", "1", "86400", "86400.5", "1e3", "abc", "", " 7 ", "inf", "nan",
                                  "10000", "10001", "2.5"])
@pytest.mark.parametrize("name", ["ready_timeout_seconds", "backoff_max_seconds", "backoff_limit"])
def test_the_typed_check_accepts_exactly_what_the_contract_accepts(name, text):
    """fleet.policy_problem is the rule static/policy.js applies as the admin types: it must agree with the
    contract the server judges by (for values the browser can send as JSON numbers)."""
    problem = fleet.policy_problem(name, text, fleet.policy_bounds())
    try:
        value: float | str | None = None if not text.strip() else float(text)
    except ValueError:
        value = text
    base = {"backoff_base_seconds": 0.1} if name == "backoff_max_seconds" else {}
    try:
        GangPolicy.model_validate({name: value, **base})
        accepted = text.strip() not in ("inf", "nan")  # not JSON numbers: the page never sends them
    except ValidationError:
        accepted = False
    assert (problem is None) == accepted, (problem, accepted)


def test_the_typed_check_names_its_numbers():
    bounds = fleet.policy_bounds()
    assert fleet.policy_problem("ready_timeout_seconds", "0", bounds) == ("above", {"min": 0})
    assert fleet.policy_problem("backoff_limit", "-1", bounds) == ("at_least", {"min": 0})
    assert fleet.policy_problem("backoff_limit", "2.5", bounds) == ("not_integer", {})
    assert fleet.policy_problem("backoff_max_seconds", "700000", bounds) == ("at_most", {"max": 604_800})
    assert fleet.policy_problem("ready_timeout_seconds", " ", bounds) == ("required", {})
    assert fleet.backoff_problem(30, 20) == ("max_below_base", {"base": 30, "max": 20})
    assert fleet.backoff_problem(30, 30) is None and fleet.backoff_problem(None, 1) is None
    with pytest.raises(ValidationError):
        GangPolicy(backoff_base_seconds=30, backoff_max_seconds=20)


def test_numbers_go_into_fields_plainly():
    assert (fleet.plain(90.0), fleet.plain(2.5), fleet.plain(1234567), fleet.plain(0.1)) == ("90", "2.5", "1234567",
                                                                                             "0.1")


def test_policy_js_applies_the_same_messages():
    """Every message the typed check can name has its words, and the page's script uses each of them."""
    script = (Path(i18n.__file__).parent / "static" / "policy.js").read_text()
    for name in ("required", "not_integer", "above", "at_least", "at_most", "max_below_base"):
        assert f'"policy.err_{name}"' in script
        assert i18n.translate("pt-BR", f"policy.err_{name}") != f"policy.err_{name}"
    # A text that is no number in the page's locale: numparse.js's reading and the numbers.* words (not a
    # locale-blind pattern: pt-BR "1.000" is a thousand).
    assert "TetoNumbers.parse(text, P.locale)" in script and '"numbers." + read.problem' in script


def test_audit_filters_trim_and_parse_times():
    f = fleet.audit_filters({"actor": "  ana ", "job_id": "", "kind": None, "since": "2026-12-01T10:00",
                             "until": "yesterday"})
    assert f["actor"] == "ana" and f["job_id"] is None and f["kind"] is None
    assert f["since_time"] == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert f["until"] is None and "until_time" not in f and f["invalid"] == ["until"]
    aware = fleet.audit_filters({"since": "2026-12-01T10:00:00-03:00"})["since_time"]
    assert aware == datetime(2026, 12, 1, 13, 0, tzinfo=UTC)


def test_every_state_status_test_and_phase_the_pages_show_has_its_words():
    keys = set(i18n.catalogue("en"))
    wanted = ({f"nodes.state_{s.value}" for s in NodeState} | {f"nodes.test_{s.value}" for s in CheckStatus}
              | {"nodes.test_busy"} | {f"nodes.testname_{t.value}" for t in CheckTest}
              | {f"executors.phase_{p.value}" for p in Phase}
              | {f"audit.outcome_{o}" for o in ("received", "accepted", "refused", "rejected")}
              | {f"nodes.kind_{k}" for k in ("join", "recovery", "on_demand")}
              | {f"nodes.source_{k}" for k in ("baseline", "group", "run")}
              | {f"nodes.metric_{m}" for m in ("tflops", "membw", "busbw", "algbw")}
              | {f"nodes.outcome_{o}" for o in ("passed", "failed", "not_applicable", "unknown")})
    assert wanted <= keys, sorted(wanted - keys)


def test_the_operations_stylesheet_meets_wcag_aa():
    from tests.unit.test_panel_contrast import contrast

    css = (Path(i18n.__file__).parent / "static" / "ops.css").read_text()
    checked = 0
    for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        props = dict((k.strip(), v.strip()) for k, v in re.findall(r"(?:^|;)\s*([\w-]+)\s*:\s*([^;]+)",
                                                                                  body))
        if "color" in props and "background" in props:
            assert contrast(props["color"], props["background"]) >= 4.5, selector
            checked += 1
    assert checked >= 5
