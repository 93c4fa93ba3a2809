"""teto.sdk with directory checkpoints (issue 27): report_checkpoint seals a directory and reports it with its
kind, size and manifest checksum; seal_checkpoint alone; retention of whole directories; resume_checkpoint
returns the directory; a link inside is refused and the agent told why."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from agents.executor import ckpt_dir as cd
from agents.executor import sdk, sdk_link


@pytest.fixture
def pipe(tmp_path, monkeypatch):
    """The SDK writing to a pipe of ours, its checkpoint directory in tmp_path (no TETO_JOB_ID: no SIGTERM
    handler is installed in the test process); returns a function reading the lines written so far."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in [k for k in os.environ if k.startswith("TETO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TETO_REPORT_FD", str(w))
    monkeypatch.setenv("TETO_CHECKPOINT_DIR", str(ck))
    monkeypatch.setenv("TETO_CHECKPOINTS_KEPT", "2")
    monkeypatch.setitem(sdk_link.state, "fd", None)
    buf = bytearray()

    def lines() -> list[dict]:
        try:
            while chunk := os.read(r, 65536):
                buf.extend(chunk)
        except BlockingIOError:
            pass
        return [json.loads(x) for x in bytes(buf).splitlines()]

    yield ck, lines
    sdk_link.state["fd"] = None
    os.close(r)
    os.close(w)


def _hf(root: Path, step: int) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir()
    (d / "adapter_model.safetensors").write_bytes(bytes([step % 256]) * 64)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def _checkpoints(lines) -> list[dict]:
    return [x for x in lines() if x["type"] == "checkpoint"]


def test_a_directory_is_sealed_and_reported_as_one_checkpoint(pipe):
    ck, lines = pipe
    d = _hf(ck, 120)
    sdk.report_checkpoint(120, d)
    (report,) = _checkpoints(lines)
    manifest = (d / cd.MANIFEST).read_bytes()
    assert report == {"type": "checkpoint", "step": 120, "path": str(d.resolve()), "kind": "directory", "files": 2,
                      "bytes": 64 + len(json.dumps({"global_step": 120})),
                      "sha256": hashlib.sha256(manifest).hexdigest()}
    assert [x["phase"] for x in lines() if x["type"] == "phase"] == ["checkpointing", "training"]
    sdk.report_checkpoint(120, d)  # reported again: the same manifest, not sealed anew
    assert (d / cd.MANIFEST).read_bytes() == manifest and _checkpoints(lines)[-1] == report


def test_a_file_report_says_its_kind(pipe):
    ck, lines = pipe
    f = ck / "epoch=0-step=7.ckpt"
    f.write_bytes(b"lightning")
    sdk.report_checkpoint(7, f)
    (report,) = _checkpoints(lines)
    assert report["kind"] == "file" and report["bytes"] == 9 and "files" not in report
    assert (ck / "epoch=0-step=7.json").exists()


def test_seal_checkpoint_alone_returns_the_manifest_and_reports_nothing(pipe):
    ck, lines = pipe
    d = _hf(ck, 3)
    manifest = sdk.seal_checkpoint(d, 3)
    assert isinstance(manifest, sdk.Manifest) and manifest.step == 3
    assert [e.path for e in manifest.files] == ["adapter_model.safetensors", "trainer_state.json"]
    assert _checkpoints(lines) == [] and cd.verify(d)[0].manifest == manifest


def test_retention_deletes_whole_directories_beyond_the_kept(pipe):
    ck, _ = pipe
    for step in (10, 20, 30):
        sdk.report_checkpoint(step, _hf(ck, step))
    _hf(ck, 40)  # being written by the trainer, not yet reported
    assert sorted(p.name for p in ck.iterdir()) == ["checkpoint-20", "checkpoint-30", "checkpoint-40"]


def test_a_link_inside_is_refused_and_the_agent_told_why(pipe):
    ck, lines = pipe
    d = _hf(ck, 5)
    (d / "escape").symlink_to("/etc/hostname")
    with pytest.raises(sdk.CheckpointInvalid, match="escape: a link"):
        sdk.report_checkpoint(5, d)
    (invalid,) = [x for x in lines() if x["type"] == "checkpoint_invalid"]
    assert invalid["path"] == str(d.resolve()) and invalid["reason"].startswith("escape: a link")
    assert _checkpoints(lines) == [] and not (d / cd.MANIFEST).exists()


def test_over_the_quota_is_refused(pipe, monkeypatch):
    ck, lines = pipe
    monkeypatch.setenv("TETO_CHECKPOINT_QUOTA_BYTES", "10")
    with pytest.raises(sdk.CheckpointRefused):
        sdk.report_checkpoint(5, _hf(ck, 5))
    (refused,) = [x for x in lines() if x["type"] == "checkpoint_refused"]
    assert refused["quota"] == 10 and refused["bytes"] > 10


def test_resume_returns_the_directory(pipe, monkeypatch):
    ck, _ = pipe
    d = _hf(ck, 8)
    sdk.seal_checkpoint(d, 8)
    assert sdk.resume_checkpoint() == (8, d)  # outside Teto: the latest valid one in the directory
    monkeypatch.setenv("TETO_JOB_ID", "j")
    monkeypatch.setattr(sdk_link, "install", lambda: None)
    monkeypatch.setenv("TETO_RESUME_FROM", str(d))
    assert sdk.resume_checkpoint() == (8, d)  # under Teto: the one the agent chose
    # ...and verified just before the run started: its step is read from the manifest, nothing is hashed again
    (d / "adapter_model.safetensors").write_bytes(b"x" * 64)
    assert sdk.resume_checkpoint() == (8, d) and cd.verify(d)[0] is None
