"""The agent's long-lived run guard (guard.py, guard_client.py): a user's command that trains in a grandchild
(``sh -c``) dies with its agent, and with the guard; signals reach it; its exit status passes through; its
descriptors, environment, working directory, umask, cgroup and uid are the run's; one guard serves every run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from agents.executor import guard, guard_child, guard_protocol
from agents.executor.guard_client import GUARD, GUARD_LOST, Guard
from tests.support.services import eventually_blocking

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) is not training.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def _run(g: Guard, argv: list[str], **kw) -> tuple[int, bytes, bytes, bytes]:
    """(exit status, stdout, stderr, what the command wrote to its report pipe) of one command."""
    read_fd, write_fd = os.pipe()
    try:
        proc = await g.spawn(argv, kw.pop("env", {"PATH": os.environ["PATH"]}), report_fd=write_fd, **kw)
    finally:
        os.close(write_fd)
    out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
    rc = await proc.wait()
    with os.fdopen(read_fd, "rb") as f:
        report = f.read()
    return rc, out, err, report


def _guard_pid(g: Guard) -> int:
    assert g.proc is not None
    return g.proc.pid


STAND_IN_AGENT = textwrap.dedent("""
    import asyncio, os, sys
    from agents.executor.guard_client import Guard

    async def main():
        g = Guard(sys.executable)
        r, w = os.pipe()
        await g.spawn(["sh", "-c", "sleep 300 & echo $! > " + sys.argv[1] + "; wait"],
                      {"PATH": os.environ["PATH"]}, report_fd=w)
        print(g.proc.pid, flush=True)
        await asyncio.sleep(300)

    asyncio.run(main())
""")


def test_a_grandchild_of_a_command_dies_when_the_agent_is_killed(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    agent = subprocess.Popen([sys.executable, "-c", STAND_IN_AGENT, str(pid_file)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    guard_pid = int(agent.stdout.readline())
    eventually_blocking(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command to start",
                        every=0.05)
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild) and _alive(guard_pid)
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    eventually_blocking(lambda: not _alive(grandchild), what="the grandchild to end with its agent", every=0.05)
    eventually_blocking(lambda: not _alive(guard_pid), what="the guard to end with its agent", every=0.05)


async def test_a_command_dies_with_its_guard_and_the_next_run_gets_a_new_guard(tmp_path):
    g = Guard(sys.executable)
    try:
        read_fd, write_fd = os.pipe()
        proc = await g.spawn(["sleep", "300"], {"PATH": os.environ["PATH"]}, report_fd=write_fd)
        os.close(write_fd)
        os.close(read_fd)
        first = _guard_pid(g)
        os.kill(first, signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), 10) == GUARD_LOST
        eventually_blocking(lambda: not _alive(proc.pid), what="the command to end with its guard", every=0.05)
        rc, out, _, _ = await _run(g, ["sh", "-c", "echo again"])
        assert (rc, out) == (0, b"again\n") and _guard_pid(g) != first
    finally:
        await g.close()


async def test_exit_status_signals_and_a_missing_program(tmp_path):
    g = Guard(sys.executable)
    try:
        assert (await _run(g, ["sh", "-c", "exit 3"]))[0] == 3
        assert (await _run(g, ["sh", "-c", "kill -9 $$"]))[0] == 128 + signal.SIGKILL  # as a shell reports it
        rc, _, err, _ = await _run(g, [str(tmp_path / "missing")])
        assert rc == 127 and b"cannot start" in err
        # A signal sent to the guard alone (not by its dying agent) reaches the commands' groups.
        read_fd, write_fd = os.pipe()
        proc = await g.spawn(["sleep", "300"], {"PATH": os.environ["PATH"]}, report_fd=write_fd)
        os.close(write_fd)
        os.close(read_fd)
        assert os.getpgid(proc.pid) == proc.pid  # its own group: the agent stops a run by signalling it
        await asyncio.sleep(0.2)
        os.kill(_guard_pid(g), signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 128 + signal.SIGTERM
        assert (await _run(g, ["true"]))[0] == 0  # and the guard serves on
    finally:
        await g.close()


async def test_the_command_gets_its_descriptors_environment_and_directory_and_nothing_else(tmp_path):
    g = Guard(sys.executable)
    try:
        script = ('import json, os, sys; os.write(int(os.environ["TETO_REPORT_FD"]), os.environ["TETO_SOMETHING"]'
                  '.encode()); print(json.dumps([sorted(int(f) for f in os.listdir("/proc/self/fd")), os.getcwd(),'
                  ' os.umask(0), os.environ.get("TETO_NATS_URL")])); sys.stderr.write("err")')
        env = {"PATH": os.environ["PATH"], "TETO_SOMETHING": "kept"}
        rc, out, err, report = await _run(g, [sys.executable, "-c", script], env=env, cwd=tmp_path, umask=0o077)
        assert (rc, err, report) == (0, b"err", b"kept")
        # 0-2, the report pipe as 3, and the listing's own directory: not the guard's socket or anything else
        assert json.loads(out) == [[0, 1, 2, 3, 4], str(tmp_path), 0o077, None]
        # The guard holds nothing of the agent's environment (its credentials).
        assert Path(f"/proc/{_guard_pid(g)}/environ").read_bytes().count(b"=") <= 1
    finally:
        await g.close()


async def test_one_guard_serves_every_run_and_closing_it_kills_what_still_runs():
    g = Guard(sys.executable)
    read_fd, write_fd = os.pipe()
    try:
        for _ in range(3):
            assert (await _run(g, ["true"]))[0] == 0
        first = _guard_pid(g)
        proc = await g.spawn(["sleep", "300"], {"PATH": os.environ["PATH"]}, report_fd=write_fd)
        assert _guard_pid(g) == first
    finally:
        os.close(write_fd)
        os.close(read_fd)
        await g.close()
    eventually_blocking(lambda: not _alive(proc.pid), what="the command to end with its closed guard", every=0.05)
    assert not _alive(first)


def test_a_guard_whose_parent_is_not_the_agent_named_serves_nothing():
    """The agent died between starting the guard and the guard's parent-death request."""
    import socket

    ours, theirs = socket.socketpair()
    res = subprocess.run([sys.executable, "-I", "-S", str(GUARD), "--parent", "1", "--socket", str(theirs.fileno())],
                         pass_fds=(theirs.fileno(),), timeout=30)
    assert res.returncode == guard_protocol.AGENT_GONE
    theirs.close()
    assert ours.recv(10) == b""  # it closed its end without serving
    ours.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="taking a run's uid needs root")
