"""Directory checkpoints in the checkpoint store: reported as directories once stored (store/hooks.py, with the
files their own manifest lists), and judged after a restore by ckpt_dir's rules (their ``teto-manifest.json``) as
well as object by object, so a directory whose inner manifest disagrees is skipped naming the file."""

from __future__ import annotations

import types
from pathlib import Path

from agents.executor import checkpoints, ckpt_dir
from agents.executor.reports import Reports
from agents.executor.store import hooks
from agents.executor.store import manifest as mf
from agents.executor.store.fetch import fetch, local_check
from agents.executor.store.fs import FsStore
from agents.executor.store.restore import restore
from agents.executor.store.uploader import Backoff, Upload, Uploader
from libs.contracts.agents import AcceptedCheckpoint
from libs.contracts.telemetry import CheckpointKind, CheckpointReport

JOB = "job-d"


def _hf(root: Path, step: int, payload: bytes = b"w" * 100) -> Path:
    """A Hugging Face-like checkpoint directory (a nested folder too), not sealed yet."""
    d = root / f"checkpoint-{step}"
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "adapter_model.safetensors").write_bytes(payload)
    (d / "optimizer.pt").write_bytes(b"o" * 40)
    (d / "trainer_state.json").write_text('{"global_step": %d}' % step)
    return d


def _entries(path: str, names: list[str]) -> tuple[mf.Entry, ...]:
    return tuple(mf.Entry(path=n, key=mf.object_key(JOB, 1, 10, n), bytes=1, sha256="0" * 64) for n in names)


def _made(path: str, names: list[str]) -> mf.Manifest:
    return mf.Manifest(job_id=JOB, step=10, epoch=1, path=path, sha256=None, objects=_entries(path, names),
                       written_at="t", stored_at="t")


# -- the pure rule -------------------------------------------------------------------------------------------------

def test_shape_of_a_stored_checkpoint():
    assert mf.shape(_made("step-00000010.pt", ["step-00000010.pt", "step-00000010.json"])) == \
        (CheckpointKind.FILE, None)
    assert mf.shape(_made("checkpoint-10", ["checkpoint-10/a/w.bin", "checkpoint-10/opt.pt",
                                            "checkpoint-10/teto-manifest.json"])) == (CheckpointKind.DIRECTORY, 2)
    # A file whose name starts like a directory's is not inside it.
    assert mf.shape(_made("checkpoint-1", ["checkpoint-10", "checkpoint-1.json"])) == (CheckpointKind.FILE, None)


# -- the report once stored ----------------------------------------------------------------------------------------

def _run(directory: Path) -> types.SimpleNamespace:
    grant = types.SimpleNamespace(job_id=JOB, epoch=1, rank=0, world_size=1, resume_from=None,
                                  checkpoint_quota_bytes=None, spec=types.SimpleNamespace(checkpoint_quota_bytes=None))
    return types.SimpleNamespace(grant=grant, uploader=None, confirmed_file=None, retention=None, pending_step=None)


