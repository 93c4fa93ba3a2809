"""Pure parts of the executor: the lease contact rule, usage samples, the launch environment, settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.executor import launch
from agents.executor.heartbeat import UsageMeter
from agents.executor.lease import Contact
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, FinetuneWorkload
from libs.contracts.telemetry import GpuInfo
from libs.runtime.settings import SettingsError
from tests.support import builders

pytestmark = pytest.mark.unit


# -- lease contact ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("since_contact", "lost"), [(0.0, False), (4.49, False), (4.5, True), (10.0, True)],
                         ids=["just-renewed", "just-before-deadline", "at-deadline", "long-gone"])
def test_contact_is_lost_at_lease_minus_margin(since_contact, lost):
    contact = Contact(lease_seconds=6.0, stop_margin_seconds=1.5, last_contact=100.0)
    assert contact.lost(100.0 + since_contact) is lost


def test_contact_never_moves_backwards_when_replies_arrive_out_of_order():
    contact = Contact(lease_seconds=6.0, stop_margin_seconds=1.5, last_contact=100.0)
    contact.acknowledged(103.0)
    contact.acknowledged(101.0)  # a late reply to an earlier renewal
    assert contact.last_contact == 103.0 and contact.deadline == 107.5


# -- usage samples ------------------------------------------------------------------------------------------

def test_usage_samples_are_numbered_and_cover_wall_time_while_running():
    meter = UsageMeter()
    assert meter.next_sample(0.0) is None  # idle: nothing to charge
    meter.start("j", 2, devices=1, now=10.0)
    first = meter.next_sample(13.0)
    assert (first.seq, first.wall_seconds, first.devices, first.epoch) == (1, 3.0, 1, 2)
    meter.acknowledged(first)
    second = meter.next_sample(14.5)
    assert (second.seq, second.wall_seconds) == (2, 1.5)


def test_an_unacknowledged_sample_is_resent_unchanged_and_no_time_is_lost():
    meter = UsageMeter()
    meter.start("j", 1, devices=2, now=0.0)
    lost = meter.next_sample(1.0)
    assert meter.next_sample(2.0) is lost  # the heartbeat failed: same seq again
    meter.acknowledged(lost)
    nxt = meter.next_sample(3.0)
    assert (nxt.seq, nxt.wall_seconds, nxt.devices) == (2, 2.0, 2)


def test_the_last_stretch_is_charged_after_the_process_ends_and_then_nothing():
    meter = UsageMeter()
    meter.start("j", 1, devices=1, now=0.0)
    meter.acknowledged(meter.next_sample(1.0))
    meter.finish(1.25)
    final = meter.next_sample(50.0)
    assert (final.seq, final.wall_seconds) == (2, 0.25)
    meter.acknowledged(final)
    assert meter.next_sample(60.0) is None and meter.backlog == 0


def test_a_new_run_starts_numbering_again():
    meter = UsageMeter()
    meter.start("a", 1, devices=1, now=0.0)
    meter.finish(1.0)
    meter.acknowledged(meter.next_sample(1.0))
    meter.start("a", 2, devices=1, now=2.0)
    s = meter.next_sample(3.0)
    assert (s.epoch, s.seq) == (2, 1)


# -- launch -------------------------------------------------------------------------------------------------

def _settings(tmp_path, **kw) -> ExecutorSettings:
    return ExecutorSettings.from_env(env={}, **{"data_dir": tmp_path, "executor_id": "ex-1", **kw})


def _grant(workload, **kw) -> RunJob:
    return builders.grant(builders.spec(workload=workload, checkpoint_every_steps=7, **kw), epoch=3, attempt=2)


def test_command_environment_tells_the_script_everything_and_cannot_be_overridden(tmp_path):
    grant = _grant(CommandWorkload(command=["train"], env={"LR": "0.1", "TETO_JOB_ID": "forged"}))
    resume = tmp_path / "checkpoints" / "j1" / "step-00000007.pt"
    got = launch.build(grant, _settings(tmp_path), [], resume_from=resume,
                       base_env={"PATH": "/bin", "TETO_NATS_URL": "nats://secret"})
    env = got.env
    assert got.argv == ["train"] and got.guarded  # the command itself, started by the agent's guard
    assert got.cwd == tmp_path / "executors" / "ex-1" / "jobs" / "j1"  # its own, never the agent's
    assert env["LR"] == "0.1" and env["PATH"] == "/bin" and "TETO_NATS_URL" not in env
    assert (env["TETO_JOB_ID"], env["TETO_EPOCH"], env["TETO_ATTEMPT"]) == ("j1", "3", "2")
    assert env["TETO_RESUME_FROM"] == str(resume.resolve()) and env["TETO_CHECKPOINT_EVERY"] == "7"
    assert env["TETO_CHECKPOINT_DIR"] == str((tmp_path / "checkpoints" / "j1").resolve())
    assert (env["TETO_RANK"], env["TETO_WORLD_SIZE"], env["TETO_DEVICE"]) == ("0", "1", "cpu")
    assert str(launch.PROJECT_ROOT) in env["PYTHONPATH"].split(":")


@pytest.mark.parametrize(("spec_kept", "agent_kept", "told"), [
    (None, None, "3"),  # the executor's default
    (None, 7, "7"),
    (5, 7, "5"),  # the job's own wins
    (0, 7, "0"),  # the job keeps every one
    (None, 0, "0"),
])
def test_the_script_is_told_how_many_checkpoints_to_keep(tmp_path, spec_kept, agent_kept, told):
    grant = _grant(CommandWorkload(command=["train"], env={"TETO_CHECKPOINTS_KEPT": "999"}),
                   checkpoints_kept=spec_kept)
    settings = _settings(tmp_path, **({} if agent_kept is None else {"checkpoints_kept": agent_kept}))
    assert launch.build(grant, settings, [], resume_from=None, base_env={}).env["TETO_CHECKPOINTS_KEPT"] == told


def test_finetune_runs_the_builtin_module_with_its_params_in_its_job_dir(tmp_path):
    grant = _grant(FinetuneWorkload())
    got = launch.build(grant, _settings(tmp_path), [], resume_from=None, base_env={})
    assert got.argv[1:] == ["-m", launch.FINETUNE_MODULE] and got.env["TETO_RESUME_FROM"] == ""
    assert '"steps":300' in got.env["TETO_PARAMS"] and got.cwd == tmp_path / "executors" / "ex-1" / "jobs" / "j1"


@pytest.mark.parametrize(("gpus", "asked", "held", "visible"), [
    (0, 0, 1, ""), (0, 4, 1, ""), (4, 0, 1, "0"), (4, 2, 2, "0,1"), (2, 8, 2, "0,1"),
], ids=["cpu", "cpu-asked-gpus", "gpu-node-any-job", "two-of-four", "more-than-there-are"])
@pytest.mark.parametrize("job_sets", [{}, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NVIDIA_VISIBLE_DEVICES": "all"}],
                         ids=["job-silent", "job-asks-for-more"])
def test_devices_charged_and_visible(tmp_path, gpus, asked, held, visible, job_sets):
    """The agent alone says which devices a run sees, and they are the ones it is charged for."""
    infos = [GpuInfo(index=i, name="H200") for i in range(gpus)]
    grant = _grant(CommandWorkload(command=["x"], env=job_sets), gpus_per_worker=asked)
    assert launch.devices_held(grant, infos) == held
    env = launch.build(grant, _settings(tmp_path), infos, resume_from=None,
                       base_env={"CUDA_VISIBLE_DEVICES": "7"}).env
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == visible
    assert env["TETO_DEVICE"] == ("cuda" if gpus else "cpu")


# -- settings -----------------------------------------------------------------------------------------------

def test_default_ids_are_distinct_per_agent_and_safe_as_subject_tokens(tmp_path):
    a, b = _settings(tmp_path, executor_id=None), _settings(tmp_path, executor_id=None)
    assert a.executor_id != b.executor_id and a.node_id != b.node_id
    assert a.node_id.rsplit("-", 1)[-1] == a.executor_id.rsplit("-", 1)[-1]
    assert all(c.isalnum() or c in "-_" for c in a.executor_id + a.node_id)


def test_abandon_grace_leaves_the_process_dead_before_the_lease_ends(tmp_path):
    s = _settings(tmp_path, lease_seconds=6, heartbeat_seconds=1, stop_margin_seconds=1.5, stop_grace_seconds=10)
    assert s.abandon_grace_seconds < s.effective_stop_margin


def test_a_progress_interval_longer_than_the_lease_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="progress interval"):
        _settings(tmp_path, lease_seconds=6, heartbeat_seconds=1, stop_margin_seconds=1,
                  progress_interval_seconds=10)


class _Proc:
    """A process whose Popen-style methods must not be used: they poll, and a poll can reap the child behind
    asyncio's watcher (which then reports exit status 255)."""

    pid = 4242
    returncode = None

    def send_signal(self, sig):  # noqa: ARG002
        raise AssertionError("send_signal polls and may reap the child")

    def poll(self):
        raise AssertionError("poll may reap the child")


