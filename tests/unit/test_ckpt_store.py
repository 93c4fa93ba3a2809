"""The checkpoint store's rules (store/manifest.py, uploader.supersede, files, config) and the uploader and
restore against a directory store: manifest last, supersede, retries, corrupt and missing objects, lineage."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from agents.executor import checkpoints
from agents.executor.store import files
from agents.executor.store import manifest as mf
from agents.executor.store.base import ObjectMissing, StoreRefused, StoreUnavailable
from agents.executor.store.config import StoreConfigError, parse_url
from agents.executor.store.fs import FsStore
from agents.executor.store.restore import restore
from agents.executor.store.uploader import Backoff, Upload, Uploader, supersede
from libs.contracts.agents import AcceptedCheckpoint
from libs.contracts.telemetry import CheckpointKind
from tests.support.services import eventually

JOB = "job-1"


def up(step: int, epoch: int = 1, **kw) -> Upload:
    return Upload(job_id=JOB, epoch=epoch, step=step, rel=f"step-{step:08d}.pt", sha256=kw.get("sha"),
                  bytes=None, written_at="2026-12-05T00:00:00+00:00", parent=kw.get("parent"))


# -- pure rules ----------------------------------------------------------------------------------------------------

def test_manifest_keys_carry_step_and_epoch_and_parse_back():
    key = mf.manifest_key(JOB, 120, 3)
    assert key == "job-1/manifests/step-00000120-e3.json"
    assert mf.parse_manifest_key(JOB, key) == (120, 3)
    assert mf.parse_manifest_key("job-2", key) is None
    assert mf.parse_manifest_key(JOB, mf.object_key(JOB, 3, 120, "step-00000120.pt")) is None
    assert mf.object_key(JOB, 3, 120, "d/a.bin") == "job-1/e3-step-00000120/d/a.bin"


def test_stored_lists_manifests_newest_first_and_ignores_objects():
    keys = [mf.manifest_key(JOB, 10, 1), mf.object_key(JOB, 1, 30, "x"), mf.manifest_key(JOB, 20, 2),
            mf.manifest_key(JOB, 20, 1), "job-10/manifests/step-00000099-e1.json"]
    assert mf.stored(JOB, keys) == [(20, 2), (20, 1), (10, 1)]


def test_of_run_keeps_one_epoch_at_or_before_the_step():
    found = [(40, 2), (30, 1), (30, 2), (20, 2), (10, 1)]
    assert mf.of_run(found, 30, 2) == [(30, 2), (20, 2)]
    assert mf.of_run(found, 30, 1) == [(30, 1), (10, 1)]
    assert mf.of_run(found, 5, 1) == []


@pytest.mark.parametrize(("found", "newest", "keep", "gone"), [
    ([(30, 1), (20, 1), (10, 1)], (30, 1), 2, [(10, 1)]),
    ([(30, 1), (20, 1), (10, 1)], (30, 1), 3, []),
    ([(30, 1), (20, 1), (10, 1)], (30, 1), 0, []),
    ([(40, 1), (30, 2), (20, 2), (10, 1)], (30, 2), 2, [(10, 1), (40, 1)]),  # a fenced-out run's newer one goes
    ([(40, 2), (30, 2), (20, 2)], (30, 2), 1, [(20, 2)]),  # its own epoch's newer one is still to be reported
], ids=["keep-2", "keep-all-3", "keep-0", "fenced-newer", "own-newer-stays"])
def test_prunable(found, newest, keep, gone):
    assert mf.prunable(found, newest, keep) == gone


def _manifest(**over) -> mf.Manifest:
    entry = mf.Entry("step-00000010.pt", mf.object_key(JOB, 1, 10, "step-00000010.pt"), 3, "ab" * 32)
    base = dict(job_id=JOB, step=10, epoch=1, path="step-00000010.pt", sha256="ab" * 32, objects=(entry,),
                written_at="t", stored_at="t", parent=(5, 0))
    base.update(over)
    return mf.Manifest(**base)


def test_manifest_round_trip():
    made = _manifest()
    assert mf.load(made.to_bytes(), job_id=JOB, step=10, epoch=1) == made
    assert json.loads(made.to_bytes())["bytes"] == 3


@pytest.mark.parametrize("change", [
    lambda m: mf.Manifest(**{**m.__dict__, "step": 11}),  # under another checkpoint's key
    lambda m: mf.Manifest(**{**m.__dict__, "objects": ()}),
    lambda m: mf.Manifest(**{**m.__dict__, "objects": (mf.Entry("x", mf.object_key(JOB, 1, 9, "x"), 1, "00"),)}),
    lambda m: mf.Manifest(**{**m.__dict__, "objects": (mf.Entry("../x", mf.object_key(JOB, 1, 10, "../x"), 1,
                                                                "00"),)}),
], ids=["other-key", "no-objects", "object-of-another-checkpoint", "dot-dot"])
def test_manifest_that_does_not_describe_its_checkpoint_is_refused(change):
    with pytest.raises(mf.ManifestError):
        mf.load(change(_manifest()).to_bytes(), job_id=JOB, step=10, epoch=1)


@pytest.mark.parametrize("data", [b"", b"[]", b'{"schema": "x"}', b"\xff"], ids=["empty", "list", "schema", "binary"])
def test_unreadable_manifest(data):
    with pytest.raises(mf.ManifestError):
        mf.load(data, job_id=JOB, step=10, epoch=1)


def test_supersede_drops_older_queued_never_the_newer():
    queue, gone = supersede([up(10), up(20)], up(30))
    assert [u.step for u in queue] == [30] and [u.step for u in gone] == [10, 20]
    queue, gone = supersede([up(30)], up(20))  # an older report never supersedes a newer one
    assert [u.step for u in queue] == [30] and [u.step for u in gone] == [20]
    queue, gone = supersede([], up(5))
    assert [u.step for u in queue] == [5] and gone == []


def test_held_after_counts_what_retention_leaves():
    objects = [(mf.object_key(JOB, 1, 10, "a"), 5), (mf.manifest_key(JOB, 10, 1), 1),
               (mf.object_key(JOB, 1, 20, "a"), 7), (mf.manifest_key(JOB, 20, 1), 2), ("job-10/x", 100)]
    assert mf.held_after(JOB, objects, [(10, 1)]) == 9
    assert mf.held_after(JOB, objects, []) == 15


def test_backoff_doubles_up_to_its_cap():
    b = Backoff(first=0.5, cap=4.0)
    assert [b.delay(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.delay(10_000) == 4.0


@pytest.mark.parametrize(("url", "want"), [
    ("s3://ckpt", ("s3", "ckpt", "")), ("s3://ckpt/a/b/", ("s3", "ckpt", "a/b")), ("file:///srv/x", ("file", "", "")),
])
def test_parse_url(url, want):
    where = parse_url(url)
    assert (where.scheme, where.bucket, where.prefix) == want


@pytest.mark.parametrize("url", ["http://x/y", "s3://", "s3://a", "s3://b_ad/x", "s3://ok-bucket/a//b",
                                 "s3://ok-bucket/../x", "file://host/x", "s3://ok-bucket/x?y=1", "ckpt"])
def test_parse_url_refuses(url):
    with pytest.raises(StoreConfigError):
        parse_url(url)


def test_sealed_last():
    rels = ["step-00000010.json", "step-00000010.pt", "d/teto-manifest.json", "d/a.json", "d/b.bin"]
    assert sorted(rels, key=files.sealed_last) == ["d/a.json", "d/b.bin", "step-00000010.pt", "d/teto-manifest.json",
                                                   "step-00000010.json"]


# -- local files ---------------------------------------------------------------------------------------------------

def test_members_of_a_file_and_of_a_directory(tmp_path):
    ckpt = checkpoints.save_bytes(tmp_path, 10, b"abc")
    assert files.members(tmp_path, files.relative(tmp_path, ckpt.path)) == ["step-00000010.pt", "step-00000010.json"]
    d = tmp_path / "step-00000020"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "w.bin").write_bytes(b"w")
    (d / "teto-manifest.json").write_text("{}")
    (d / "a.json").write_text("{}")
    assert files.members(tmp_path, "step-00000020") == ["step-00000020/a.json", "step-00000020/sub/w.bin",
                                                         "step-00000020/teto-manifest.json"]


def test_links_and_paths_outside_are_not_checkpoints(tmp_path):
    (tmp_path / "secret").write_bytes(b"s")
    job = tmp_path / "job"
    (job / "step-00000030").mkdir(parents=True)
    (job / "step-00000030" / "w").symlink_to(tmp_path / "secret")
    (job / "step-00000040.pt").symlink_to(tmp_path / "secret")
    with pytest.raises(files.NotACheckpoint, match="link"):
        files.members(job, "step-00000030")
    with pytest.raises(files.NotACheckpoint, match="link"):
        files.members(job, "step-00000040.pt")
    with pytest.raises(files.NotACheckpoint, match="not inside"):
        files.relative(job, tmp_path / "secret")
    with pytest.raises(OSError):  # ELOOP: O_NOFOLLOW never opens the link's target
        files.hash_file(job / "step-00000040.pt")


# -- the uploader against a directory store -------------------------------------------------------------------------

class Recording(FsStore):
    """A directory store that records its calls, can be taken down, and can hold an upload until released."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[tuple[str, str]] = []
        self.down = False
        self.hold = threading.Event()
        self.hold.set()

    def put_file(self, key: str, path: Path) -> None:
        self.hold.wait(10)
        if self.down:
            raise StoreUnavailable(key, "connection refused")
        super().put_file(key, path)
        self.calls.append(("put", key))

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.down:
            raise StoreUnavailable(key, "connection refused")
        super().put_bytes(key, data)
        self.calls.append(("put", key))


