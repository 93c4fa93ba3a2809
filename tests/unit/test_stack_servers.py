"""``teto up`` starts its embedded PostgreSQL again when it dies (teto/stack/servers.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from teto.stack.servers import PostgresWatch, postmaster_pid, process_alive

pytestmark = pytest.mark.unit


def test_a_running_process_is_alive_and_a_reaped_or_unreaped_dead_one_is_not():
    assert process_alive(os.getpid())
    child = subprocess.Popen(["true"])
    while not os.path.exists(f"/proc/{child.pid}/stat") or process_alive(child.pid):
        if child.poll() is not None:
            break
    # Exited: a zombie until reaped, gone after; dead either way.
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)


def test_the_postmaster_pid_is_the_lock_files_first_line(tmp_path: Path):
    assert postmaster_pid(tmp_path) is None
    (tmp_path / "postmaster.pid").write_text("4242\n/data\n1700000000\n5432\n")
    assert postmaster_pid(tmp_path) == 4242
    (tmp_path / "postmaster.pid").write_text("garbage\n")
    assert postmaster_pid(tmp_path) is None


class FakePostgres:
    url = "postgresql://teto:x@127.0.0.1:5432/teto"

    def __init__(self, pgdata: Path, fail: int = 0) -> None:
        self.pgdata, self.fail, self.starts = pgdata, fail, 0

    def _pgdata(self) -> Path:
        return self.pgdata

    def start(self, timeout: float) -> None:
        self.starts += 1
        if self.fail:
            self.fail -= 1
            raise RuntimeError("shared memory still in use")
        (self.pgdata / "postmaster.pid").write_text(f"{os.getpid()}\n")


def test_a_dead_server_is_started_again_after_its_back_off_and_a_live_one_is_left_alone(tmp_path: Path):
    now = [100.0]
    pg = FakePostgres(tmp_path, fail=1)
    watch = PostgresWatch(pg, clock=lambda: now[0])
    assert watch.check() is False and pg.starts == 0  # first seen dead: waits its back-off (0.5 s)
    now[0] += 0.5
    assert watch.check() is False and pg.starts == 1  # the start failed: tried again later
    assert watch.check() is False and pg.starts == 1  # the second death in a minute waits 1 s
    now[0] += 1.0
    assert watch.check() is True and pg.starts == 2
    assert watch.check() is False and pg.starts == 2  # running: nothing to do
