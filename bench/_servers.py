"""Real servers for benchmarks: the embedded NATS and PostgreSQL, on free ports in a temp dir."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from teto.stack.embedded import EmbeddedNats, EmbeddedPostgres


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="teto-bench-"))
    os.chmod(root, 0o755)  # the PostgreSQL service user must enter it
    nats = EmbeddedNats(root / "nats").start()
    pg = EmbeddedPostgres(root / "pg").start()
    try:
        yield nats.url, pg.url
    finally:
        nats.stop()
        pg.stop(destroy=True)
        shutil.rmtree(root, ignore_errors=True)
