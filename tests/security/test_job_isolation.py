"""Attacks 1 and 4 (and the leftover-process and device ones) as a job would make them: a real executor agent,
as root, runs attacking ``command`` workloads against a real NATS server, with the data directory laid out and
hardened the way ``teto up`` does. Each attack must be refused or harmless.

Needs root (a per-run uid can only be taken by root) and the system's Python of this version (the venv's
interpreter lives under /root, which a workload uid cannot enter: exactly what TETO_WORKLOAD_PYTHON is for).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from agents.executor import isolation
from agents.executor.settings import ExecutorSettings
from libs.contracts.telemetry import RunOutcome
from services.gateway.auth import create_token
from teto.stack.isolation import harden_data_dir, workload_python
from tests.integration.helpers_executor import TRAIN_SCRIPT, agent_with_fake_queue, command, finetune, process_gone
from tests.support.services import eventually

pytestmark = pytest.mark.security

UID_RANGE = "200000-200999"
PYTHON = workload_python()[0] or sys.executable
if os.geteuid() != 0:
    pytestmark = [pytestmark, pytest.mark.skip(reason="per-run uids need root")]


@pytest.fixture(scope="module")
def base_dir():
    """The fine-tune's base model cache, built once by the agent (root) and only read by runs."""
    root = Path(tempfile.mkdtemp(prefix="teto-sec-base-"))
    os.chmod(root, 0o755)
    yield root / "base"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def data_dir():
    """A data directory where ``teto up`` would make one: the stack file and tokens file in it, hardened."""
    root = Path(tempfile.mkdtemp(prefix="teto-sec-"))
    os.chmod(root, 0o755)
    data = root / "data"
    data.mkdir()
    (data / "stack.json").write_text(json.dumps({"admin_token": "ADMIN-SECRET"}))
    os.chmod(data / "stack.json", 0o600)
    create_token(data / "tokens.json", "local-admin", "admin")
    for d in ("executors", "checkpoints", "base", "logs", "nats"):
        (data / d).mkdir()
    (data / "logs" / "gateway.log").write_text("a log a job must not read")
    harden_data_dir(data)
    yield data
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=[True, False], ids=["cgroup", "no-cgroup"])
def cgroup(request):
    return request.param


@pytest.fixture
async def agent(env, data_dir, monkeypatch, base_dir, cgroup):
    """An agent as root with per-run uids, held by a cgroup per run, or (where there is none) by its process
    group and a sweep of its uid."""
    # The agent's own configuration and credentials, in its environment as a deployment has them.
    monkeypatch.setenv("TETO_DATABASE_URL", "postgresql://teto:DB-SECRET@127.0.0.1/teto")
    monkeypatch.setenv("TETO_NATS_PASSWORD", "NATS-SECRET")
    monkeypatch.setenv("AGENT_ONLY_SECRET", "AGENT-SECRET")
    settings = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", data_dir=data_dir,
                            progress_interval_seconds=0.3, stop_grace_seconds=3.0, workload_uid_range=UID_RANGE,
                            workload_python=PYTHON, workload_cgroup=cgroup, base_model_dir=base_dir,
                            torch_threads=1)
    async with agent_with_fake_queue(settings) as stack:
        yield stack


