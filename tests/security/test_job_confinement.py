"""Attacks (issue 26, item 6) as a job would make them, on a real agent as root with per-run uids against real
NATS (the fixtures of test_job_isolation.py): a job creates a user namespace (``unshare -Ur``), allocates past its
memory limit, forks past its processes limit, writes past its disk limit. Each is refused or the run is ended,
and the job's error and ``started`` event say which limit held and how (or that it does not hold here)."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

from libs.contracts.telemetry import RunOutcome
from tests.integration.helpers_executor import command, finetune
from tests.security.test_job_isolation import PYTHON, agent, base_dir, data_dir  # noqa: F401 - fixtures

pytestmark = pytest.mark.security

PROBE = textwrap.dedent("""
    import json, subprocess
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    runs = {name: subprocess.run(argv, capture_output=True, text=True)
            for name, argv in {"user": ["unshare", "-Ur", "id"], "net": ["unshare", "-n", "true"],
                               "mount": ["unshare", "-m", "true"]}.items()}
    print(json.dumps({"no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
                      **{k: [r.returncode, r.stderr.strip()] for k, r in runs.items()}}), flush=True)
""")


@pytest.fixture(params=[True], ids=["cgroup"])
def cgroup(request):
    return request.param


def log_of(settings, job: str) -> str:
    return (settings.effective_work_dir / "jobs" / job / "epoch-1.log").read_text()


async def test_a_job_cannot_create_namespaces_and_runs_with_no_new_privs(agent):
    settings, js, queue = agent
    job = uuid.uuid4().hex
    await queue.grant(js, settings, job, command({}, PYTHON, "-c", PROBE))
    done = await queue.wait_finished(job, timeout=60)
    assert done.outcome is RunOutcome.SUCCEEDED, done
    out = json.loads(log_of(settings, job).strip().splitlines()[-1])
    assert out["no_new_privs"] == "1" and out["seccomp"] == "2", out  # 2: a filter is installed
    for kind in ("user", "net", "mount"):
        assert out[kind][0] != 0 and "Operation not permitted" in out[kind][1], out
    (started,) = queue.of(job, "started")
    assert "no new namespaces" in started.detail["confinement"]["seccomp"]


async def test_a_job_allocating_past_its_memory_limit_is_refused(agent):
    settings, js, queue = agent
    job = uuid.uuid4().hex
    hog = "x = bytearray(768 << 20); print('allocated', len(x))"
    await queue.grant(js, settings, job, command({}, PYTHON, "-c", hog), limits={"memory_mb": 128})
    done = await queue.wait_finished(job, timeout=60)
    assert done.outcome is RunOutcome.FAILED, done
    assert "allocated" not in log_of(settings, job)
    assert "MemoryError" in done.error and "memory: 128 MiB" in done.error, done.error
    (started,) = queue.of(job, "started")
    assert started.detail["confinement"]["limits"]["memory"].startswith("128 MiB")


async def test_a_job_forking_past_its_pids_limit_is_refused(agent):
    settings, js, queue = agent
    job = uuid.uuid4().hex
    bomb = textwrap.dedent("""
        import subprocess
        kids = [subprocess.Popen(["sleep", "60"]) for _ in range(40)]
        print("forked", len(kids))
    """)
    await queue.grant(js, settings, job, command({}, PYTHON, "-c", bomb), limits={"pids": 16})
    done = await queue.wait_finished(job, timeout=60)
    assert done.outcome is RunOutcome.FAILED, done
    assert "forked" not in log_of(settings, job)
    assert "BlockingIOError" in done.error and "pids: 16" in done.error, done.error


async def test_a_job_writing_past_its_disk_limit_is_stopped_with_the_reason(agent):
    settings, js, queue = agent
    job = uuid.uuid4().hex
    writer = 'head -c 20000000 /dev/zero > "$TMPDIR/big"; echo "wrote $(wc -c < "$TMPDIR/big")"'
    await queue.grant(js, settings, job, command({}, "/bin/sh", "-c", f'{writer}; exit 0'), limits={"disk_mb": 5})
    done = await queue.wait_finished(job, timeout=60)
    assert "wrote 5242880" in log_of(settings, job)  # the write stopped at the limit, not at 20 MB
    python_job = uuid.uuid4().hex
    big = "open(__import__('os').environ['TMPDIR'] + '/big', 'wb').write(b'x' * (20 << 20)); print('written')"
    await queue.grant(js, settings, python_job, command({}, PYTHON, "-c", big), limits={"disk_mb": 5})
    done = await queue.wait_finished(python_job, timeout=60)
    assert done.outcome is RunOutcome.FAILED and "File too large" in done.error, done
    assert "disk: 5 MiB per file" in done.error
    sigxfsz = uuid.uuid4().hex  # a process that does not ignore SIGXFSZ is ended by it: the reason is named
    head = 'exec head -c 20000000 /dev/zero > "$TMPDIR/big"'
    await queue.grant(js, settings, sigxfsz, command({}, "/bin/sh", "-c", head), limits={"disk_mb": 5})
    done = await queue.wait_finished(sigxfsz, timeout=60)
    assert done.outcome is RunOutcome.FAILED and "stopped by its disk limit" in done.error, done


async def test_a_job_writing_many_files_past_its_disk_limit_is_ended_with_the_reason(agent):
    """Each file below the per-file limit, their sum without end: only the agent's watch can end the run."""
    settings, js, queue = agent
    job = uuid.uuid4().hex
    filler = textwrap.dedent("""
        import itertools, os, time
        for i in itertools.count():
            with open(os.path.join(os.environ["TMPDIR"], f"part-{i}"), "wb") as f:
                f.write(os.urandom(1 << 20))
            time.sleep(0.02)  # at most 50 MiB/s: a bounded overshoot on a shared disk
    """)
    await queue.grant(js, settings, job, command({}, PYTHON, "-c", filler), limits={"disk_mb": 20})
    done = await queue.wait_finished(job, timeout=120)
    assert done.outcome is RunOutcome.FAILED, done
    assert "stopped by its disk limit: its files grew by" in done.error and "20 MiB" in done.error, done.error


async def test_the_built_in_fine_tune_is_held_to_its_memory_limit_too(agent):
    """The fine-tune starts through the sandbox's preexec, not the guard: the same limits and filter hold. With
    64 MiB it cannot even load torch; the error says which limit held it."""
    settings, js, queue = agent
    job = uuid.uuid4().hex
    await queue.grant(js, settings, job, finetune(3), every=3, limits={"memory_mb": 64})
    done = await queue.wait_finished(job, timeout=120)
    assert done.outcome is RunOutcome.FAILED, done
    assert "memory: 64 MiB per process" in done.error, done.error
    (started,) = queue.of(job, "started")
    assert "no new namespaces" in started.detail["confinement"]["seccomp"]
