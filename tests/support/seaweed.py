"""A SeaweedFS S3 server a test owns (the same ``weed mini`` ``teto up`` embeds): started, killed and started
again on the same ports and data, to show what the checkpoint store does while its store is away."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from libs.runtime.ports import free_port
from teto.stack.seaweed import EmbeddedSeaweed


class OwnSeaweed:
    """``tls``: (certificate, key) files: S3 over HTTPS too, on ``https_port``."""

    def __init__(self, root: Path, tls: tuple[Path, Path] | None = None) -> None:
        self.server = EmbeddedSeaweed(root).prepare()
        self.proc: subprocess.Popen | None = None
        self.log = root / "weed.log"
        self.tls = tls
        self.https_port = free_port() if tls else None

    def start(self, timeout: float = 60.0) -> None:
        out = open(self.log, "ab")
        extra = [f"-s3.cert.file={self.tls[0]}", f"-s3.key.file={self.tls[1]}",
                 f"-s3.port.https={self.https_port}"] if self.tls else []
        self.proc = subprocess.Popen(self.server.argv() + extra, env=self.server.env(dict(os.environ)), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        proc = self.proc
        self.server.wait_ready(timeout, alive=lambda: proc.poll() is None)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def env(self) -> dict[str, str]:
        """What an operator sets for the executors to use this store (``teto up`` then starts none of its own)."""
        return self.server.executor_env()

    def client(self):
        return self.server.client()


@contextmanager
def own_seaweed(root: Path) -> Iterator[OwnSeaweed]:
    store = OwnSeaweed(root)
    store.start()
    try:
        yield store
    finally:
        store.kill()