helds: list[int | None] = []  # what each stored report said the job's checkpoints hold (the latest last)


def uploader(store, directory, **kw) -> tuple[Uploader, list, list]:
    stored, skipped = [], []
    u = Uploader(store, directory, on_stored=lambda upl, made, held: stored.append((upl.step, made)) or helds.append(held),
                 on_skipped=lambda upl, name, why: skipped.append((upl.step, name, why)),
                 backoff=Backoff(first=0.01, cap=0.05), **kw)
    return u, stored, skipped


def report(directory: Path, step: int, data: bytes, epoch: int = 1, parent=None) -> Upload:
    ckpt = checkpoints.save_bytes(directory, step, data)
    return Upload(job_id=JOB, epoch=epoch, step=step, rel=ckpt.path.name, sha256=ckpt.sha256, bytes=ckpt.bytes,
                  written_at="t", parent=parent)


async def test_objects_go_up_before_their_manifest_and_report_once_stored(tmp_path):
    store = Recording(tmp_path / "store")
    u, stored, skipped = uploader(store, tmp_path / "job")
    u.submit(report(tmp_path / "job", 10, b"x" * 1000))
    assert await u.drain(10)
    keys = [k for _, k in store.calls]
    assert keys[-1] == mf.manifest_key(JOB, 10, 1)
    assert set(keys[:-1]) == {mf.object_key(JOB, 1, 10, "step-00000010.pt"), mf.object_key(JOB, 1, 10,
                                                                                            "step-00000010.json")}
    (step, made), = stored
    assert step == 10 and made.bytes == 1000 + (tmp_path / "job" / "step-00000010.json").stat().st_size
    assert made.objects[0].sha256 == hashlib.sha256(b"x" * 1000).hexdigest() and skipped == []
    await u.close()


