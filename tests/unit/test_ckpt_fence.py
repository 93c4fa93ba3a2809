"""A run resumes from the checkpoint the queue accepted, never from a file because it is newest
(agents/executor/ckpt_fence.py, DESIGN.md section 12): the rule (``choose``) over every kind of file, and the
edge (``resume_point``) on a real directory with a fenced-out run's file and an unreadable one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.executor import checkpoints
from agents.executor.ckpt_fence import Found, choose, inspect, is_accepted, resume_point
from libs.contracts.agents import AcceptedCheckpoint
from services.queue.domain.resume import resume_point as grant_resume_point

SHA_A, SHA_B = "a" * 64, "b" * 64


def found(step: int, sha: str | None = SHA_A, epoch: int | None = 3, link: bool = False) -> Found:
    return Found(step, Path(f"step-{step:08d}.pt"), sha256=sha, epoch=epoch, link=link)


ACCEPTED = AcceptedCheckpoint(step=95, sha256=SHA_A, epoch=3)


def test_the_accepted_checkpoint_is_the_resume_point_and_a_newer_file_of_a_fenced_out_run_is_fenced():
    choice = choose([found(100, SHA_B, epoch=3), found(95), found(90)], ACCEPTED)
    assert choice.resume == [Path("step-00000095.pt"), Path("step-00000090.pt")]
    assert [p for p, _ in choice.fenced] == [Path("step-00000100.pt")]
    assert "never accepted" in choice.fenced[0][1]


@pytest.mark.parametrize(("file", "accepted"), [
    (found(95, SHA_A, 3), True),
    (found(95, SHA_A.upper(), 3), True),  # a checksum is a checksum whatever its case
    (found(95, SHA_B, 3), False),  # same name, other bytes: the fenced-out run's file renamed over the accepted one
    (found(95, SHA_A, 4), False),  # same bytes claimed by another epoch's run
    (found(95, None, 3), False),  # unreadable sidecar: cannot be shown to be the accepted one
    (found(95, SHA_A, None), True),  # an older writer's sidecar without an epoch: its checksum decides
    (found(95, SHA_A, 3, link=True), False),  # a link is never a checkpoint
    (found(94, SHA_A, 3), False),
], ids=["same", "case", "other-bytes", "other-epoch", "no-sidecar", "no-epoch", "link", "other-step"])
def test_a_file_is_the_accepted_checkpoint_only_by_step_checksum_and_epoch(file, accepted):
    assert is_accepted(file, ACCEPTED) is accepted


def test_what_the_queue_left_unsaid_is_not_compared():
    legacy = AcceptedCheckpoint(step=95)  # accepted before reports carried a checksum or checkpoints an epoch
    assert is_accepted(found(95, SHA_B, 7), legacy)


def test_with_nothing_accepted_every_file_is_fenced_and_none_is_resumed_from():
    choice = choose([found(100), found(5, link=True)], None)
    assert choice.resume == []
    assert [why for _, why in choice.fenced] == ["the queue accepted no checkpoint of this job",
                                                 "a link, not a checkpoint file"]


def test_only_older_files_of_the_accepted_epoch_are_fallbacks_and_other_older_files_stay_for_retention():
    files = [found(95, SHA_B, 3), found(90, SHA_A, 2), found(85, SHA_A, 3), found(80, SHA_A, 3, link=True)]
    choice = choose(files, ACCEPTED)
    assert choice.resume == [Path("step-00000085.pt")]  # the accepted file is not there: step 95 is another's
    assert [p for p, _ in choice.fenced] == [Path("step-00000095.pt")]  # epoch 2's step 90 is left alone


def test_the_grant_carries_the_stored_accepted_checkpoint_with_its_epoch():
    stored = {"step": 95, "path": "/x", "sha256": SHA_A, "bytes": 3, "at": "2026-01-01T00:00:00+00:00", "epoch": 3}
    assert grant_resume_point(stored) == ACCEPTED
    assert grant_resume_point({"step": 95, "sha256": None}) == AcceptedCheckpoint(step=95)
    assert grant_resume_point(None) is None and grant_resume_point({}) is None
    assert grant_resume_point({"step": -1}) is None  # nothing it can name: from scratch, never a guess


def test_a_run_resumes_from_the_accepted_file_the_fenced_out_runs_newer_file_is_deleted(tmp_path):
    ckpt = checkpoints.checkpoint_path(tmp_path, 95)
    checkpoints.write_atomic(ckpt, lambda f: f.write(b"accepted"))
    good = checkpoints.write_sidecar(ckpt, 95, epoch=3)
    late = checkpoints.checkpoint_path(tmp_path, 100)
    checkpoints.write_atomic(late, lambda f: f.write(b"written after the lease was gone"))
    checkpoints.write_sidecar(late, 100, epoch=3)
    got, skipped = resume_point(tmp_path, AcceptedCheckpoint(step=95, sha256=good.sha256, epoch=3))
    assert got is not None and got.path == ckpt and got.step == 95
    assert [p for p, _ in skipped] == [late]
    assert not late.exists() and not checkpoints.sidecar_path(late).exists()


def test_a_file_renamed_over_the_accepted_one_is_not_resumed_from(tmp_path):
    ckpt = checkpoints.checkpoint_path(tmp_path, 95)
    checkpoints.write_atomic(ckpt, lambda f: f.write(b"accepted"))
    sha = checkpoints.write_sidecar(ckpt, 95, epoch=4).sha256
    checkpoints.write_atomic(ckpt, lambda f: f.write(b"the fenced-out run's"))  # epoch 3, renamed last
    checkpoints.write_sidecar(ckpt, 95, epoch=3)
    got, skipped = resume_point(tmp_path, AcceptedCheckpoint(step=95, sha256=sha, epoch=4))
    assert got is None and [p for p, _ in skipped] == [ckpt]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: the case is an agent that cannot")
def test_an_unreadable_file_is_a_reason_never_an_exception(tmp_path):
    ckpt = checkpoints.checkpoint_path(tmp_path, 100)
    checkpoints.write_atomic(ckpt, lambda f: f.write(b"another run's"))
    checkpoints.write_sidecar(ckpt, 100, epoch=3)
    for p in (ckpt, checkpoints.sidecar_path(ckpt)):
        p.chmod(0)
    assert inspect(100, ckpt) == Found(100, ckpt)  # its sidecar cannot be read: says nothing
    got, skipped = resume_point(tmp_path, None)
    assert got is None and [p for p, _ in skipped] == [ckpt]  # fenced, deleted where the directory allows


def test_a_sidecar_that_cannot_be_read_even_by_root_is_a_reason_never_an_exception(tmp_path):
    ckpt = checkpoints.checkpoint_path(tmp_path, 100)
    checkpoints.write_atomic(ckpt, lambda f: f.write(b"another run's"))
    checkpoints.sidecar_path(ckpt).mkdir()  # reading it fails for anyone (EISDIR), as an unreadable file does
    assert inspect(100, ckpt) == Found(100, ckpt)
    got, skipped = resume_point(tmp_path, AcceptedCheckpoint(step=100, sha256=SHA_A, epoch=3))
    assert got is None and [p for p, _ in skipped] == [ckpt]


def test_a_sidecar_records_the_epoch_of_the_run_that_wrote_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TETO_EPOCH", "7")
    ckpt = checkpoints.save_bytes(tmp_path, 5, b"w")
    assert inspect(5, ckpt.path).epoch == 7
    monkeypatch.delenv("TETO_EPOCH")
    ckpt = checkpoints.save_bytes(tmp_path, 6, b"w")
    assert inspect(6, ckpt.path).epoch is None


def test_a_rank_that_does_not_write_the_directory_skips_what_was_never_accepted_but_deletes_nothing(tmp_path):
    late = checkpoints.checkpoint_path(tmp_path, 100)
    checkpoints.write_atomic(late, lambda f: f.write(b"never accepted"))
    checkpoints.write_sidecar(late, 100, epoch=3)
    got, skipped = resume_point(tmp_path, ACCEPTED, clean=False)
    assert got is None and [p for p, _ in skipped] == [late] and late.exists()


def test_under_teto_a_runs_retention_stops_at_the_last_checkpoint_whose_report_the_bus_took(tmp_path, monkeypatch):
    from agents.executor import ckpt_fence, sdk

    for step in (10, 20, 30, 40):
        checkpoints.save_bytes(tmp_path, step, b"w")
    confirmed = tmp_path / "epoch-3.confirmed"
    monkeypatch.setenv("TETO_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "1")
    monkeypatch.setenv("TETO_CHECKPOINT_CONFIRMED", str(confirmed))
    names = lambda: sorted(p.name for p in tmp_path.glob("*.pt"))  # noqa: E731
    sdk._prune(40)  # nothing confirmed yet (its agent frozen, its bus cut): nothing deleted
    assert names() == [f"step-{s:08d}.pt" for s in (10, 20, 30, 40)]
    ckpt_fence.confirm(confirmed, 20)  # the bus took the report of step 20: the accepted one, at most
    sdk._prune(40)
    assert names() == [f"step-{s:08d}.pt" for s in (20, 30, 40)]
    ckpt_fence.retain(tmp_path, 1, 40)  # the agent, once step 40's report is taken
    assert names() == ["step-00000040.pt"]
