"""run.unreadable_grant: the report that fails a grant the executor cannot read, when the grant names its job."""

from __future__ import annotations

import json

from agents.executor.run import unreadable_grant
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import RunFinished, RunOutcome

SUBJECTS = Subjects("teto")
JOB = "job-" + "a" * 12


def _data(**fields) -> bytes:
    return json.dumps({"job_id": JOB, "epoch": 3, "executor_id": "ex-1", "spec": {"workload": {"kind": "?"}},
                       **fields}).encode()


def test_a_grant_naming_its_job_and_epoch_fails_that_attempt_with_the_reason():
    subject, note = unreadable_grant(_data(), "ex-1", SUBJECTS, "workload: unknown kind")
    assert subject == SUBJECTS.progress(JOB, "ex-1")
    assert isinstance(note, RunFinished)
    assert (note.job_id, note.epoch, note.executor_id, note.outcome) == (JOB, 3, "ex-1", RunOutcome.FAILED)
    assert note.error == "the executor cannot read this grant: workload: unknown kind"


def test_a_grant_without_an_executor_is_taken_as_addressed_here():
    body = json.loads(_data())
    del body["executor_id"]
    found = unreadable_grant(json.dumps(body).encode(), "ex-1", SUBJECTS, "bad")
    assert found is not None and found[1].executor_id == "ex-1"


def test_another_executors_grant_is_not_reported_here():
    assert unreadable_grant(_data(executor_id="ex-2"), "ex-1", SUBJECTS, "bad") is None


def test_the_reason_is_bounded():
    _, note = unreadable_grant(_data(), "ex-1", SUBJECTS, "x" * 20_000)
    assert len(note.error) == 8000


def test_what_names_no_job_gives_no_report():
    for data in (b"not json", b"[1, 2]", json.dumps({"epoch": 1}).encode(), json.dumps({"job_id": JOB}).encode(),
                 _data(job_id="a.b"), _data(job_id=None), _data(epoch="x")):
        assert unreadable_grant(data, "ex-1", SUBJECTS, "bad") is None, data
