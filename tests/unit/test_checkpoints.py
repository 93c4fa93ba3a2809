"""Checkpoint files: atomic writes, sidecars with checksums, and the choice of the latest valid one."""

from __future__ import annotations

import json
import os

import pytest

from agents.executor import checkpoints as ck

pytestmark = pytest.mark.unit


def test_save_writes_file_and_sidecar_with_checksum(tmp_path):
    c = ck.save_bytes(tmp_path, 120, b"weights" * 100)
    assert c.path == tmp_path / "step-00000120.pt" and c.step == 120 and c.bytes == 700
    meta = json.loads((tmp_path / "step-00000120.json").read_text())
    assert meta["step"] == 120 and meta["sha256"] == c.sha256 and meta["bytes"] == 700 and meta["created_at"]
    assert ck.validate(c.path) == (c, None)


def test_a_failed_write_leaves_neither_a_partial_file_nor_a_temp_file(tmp_path):
    def explode(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        ck.save(tmp_path, 5, explode, fmt="bytes")
    assert os.listdir(tmp_path) == []


def test_overwriting_replaces_the_whole_file(tmp_path):
    ck.save_bytes(tmp_path, 5, b"old" * 1000)
    new = ck.save_bytes(tmp_path, 5, b"new")
    assert (tmp_path / "step-00000005.pt").read_bytes() == b"new"
    assert ck.validate(new.path)[0] == new
    assert sorted(os.listdir(tmp_path)) == ["step-00000005.json", "step-00000005.pt"]


def _corrupt(path):
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:3])


def _drop_sidecar(path):
    ck.sidecar_path(path).unlink()


def _garble_sidecar(path):
    ck.sidecar_path(path).write_text("{not json")


def _unreadable(path):
    path.unlink()
    path.mkdir()  # a directory where a file should be: reading fails


@pytest.mark.parametrize(("damage", "reason"), [
    (_corrupt, "checksum mismatch"),
    (_truncate, "truncated"),
    (_drop_sidecar, "no sidecar"),
    (_garble_sidecar, "unreadable sidecar"),
    (_unreadable, "unreadable"),
], ids=["corrupt", "truncated", "missing-sidecar", "garbled-sidecar", "unreadable"])
def test_a_damaged_newest_checkpoint_is_skipped_with_its_reason(tmp_path, damage, reason):
    ck.save_bytes(tmp_path, 10, b"a" * 50)
    ck.save_bytes(tmp_path, 20, b"b" * 50)
    newest = ck.save_bytes(tmp_path, 30, b"c" * 50)
    damage(newest.path)
    best, skipped = ck.latest_valid(tmp_path)
    assert best is not None and best.step == 20
    assert [p for p, _ in skipped] == [newest.path]
    assert skipped[0][1].startswith(reason)


def test_latest_valid_wins_by_step_not_by_name_order_or_time(tmp_path):
    ck.save_bytes(tmp_path, 1000, b"x")
    ck.save_bytes(tmp_path, 999, b"y")  # written later, older step
    best, skipped = ck.latest_valid(tmp_path)
    assert best.step == 1000 and skipped == []


def test_every_checkpoint_damaged_means_start_fresh_with_all_reasons(tmp_path):
    for step in (1, 2):
        _corrupt(ck.save_bytes(tmp_path, step, b"zz").path)
    best, skipped = ck.latest_valid(tmp_path)
    assert best is None and [p.name for p, _ in skipped] == ["step-00000002.pt", "step-00000001.pt"]


def test_missing_directory_and_stray_files_are_not_checkpoints(tmp_path):
    assert ck.latest_valid(tmp_path / "nope") == (None, [])
    (tmp_path / ".step-00000009.pt.abc.tmp").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("hello")
    assert ck.latest_valid(tmp_path) == (None, [])


# -- keeping the newest ones ---------------------------------------------------------------------------------


def _found(*spec: str) -> list[tuple[int, bool, str]]:
    """'4' is a complete checkpoint of step 4, '4?' an incomplete one (no sidecar)."""
    return [(int(x.rstrip("?")), not x.endswith("?"), x) for x in spec]


@pytest.mark.parametrize(("found", "step", "keep", "gone"), [
    (("2", "4", "6", "8", "10"), 10, 3, ["4", "2"]),
    (("2", "4", "6", "8", "10"), 10, 1, ["8", "6", "4", "2"]),
    (("2", "4", "6"), 6, 3, []),  # no more than kept
    (("2", "4", "6"), 6, 5, []),
    (("2", "4", "6"), 6, 0, []),  # 0 keeps every one
    (("2", "4", "6"), 6, -1, []),
    ((), 6, 3, []),
    (("6",), 6, 1, []),  # the newest is never deleted
    # Newer than the step just completed (a damaged one a resume skipped): not touched, not counted.
    (("2", "4", "6", "8?", "10"), 6, 2, ["2"]),
    # Incomplete ones are not counted; between kept ones they stay, older than the last kept they go.
    (("2", "4?", "6", "8?", "10"), 10, 2, ["4?", "2"]),
    (("2?", "4", "6"), 6, 2, ["2?"]),
    (("2", "4?", "6?"), 6, 1, []),  # the newest complete one is 2 (the only one): it stays
    # The order given does not matter.
    (("10", "2", "8", "4", "6"), 10, 2, ["6", "4", "2"]),
])
def test_prunable_keeps_the_newest_complete_ones_at_or_before_the_step(found, step, keep, gone):
    assert ck.prunable(_found(*found), step, keep) == gone


def _write(directory, step, complete=True):
    if complete:
        return ck.save_bytes(directory, step, f"state {step}".encode()).path
    path = ck.checkpoint_path(directory, step)
    path.write_bytes(b"half")
    return path


def test_prune_deletes_each_file_and_its_sidecar_and_leaves_the_rest(tmp_path):
    for step in (1, 2, 3, 4, 5):
        _write(tmp_path, step, complete=step != 2)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".step-00000006.pt.x.tmp").write_bytes(b"a write in flight")
    assert ck.prune(tmp_path, 5, 2) == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-00000006.pt.x.tmp", "notes.txt",
                                                          "step-00000004.json", "step-00000004.pt",
                                                          "step-00000005.json", "step-00000005.pt"]
    assert ck.latest_valid(tmp_path)[0].step == 5


def test_prune_removes_a_link_and_never_what_it_points_to(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious"
    target.write_bytes(b"keep me")
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / "step-00000001.pt").symlink_to(target)
    (ckpts / "step-00000001.json").symlink_to(target)
    for step in (2, 3):
        _write(ckpts, step)
    assert ck.prune(ckpts, 3, 1) == [1, 2]
    assert target.read_bytes() == b"keep me" and sorted(p.name for p in ckpts.iterdir()) == [
        "step-00000003.json", "step-00000003.pt"]


def test_a_link_is_not_a_complete_checkpoint_to_keep(tmp_path):
    _write(tmp_path, 1)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    (tmp_path / "step-00000002.pt").symlink_to(target)
    ck.sidecar_path(tmp_path / "step-00000002.pt").write_text("{}")
    _write(tmp_path, 3)
    # Counted as complete, the link would have pushed step 1 out; it is not, so 3 and 1 are the two kept.
    assert ck.prune(tmp_path, 3, 2) == []
    assert ck.validate(tmp_path / "step-00000001.pt")[0] is not None