def test_signalling_a_run_goes_to_its_process_group_and_never_polls(monkeypatch):
    import signal as sig

    from agents.executor import process, runner

    sent = []
    monkeypatch.setattr(runner.os, "killpg", lambda pid, s: sent.append(("group", pid, s)))
    monkeypatch.setattr(runner.os, "kill", lambda pid, s: sent.append(("pid", pid, s)))
    child = runner.Child(proc=_Proc(), launch=process.Launch(argv=["x"], env={}, log_path=Path("/dev/null")))
    child.signal(sig.SIGKILL)
    assert sent == [("group", 4242, sig.SIGKILL)]

    def no_group(pid, s):
        raise ProcessLookupError

    monkeypatch.setattr(runner.os, "killpg", no_group)
    child.signal(sig.SIGTERM)  # not a group leader any more: the process alone
    assert sent[-1] == ("pid", 4242, sig.SIGTERM)



async def test_shutdown_waits_are_bounded_even_for_a_task_that_ignores_cancellation(caplog):
    import asyncio
    import time

    from agents.executor.main import _settle

    release = asyncio.Event()

    async def stubborn():
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # a buggy loop that swallows its cancellation

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    task.cancel()
    t0 = time.monotonic()
    await _settle([task], 0.3)
    assert time.monotonic() - t0 < 2.0
    assert "stubborn did not stop" in caplog.text
    release.set()  # leave nothing behind
    task.cancel()
    await asyncio.wait([task], timeout=2)
    assert task.done()


