"""The fault matrix's own rules, without a stack: the hostile generator and the invariant checks' pure parts.

A matrix that generated nothing hostile, or an invariant that could not fail, would pass by default; these
show each one can see what it is there to see.
"""

from __future__ import annotations

import json

import pytest

from libs.contracts.registry import CATALOGUE
from services.budget.domain.ledger import gpu_seconds
from tests.faults.invariants import IN_FLIGHT_SLACK, ConsumerState, run_overlaps, subject_matches, usage_sent
from tests.support.hostile import hostile_messages

pytestmark = pytest.mark.faults

MAX_PAYLOAD = 1 << 20
MSGS = hostile_messages("teto", executor_ids=["ex-a", "ex-b"], max_payload=MAX_PAYLOAD)


def test_the_burst_is_bounded_and_fits_the_bus():
    assert 200 <= len(MSGS) <= 500
    assert all(len(m.data) < MAX_PAYLOAD for m in MSGS)
    assert max(len(m.data) for m in MSGS) > MAX_PAYLOAD - 4096  # near the limit, not far below it


def test_every_subject_of_the_catalogue_gets_hostile_messages():
    wanted = {e.subject.split("<")[0].rstrip(".") for e in CATALOGUE if not e.subject.startswith("(")}
    hit = {w for w in wanted if any(m.subject.startswith(w) for m in MSGS)}
    assert hit == wanted
    # Request/reply subjects too (the renewal under whichever executor the catalogue's order gives it).
    assert {m.subject.removesuffix(".ex-a").removesuffix(".ex-b") for m in MSGS if m.core} == {
        "teto.rpc.lease.renew", "teto.rpc.budget.status", "teto.rpc.budget.orgs", "teto.rpc.audit.verify",
        "teto.rpc.status"}


@pytest.mark.parametrize("kind", ["empty", "not JSON", "JSON array", "wrong schema", "missing", "wrong type",
                                  "int 2**63", "int 2**31", "inf", "NUL in string", "dot in id",
                                  "near max payload"])
def test_every_kind_of_damage_is_sent(kind):
    assert any(m.kind.startswith(kind) for m in MSGS), kind


def test_infinity_goes_out_as_a_json_number_that_parses_as_infinity():
    (body, *_) = [json.loads(m.data) for m in MSGS if m.kind.startswith("inf in")]
    assert float("inf") in body.values()


@pytest.mark.parametrize("damage", ["empty", "not JSON", "JSON array", "wrong schema", "missing"])
def test_structural_damage_is_refused_by_the_contracts_themselves(damage):
    # These never depend on a bound the contracts may lack: if one decoded, the generator would be sending a
    # valid (forged) message instead of a broken one.
    from libs.contracts.envelope import ContractError

    by_subject = {}
    for e in CATALOGUE:
        by_subject.setdefault(e.subject.split("<")[0].rstrip("."), []).append(e.model)
    checked = 0
    for m in (m for m in MSGS if m.kind.startswith(damage)):
        models = next(v for k, v in sorted(by_subject.items(), key=lambda kv: -len(kv[0]))
                      if m.subject.startswith(k))
        for model in models:
            with pytest.raises((ContractError, ValueError)):
                model.decode(m.data)
        checked += 1
    assert checked


def _run(event: str, t: float, epoch: int, executor: str = "ex-a") -> dict:
    return {"event": event, "t": t, "pid": 1, "epoch": epoch, "executor": executor}


def test_runs_one_after_another_are_no_overlap():
    runs = [_run("start", 1, 1), _run("checkpoint", 2, 1), _run("start", 3, 2, "ex-b"), _run("end", 4, 2, "ex-b")]
    assert run_overlaps(runs) == []


@pytest.mark.parametrize("runs, found", [
    ([_run("start", 1, 1), _run("overlap", 2, 2, "ex-b")], "overlap"),
    ([_run("start", 1, 1), _run("checkpoint", 3, 1), _run("start", 2, 2, "ex-b")], "still wrote"),
    ([_run("start", 1, 1), _run("start", 2, 1, "ex-b")], "ran on"),
], ids=["lock held", "old epoch wrote late", "one epoch two executors"])
def test_a_job_in_two_places_is_seen(runs, found):
    assert any(found in p for p in run_overlaps(runs))


def test_usage_sent_counts_each_sample_once_and_only_for_the_jobs_asked():
    sample = {"job_id": "j1", "epoch": 1, "seq": 1, "devices": 2, "wall_seconds": 1.5}
    hb = {"schema": "teto.hb/1", "executor_id": "ex-a", "usage": sample}
    other = {"schema": "teto.hb/1", "executor_id": "ex-a", "usage": {**sample, "job_id": "j2"}}
    bodies = [("teto.hb.ex-a", hb), ("teto.hb.ex-a", hb), ("teto.hb.ex-a", other), ("teto.hb.ex-a", None)]
    assert usage_sent(bodies, {"j1"}) == {"j1": gpu_seconds(2, 1.5)}


def test_a_consumer_settles_only_without_redeliveries_and_without_a_backlog():
    assert ConsumerState("S", "d", 0, 1, 0).settled
    assert not ConsumerState("S", "d", 0, 1, 1).settled
    assert not ConsumerState("S", "d", IN_FLIGHT_SLACK, 1, 0).settled


def test_a_heartbeats_usage_sample_is_broken_inside_too():
    # The ledger's columns (seq, epoch: int4; wall_seconds: float8) are only reached through the nested sample.
    usage = [json.loads(m.data)["usage"] for m in MSGS if m.subject.startswith("teto.hb.") and ".*" in m.kind
             and m.kind.startswith(("int 2**63", "inf"))]
    assert any(u["seq"] == 2**63 for u in usage)
    assert any(u["wall_seconds"] == float("inf") for u in usage)


@pytest.mark.parametrize("subject, pattern, matches", [
    ("teto.cmd.submit", "teto.cmd.submit", True), ("teto.cmd.submit", "teto.cmd.*", True),
    ("teto.job.j1.leased", "teto.job.>", True), ("teto.job", "teto.job.>", False),
    ("teto.cmd.run_health_check", "teto.cmd.set_policy", False), ("teto.hb.a.b", "teto.hb.*", False),
])
def test_subject_matching_follows_nats_wildcards(subject, pattern, matches):
    assert subject_matches(subject, pattern) is matches