async def test_a_stored_directory_is_reported_as_a_directory_with_its_files(tmp_path):
    local = tmp_path / "job"
    sealed = ckpt_dir.seal(_hf(local, 10), 10, epoch=1)
    sent: list[tuple[type, dict]] = []
    reports = Reports(lambda run, cls, **fields: sent.append((cls, fields)), 60.0)
    run = _run(local)
    store = FsStore(tmp_path / "store")
    run.uploader = hooks.uploader_for(run, store, local, keep=0, concurrency=2,
                                      send=lambda run, cls, **f: sent.append((cls, f)), report=reports.stored)
    reports.on_report(run, {"type": "checkpoint", "step": 10, "path": str(sealed.path), "sha256": sealed.sha256,
                            "bytes": sealed.bytes, "kind": "directory", "files": 3})
    assert await run.uploader.drain(10)
    await run.uploader.close()
    (fields,) = [f for cls, f in sent if cls is CheckpointReport]
    assert fields["checkpoint_kind"] is CheckpointKind.DIRECTORY and fields["files"] == 3
    assert fields["path"] == f"{store.location}/{mf.manifest_key(JOB, 10, 1)}" and fields["sha256"] == sealed.sha256
    assert fields["bytes"] == sealed.bytes + ckpt_dir.manifest_path(sealed.path).stat().st_size
    # The contract takes it as it is (the queue's job view and panel read checkpoint_kind from it).
    report = CheckpointReport(job_id=JOB, epoch=1, executor_id="e1", **fields)
    assert report.checkpoint_kind is CheckpointKind.DIRECTORY and report.files == 3

    # A file checkpoint stays a file.
    sent.clear()
    run.uploader = hooks.uploader_for(run, store, local, keep=0, concurrency=2,
                                      send=lambda run, cls, **f: sent.append((cls, f)), report=reports.stored)
    ckpt = checkpoints.save_bytes(local, 20, b"f" * 10)
    reports.on_report(run, {"type": "checkpoint", "step": 20, "path": str(ckpt.path), "sha256": ckpt.sha256,
                            "bytes": ckpt.bytes})
    assert await run.uploader.drain(10)
    await run.uploader.close()
    (fields,) = [f for cls, f in sent if cls is CheckpointReport]
    assert fields["checkpoint_kind"] is CheckpointKind.FILE and "files" not in fields


# -- after a restore: the directory's own manifest ---------------------------------------------------------------

async def _store(tmp_path: Path, writer: Path, steps_and_dirs: list[tuple[int, Path]]) -> FsStore:
    store = FsStore(tmp_path / "store")
    stored: list[int] = []
    u = Uploader(store, writer, on_stored=lambda upl, made, held: stored.append(upl.step),
                 on_skipped=lambda *a: None, backoff=Backoff(first=0.01, cap=0.05))
    for step, d in steps_and_dirs:
        u.submit(Upload(job_id=JOB, epoch=1, step=step, rel=d.name, sha256=None, bytes=None, written_at="t"))
        assert await u.drain(10)
    await u.close()
    assert stored == [s for s, _ in steps_and_dirs]
    return store


async def test_a_restored_directory_whose_own_manifest_disagrees_is_skipped_naming_the_file(tmp_path):
    writer = tmp_path / "writer"
    good = ckpt_dir.seal(_hf(writer, 10), 10, epoch=1).path
    bad = ckpt_dir.seal(_hf(writer, 20), 20, epoch=1).path
    # Changed after it was sealed and before its upload: every object's SHA-256 in the store is right, the
    # directory is not the checkpoint its manifest describes.
    (bad / "optimizer.pt").write_bytes(b"X" * 40)
    store = await _store(tmp_path, writer, [(10, good), (20, bad)])
    accepted = AcceptedCheckpoint(step=20, sha256=None, epoch=1)

    made, path, skipped = restore(store, JOB, tmp_path / "node", accepted, check=local_check(None, None))
    assert made.step == 10 and path == tmp_path / "node" / "checkpoint-10"
    (where, why), = skipped
    assert where == f"{store.location}/{mf.manifest_key(JOB, 20, 1)}"
    assert why.startswith("teto-manifest.json disagrees: optimizer.pt: checksum mismatch"), why
    assert not (tmp_path / "node" / "checkpoint-20").exists()
    assert ckpt_dir.verify(path)[1] is None

    # Through the agent's fetch: the checkpoint handed to the run is the good directory, judged as in place.
    grant = types.SimpleNamespace(job_id=JOB, resume_from=accepted)
    ckpt, skips = await fetch(store, grant, tmp_path / "node2")  # type: ignore[arg-type]
    assert ckpt.step == 10 and ckpt.format == "directory" and ckpt.path.name == "checkpoint-10"
    assert [w for w, _ in skips] == [where]


async def test_a_restored_directory_without_its_own_manifest_is_skipped(tmp_path):
    writer = tmp_path / "writer"
    good = ckpt_dir.seal(_hf(writer, 10), 10, epoch=1).path
    unsealed = _hf(writer, 20)  # reported but never sealed: no teto-manifest.json inside
    store = await _store(tmp_path, writer, [(10, good), (20, unsealed)])
    made, path, skipped = restore(store, JOB, tmp_path / "node", AcceptedCheckpoint(step=20, sha256=None, epoch=1),
                                  check=local_check(None, None))
    assert made.step == 10 and "no manifest (teto-manifest.json)" in skipped[0][1]