async def test_a_queued_checkpoint_is_superseded_by_a_newer_one_the_one_in_flight_is_not(tmp_path):
    store = Recording(tmp_path / "store")
    store.hold.clear()  # the first upload stalls (a slow store)
    superseded = []
    u, stored, _ = uploader(store, tmp_path / "job", on_superseded=lambda upl: superseded.append(upl.step))
    for step in (10, 20, 30):
        u.submit(report(tmp_path / "job", step, b"s%d" % step))
        await asyncio.sleep(0)
    await eventually(lambda: u.in_flight is not None and u.in_flight.step == 10, what="step 10 in flight")
    assert [x.step for x in u.queue] == [30] and superseded == [20]
    store.hold.set()
    assert await u.drain(10)
    assert [s for s, _ in stored] == [10, 30]  # in order, the newest last
    assert mf.stored(JOB, [o.key for o in store.list("")]) == [(30, 1), (10, 1)]
    await u.close()


async def test_store_down_keeps_uploading_and_nothing_is_reported_until_it_is_back(tmp_path):
    store = Recording(tmp_path / "store")
    store.down = True
    u, stored, _ = uploader(store, tmp_path / "job")
    u.submit(report(tmp_path / "job", 10, b"a"))
    await eventually(lambda: u.retries >= 3, what="retries")
    assert stored == [] and "connection refused" in u.last_error and [x.step for x in u.behind] == [10]
    assert mf.stored(JOB, [o.key for o in store.list("")]) == []
    store.down = False
    assert await u.drain(10)
    assert [s for s, _ in stored] == [10]
    await u.close()


