"""Job isolation's pure rules: the environment a run inherits, per-run uids, cgroup paths, what a workload uid can
reach, what an agent says it cannot enforce; and the launch and ``teto up`` decisions built on them."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.executor import checkpoints, isolation, launch
from agents.executor.isolation import IsolationError, UidRange
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.runtime.settings import SettingsError
from teto.stack import isolation as up_isolation

AGENT_ENV = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC", "HOME": "/root",
             "TETO_DATABASE_URL": "postgresql://u:pw@db/teto", "TETO_NATS_URL": "nats://u:pw@bus",
             "TETO_TOKENS_FILE": "/data/tokens.json", "TETO_NATS_PASSWORD": "pw", "AWS_SECRET_ACCESS_KEY": "k",
             "PYTHONPATH": "/agent/only", "LD_PRELOAD": "/evil.so", "NCCL_DEBUG": "INFO", "SSH_AUTH_SOCK": "/s"}


def test_a_run_inherits_only_locale_time_zone_and_path():
    assert isolation.scrub_env(AGENT_ENV) == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC"}


def test_more_names_can_be_allowed_but_never_a_teto_setting():
    got = isolation.scrub_env(AGENT_ENV, isolation.parse_allow("NCCL_*, TETO_*, TETO_DATABASE_URL ,"))
    assert got["NCCL_DEBUG"] == "INFO" and not [k for k in got if k.startswith("TETO_")]


@pytest.mark.parametrize(("indices", "visible"), [(None, ""), ([], ""), ([0], "0"), ([2, 3], "2,3")])
def test_device_variables_name_exactly_the_granted_devices(indices, visible):
    assert isolation.device_env(indices) == {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}


@pytest.mark.parametrize(("value", "expected"), [
    ("", None), ("200000-200999", UidRange(200000, 200999)), (" 5000 - 5000 ", UidRange(5000, 5000))])
def test_uid_ranges(value, expected):
    assert isolation.parse_uid_range(value) == expected


@pytest.mark.parametrize("value", ["0-100", "200-2000", "5-x", "300000-200000", "1000-4294967295"],
                         ids=["root", "system-accounts", "not-a-range", "reversed", "nobody-overflow"])
def test_uid_ranges_that_would_hand_out_a_system_uid_or_nothing_are_refused(value):
    with pytest.raises(IsolationError):
        isolation.parse_uid_range(value)


def test_settings_refuse_a_bad_uid_range_at_start_up():
    with pytest.raises(SettingsError, match="1000"):
        ExecutorSettings.from_env(env={"TETO_WORKLOAD_UID_RANGE": "0-10"})


def test_uid_candidates_cover_the_range_once_from_any_start():
    uids = UidRange(100000, 100004)
    assert isolation.uid_candidates(uids, 7) == [100002, 100003, 100004, 100000, 100001]
    assert sorted(isolation.uid_candidates(uids, 123456789)) == list(range(100000, 100005))


MOUNTS = """sysfs /sys sysfs rw 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


