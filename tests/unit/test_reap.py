"""A test session killed before its teardown: the next one stops its servers and deletes its files
(tests/support/reap.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support import reap

pytestmark = pytest.mark.unit


def _sleeper(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process whose command line names ``argv`` (as a server's names its data directory)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv], start_new_session=True,
                            env=env)


def _gone(proc: subprocess.Popen) -> bool:
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_root_is_abandoned_once_its_owner_has_ended_even_if_its_pid_comes_back(tmp_path, monkeypatch):
    monkeypatch.delenv(reap.MARK, raising=False)  # the claim below marks this process: undone after the test
    mine, ended, reused, unclaimed = (tmp_path / f"teto-test-{n}" for n in ("mine", "ended", "reused", "unclaimed"))
    for root in (mine, ended, reused, unclaimed):
        root.mkdir()
    reap.claim(mine)
    done = subprocess.Popen(["true"])
    done.wait()
    reap.claim(ended, done.pid)  # no such process any more (its start time is None)
    (reused / reap.OWNER).write_text(f"{os.getpid()} 1")  # this pid, another start time
    (tmp_path / "teto-test-afile").write_text("not a root")
    assert reap.owner_alive(mine) and reap.owner_alive(unclaimed)  # never claimed: not a session of ours
    assert reap.abandoned(tmp_path) == [ended, reused]


def test_reap_kills_what_runs_from_the_root_and_its_cluster_and_nothing_else(tmp_path):
    root = tmp_path / "teto-test-x"
    (root / "nats").mkdir(parents=True)
    shared = tmp_path / "shared"
    cluster = shared / "data-abc"
    cluster.mkdir(parents=True)
    (shared / "data-abc.origin").write_text(str(root / "pg"))
    other = shared / "data-def"
    other.mkdir()
    (shared / "data-def.origin").write_text(str(tmp_path / "elsewhere" / "pg"))
    server = _sleeper("-sd", str(root / "nats" / "jetstream"))
    postmaster = _sleeper("-D", str(cluster))
    bystander = _sleeper("-D", str(other), env={**os.environ, reap.MARK: str(root) + "-not"})
    executor = _sleeper("-m", "teto.cli", "executor", env={**os.environ, reap.MARK: str(root)})  # started by it
    try:
        time.sleep(0.2)  # their command lines are in /proc
        killed = reap.reap(root, shared)
        assert sorted(killed) == sorted([server.pid, postmaster.pid, executor.pid])
        assert _gone(server) and _gone(postmaster) and _gone(executor) and bystander.poll() is None
        assert not root.exists() and not cluster.exists() and not (shared / "data-abc.origin").exists()
        assert other.exists() and (shared / "data-def.origin").exists()
    finally:
        for p in (server, postmaster, bystander, executor):
            p.kill()
            p.wait()


def test_a_claim_marks_the_processes_this_session_starts(tmp_path, monkeypatch):
    monkeypatch.delenv(reap.MARK, raising=False)
    reap.claim(tmp_path)
    child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{reap.MARK}'])"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(tmp_path)


def test_a_claim_replaces_the_owner_file_whole_never_writes_into_it(tmp_path, monkeypatch):
    """Another session scanning while this one claims must see the old owner or the new one: an empty file, read
    between a truncation and its write, would make it take this live root for abandoned and reap it."""
    monkeypatch.delenv(reap.MARK, raising=False)
    root = tmp_path / "teto-test-x"
    root.mkdir()
    (root / reap.OWNER).write_text("1 1")
    os.link(root / reap.OWNER, tmp_path / "seen-before")  # a reader holding the old file
    reap.claim(root)
    assert (tmp_path / "seen-before").read_text() == "1 1"  # replaced by rename, not truncated in place
    assert reap.owner_alive(root) and sorted(p.name for p in root.iterdir()) == [reap.OWNER]
