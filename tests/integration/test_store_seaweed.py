"""The S3 store on a real SeaweedFS server: multipart round trip, the errors the agent's retries depend on
(missing, refused credentials, the server gone), and an agent's upload killed midway never becoming a checkpoint."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agents.executor import checkpoints
from agents.executor.store import manifest as mf
from agents.executor.store.base import ObjectMissing, StoreRefused, StoreUnavailable
from agents.executor.store.restore import restore
from agents.executor.store.s3 import S3Config, S3Store
from agents.executor.store.uploader import Upload, Uploader
from libs.contracts.agents import AcceptedCheckpoint
from tests.support.services import eventually_blocking
from tests.support.seaweed import OwnSeaweed

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    store = OwnSeaweed(tmp_path_factory.mktemp("seaweed"))
    store.start()
    yield store
    store.kill()


def s3_store(seaweed: OwnSeaweed, prefix: str, **over) -> S3Store:
    server = seaweed.server
    config = dict(endpoint=server.endpoint, bucket=server.bucket, prefix=prefix, access_key_id=server.access_key_id,
                  secret_access_key=server.secret_file.read_text().strip(), part_bytes=5 << 20, concurrency=4)
    config.update(over)
    return S3Store(S3Config(**config))


def test_multipart_round_trip_list_and_delete(seaweed, tmp_path):
    store = s3_store(seaweed, "roundtrip/a")
    data = os.urandom(12 << 20) + b"tail"  # three parts
    (tmp_path / "big").write_bytes(data)
    store.put_file("x/big", tmp_path / "big")
    store.put_bytes("x/small", b"12345")
    store.get_file("x/big", tmp_path / "back")
    assert hashlib.sha256((tmp_path / "back").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert {(o.key, o.bytes) for o in store.list("x/")} == {("x/big", len(data)), ("x/small", 5)}
    assert store.list("y/") == [] and store.location == "s3://teto-checkpoints/roundtrip/a"
    with pytest.raises(StoreRefused):
        store.get_bytes("x/small", 4)
    store.delete(["x/big", "x/small", "x/never-there"])
    assert store.list("x/") == []
    with pytest.raises(ObjectMissing):
        store.get_bytes("x/small", 100)
    with pytest.raises(ObjectMissing):
        store.get_file("x/big", tmp_path / "gone")


def test_a_download_is_stopped_inside_a_large_object(seaweed, tmp_path):
    """A cancel or a lost lease stops a restore within a MiB of a part, not after the object (minutes for a large
    one); the parts in flight end too, and the object, whole, still downloads afterwards."""
    from agents.executor.store.base import Stopped

    store = s3_store(seaweed, "stop")
    data = os.urandom(20 << 20)  # four parts of 5 MiB, four at once
    (tmp_path / "big").write_bytes(data)
    store.put_file("x/big", tmp_path / "big")
    asked = []

    def stopped() -> bool:  # true once the download has asked six times (a few MiB in)
        asked.append(1)
        return len(asked) > 6

    with pytest.raises(Stopped) as stop:
        store.get_file("x/big", tmp_path / "back", stopped)
    assert stop.value.got < len(data), stop.value
    sha, size = store.get_file("x/big", tmp_path / "back")
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert (tmp_path / "back").read_bytes() == data


def test_wrong_secret_is_refused_and_a_server_gone_is_unavailable(seaweed, tmp_path):
    with pytest.raises(StoreRefused):
        s3_store(seaweed, "p", secret_access_key="not-the-secret").put_bytes("k", b"v")
    with pytest.raises(StoreRefused):
        s3_store(seaweed, "p", secret_access_key="not-the-secret").list("")
    gone = s3_store(seaweed, "p", endpoint="http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(StoreUnavailable):
        gone.put_bytes("k", b"v")
    with pytest.raises(StoreUnavailable):
        gone.list("")


def test_an_upload_killed_before_its_manifest_is_never_a_checkpoint(seaweed, tmp_path):
    job, local = "killed-job", tmp_path / "ckpt"
    store = s3_store(seaweed, "")
    first = checkpoints.save_bytes(local, 10, b"first")
    stored = []
    uploader = Uploader(store, local, on_stored=lambda u, m, held: stored.append(m), on_skipped=lambda *a: None)

    async def upload_first() -> None:
        uploader.submit(Upload(job, 1, 10, first.path.name, first.sha256, first.bytes, "t"))
        assert await uploader.drain(60)
        await uploader.close()

    asyncio.run(upload_first())
    checkpoints.save_bytes(local, 20, os.urandom(11 << 20))  # three parts, two at once
    marker = tmp_path / "marker"
    server = seaweed.server
    victim = subprocess.Popen([sys.executable, "-m", "tests.support.upload_victim", server.endpoint, server.bucket,
                               str(server.root), str(local), job, "20", str(marker)], cwd=REPO)
    try:
        eventually_blocking(lambda: marker.exists() or victim.poll() is not None, 120, "the upload's last object")
        assert victim.poll() is None, "the uploader ended before its manifest"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(30)
    finally:
        if victim.poll() is None:
            victim.kill()
    keys = [o.key for o in store.list(mf.job_prefix(job))]
    assert mf.object_key(job, 1, 20, "step-00000020.pt") in keys  # its data is there ...
    assert mf.stored(job, keys) == [(10, 1)]  # ... but without its manifest it does not exist
    # Even a resume told to take step 20 cannot: it uses the last stored checkpoint of that run, step 10.
    made, path, skipped = restore(store, job, tmp_path / "node", AcceptedCheckpoint(step=20, sha256=None, epoch=1))
    assert made.step == 10 and path.read_bytes() == b"first" and skipped == []


def test_tls_with_a_ca_file(tmp_path):
    from teto.tls import make_tls

    made = make_tls(tmp_path / "tls", ["127.0.0.1", "localhost"])
    store = OwnSeaweed(tmp_path / "seaweed", tls=(made.cert, made.key))
    store.start()
    try:
        https = f"https://127.0.0.1:{store.https_port}"
        eventually_blocking(lambda: _answers(https, made.ca), 30, "the HTTPS port")
        trusted = s3_store(store, "tls", endpoint=https, ca_file=made.ca)
        trusted.put_bytes("k", b"over tls")
        assert trusted.get_bytes("k", 100) == b"over tls"
        with pytest.raises(StoreRefused, match="TLS"):  # the system's CAs do not know this one: refused, not retried
            s3_store(store, "tls", endpoint=https).get_bytes("k", 100)
    finally:
        store.kill()


def _answers(url: str, ca: Path) -> bool:
    import ssl
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=2, context=ssl.create_default_context(cafile=str(ca)))
    except urllib.error.HTTPError:
        return True  # 403 to an anonymous request: it is up
    except OSError:
        return False
    return True


def test_a_directory_checkpoint_round_trip_judged_by_its_own_manifest(seaweed, tmp_path):
    """A directory checkpoint stored and restored through the real server; one altered after it was sealed (every
    object's SHA-256 right in the store) is skipped naming the file, and the previous one is handed over."""
    from agents.executor import ckpt_dir
    from agents.executor.store.fetch import local_check
    from agents.executor.store.manifest import shape
    from libs.contracts.telemetry import CheckpointKind

    job, local = "dir-job", tmp_path / "ckpt"
    sealed = []
    for step in (10, 20):
        d = local / f"checkpoint-{step}"
        (d / "adapter").mkdir(parents=True)
        (d / "adapter" / "weights.bin").write_bytes(os.urandom(6 << 20))  # two parts
        (d / "optimizer.pt").write_bytes(os.urandom(1000))
        sealed.append(ckpt_dir.seal(d, step, epoch=1))
    (local / "checkpoint-20" / "optimizer.pt").write_bytes(os.urandom(1000))
    store = s3_store(seaweed, "")
    stored = []
    uploader = Uploader(store, local, on_stored=lambda u, m, held: stored.append(m), on_skipped=lambda *a: None)

    async def upload() -> None:
        for s in sealed:
            uploader.submit(Upload(job, 1, s.step, s.path.name, s.sha256, s.bytes, "t"))
            assert await uploader.drain(60)
        await uploader.close()

    asyncio.run(upload())
    assert [shape(m) for m in stored] == [(CheckpointKind.DIRECTORY, 2)] * 2
    made, path, skipped = restore(store, job, tmp_path / "node", AcceptedCheckpoint(step=20, sha256=None, epoch=1),
                                  check=local_check(None, None))
    assert made.step == 10 and ckpt_dir.verify(path)[1] is None
    assert (path / "adapter" / "weights.bin").read_bytes() == (local / "checkpoint-10" / "adapter" /
                                                                 "weights.bin").read_bytes()
    (where, why), = skipped
    assert where.endswith(mf.manifest_key(job, 20, 1)) and why.startswith(
        "teto-manifest.json disagrees: optimizer.pt: checksum mismatch"), skipped