async def test_a_command_takes_the_runs_uid_without_groups_and_the_guard_stays_the_agents(tmp_path):
    g = Guard(sys.executable)
    try:
        rc, out, _, _ = await _run(g, ["sh", "-c", "id -u; id -g; id -G; grep ^PPid /proc/$$/status"],
                                   uid=200777, gid=200777, cwd=Path("/"))
        uid, gid, groups, ppid = out.decode().split("\n")[:4]
        assert (rc, uid, gid, groups) == (0, "200777", "200777", "200777")
        assert int(ppid.split()[1]) == _guard_pid(g)
        assert os.stat(f"/proc/{_guard_pid(g)}").st_uid == 0
    finally:
        await g.close()


async def test_a_run_in_a_sandbox_is_in_its_cgroup_and_its_leftovers_die(tmp_path):
    """runner.Child through the guard: the command joins the run's cgroup before it starts, never holds the
    agent's cgroup.procs, has the sandbox's umask, and what it left behind dies with the run."""
    from agents.executor import sandbox as sandboxes
    from agents.executor.process import Launch
    from agents.executor.runner import Child

    root = sandboxes.find_cgroup_root()
    name = f"test-guard-{uuid.uuid4().hex[:8]}"
    try:
        box = sandboxes.open_sandbox(uid_range="", workload_user="", lock_dir=tmp_path / "locks", use_cgroup=True,
                                     cgroup_root=root, cgroup_name=lambda r: r / "teto" / name,
                                     dirs=[tmp_path / "work"], start=0)
    except OSError:
        box = None
    if root is None or box is None or box.cgroup is None:
        pytest.skip("no writable cgroup v2 here")
    pid_file, seen = tmp_path / "left.pid", tmp_path / "seen"
    script = (f"sleep 300 & echo $! > {pid_file}; cat /proc/self/cgroup > {seen}; ls -l /proc/self/fd/ >> {seen}; "
              f"umask >> {seen}")
    g = Guard(sys.executable)
    try:
        child = await Child.start(Launch(argv=["sh", "-c", script], env={"PATH": os.environ["PATH"]},
                                         log_path=tmp_path / "run.log", guarded=True), lambda record: None, box,
                                  guard=g)
        assert await child.wait() == 0
    finally:
        await g.close()
    text = seen.read_text()
    assert any(line.startswith("0::") and line.endswith(f"/teto/{name}") for line in text.splitlines())
    assert "cgroup.procs" not in text  # closed at exec: the command cannot move processes
    assert "0077" in text
    left = int(pid_file.read_text())
    eventually_blocking(lambda: not _alive(left), what="the run's leftover to end with it", every=0.05)
    assert not box.cgroup.path.exists()


async def test_a_guard_that_fails_kills_its_commands_groups_before_it_goes(tmp_path):
    """A request the guard cannot read ends it (a bug, not a run's input): whatever its commands started dies
    first, grandchildren included (their parent-death signal reaches only the commands themselves)."""
    pid_file = tmp_path / "grandchild.pid"
    g = Guard(sys.executable)
    read_fd, write_fd = os.pipe()
    try:
        proc = await g.spawn(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], {"PATH": os.environ["PATH"]},
                             report_fd=write_fd)
        eventually_blocking(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command to start",
                            every=0.05)
        grandchild = int(pid_file.read_text())
        assert g.sock is not None
        g.sock.sendall(guard_protocol.HEADER.pack(5) + b"{nope")  # not JSON
        assert await asyncio.wait_for(proc.wait(), 10) == GUARD_LOST
        eventually_blocking(lambda: not _alive(grandchild), what="the grandchild to end with its failed guard",
                            every=0.05)
    finally:
        os.close(write_fd)
        os.close(read_fd)
        await g.close()