# -- a restore stopped inside a large object ------------------------------------------------------------------------

async def test_a_restore_is_stopped_inside_a_large_object_not_only_between_objects(tmp_path):
    from agents.executor import ckpt_quota

    writer = tmp_path / "writer"
    ckpt = checkpoints.save_bytes(writer, 10, b"z" * (8 << 20))  # eight chunks of a MiB
    store = FsStore(tmp_path / "store")
    u = Uploader(store, writer, on_stored=lambda *a: None, on_skipped=lambda *a: None)
    u.submit(Upload(job_id=JOB, epoch=1, step=10, rel=ckpt.path.name, sha256=ckpt.sha256, bytes=ckpt.bytes,
                    written_at="t"))
    assert await u.drain(10)
    await u.close()
    asked = []

    def stopped() -> bool:  # a cancel arriving once the object's third MiB has been asked for
        asked.append(1)
        return len(asked) > 3

    node = tmp_path / "node"
    try:
        restore(store, JOB, node, AcceptedCheckpoint(step=10, sha256=ckpt.sha256, epoch=1), stopped=stopped)
    except ckpt_quota.VerificationStopped as exc:
        stop = exc
    else:
        raise AssertionError("the restore was not stopped")
    assert stop.path == node / ckpt.path.name and 0 < stop.hashed < ckpt.bytes, stop
    assert not (node / ckpt.path.name).exists()
    assert [p.name for p in node.iterdir() if p.name.endswith(".restore")] == []  # nothing half written is left


# -- the uploads below the training process's CPU priority ---------------------------------------------------------

async def test_uploads_run_in_threads_below_the_training_process_cpu_priority(tmp_path):
    import os
    import threading

    from agents.executor.store import uploader as up

    seen: dict[str, int] = {}

    class Watching(FsStore):
        def put_file(self, key: str, path: Path) -> None:
            seen["upload"] = (os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.sched_getscheduler(0))
            inner = threading.Thread(target=lambda: seen.setdefault(
                "started by it", (os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                                  os.sched_getscheduler(0))))
            inner.start()  # as the client's multipart threads are
            inner.join()
            super().put_file(key, path)

    writer = tmp_path / "writer"
    ckpt = checkpoints.save_bytes(writer, 10, b"p" * 100)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    u = Uploader(Watching(tmp_path / "store"), writer, on_stored=lambda *a: None, on_skipped=lambda *a: None)
    u.submit(Upload(job_id=JOB, epoch=1, step=10, rel=ckpt.path.name, sha256=ckpt.sha256, bytes=ckpt.bytes,
                    written_at="t"))
    assert await u.drain(10)
    await u.close()
    lowered = (max(before, up.NICE), os.SCHED_IDLE)
    assert seen == {"upload": lowered, "started by it": lowered}, seen
    # The agent's own threads are not lowered.
    assert (os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.sched_getscheduler(0)) == \
        (before, os.SCHED_OTHER)


async def test_a_checkpoint_is_behind_until_reported_so_a_drain_never_ends_before_its_report(tmp_path):
    """The run's end is reported once the drain says its uploads are done: its last checkpoint's report must come
    first (it was once left behind when the store's listing, between manifest and report, took a while)."""
    writer = tmp_path / "writer"
    ckpt = checkpoints.save_bytes(writer, 10, b"d" * 100)
    when_reported: list[list[int]] = []
    u = Uploader(FsStore(tmp_path / "store"), writer, on_skipped=lambda *a: None,
                 on_stored=lambda upl, made, held: when_reported.append([x.step for x in u.behind]))
    u.submit(Upload(job_id=JOB, epoch=1, step=10, rel=ckpt.path.name, sha256=ckpt.sha256, bytes=ckpt.bytes,
                    written_at="t"))
    assert await u.drain(10)
    await u.close()
    assert when_reported == [[10]] and u.behind == []