async def test_a_file_changed_since_reported_is_skipped_and_the_next_goes_on(tmp_path):
    store = Recording(tmp_path / "store")
    u, stored, skipped = uploader(store, tmp_path / "job")
    first = report(tmp_path / "job", 10, b"a")
    (tmp_path / "job" / "step-00000010.pt").write_bytes(b"tampered")
    u.submit(first)
    assert await u.drain(10)
    u.submit(report(tmp_path / "job", 20, b"b"))
    assert await u.drain(10)
    assert skipped[0][:2] == (10, "step-00000010.pt") and "changed since it was reported" in skipped[0][2]
    assert [s for s, _ in stored] == [20]
    assert mf.manifest_key(JOB, 10, 1) not in [o.key for o in store.list("")]
    await u.close()


async def test_retention_deletes_older_checkpoints_manifest_and_objects(tmp_path):
    store = Recording(tmp_path / "store")
    u, stored, _ = uploader(store, tmp_path / "job", keep=2)
    for step in (10, 20, 30):
        u.submit(report(tmp_path / "job", step, b"c%d" % step))
        assert await u.drain(10)
    objects = store.list("")
    keys = [o.key for o in objects]
    assert mf.stored(JOB, keys) == [(30, 1), (20, 1)]
    assert not [k for k in keys if "step-00000010" in k]
    assert helds[-1] == sum(o.bytes for o in objects)  # reported as it is once retention is done
    await u.close()


# -- restore --------------------------------------------------------------------------------------------------------

async def stored_checkpoints(tmp_path: Path, steps, epoch=1, parent=None) -> FsStore:
    store = FsStore(tmp_path / "store")
    u, _, _ = uploader(store, tmp_path / f"writer-{epoch}")
    for step in steps:
        u.submit(report(tmp_path / f"writer-{epoch}", step, b"w%d" % step * 100, epoch=epoch, parent=parent))
        assert await u.drain(10)
    await u.close()
    return store


def accepted(store: FsStore, step: int, epoch: int) -> AcceptedCheckpoint:
    made = mf.load(store.get_bytes(mf.manifest_key(JOB, step, epoch), 1 << 20), job_id=JOB, step=step, epoch=epoch)
    return AcceptedCheckpoint(step=step, sha256=made.sha256, epoch=epoch)


async def test_restore_downloads_the_accepted_checkpoint_into_an_empty_directory(tmp_path):
    store = await stored_checkpoints(tmp_path, (10, 20))
    made, path, skipped = restore(store, JOB, tmp_path / "other-node", accepted(store, 20, 1))
    assert skipped == [] and made.step == 20 and path == tmp_path / "other-node" / "step-00000020.pt"
    ckpt, reason = checkpoints.validate(path)
    assert reason is None and ckpt.step == 20 and path.read_bytes() == b"w20" * 100
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-00000020.json", "step-00000020.pt"]


async def test_a_corrupt_object_skips_that_checkpoint_by_name_and_the_previous_is_used(tmp_path):
    store = await stored_checkpoints(tmp_path, (10, 20))
    key = mf.object_key(JOB, 1, 20, "step-00000020.pt")
    (tmp_path / "store" / key).write_bytes(b"rotten" * 50)
    made, path, skipped = restore(store, JOB, tmp_path / "node", accepted(store, 20, 1))
    assert made.step == 10 and path.name == "step-00000010.pt"
    (where, why), = skipped
    assert where == f"{store.location}/{key}" and why.startswith("corrupt")
    assert not (tmp_path / "node" / "step-00000020.pt").exists()


async def test_objects_without_their_manifest_are_no_checkpoint(tmp_path):
    store = await stored_checkpoints(tmp_path, (10, 20))
    (tmp_path / "store" / mf.manifest_key(JOB, 20, 1)).unlink()  # an upload killed before its manifest
    made, path, skipped = restore(store, JOB, tmp_path / "node", AcceptedCheckpoint(step=20, sha256=None, epoch=1))
    assert made.step == 10 and skipped == []


async def test_a_missing_object_is_named(tmp_path):
    store = await stored_checkpoints(tmp_path, (10,))
    key = mf.object_key(JOB, 1, 10, "step-00000010.json")
    (tmp_path / "store" / key).unlink()
    made, path, skipped = restore(store, JOB, tmp_path / "node", accepted(store, 10, 1))
    assert made is None and path is None and skipped[0][0].endswith(key) and "missing" in skipped[0][1]