ATTACK = textwrap.dedent("""
    import json, os, subprocess, sys
    out = {"uid": os.getuid(), "cwd": os.getcwd(), "env": dict(os.environ)}
    def attempt(name, fn):
        try:
            out[name] = ["done", repr(fn())[:200]]
        except OSError as exc:
            out[name] = ["refused", type(exc).__name__]
    data, agent, other = os.environ["DATA"], int(os.environ["AGENT_PID"]), os.environ["OTHER_JOB"]
    attempt("read_stack_file", lambda: open(data + "/stack.json").read())
    attempt("read_tokens_file", lambda: open(data + "/tokens.json").read())
    attempt("list_data_dir", lambda: os.listdir(data))
    attempt("read_service_log", lambda: open(data + "/logs/gateway.log").read())
    attempt("list_checkpoints", lambda: os.listdir(data + "/checkpoints"))
    attempt("read_other_checkpoint", lambda: open(f"{data}/checkpoints/{other}/step-00000002.pt").read())
    attempt("list_other_checkpoint_dir", lambda: os.listdir(f"{data}/checkpoints/{other}"))
    attempt("plant_in_other_checkpoint_dir",
            lambda: open(f"{data}/checkpoints/{other}/step-00000099.pt", "w").write("poison"))
    attempt("list_other_job_dir", lambda: os.listdir(os.environ["OTHER_WORK"]))
    attempt("list_jobs_of_the_node", lambda: os.listdir(os.path.dirname(os.environ["OTHER_WORK"])))
    attempt("list_agent_work_dir", lambda: os.listdir(os.path.dirname(os.path.dirname(os.environ["OTHER_WORK"]))))
    attempt("list_executors", lambda: os.listdir(data + "/executors"))
    attempt("read_agent_environ", lambda: open(f"/proc/{agent}/environ").read())
    attempt("signal_agent", lambda: os.kill(agent, 0))
    attempt("write_own_checkpoint_dir",
            lambda: open(os.environ["TETO_CHECKPOINT_DIR"] + "/mine.txt", "w").write("ok"))
    attempt("write_tmpdir", lambda: open(os.environ["TMPDIR"] + "/scratch", "w").write("ok"))
    # Leave files where the next run of this uid (another tenant, perhaps) could find them.
    for shared in ("/tmp", "/dev/shm"):
        open(f"{shared}/teto-left-{os.environ['MARK']}", "w").write("weights of tenant A")
        os.makedirs(f"{shared}/teto-left-dir-{os.environ['MARK']}/sub")
    # Leave processes behind, three ways; the run ends at once.
    out["setsid_pid"] = subprocess.Popen(["setsid", "sleep", os.environ["MARK"] + "1"]).pid
    subprocess.run(["sh", "-c", "sleep " + os.environ["MARK"] + "2 & exit 0"])
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid(); os.execvp("sleep", ["sleep", os.environ["MARK"] + "3"])
        os._exit(0)
    print(json.dumps(out), flush=True)
""")


