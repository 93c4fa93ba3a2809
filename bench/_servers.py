"""Real servers for benchmarks: the embedded NATS and PostgreSQL, on free ports in a temp dir."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from teto.stack.embedded import EmbeddedNats, EmbeddedPostgres


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="teto-bench-"))
    nats = EmbeddedNats(root / "nats").start()
    pg = EmbeddedPostgres(root / "pg").start()
    try:
        yield nats.url, pg.url
    finally:
        nats.stop()
        pg.stop()
