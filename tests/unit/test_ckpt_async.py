"""Background checkpoints: the snapshot, one write in flight, reports only after the rename, and the SDK's
``save_checkpoint(..., background=True)`` / ``wait_checkpoints()``."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import pytest
import torch

from agents.executor import checkpoints as ck
from agents.executor import ckpt_async, sdk, sdk_link

pytestmark = pytest.mark.unit


# -- snapshot ------------------------------------------------------------------------------------------------


def test_a_snapshot_does_not_change_when_the_training_state_does():
    w = torch.ones(4)
    state = OrderedDict(w=w, nested={"m": [torch.zeros(2), 3]}, name="x")
    snap = ckpt_async.snapshot(state)
    w.add_(1)
    state["nested"]["m"][0].add_(5)
    state["nested"]["m"][1] = 9
    assert isinstance(snap, OrderedDict)
    assert torch.equal(snap["w"], torch.ones(4)) and torch.equal(snap["nested"]["m"][0], torch.zeros(2))
    assert snap["nested"]["m"][1] == 3 and snap["name"] == "x"


def test_a_snapshot_reuses_the_previous_buffers_when_shapes_match():
    first = ckpt_async.snapshot({"w": torch.ones(3), "b": torch.ones(2)})
    old_w, old_b = first["w"], first["b"]
    second = ckpt_async.snapshot({"w": torch.full((3,), 7.0), "b": torch.ones(5)}, reuse=first)
    assert second["w"] is old_w and torch.equal(old_w, torch.full((3,), 7.0))  # copied into the old buffer
    assert second["b"] is not old_b and second["b"].shape == (5,)  # a new shape gets a new buffer


def test_tied_weights_stay_one_tensor_and_bytes_are_copied():
    w = torch.randn(4, 4)
    snap = ckpt_async.snapshot({"emb": w, "head": w})
    assert snap["emb"] is snap["head"] and snap["emb"].data_ptr() != w.data_ptr()
    data = bytearray(b"abc")
    copied = ckpt_async.snapshot(data)
    data[0] = ord("z")
    assert copied == b"abc"


# -- the writer ----------------------------------------------------------------------------------------------


def _gate(monkeypatch):
    """Make each payload write wait for the test; record how many writes run at once."""
    gate, seen = threading.Semaphore(0), {"now": 0, "max": 0}
    real = ckpt_async.write_payload

    def slow(f, payload):
        seen["now"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        gate.acquire(timeout=10)
        real(f, payload)
        seen["now"] -= 1

    monkeypatch.setattr(ckpt_async, "write_payload", slow)
    return gate, seen


def test_one_write_in_flight_and_a_new_save_waits_for_it(tmp_path, monkeypatch):
    gate, seen = _gate(monkeypatch)
    writer, done = ckpt_async.BackgroundWriter(), []
    writer.submit(tmp_path, 1, b"one", fmt="bytes", on_done=done.append)
    second = threading.Thread(target=writer.submit,
                              args=(tmp_path, 2, b"two"), kwargs={"fmt": "bytes", "on_done": done.append})
    second.start()
    time.sleep(0.2)
    assert second.is_alive() and writer.busy and done == []  # blocked behind the first write
    gate.release()
    second.join(5)
    gate.release()
    assert writer.wait(5)
    assert [c.step for c in done] == [1, 2] and seen["max"] == 1
    assert all(ck.validate(c.path)[0] == c for c in done)


def test_the_report_comes_only_after_the_checkpoint_is_complete(tmp_path):
    seen = []

    def on_done(c):
        seen.append(ck.validate(c.path))

    writer = ckpt_async.BackgroundWriter()
    writer.submit(tmp_path, 3, {"w": torch.ones(3)}, fmt="torch", on_done=on_done)
    writer.wait(10)
    (valid, reason), = seen
    assert reason is None and valid.step == 3 and valid.format == "torch"
    assert torch.equal(torch.load(valid.path, weights_only=True)["w"], torch.ones(3))


def test_a_failed_write_is_raised_at_the_next_wait_and_reports_nothing(tmp_path, monkeypatch):
    def boom(f, payload):
        f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_async, "write_payload", boom)
    writer, done = ckpt_async.BackgroundWriter(), []
    writer.submit(tmp_path, 4, b"x", fmt="bytes", on_done=done.append)
    with pytest.raises(RuntimeError, match="disk full"):
        writer.wait(5)
    assert done == [] and list(tmp_path.iterdir()) == []
    assert writer.wait(5)  # raised once


# -- the SDK -------------------------------------------------------------------------------------------------


@pytest.fixture
def sdk_env(tmp_path, monkeypatch):
    for name in ("TETO_JOB_ID", "TETO_RANK", "TETO_REPORT_FD", "TETO_STOP_FILE", "TETO_CHECKPOINTS_KEPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TETO_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setattr(sdk_link, "writer", ckpt_async.BackgroundWriter())
    monkeypatch.setitem(sdk_link.state, "atexit", True)  # no exit hook registered for the test process
    sent = []
    monkeypatch.setattr(sdk_link, "send", sent.append)
    yield sent
    sdk_link.stop["set"] = False


def test_a_background_save_reports_after_the_write_and_keeps_the_saved_state(sdk_env, tmp_path, monkeypatch):
    gate, _ = _gate(monkeypatch)
    w = torch.zeros(3)
    path = sdk.save_checkpoint({"w": w}, 7, background=True)
    w.add_(1)  # training goes on while the write is held back
    assert path == tmp_path / "step-00000007.pt" and not path.exists()
    assert [m for m in sdk_env if m["type"] == "checkpoint"] == []
    gate.release()
    sdk.wait_checkpoints()
    (report,) = [m for m in sdk_env if m["type"] == "checkpoint"]
    assert report["step"] == 7 and report["sha256"] == ck.validate(path)[0].sha256
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.zeros(3))


def test_a_synchronous_save_waits_for_the_background_one(sdk_env, monkeypatch):
    gate, _ = _gate(monkeypatch)
    sdk.save_checkpoint(b"a", 1, background=True)
    threading.Timer(0.3, gate.release).start()  # the background write is held back 0.3 s
    sdk.save_checkpoint(b"b", 2)
    assert [m["step"] for m in sdk_env if m["type"] == "checkpoint"] == [1, 2]


def test_after_a_stop_request_saves_are_synchronous(sdk_env, tmp_path):
    sdk_link.stop["set"] = True
    sdk.save_checkpoint({"w": torch.ones(2)}, 9, background=True)
    assert not sdk_link.writer.busy and ck.validate(tmp_path / "step-00000009.pt")[0] is not None
    assert [m["step"] for m in sdk_env if m["type"] == "checkpoint"] == [9]


# -- how many are kept ---------------------------------------------------------------------------------------


def _steps(directory) -> list[int]:
    return [step for step, _ in reversed(ck.candidates(directory))]


def test_only_the_newest_checkpoints_kept_remain_after_synchronous_and_background_saves(sdk_env, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "2")
    for step in (2, 4, 6):
        sdk.save_checkpoint({"w": torch.full((2,), float(step))}, step)
    assert _steps(tmp_path) == [4, 6] and not ck.sidecar_path(tmp_path / "step-00000002.pt").exists()
    for step in (8, 10):
        sdk.save_checkpoint({"w": torch.full((2,), float(step))}, step, background=True)
    sdk.wait_checkpoints()
    assert _steps(tmp_path) == [8, 10]
    assert [m["step"] for m in sdk_env if m["type"] == "checkpoint"] == [2, 4, 6, 8, 10]  # each reported
    assert torch.equal(torch.load(ck.latest_valid(tmp_path)[0].path, weights_only=True)["w"], torch.full((2,), 10.0))


def test_a_background_checkpoint_removes_older_ones_only_once_it_is_complete(sdk_env, tmp_path, monkeypatch):
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "1")
    sdk.save_checkpoint(b"first", 1)
    gate, _ = _gate(monkeypatch)
    sdk.save_checkpoint(b"second", 2, background=True)
    time.sleep(0.1)
    assert _steps(tmp_path) == [1] and ck.validate(tmp_path / "step-00000001.pt")[0] is not None  # still there
    gate.release()
    sdk.wait_checkpoints()
    assert _steps(tmp_path) == [2]


def test_the_checkpoint_of_a_stop_deletes_nothing_and_the_next_runs_first_one_does(sdk_env, tmp_path, monkeypatch):
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "1")
    sdk.save_checkpoint(b"a", 1)
    sdk_link.stop["set"] = True  # the stop's grace is the job's devices, still charged: no deletions in it
    sdk.save_checkpoint(b"b", 2)
    assert _steps(tmp_path) == [1, 2] and [m["step"] for m in sdk_env if m["type"] == "checkpoint"] == [1, 2]
    sdk_link.stop["set"] = False  # the next run
    sdk.save_checkpoint(b"c", 3, background=True)
    sdk.wait_checkpoints()
    assert _steps(tmp_path) == [3]


def test_outside_teto_or_with_zero_every_checkpoint_is_kept(sdk_env, tmp_path, monkeypatch):
    for step in (1, 2, 3, 4):
        sdk.save_checkpoint(b"x", step)
    assert _steps(tmp_path) == [1, 2, 3, 4]
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "0")
    sdk.save_checkpoint(b"x", 5)
    assert _steps(tmp_path) == [1, 2, 3, 4, 5]


def test_a_checkpoint_that_cannot_be_removed_never_fails_the_training(sdk_env, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "1")

    def refuse(directory, step, keep):
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(ck, "prune", refuse)
    sdk.save_checkpoint(b"a", 1)
    assert sdk.save_checkpoint(b"b", 2) == tmp_path / "step-00000002.pt"
    sdk.save_checkpoint(b"c", 3, background=True)
    sdk.wait_checkpoints()  # raises nothing
    assert _steps(tmp_path) == [1, 2, 3]
    assert "teto: older checkpoints not removed: PermissionError" in capfd.readouterr().err


def test_a_checkpoint_the_script_wrote_itself_in_the_sdks_layout_is_kept_like_the_sdks(sdk_env, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "1")
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    for step in (1, 2):
        (tmp_path / f"step-{step:08d}.pt").write_bytes(b"own")
        sdk.report_checkpoint(step, tmp_path / f"step-{step:08d}.pt")
        (elsewhere / f"step-{step:08d}.pt").write_bytes(b"own")
        sdk.report_checkpoint(step, elsewhere / f"step-{step:08d}.pt")
    assert _steps(tmp_path) == [2]
    assert _steps(elsewhere) == [1, 2]  # not the SDK's directory: not its to delete
