"""Directory checkpoints (issue 27): the manifest's pure rules, sealing and verification, and the same candidates,
resume choice and retention rules as file checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.executor import checkpoints as ck
from agents.executor import ckpt_dir as cd
from agents.executor import ckpt_fence, ckpt_quota
from libs.contracts.agents import AcceptedCheckpoint

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SHA = "a" * 64


def _hf(root: Path, step: int, payload: bytes = b"w" * 100) -> Path:
    """A Hugging Face-like checkpoint directory: weights, optimizer, a nested folder, trainer state."""
    d = root / f"checkpoint-{step}"
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "adapter_model.safetensors").write_bytes(payload)
    (d / "optimizer.pt").write_bytes(b"o" * 40)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


# -- pure rules -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "step"), [
    ("step-00000120.pt", 120), ("checkpoint-120", 120), ("step-7", 7), ("epoch=0-step=120.ckpt", 120),
    ("epoch=3-step=9", 9), ("step=4.ckpt", 4),
    ("step-00000120.json", None), ("checkpoint-120.json", None), ("last.ckpt", None), (".checkpoint-1", None),
    ("checkpoint-", None), ("runs", None), ("step-12.pt", None), (".step-00000001.pt.x.tmp", None),
], ids=str)
def test_step_of_a_name(name, step):
    assert cd.step_of(name) == step


@pytest.mark.parametrize("rel", ["/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "", "a\\b", "a\0b",
                                 "teto-manifest.json", "a/"], ids=repr)
def test_unsafe_paths_are_named(rel):
    assert cd.unsafe(rel) is not None


@pytest.mark.parametrize("rel", ["a", "a/b.safetensors", ".hidden", "x/teto-manifest.json"], ids=repr)
def test_paths_inside_are_safe(rel):
    assert cd.unsafe(rel) is None


def test_build_then_parse_round_trips_sorted():
    files = [cd.Entry("b", 2, SHA), cd.Entry("a/c", 3, "b" * 64)]
    m = cd.parse(cd.build(12, files, epoch=4, created_at=T0.isoformat()))
    assert m == cd.Manifest(12, (cd.Entry("a/c", 3, "b" * 64), cd.Entry("b", 2, SHA)), 4, T0.isoformat())
    assert m.bytes == 5
    assert cd.parse(cd.build(1, [], epoch=None, created_at="")).epoch is None


def _doc(**over) -> bytes:
    body = {"format": cd.FORMAT, "step": 3, "files": [{"path": "a", "bytes": 1, "sha256": SHA}], **over}
    return json.dumps(body).encode()


@pytest.mark.parametrize(("data", "why"), [
    (b"{nope", "unreadable manifest"),
    (_doc(format="other/1"), "not a teto-manifest/1"),
    (_doc(step=-1), "step, epoch or files"),
    (_doc(step=True), "step, epoch or files"),
    (_doc(epoch="1"), "step, epoch or files"),
    (_doc(files={}), "step, epoch or files"),
    (_doc(files=[{"path": "a", "bytes": 1}]), "file entry"),
    (_doc(files=[{"path": "a", "bytes": 1, "sha256": "XYZ"}]), "file entry"),
    (_doc(files=[{"path": "../a", "bytes": 1, "sha256": SHA}]), "leaves the checkpoint"),
    (_doc(files=[{"path": "/a", "bytes": 1, "sha256": SHA}]), "not a relative path"),
    (_doc(files=[{"path": "a", "bytes": 1, "sha256": SHA}] * 2), "listed twice"),
], ids=["json", "format", "negative-step", "bool-step", "string-epoch", "files-object", "no-sha", "bad-sha",
        "escape", "absolute", "twice"])
def test_a_malformed_manifest_says_why(data, why):
    with pytest.raises(ValueError, match=why):
        cd.parse(data)


MANIFEST = cd.Manifest(5, (cd.Entry("a", 1, SHA), cd.Entry("d/b", 2, SHA)))


@pytest.mark.parametrize(("found", "file", "why"), [
    ([("a", 1), ("d/b", 2)], None, None),
    ([("a", 1)], "d/b", "missing"),
    ([("a", 1), ("d/b", 1)], "d/b", "truncated or altered: 1 bytes, the manifest says 2"),
    ([("a", 1), ("d/b", 2), ("new", 0)], "new", "not in the manifest"),
], ids=["same", "missing", "size", "extra"])
def test_compare_names_the_file(found, file, why):
    wrong = cd.compare(MANIFEST, found)
    if file is None:
        assert wrong is None
    else:
        assert wrong.file == file and why in wrong.why and str(wrong).startswith(f"{file}: ")


# -- sealing and verification ---------------------------------------------------------------------------------

def test_seal_writes_every_file_then_verify_accepts_it(tmp_path):
    d = _hf(tmp_path, 120)
    sealed = cd.seal(d, 120, epoch=3, now=T0)
    data = (d / cd.MANIFEST).read_bytes()
    assert sealed.sha256 == hashlib.sha256(data).hexdigest() and sealed.step == 120
    assert [e.path for e in sealed.manifest.files] == ["adapter/adapter_model.safetensors", "optimizer.pt",
                                                       "trainer_state.json"]
    assert sealed.manifest.files[1].sha256 == hashlib.sha256(b"o" * 40).hexdigest()
    assert sealed.bytes == sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and p.name != cd.MANIFEST)
    assert json.loads(data)["epoch"] == 3
    again, reason = cd.verify(d)
    assert reason is None and again == sealed
    ckpt, reason = ck.validate(d)
    assert reason is None and (ckpt.kind, ckpt.step, ckpt.sha256, ckpt.bytes, ckpt.files) == (
        "directory", 120, sealed.sha256, sealed.bytes, 3)
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]  # the manifest's temp file renamed


def test_the_epoch_comes_from_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TETO_EPOCH", "7")
    assert cd.seal(_hf(tmp_path, 1), 1).manifest.epoch == 7


def _corrupt(d):
    p = d / "adapter" / "adapter_model.safetensors"
    p.write_bytes(b"X" + p.read_bytes()[1:])


def _truncate(d):
    p = d / "optimizer.pt"
    p.write_bytes(p.read_bytes()[:5])


def _delete(d):
    (d / "optimizer.pt").unlink()


def _extra(d):
    (d / "rng_state.pth").write_bytes(b"r")


def _no_manifest(d):
    (d / cd.MANIFEST).unlink()


def _garble(d):
    (d / cd.MANIFEST).write_text("{")


def _link_inside(d):
    (d / "optimizer.pt").unlink()
    (d / "optimizer.pt").symlink_to("/etc/hostname")


def _link_manifest(d):
    target = d.parent / "elsewhere.json"
    (d / cd.MANIFEST).rename(target)
    (d / cd.MANIFEST).symlink_to(target)


def _fifo(d):
    os.mkfifo(d / "pipe")


@pytest.mark.parametrize(("damage", "reason"), [
    (_corrupt, "adapter/adapter_model.safetensors: checksum mismatch"),
    (_truncate, "optimizer.pt: truncated or altered: 5 bytes, the manifest says 40"),
    (_delete, "optimizer.pt: missing"),
    (_extra, "rng_state.pth: not in the manifest"),
    (_no_manifest, "no manifest (teto-manifest.json): the checkpoint was never completed"),
    (_garble, "teto-manifest.json: unreadable manifest"),
    (_link_inside, "optimizer.pt: a link"),
    (_link_manifest, "teto-manifest.json: unreadable"),
    (_fifo, "pipe: not a regular file"),
], ids=["corrupt", "truncated", "deleted", "extra", "no-manifest", "garbled", "link-inside", "link-manifest",
        "fifo"])
def test_a_damaged_directory_is_refused_naming_the_file(tmp_path, damage, reason):
    d = _hf(tmp_path, 10)
    cd.seal(d, 10)
    damage(d)
    sealed, why = cd.verify(d)
    assert sealed is None and why.startswith(reason), why


def test_a_link_to_a_directory_is_never_a_checkpoint(tmp_path):
    d = _hf(tmp_path / "real", 10)
    cd.seal(d, 10)
    (tmp_path / "checkpoint-10").symlink_to(d)
    ckpt, why = ck.validate(tmp_path / "checkpoint-10")
    assert ckpt is None and "link" in why


def test_seal_refuses_a_link_inside_and_writes_no_manifest(tmp_path):
    d = _hf(tmp_path, 10)
    (d / "sub").mkdir()
    (d / "sub" / "escape").symlink_to("/etc/hostname")
    with pytest.raises(cd.Invalid) as exc:
        cd.seal(d, 10)
    assert exc.value.file == "sub/escape" and "link" in exc.value.why
    assert not (d / cd.MANIFEST).exists()


def test_seal_over_the_quota_writes_no_manifest(tmp_path):
    d = _hf(tmp_path, 10)
    with pytest.raises(ckpt_quota.CheckpointRefused) as exc:
        cd.seal(d, 10, quota=50)
    assert exc.value.size > 50 and not (d / cd.MANIFEST).exists()


def test_verification_is_bounded_by_the_quota_and_stops(tmp_path):
    d = _hf(tmp_path, 10, payload=b"w" * (3 << 20))
    cd.seal(d, 10)
    sealed, why = cd.verify(d, quota=1000)
    assert sealed is None and why.startswith("over the checkpoint quota: the checkpoint claims")
    with pytest.raises(ckpt_quota.VerificationStopped):
        cd.verify(d, stopped=lambda: True)


def test_measured_size_and_remove(tmp_path):
    d = _hf(tmp_path, 10)
    assert cd.measured_size(d) == 100 + 40 + len(json.dumps({"global_step": 10}))
    cd.seal(d, 10)
    cd.remove(d)
    assert not d.exists()
    link = tmp_path / "checkpoint-11"
    target = _hf(tmp_path / "kept", 11)
    cd.seal(target, 11)
    link.symlink_to(target)
    cd.remove(link)
    assert not link.exists() and (target / cd.MANIFEST).is_file()  # the link removed, never followed
    plain = tmp_path / "checkpoint-12"
    plain.write_bytes(b"a file in a directory's place")
    cd.remove(plain)
    cd.remove(tmp_path / "checkpoint-13")  # already gone: nothing to do
    assert not plain.exists()


# -- the same rules as file checkpoints -----------------------------------------------------------------------

def test_candidates_mix_files_and_directories_newest_first(tmp_path):
    ck.save_bytes(tmp_path, 5, b"a")
    _hf(tmp_path, 10)
    (tmp_path / "epoch=0-step=15.ckpt").write_bytes(b"l")
    (tmp_path / "runs").mkdir()
    assert [(s, p.name) for s, p in ck.candidates(tmp_path)] == [
        (15, "epoch=0-step=15.ckpt"), (10, "checkpoint-10"), (5, "step-00000005.pt")]


def test_latest_valid_skips_a_corrupt_newest_directory_for_the_previous(tmp_path):
    for step in (10, 20):
        cd.seal(_hf(tmp_path, step), step)
    _corrupt(tmp_path / "checkpoint-20")
    best, skipped = ck.latest_valid(tmp_path)
    assert best.step == 10 and best.kind == "directory"
    assert skipped == [(tmp_path / "checkpoint-20",
                        skipped[0][1])] and skipped[0][1].startswith("adapter/adapter_model.safetensors: checksum")


def test_prune_deletes_whole_directories_never_the_newest_complete(tmp_path):
    for step in (10, 20, 30):
        cd.seal(_hf(tmp_path, step), step)
    _hf(tmp_path, 40)  # being written: no manifest yet
    assert ck.prune(tmp_path, 30, keep=1) == [10, 20]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-30", "checkpoint-40"]


def test_prune_keeps_an_incomplete_directory_between_complete_ones(tmp_path):
    cd.seal(_hf(tmp_path, 10), 10)
    _hf(tmp_path, 20)
    cd.seal(_hf(tmp_path, 30), 30)
    assert ck.prune(tmp_path, 30, keep=2) == []
    assert ck.prune(tmp_path, 30, keep=1) == [10, 20]


def test_resume_takes_the_accepted_directory_and_cleans_the_unaccepted(tmp_path):
    a = cd.seal(_hf(tmp_path, 10), 10, epoch=2)
    cd.seal(_hf(tmp_path, 20), 20, epoch=2)
    cd.seal(_hf(tmp_path, 30), 30, epoch=3)  # a fenced-out run's, never accepted
    accepted = AcceptedCheckpoint(step=20, sha256=hashlib.sha256((tmp_path / "checkpoint-20" / cd.MANIFEST)
                                                                  .read_bytes()).hexdigest(), epoch=2)
    _corrupt(tmp_path / "checkpoint-20")
    ckpt, skipped = ckpt_fence.resume_point(tmp_path, accepted)
    assert ckpt.path == tmp_path / "checkpoint-10" and ckpt.sha256 == a.sha256 and ckpt.kind == "directory"
    assert [p.name for p, _ in skipped] == ["checkpoint-30", "checkpoint-20"]
    assert "newer than the last checkpoint the queue accepted" in skipped[0][1]
    assert skipped[1][1].startswith("adapter/adapter_model.safetensors: checksum mismatch")
    assert not (tmp_path / "checkpoint-30").exists()  # never accepted: deleted whole


def test_inspect_reads_the_manifest_not_a_linked_one(tmp_path):
    d = _hf(tmp_path, 10)
    sealed = cd.seal(d, 10, epoch=4)
    assert ckpt_fence.inspect(10, d) == ckpt_fence.Found(10, d, sha256=sealed.sha256, epoch=4)
    _link_manifest(d)
    assert ckpt_fence.inspect(10, d) == ckpt_fence.Found(10, d)


# -- the agent's side of a report -----------------------------------------------------------------------------

def _agent_reports():
    import types

    from agents.executor.reports import Reports
    from libs.contracts.telemetry import Phase

    sent: list[tuple[type, dict]] = []
    grant = types.SimpleNamespace(rank=0, job_id="j1", world_size=1, checkpoint_quota_bytes=200,
                                  spec=types.SimpleNamespace(checkpoint_quota_bytes=1000))
    run = types.SimpleNamespace(grant=grant, phase=Phase.TRAINING, step=None, pending_step=None,
                                last_step_sent_at=None, step_seconds_sum=0.0, step_seconds_n=0, confirmed_file=None)
    return Reports(lambda run, cls, **fields: sent.append((cls, fields)), 60.0), run, sent


def test_the_agent_reports_a_directory_with_its_kind_and_judges_its_whole_size(tmp_path):
    from libs.contracts.telemetry import CheckpointKind, CheckpointReport, CheckpointSkipped

    reports, run, sent = _agent_reports()
    small = cd.seal(_hf(tmp_path, 1), 1)
    big = cd.seal(_hf(tmp_path, 2, payload=b"w" * 300), 2)
    for s in (small, big):
        reports.on_report(run, {"type": "checkpoint", "step": s.step, "path": str(s.path), "sha256": s.sha256,
                                "bytes": 1, "kind": "directory", "files": 3})  # the second's report lies
    reports.on_report(run, {"type": "checkpoint_invalid", "step": 3, "path": "/c/checkpoint-3",
                            "reason": "escape: a link: a checkpoint holds regular files only"})
    assert [cls for cls, _ in sent] == [CheckpointReport, CheckpointSkipped, CheckpointSkipped]
    assert sent[0][1]["checkpoint_kind"] is CheckpointKind.DIRECTORY and sent[0][1]["files"] == 3
    assert sent[1][1]["reason"].startswith(f"over the checkpoint quota: the checkpoint has {big.bytes + 0} bytes")
    assert sent[2][1] == {"path": "/c/checkpoint-3", "reason": "escape: a link: a checkpoint holds regular files only"}


def test_a_training_library_s_own_unreported_checkpoints_are_skipped_never_deleted(tmp_path):
    """A job that keeps its own checkpoints (a Trainer without Teto's callback) loses nothing on a requeue; what Teto
    sealed and the queue never accepted is deleted as before."""
    own_dir = _hf(tmp_path, 10)  # no manifest: the script's own
    own_file = tmp_path / "epoch=0-step=15.ckpt"
    own_file.write_bytes(b"lightning")
    cd.seal(_hf(tmp_path, 20), 20, epoch=3)  # sealed by a fenced-out run
    ck.save_bytes(tmp_path, 25, b"sdk", fmt="bytes")
    ckpt, skipped = ckpt_fence.resume_point(tmp_path, None)
    assert ckpt is None and [p.name for p, _ in skipped] == ["step-00000025.pt", "checkpoint-20",
                                                             "epoch=0-step=15.ckpt", "checkpoint-10"]
    assert own_dir.is_dir() and own_file.is_file()
    assert not (tmp_path / "checkpoint-20").exists() and not (tmp_path / "step-00000025.pt").exists()
    assert ckpt_fence.sealed_by_teto(tmp_path / "step-00000099.pt")  # the SDK's name, complete or not