def _fresh_cgroup(tmp_path: Path) -> Path:
    from agents.executor import sandbox as sandboxes

    root = sandboxes.find_cgroup_root()
    if root is None:
        pytest.skip("no cgroup v2 here")
    path = root / "teto" / f"test-born-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True)
    except OSError:
        pytest.skip("no writable cgroup v2 here")
    return path


async def test_a_command_is_born_in_its_runs_cgroup_without_a_write_to_cgroup_procs(tmp_path):
    """The guard starts the command inside the run's cgroup (clone3 into it) rather than moving it there after a
    fork: a write to cgroup.procs waits for an RCU grace period, most of a run's start on a busy node. Handed a
    cgroup.procs it can only read, the command still starts in the cgroup (the old fork-and-write refused: 126)."""
    cgroup = _fresh_cgroup(tmp_path)
    procs = os.open(cgroup / "cgroup.procs", os.O_RDONLY)
    g = Guard(sys.executable)
    try:
        rc, out, err, _ = await _run(g, ["cat", "/proc/self/cgroup"], cgroup_fd=procs)
    finally:
        os.close(procs)
        await g.close()
        eventually_blocking(lambda: not (cgroup / "cgroup.procs").read_text().strip(), what="the cgroup to empty",
                            every=0.05)
        cgroup.rmdir()
    assert rc == 0, err
    assert f"0::/{cgroup.relative_to(cgroup.parents[1])}" in out.decode() or out.decode().strip().endswith(
        f"/teto/{cgroup.name}"), out


FORK_INTO = textwrap.dedent("""
    import ctypes, errno, json, os, sys
    sys.path.insert(0, sys.argv[3])
    from agents.executor import guard_child

    if sys.argv[2] == "no-clone3":
        guard_child._CLONE3[:] = [None]
    elif sys.argv[2] == "enosys":
        def refused(dir_fd):
            return -1, errno.ENOSYS
        guard_child._CLONE3[:] = [refused]
    procs = os.open(sys.argv[1], os.O_WRONLY)
    pid, born_in = guard_child.fork_into(procs)
    if pid == 0:
        if not born_in:
            os.write(procs, b"0")
        os.write(1, open("/proc/self/cgroup").read().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"born_in": born_in, "after": None if not guard_child._CLONE3 else guard_child._CLONE3[0] is None}))
""")


@pytest.mark.parametrize(("how", "born_in", "clone3_forgotten"), [
    ("clone3", True, False), ("no-clone3", False, True), ("enosys", False, True)])
def test_where_clone3_is_refused_the_child_joins_after_a_fork_and_the_guard_stops_trying(tmp_path, how, born_in,
                                                                                         clone3_forgotten):
    cgroup = _fresh_cgroup(tmp_path)
    try:
        out = subprocess.run([sys.executable, "-c", FORK_INTO, str(cgroup / "cgroup.procs"), how, str(ROOT)],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        eventually_blocking(lambda: not (cgroup / "cgroup.procs").read_text().strip(), what="the cgroup to empty",
                            every=0.05)
        cgroup.rmdir()
    *lines, last = out.strip().splitlines()
    assert json.loads(last) == {"born_in": born_in, "after": clone3_forgotten}
    assert any(line.startswith("0::") and line.endswith(f"/teto/{cgroup.name}") for line in lines), out


def test_a_procs_descriptor_that_is_not_a_cgroups_gets_no_clone3(tmp_path):
    # Only the directory whose cgroup.procs is the very file handed over is ever cloned into.
    fake = tmp_path / "elsewhere" / "cgroup.procs"
    fake.parent.mkdir()
    fake.write_text("")
    other = tmp_path / "other.txt"
    other.write_text("")
    for path in (fake, other):
        fd = os.open(path, os.O_RDONLY)
        try:
            found = guard_child.cgroup_dir(fd)
            if path == fake:  # the same file: its directory (clone3 then refuses a directory that is no cgroup)
                assert found is not None and os.path.samestat(os.fstat(found), os.stat(fake.parent))
                os.close(found)
            else:
                assert found is None
        finally:
            os.close(fd)


def test_a_signal_the_guard_had_not_handled_when_it_forked_is_not_acted_on_by_the_child(tmp_path):
    """clone3 copies the interpreter's pending signals as they are: the child must not take itself for the guard
    and kill every run's group on the way to its exec."""
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    a, b = __import__("socket").socketpair()
    try:
        g = guard.Guard(agent=12345, sock=a)  # not our parent: a real guard would kill all and exit here
        g.live.add(sleeper.pid)
        g.pid = os.getpid() + 1  # as seen from a child of the guard
        g.on_signal(signal.SIGTERM, None)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        a.close()
        b.close()
