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