@pytest.mark.parametrize(("text", "mount"), [
    (MOUNTS, Path("/sys/fs/cgroup/unified")), ("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", Path("/sys/fs/cgroup")),
    ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", None)], ids=["hybrid", "pure-v2", "v1-only"])
def test_the_cgroup2_mount_is_found_in_the_mount_table(text, mount):
    assert isolation.cgroup2_mount(text) == mount


def test_a_run_cgroup_sits_under_its_agent_and_cannot_climb_out():
    root = Path("/sys/fs/cgroup/unified")
    assert isolation.run_cgroup(root, "ex-1", "job1", 3, 1) == root / "teto" / "ex-1" / "job1-e3-r1"
    assert isolation.run_cgroup(root, "../..", "../x", 1).parent == root / "teto" / "x"
    assert ".." not in isolation.run_cgroup(root, "..", "..", 1).parts


def _stat(modes: dict[str, int]):
    def lstat(path: Path) -> os.stat_result:
        if str(path) not in modes:
            raise FileNotFoundError(2, "No such file or directory")
        return os.stat_result((modes[str(path)], 0, 0, 1, 0, 0, 0, 0, 0, 0))
    return lstat


def test_what_a_workload_uid_cannot_reach_is_named_with_its_mode():
    modes = {"/": 0o40755, "/root": 0o40700, "/root/venv": 0o40755, "/root/venv/python": 0o100755,
             "/opt": 0o40755, "/opt/teto": 0o40755}
    lstat = _stat(modes)
    assert isolation.unreachable(Path("/root/venv/python"), stat.S_IXOTH, lstat) == \
        "/root (mode 0700) cannot be entered by other users"
    assert isolation.unreachable(Path("/opt/teto"), stat.S_IXOTH | stat.S_IROTH, lstat) is None
    problems = isolation.reach_problems(Path("/root/venv/python"), Path("/opt/teto"), [Path("/opt/missing")], lstat)
    assert len(problems) == 2 and "No such file" in problems[1]
    advice = isolation.reach_advice(problems, 200001)
    assert "TETO_WORKLOAD_PYTHON" in advice and "/root (mode 0700)" in advice


@pytest.mark.parametrize(("kw", "says"), [
    (dict(is_root=False, uid_range="200000-200999", workload_user="", cgroup=True, cgroup_found=True), "not root"),
    (dict(is_root=True, uid_range="", workload_user="", cgroup=True, cgroup_found=True), "run as root"),
    (dict(is_root=True, uid_range="", workload_user="teto-job", cgroup=True, cgroup_found=True), "not from each"),
    (dict(is_root=False, uid_range="", workload_user="", cgroup=True, cgroup_found=False), "setsid"),
], ids=["not-root", "root-unconfigured", "one-user", "no-cgroup"])
def test_what_cannot_be_enforced_is_said(kw, says):
    assert any(says in line for line in isolation.limits(**kw))


def test_a_root_agent_with_per_run_uids_and_a_cgroup_enforces_everything():
    assert isolation.limits(is_root=True, uid_range="200000-200999", workload_user="", cgroup=True,
                            cgroup_found=True) == []


def test_a_run_is_told_its_own_home_and_temp_dir_and_can_use_another_interpreter(tmp_path):
    settings = ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1",
                                         workload_python="/usr/bin/python3.11")
    grant = RunJob(job_id="j1", epoch=1, executor_id="ex-1", attempt=1, lease_seconds=6, heartbeat_seconds=1,
                   spec=JobSpec(workload=CommandWorkload(command=["x"], env={"HOME": "/root"})))
    got = launch.build(grant, settings, [], resume_from=None, base_env=AGENT_ENV)
    work = tmp_path / "executors" / "ex-1" / "jobs" / "j1"
    assert got.env["HOME"] == str(work.resolve()) and got.env["TMPDIR"] == str((work / "tmp").resolve())
    assert got.argv == ["x"] and launch.interpreter(settings) == "/usr/bin/python3.11"  # the guard's (Agent.guard)
    assert set(got.env["PYTHONPATH"].split(":")) >= {str(launch.PROJECT_ROOT), *map(str, launch.packages())}
    assert "/agent/only" not in got.env["PYTHONPATH"] and "LD_PRELOAD" not in got.env
    assert launch.run_dirs(settings, grant) == [work, work / "tmp", tmp_path / "checkpoints" / "j1"]
    # Only rank 0 writes checkpoints, so only rank 0's uid is given the job's checkpoint directory.
    assert launch.run_dirs(settings, grant.model_copy(update={"rank": 1})) == [work, work / "tmp"]


def test_a_link_is_never_a_checkpoint(tmp_path):
    real = checkpoints.save_bytes(tmp_path / "a", 1, b"weights")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "step-00000001.pt").symlink_to(real.path)
    (tmp_path / "b" / "step-00000001.json").write_bytes(checkpoints.sidecar_path(real.path).read_bytes())
    ckpt, reason = checkpoints.validate(tmp_path / "b" / "step-00000001.pt")
    assert ckpt is None and "link" in reason


# -- teto up ------------------------------------------------------------------------------------------------------

