"""The embedded PostgreSQL's settings (``EmbeddedPostgres.options``): every server Teto runs for a user syncs its
writes to disk; only a throwaway test server (``durable=False``, the suite's shared server) skips fsync, and its
directory is deleted without being waited for (``remove_detached``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from teto.stack.embedded import EmbeddedPostgres, remove_detached
from tests.support.services import eventually_blocking

pytestmark = pytest.mark.unit


def test_a_server_syncs_its_writes_unless_it_is_a_throwaway_test_server():
    kept = EmbeddedPostgres(Path("/nonexistent"), port=5999)
    assert kept.durable and "fsync=on" in kept.options() and "fsync=off" not in kept.options()
    throwaway = EmbeddedPostgres(Path("/nonexistent"), port=5999, durable=False)
    assert "fsync=off" in throwaway.options() and "fsync=on" not in throwaway.options()
    assert throwaway.options().replace("fsync=off", "fsync=on") == kept.options()  # nothing else differs
    assert "-p 5999" in kept.options() and "password_encryption=scram-sha-256" in kept.options()


def test_a_throwaway_servers_directory_is_deleted_by_a_process_of_its_own(tmp_path):
    doomed = tmp_path / "cluster"
    (doomed / "base" / "1").mkdir(parents=True)
    (doomed / "base" / "1" / "16384").write_bytes(b"x" * 8192)
    kept = tmp_path / "kept"
    kept.mkdir()
    remove_detached(doomed)
    eventually_blocking(lambda: not doomed.exists(), what="the detached removal", every=0.01)
    assert kept.exists()
