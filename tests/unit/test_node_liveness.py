"""Which nodes are alive, gone, and allowed to set their group's median (services/health/domain/liveness.py).

The defect behind these: after a restart of ``teto up`` the old nodes' agents were gone, yet they stayed ready,
were handed to joining nodes as peers (connectivity: Connection refused) and their old figures made the median
every new node failed against, until the breaker held the whole group.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.nodes import NodeState
from services.health.domain.liveness import SampleRule, alive, last_heard, median_sample, silent

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
WITHIN = timedelta(seconds=60)
RULE = SampleRule(alive_within=WITHIN, max_age=timedelta(days=7), suite_version="2")


def ago(seconds: float | None) -> datetime | None:
    return None if seconds is None else T0 - timedelta(seconds=seconds)


@pytest.mark.parametrize(("registered", "beat", "expected"), [
    (None, None, None), (10, None, 10), (None, 5, 5), (10, 5, 5), (5, 10, 5)],
    ids=["never", "registered only", "beat only", "beat after registering", "registered after beating"])
def test_the_last_sign_of_life_is_the_later_of_registration_and_heartbeat(registered, beat, expected):
    assert last_heard(ago(registered), ago(beat)) == ago(expected)


@pytest.mark.parametrize(("registered", "beat", "is_alive"), [
    (None, None, False), (5, None, True), (600, 30, True), (600, 60, True), (600, 61, False), (61, None, False),
    (600, 3600, False)],
    ids=["never heard", "just registered", "beating", "at the edge", "silent past the timeout",
         "bare registration past the timeout", "beat long ago"])
def test_alive_means_heard_from_within_the_signal_timeout(registered, beat, is_alive):
    assert alive(ago(registered), ago(beat), T0, WITHIN) is is_alive


def test_a_node_never_heard_from_is_neither_alive_nor_silent():
    assert not alive(None, None, T0, WITHIN) and not silent(None, None, T0, WITHIN)


@pytest.mark.parametrize("state", list(NodeState), ids=str)
def test_only_a_ready_node_is_a_median_sample(state):
    sample = median_sample(state, ago(600), ago(1), ago(100), "2", T0, RULE)
    assert sample is (state is NodeState.READY)


@pytest.mark.parametrize(("beat", "checked", "suite", "is_sample"), [
    (1, 100, "2", True),
    (3600, 100, "2", False),  # its agent is gone (the restarted stack's old nodes)
    (1, 8 * 86400, "2", False),  # checked too long ago
    (1, None, "2", False),  # never checked
    (1, 100, "1", False),  # another suite version: another yardstick
    (1, 100, None, False),  # figures from before versions were reported, judged against a versioned report
], ids=["alive, recent, same suite", "dead", "stale figures", "never checked", "older suite", "unversioned"])
def test_a_ready_peer_is_a_sample_only_alive_checked_recently_under_the_same_suite(beat, checked, suite, is_sample):
    assert median_sample(NodeState.READY, ago(600), ago(beat), ago(checked), suite, T0, RULE) is is_sample


def test_unversioned_figures_still_compare_with_an_unversioned_report():
    """An agent from before suite versions, judged against its own kind: the old behaviour, not no reference."""
    legacy = SampleRule(WITHIN, timedelta(days=7), None)
    assert median_sample(NodeState.READY, ago(600), ago(1), ago(100), None, T0, legacy)


def test_a_pass_merges_figures_of_the_same_suite_and_drops_those_of_another():
    import json

    from services.health.store.nodes import figures_after_pass

    node = {"figures": json.dumps({"matmul": {"tflops_float32": 1.0}, "membw": {"copy_gbps": 9.0}}),
            "figures_suite": "2"}
    same = [{"test": "matmul", "f": json.dumps({"tflops_float32": 2.0}), "suite_version": "2"}]
    assert figures_after_pass(node, same) == {
        "figures": {"matmul": {"tflops_float32": 2.0}, "membw": {"copy_gbps": 9.0}}, "figures_suite": "2"}
    newer = [{"test": "matmul", "f": json.dumps({"tflops_float32": 3.0}), "suite_version": "3"}]
    assert figures_after_pass(node, newer) == {"figures": {"matmul": {"tflops_float32": 3.0}}, "figures_suite": "3"}