def test_teto_up_as_root_gives_each_run_its_own_uid_unless_told_otherwise(monkeypatch):
    monkeypatch.setattr(up_isolation, "workload_python", lambda: ("", []))
    own, lines = up_isolation.executor_env({}, is_root=True)
    assert own == {"TETO_WORKLOAD_UID_RANGE": up_isolation.DEFAULT_UID_RANGE}
    assert not [line for line in lines if "NOT ENFORCED" in line]
    assert up_isolation.executor_env({"TETO_WORKLOAD_UID_RANGE": "300000-300009"}, is_root=True)[0] == {}
    assert up_isolation.executor_env({"TETO_WORKLOAD_USER": "teto-job"}, is_root=True)[0] == {}


def test_teto_up_as_root_with_an_unreachable_python_uses_the_systems_or_says_why_not(monkeypatch):
    monkeypatch.setattr(up_isolation, "workload_python", lambda: ("/usr/bin/python3.11", ["/root (mode 0700)"]))
    own, _ = up_isolation.executor_env({}, is_root=True)
    assert own["TETO_WORKLOAD_PYTHON"] == "/usr/bin/python3.11"
    monkeypatch.setattr(up_isolation, "workload_python", lambda: (None, ["/root (mode 0700)"]))
    own, lines = up_isolation.executor_env({}, is_root=True)
    assert own["TETO_WORKLOAD_UID_RANGE"] == "" and any("NOT ENFORCED" in line and "/root" in line for line in lines)


def test_teto_up_not_as_root_says_what_it_cannot_enforce():
    own, lines = up_isolation.executor_env({}, is_root=False)
    assert own == {} and any(line.startswith("NOT ENFORCED") and "not root" in line for line in lines)


def test_teto_up_data_dir_lets_runs_enter_and_read_nothing_but_theirs(tmp_path):
    data = tmp_path / "data"
    for d in ("executors", "checkpoints", "base", "logs", "nats"):
        (data / d).mkdir(parents=True)
    (data / "stack.json").write_text("{}")
    os.chmod(data / "stack.json", 0o644)
    up_isolation.harden_data_dir(data)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.iterdir()}
    assert stat.S_IMODE(data.stat().st_mode) == 0o711
    assert mode == {"executors": 0o711, "checkpoints": 0o711, "base": 0o755, "logs": 0o700, "nats": 0o700,
                    "stack.json": 0o600}


def test_the_agent_says_what_it_cannot_enforce_from_its_settings(tmp_path, monkeypatch):
    from agents.executor import sandbox

    monkeypatch.setattr(sandbox, "agent_cgroup", lambda executor_id: None)
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    settings = SimpleNamespace(workload_cgroup=True, executor_id="ex-1", workload_uid_range="200000-200999",
                               workload_user="")
    lines = sandbox.describe_limits(settings)
    assert any("not root" in line for line in lines) and any("setsid" in line for line in lines)


def test_run_directories_move_where_runs_can_reach_them_when_the_data_directory_cannot_be_entered(tmp_path):
    """A data directory under a 0700 parent (root's home, pytest's temporary root): the directories runs enter
    are placed under the shared root and linked, so the same paths work for everyone."""
    from teto.stack.isolation import place_run_dirs

    closed = tmp_path / "closed"
    data_dir = closed / "teto"
    (data_dir / "checkpoints" / "job-1").mkdir(parents=True)
    (data_dir / "checkpoints" / "job-1" / "step-00000001.pt").write_bytes(b"x")
    os.chmod(closed, 0o700)
    shared = tmp_path / "shared"
    lines = place_run_dirs(data_dir, shared_root=shared)
    assert lines and "cannot be entered" in lines[0]
    for name in ("executors", "checkpoints", "base"):
        assert (data_dir / name).is_symlink() and (data_dir / name).resolve().parent.parent == shared
    assert (data_dir / "checkpoints" / "job-1" / "step-00000001.pt").read_bytes() == b"x"  # moved, not lost
    assert place_run_dirs(data_dir, shared_root=shared) == lines  # again: nothing moves twice

    os.chmod(closed, 0o755)
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="teto-open-"))  # under /tmp, which everyone enters
    try:
        os.chmod(root, 0o755)
        assert place_run_dirs(root / "teto", shared_root=shared) == []
        assert not (root / "teto" / "checkpoints").exists()
    finally:
        shutil.rmtree(root)
