"""The shared test builders (tests/support/builders.py): each default is a valid object, and overrides apply."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from libs.contracts.jobs import JobState
from libs.contracts.nodes import CheckStatus, NodeState
from libs.contracts.telemetry import RunOutcome
from services.queue.domain.facts import Job
from tests.support import builders as b

pytestmark = pytest.mark.unit

CONTRACTS = [b.spec, b.command_spec, b.submit, b.job_event, b.grant, b.heartbeat, b.registration, b.check_report,
             lambda: b.step_report(7), lambda: b.checkpoint_report(7), b.run_started, b.run_finished]


@pytest.mark.parametrize("build", CONTRACTS, ids=lambda f: f.__name__)
def test_each_contract_builder_makes_a_message_that_survives_the_wire(build):
    made = build()
    assert type(made).model_validate(made.model_dump(mode="json")) == made
    if hasattr(made, "encode"):
        assert type(made).decode(made.encode()) == made


@pytest.mark.parametrize("state", list(JobState), ids=str)
def test_a_job_in_any_state_is_consistent_with_it(state):
    job = b.job(state)
    assert job.state is state and job.lease_epoch == job.attempt_number == b.EPOCH and job.created_at == b.T0
    holds_lease = state in (JobState.RUNNING, JobState.ADMITTING)
    assert (job.lease_expires_at is not None) is holds_lease and bool(job.workers) is holds_lease
    assert job.executor_id == (b.EX if holds_lease else None)
    assert job.spec.workers == len(job.gang or (None,))  # a gang only when admitting, sized as the spec says


def test_job_overrides_apply_last_and_the_clock_moves_every_time():
    later = b.T0 + timedelta(hours=1)
    job = b.job(JobState.RUNNING, epoch=1, at=later, last_step=40, executor_id="ex-9", spec=b.spec(workers=1))
    assert (job.lease_epoch, job.last_step, job.executor_id, job.lease_expires_at) == (1, 40, "ex-9", later + b.LEASE)
    assert job.spec == b.spec(workers=1)
    assert dataclasses.asdict(b.job()) == dataclasses.asdict(Job(**dataclasses.asdict(b.job())))
    with pytest.raises(TypeError):
        b.job(no_such_field=1)


def test_contract_overrides_apply():
    assert b.spec(gpu_ceiling_seconds=60, workload={"kind": "command", "command": ["x"]}).workload.command == ["x"]
    assert b.command_spec("python", "train.py").workload.command == ["python", "train.py"]
    assert b.heartbeat("ex-2", accepting=False).model_dump(include={"executor_id", "node_id", "accepting"}) == {
        "executor_id": "ex-2", "node_id": "node-ex-2", "accepting": False}
    assert b.registration("ex-2", group="a100").node_id == "node-ex-2" and b.registration(group="a100").group == "a100"
    assert b.submit(b.spec(priority=5), org="acme").spec.priority == 5
    assert b.grant(epoch=4, rank=1, world_size=2).rank == 1
    assert b.job_event(seq=4).time == b.T0 + timedelta(seconds=4)
    assert b.check_report(CheckStatus.FAILED, error="wrong result").error == "wrong result"
    assert b.run_finished(RunOutcome.FAILED, exit_code=2).exit_code == 2


def test_node_and_fact_builders():
    assert b.node().schedulable and b.node(NodeState.CHECKING).run_id == "r1" and b.node(NodeState.READY).run_id is None
    assert not b.node(held="alert").schedulable
    assert b.granted().workers == (b.EX,) and b.granted("a", "b", epoch=9).workers == ("a", "b")
    assert b.granted().epoch == b.EPOCH + 1 and b.started().epoch == b.EPOCH
    assert (b.checkpointed(95).step, b.checkpointed(95).path) == (95, "/ckpt/step-95.pt")
    assert b.step_reported(3, total_steps=10).total_steps == 10 and b.finished().outcome is RunOutcome.SUCCEEDED


@pytest.mark.parametrize("state", list(JobState), ids=str)
def test_a_gang_job_holds_its_workers_only_while_admitting_or_running(state):
    gang = b.gang_job(state, ready=2, ended={1: "succeeded"})
    holds = state in (JobState.ADMITTING, JobState.RUNNING)
    assert gang.spec.workers == len(b.GANG) and gang.workers == (b.GANG if holds else ())
    assert [w.executor_id for w in gang.gang] == (list(b.GANG) if holds else [])
    if holds:
        assert [w.ready_at is not None for w in gang.gang] == [True, True, False]
        assert [w.ended for w in gang.gang] == [None, "succeeded", None]
    assert (gang.ready_deadline is not None) is (state is JobState.ADMITTING)
    assert (gang.next_admission_at is not None) is (state is JobState.BACKOFF)
    assert b.gang_job(workers=("a", "b"), backoff_count=2).spec.workers == 2


def test_placement_builders_make_a_snapshot_the_placement_plans():
    from services.queue.tenancy.placement import plan
    snap = b.snapshot(nodes=[b.executor_node("e1"), b.executor_node("e2", gpus=8, free=False)],
                      pending=[b.pending("a"), b.pending("b", at=1, gpus_per_worker=8)])
    assert list(snap.orgs) == [b.ORG] and snap.orgs[b.ORG].quotas is None
    made = plan(snap)
    assert [(a.job_id, a.workers) for a in made.admitted] == [("a", ("e1",))] and set(made.waiting) == {"b"}
    assert b.pending("b", at=1).created_at == b.T0 + timedelta(seconds=1) and b.pending(priority=3).priority == 3
    assert b.executor_node("e3", "/env", gpus=2).environments == frozenset({"/env"})
    quota = b.organisation("x", nominal=2, borrow=1, cohort="c").quotas[b.GROUP]
    assert (quota.nominal, quota.borrowing_limit, quota.lending_limit) == (2, 1, None)
    assert b.snapshot(b.organisation("x"), b.organisation("y")).orgs.keys() == {"x", "y"}
    assert b.running(executors=("e1", "e2")).devices == 2 and not b.running(preemptible=False).preemptible
    assert b.candidate("c", "big", at=5, devices=4).created_at == b.T0 + timedelta(seconds=5)
    assert (b.queued_job(at=60, workers=3).workers, b.queued_job().gpus_per_worker) == (3, 0)


def test_health_run_and_evaluator_builders():
    from libs.contracts.nodes import Signal
    from services.health.domain.runs import MemberStatus
    from services.health.domain.signals import Thresholds
    from services.health.evaluator import reading_of
    assert (b.member().wave, b.member().deadline) == (None, None)
    assert b.member(MemberStatus.RUNNING).deadline == b.T0 + timedelta(seconds=60)
    assert b.result("failed", "nccl", attempt=2).status is CheckStatus.FAILED and b.result().attempt == 1
    th = Thresholds(signal_timeout_seconds=60.0, stuck_after_seconds=120.0)
    assert reading_of(b.executor_reading(), "last_heartbeat", None, b.T0, th).signal is Signal.OK
    assert reading_of(b.executor_reading(heard=90.0), "last_heartbeat", None, b.T0, th).signal is Signal.NO_SIGNAL
    assert b.job_reading(state="queued", job_id="j2")["job_id"] == "j2"