async def test_fallback_follows_the_line_the_run_resumed_from_never_another_runs_checkpoint(tmp_path):
    await stored_checkpoints(tmp_path, (10, 20), epoch=1)
    await stored_checkpoints(tmp_path, (25,), epoch=2)  # a fenced-out run of epoch 2: never accepted
    store = await stored_checkpoints(tmp_path, (30,), epoch=3, parent=(20, 1))
    (tmp_path / "store" / mf.object_key(JOB, 3, 30, "step-00000030.pt")).write_bytes(b"bad")
    made, path, skipped = restore(store, JOB, tmp_path / "node", accepted(store, 30, 3))
    assert (made.step, made.epoch) == (20, 1) and len(skipped) == 1


async def test_another_checksum_than_the_accepted_one_is_skipped(tmp_path):
    store = await stored_checkpoints(tmp_path, (10,))
    made, path, skipped = restore(store, JOB, tmp_path / "node", AcceptedCheckpoint(step=10, sha256="0" * 64, epoch=1))
    assert made is None and "not the checkpoint the queue accepted" in skipped[0][1]


async def test_nothing_accepted_means_from_scratch_and_a_clean_directory(tmp_path):
    store = await stored_checkpoints(tmp_path, (10,))
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "step-00000090.pt").write_bytes(b"stale")
    assert restore(store, JOB, tmp_path / "node", None) == (None, None, [])
    assert list((tmp_path / "node").iterdir()) == []


async def test_a_file_already_here_is_not_downloaded_again(tmp_path):
    store = await stored_checkpoints(tmp_path, (10,))
    calls = []
    real = store.get_file
    store.get_file = lambda key, path, stopped=None: (calls.append(key), real(key, path, stopped))
    restore(store, JOB, tmp_path / "writer-1", accepted(store, 10, 1))
    assert calls == []


def test_store_unavailable_is_raised_for_the_caller_to_retry(tmp_path):
    class Down(FsStore):
        def list(self, prefix):
            raise StoreUnavailable(prefix, "connection refused")

    with pytest.raises(StoreUnavailable):
        restore(Down(tmp_path), JOB, tmp_path / "node", AcceptedCheckpoint(step=10, sha256=None, epoch=1))


def test_fs_store_refuses_keys_that_leave_it_and_names_missing_objects(tmp_path):
    store = FsStore(tmp_path)
    with pytest.raises(StoreRefused):
        store.put_bytes("../x", b"")
    with pytest.raises(ObjectMissing):
        store.get_bytes("nope", 10)
    store.put_bytes("a/b", b"12345")
    with pytest.raises(StoreRefused):
        store.get_bytes("a/b", 4)
    assert os.stat(tmp_path / "a" / "b").st_size == 5


async def test_a_checkpoint_directory_goes_up_and_comes_back_whole_its_manifest_file_last(tmp_path):
    writer = tmp_path / "writer"
    d = writer / "step-00000030"
    (d / "shards").mkdir(parents=True)
    (d / "shards" / "0.bin").write_bytes(b"zero" * 1000)
    (d / "shards" / "1.bin").write_bytes(b"one" * 1000)
    (d / "teto-manifest.json").write_text('{"files": 2}')
    store = Recording(tmp_path / "store")
    u, stored, skipped = uploader(store, writer)
    u.submit(Upload(job_id=JOB, epoch=2, step=30, rel="step-00000030", sha256=None, bytes=None, written_at="t"))
    assert await u.drain(10) and skipped == []
    (_, made), = stored
    assert [e.path for e in made.objects] == ["step-00000030/shards/0.bin", "step-00000030/shards/1.bin",
                                              "step-00000030/teto-manifest.json"]
    assert mf.shape(made) == (CheckpointKind.DIRECTORY, 2)  # reported as a directory of two files once stored
    restored, path, skips = restore(store, JOB, tmp_path / "node", AcceptedCheckpoint(step=30, sha256=None, epoch=2))
    assert skips == [] and path == tmp_path / "node" / "step-00000030" and path.is_dir()
    for rel in ("shards/0.bin", "shards/1.bin", "teto-manifest.json"):
        assert (path / rel).read_bytes() == (d / rel).read_bytes()
    await u.close()