def test_a_runs_paths_are_absolute_and_resolved_through_a_linked_root_as_realpath_would(tmp_path, monkeypatch):
    """The roots are resolved once per agent (launch.absolute), the run's own paths joined below them: the same
    paths a realpath of each gives, for a relative data directory reached through a link."""
    real = tmp_path / "real"
    (real / "executors" / "ex-1" / "jobs" / "j1").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    got = launch.build(_grant(CommandWorkload(command=["train"])), _settings(Path("link")), [], resume_from=None,
                       base_env={})
    work = Path("link") / "executors" / "ex-1" / "jobs" / "j1"
    env = got.env
    assert env["TETO_WORK_DIR"] == env["HOME"] == str(work.resolve()) == str(real / "executors" / "ex-1" / "jobs" / "j1")
    assert env["TMPDIR"] == str((work / "tmp").resolve())
    assert env["TETO_STOP_FILE"] == str((work / "epoch-3.stop.json").resolve())
    assert env["TETO_CHECKPOINT_DIR"] == str((Path("link") / "checkpoints" / "j1").resolve())
    assert env["TETO_BASE_DIR"] == str((Path("link") / "base").resolve())


@pytest.mark.parametrize("extra", ["", "NCCL_*, MY_VAR", "TETO_*"])
def test_the_scrubbed_environment_is_exactly_the_allowed_names(extra):
    from agents.executor import isolation

    env = {"PATH": "/bin", "LC_ALL": "C", "LCX": "no", "NCCL_DEBUG": "INFO", "MY_VAR": "1", "MY_VARIANT": "no",
           "TETO_NATS_URL": "secret", "HOME": "/root"}
    allow = isolation.parse_allow(extra)
    expected = {k: v for k, v in env.items()
                if not k.startswith("TETO_") and isolation.allowed(k, (*isolation.BASE_ALLOW, *allow))}
    assert isolation.scrub_env(env, allow) == expected
    assert "LCX" not in expected and "MY_VARIANT" not in expected and "TETO_NATS_URL" not in expected