def _processes_with(mark: str) -> list[int]:
    """Live processes whose command line holds ``mark`` (a zombie's is empty: it runs nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


async def test_an_attacking_job_reaches_nothing_but_its_own_and_leaves_nothing_behind(agent):
    settings, js, queue = agent
    # A victim tenant's job first, which checkpoints.
    victim = uuid.uuid4().hex
    await queue.grant(js, settings, victim, command({"STEPS": "2"}, PYTHON, TRAIN_SCRIPT), every=1)
    done = await queue.wait_finished(victim, timeout=60)
    assert done.outcome is RunOutcome.SUCCEEDED, done
    victim_ckpt = settings.effective_checkpoint_dir / victim
    assert (victim_ckpt / "step-00000002.pt").exists()
    # Handed back to the agent after the run, private to it.
    assert victim_ckpt.stat().st_uid == os.geteuid() and victim_ckpt.stat().st_mode & 0o077 == 0

    attacker = uuid.uuid4().hex
    mark = f"98{uuid.uuid4().int % 10**6:06d}"
    env = {"DATA": str(settings.data_dir), "AGENT_PID": str(os.getpid()), "OTHER_JOB": victim,
           "OTHER_WORK": str(settings.effective_work_dir / "jobs" / victim), "MARK": mark,
           "CUDA_VISIBLE_DEVICES": "0,1,2,3", "NVIDIA_VISIBLE_DEVICES": "all"}
    await queue.grant(js, settings, attacker, command(env, PYTHON, "-c", ATTACK))
    done = await queue.wait_finished(attacker, timeout=60)
    assert done.outcome is RunOutcome.SUCCEEDED, done
    work = settings.effective_work_dir / "jobs" / attacker
    out = json.loads((work / "epoch-1.log").read_text().strip().splitlines()[-1])

    first, last = (int(x) for x in UID_RANGE.split("-"))
    assert first <= out["uid"] <= last
    assert out["cwd"] == str(work.resolve())
    refused = ["read_stack_file", "read_tokens_file", "list_data_dir", "read_service_log", "list_checkpoints",
               "read_other_checkpoint", "list_other_checkpoint_dir", "plant_in_other_checkpoint_dir",
               "list_other_job_dir", "list_jobs_of_the_node", "list_agent_work_dir", "list_executors",
               "read_agent_environ", "signal_agent"]
    assert {k: out[k][0] for k in refused} == dict.fromkeys(refused, "refused"), out
    assert out["write_own_checkpoint_dir"][0] == out["write_tmpdir"][0] == "done", out
    assert not (victim_ckpt / "step-00000099.pt").exists()

    # Nothing of the agent's configuration: no TETO_* setting, no credentials, no other variable of the agent.
    seen = out["env"]
    assert not {"TETO_DATABASE_URL", "TETO_NATS_URL", "TETO_NATS_PASSWORD", "TETO_DATA_DIR",
                "AGENT_ONLY_SECRET"} & set(seen)
    assert not [k for k, v in seen.items() if "SECRET" in v and k != "ATTACK"]
    assert seen["HOME"] == str(work.resolve()) and seen["TMPDIR"].startswith(str(work.resolve()))
    # The agent alone says which devices a run sees (none on a CPU-only node), whatever the job asked for.
    assert seen["CUDA_VISIBLE_DEVICES"] == seen["NVIDIA_VISIBLE_DEVICES"] == ""

    # Nothing the run started survived it: setsid, `sh -c 'x & exit 0'`, a double fork.
    assert process_gone(out["setsid_pid"])
    assert not _processes_with(mark), "a process the run left behind is still alive"
    # ... nor any file it left in the world-writable directories.
    assert not [p for shared in ("/tmp", "/dev/shm") for p in Path(shared).glob(f"teto-left*{mark}")]
    # The agent takes the next job (the run's uid and cgroup were released).
    after = uuid.uuid4().hex
    await queue.grant(js, settings, after, command({"STEPS": "1"}, PYTHON, TRAIN_SCRIPT))
    assert (await queue.wait_finished(after, timeout=60)).outcome is RunOutcome.SUCCEEDED


async def test_a_job_resumes_from_its_checkpoint_after_a_lease_loss_under_a_fresh_uid(agent):
    settings, js, queue = agent
    job = uuid.uuid4().hex
    await queue.grant(js, settings, job, command({"STEPS": "100000", "STEP_SECONDS": "0.05"}, PYTHON, TRAIN_SCRIPT),
                      every=5)
    await eventually(lambda: queue.of(job, "checkpoint"), 60, "a checkpoint")
    queue.answer = "silent"
    done = await queue.wait_finished(job, epoch=1, timeout=30)
    assert done.outcome is RunOutcome.ABANDONED, done
    ckpt_dir = settings.effective_checkpoint_dir / job
    # Back in the agent's hands: the lost run can no longer touch what the next attempt resumes from.
    assert all(p.stat().st_uid == os.geteuid() for p in [ckpt_dir, *ckpt_dir.iterdir()])
    queue.answer = "ok"
    await queue.grant(js, settings, job, command({"STEPS": "12"}, PYTHON, TRAIN_SCRIPT), epoch=2, attempt=1)
    done = await queue.wait_finished(job, epoch=2, timeout=60)
    assert done.outcome is RunOutcome.SUCCEEDED and done.resumed_from_step and done.resumed_from_step >= 5, done


async def test_a_planted_link_is_never_taken_for_a_checkpoint(agent):
    """A run that links ``step-N.pt`` to a file it cannot read must not get the agent to read it or resume from it."""
    settings, js, queue = agent
    job = uuid.uuid4().hex
    plant = ("import os; d = os.environ['TETO_CHECKPOINT_DIR']; "
             "os.symlink('/etc/shadow', d + '/step-00000500.pt'); "
             "open(d + '/step-00000500.json', 'w').write('{\"step\": 500, \"sha256\": \"x\", \"bytes\": 1}')")
    await queue.grant(js, settings, job, command({}, PYTHON, "-c", plant))
    assert (await queue.wait_finished(job, timeout=60)).outcome is RunOutcome.SUCCEEDED
    await queue.grant(js, settings, job, command({"STEPS": "1"}, PYTHON, TRAIN_SCRIPT), epoch=2)
    done = await queue.wait_finished(job, epoch=2, timeout=60)
    assert done.outcome is RunOutcome.SUCCEEDED and done.resumed_from_step is None, done
    skipped = queue.of(job, "checkpoint_skipped", epoch=2)
    assert skipped and "link" in skipped[0].reason


@pytest.mark.parametrize("cgroup", [True], ids=["cgroup"])
async def test_the_built_in_fine_tune_runs_under_its_uid_and_cannot_touch_the_shared_base_model(agent):
    settings, js, queue = agent
    job = uuid.uuid4().hex
    await queue.grant(js, settings, job, finetune(6), every=3)
    done = await queue.wait_finished(job, timeout=120)
    assert done.outcome is RunOutcome.SUCCEEDED, done
    base = settings.effective_base_model_dir
    assert [p for p in base.iterdir() if p.suffix == ".pt"]
    assert all(p.stat().st_uid == os.geteuid() and not p.stat().st_mode & 0o022 for p in [base, *base.iterdir()])
    attacker = uuid.uuid4().hex
    poison = "import os, glob; p = glob.glob(os.environ['TETO_BASE_DIR'] + '/*.pt')[0]; open(p, 'ab').write(b'x')"
    await queue.grant(js, settings, attacker, command({}, PYTHON, "-c", poison))
    done = await queue.wait_finished(attacker, timeout=60)
    assert done.outcome is RunOutcome.FAILED and "PermissionError" in done.error, done


def test_the_isolation_limits_of_a_root_agent_with_a_uid_range_are_none_but_the_cgroup():
    assert isolation.limits(is_root=True, uid_range=UID_RANGE, workload_user="", cgroup=True,
                            cgroup_found=True) == []


def test_a_gang_rank_resumes_from_its_own_copy_of_rank_0s_checkpoint(tmp_path):
    """Rank 0's uid owns the job's checkpoint directory; another rank gets a copy it owns, never a way in."""
    from agents.executor import checkpoints, sandbox

    ckpt = checkpoints.save_bytes(tmp_path / "checkpoints" / "j", 5, b"weights")
    work = tmp_path / "work"
    work.mkdir()
    copy = sandbox.hand_over(ckpt.path, work, sandbox.Sandbox(uid=200998, gid=200998))
    assert copy.read_bytes() == b"weights" and copy.parent.parent == work
    assert {p.stat().st_uid for p in [copy.parent, *copy.parent.iterdir()]} == {200998}
    assert checkpoints.validate(copy)[0].step == 5


def test_a_gang_rank_resumes_from_its_own_copy_of_rank_0s_checkpoint_directory(tmp_path):
    """The same for a directory checkpoint (issue 27): the whole directory, manifest included, owned by the rank."""
    from agents.executor import checkpoints, ckpt_dir, sandbox

    src = tmp_path / "checkpoints" / "j" / "checkpoint-5"
    (src / "optimizer").mkdir(parents=True)
    (src / "adapter.safetensors").write_bytes(b"weights")
    (src / "optimizer" / "state.pt").write_bytes(b"state")
    ckpt_dir.seal(src, 5)
    work = tmp_path / "work"
    work.mkdir()
    copy = sandbox.hand_over(src, work, sandbox.Sandbox(uid=200998, gid=200998))
    assert copy.name == "checkpoint-5" and copy.parent.parent == work
    assert {p.lstat().st_uid for p in [copy.parent, copy, *copy.rglob("*")]} == {200998}
    ckpt, why = checkpoints.validate(copy)
    assert why is None and (ckpt.step, ckpt.kind, ckpt.files) == (5, "directory", 2)
