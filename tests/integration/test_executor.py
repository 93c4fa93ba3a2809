"""The executor agent against a real NATS server, with the test playing the queue: grants, renewals, stops.

Covers the built-in fine-tune (checkpoints, resume at k+1, a corrupt checkpoint skipped), a user's command
through teto.sdk, failure with the stderr tail, StopJob, abandoning before the lease ends when the queue goes
silent or refuses, malformed directives refused visibly, and a training process that dies with its agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid

import pytest

from agents.executor.settings import ExecutorSettings
from libs.contracts.envelope import RejectedMessage
from libs.contracts.jobs import FinetuneParams
from libs.contracts.nodes import NodeRegistered
from libs.contracts.telemetry import Phase, RunOutcome
from libs.runtime import bus

from tests.integration.helpers_executor import FakeQueue, agent_with_fake_queue, command, finetune, process_gone
from tests.support.services import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("base")  # the fine-tune's base checkpoint, built once per session


def _settings(env, base_dir, **overrides) -> ExecutorSettings:
    return env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", progress_interval_seconds=0.3,
                        stop_grace_seconds=3.0, base_model_dir=base_dir, torch_threads=1, **overrides)


@pytest.fixture
async def stack(env, base_dir):
    """A running agent, a NATS connection for the test, and the fake queue."""
    async with agent_with_fake_queue(_settings(env, base_dir)) as stack:
        yield stack


def _job() -> str:
    return uuid.uuid4().hex


async def test_finetune_checkpoints_then_resumes_past_a_corrupt_checkpoint(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, finetune(20), every=5)
    done = await queue.wait_finished(job, timeout=90)
    assert done.outcome is RunOutcome.SUCCEEDED and done.exit_code == 0 and done.last_step == 20, done
    (started,) = queue.of(job, "started")
    assert started.resumed_from_step is None and started.device == "cpu"
    steps = queue.of(job, "step")
    assert steps[-1].step == 20 and steps[-1].total_steps == 20 and all(s.loss > 0 for s in steps)
    assert steps[-1].metrics["learning_rate"] == FinetuneParams().learning_rate  # shown beside the loss (issue 27)
    assert any(s.step_seconds for s in steps)
    assert [c.step for c in queue.of(job, "checkpoint")] == [5, 10, 15, 20]
    ckpt_dir = settings.effective_checkpoint_dir / job
    # Four written and reported; the newest three kept (the executor's default, TETO_CHECKPOINTS_KEPT).
    assert sorted(p.name for p in ckpt_dir.glob("*.pt")) == [f"step-{s:08d}.pt" for s in (10, 15, 20)]
    # its running time was reported as usage records: numbered, one device (CPU)
    usage = queue.records(job)
    assert usage and [u.seq for u in usage] == list(range(1, len(usage) + 1)) and {u.devices for u in usage} == {1}

    # The newest checkpoint is damaged; the next grant (next epoch) skips it and resumes at step 16.
    newest = ckpt_dir / "step-00000020.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    await queue.grant(js, settings, job, finetune(25), epoch=2, every=5, attempt=2)
    done = await queue.wait_finished(job, epoch=2, timeout=90)
    assert done.outcome is RunOutcome.SUCCEEDED and done.last_step == 25 and done.resumed_from_step == 15, done
    (skipped,) = queue.of(job, "checkpoint_skipped", epoch=2)
    assert skipped.path.endswith("step-00000020.pt") and "truncated" in skipped.reason
    (started,) = queue.of(job, "started", epoch=2)
    assert started.resumed_from_step == 15 and started.resumed_from.endswith("step-00000015.pt")
    assert queue.of(job, "step", epoch=2)[0].step == 16  # continues at k+1, never at 0
    assert [c.step for c in queue.of(job, "checkpoint", epoch=2)] == [20, 25]
    assert sorted(p.name for p in ckpt_dir.glob("*.pt")) == [f"step-{s:08d}.pt" for s in (15, 20, 25)]


async def test_command_workload_reports_through_the_sdk(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "12", "STEP_SECONDS": "0.02"}), every=4)
    done = await queue.wait_finished(job, timeout=30)
    assert done.outcome is RunOutcome.SUCCEEDED and done.last_step == 12, done
    assert [c.step for c in queue.of(job, "checkpoint")] == [4, 8, 12]
    assert queue.of(job, "step")[-1].metrics["weight"] > 0
    # the node registered itself on start
    sub = await js.pull_subscribe(settings.subjects.node(settings.node_id, "registered"), durable=None)
    (msg,) = await sub.fetch(1, timeout=5)
    note = NodeRegistered.decode(msg.data)
    assert note.executor_id == settings.executor_id and note.group == "default" and note.gpus == []
    # and it is idle and accepting again
    await eventually(lambda: queue.heartbeats[-1].accepting and queue.heartbeats[-1].phase is Phase.IDLE, 5,
                     "an idle heartbeat")


async def test_failing_command_reports_failed_with_its_stderr_tail(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "10", "FAIL_AT_STEP": "3"}))
    done = await queue.wait_finished(job, timeout=30)
    assert done.outcome is RunOutcome.FAILED and done.exit_code == 3 and done.last_step == 2, done
    assert "diverged at step 3" in done.error


async def test_missing_program_fails_the_run_instead_of_the_agent(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({}, "/no/such/program"))
    done = await queue.wait_finished(job, timeout=15)
    assert done.outcome is RunOutcome.FAILED and "/no/such/program" in done.error


async def test_stop_job_stops_the_process_after_a_final_checkpoint(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "100000", "STEP_SECONDS": "0.05"}), every=100000)
    await eventually(lambda: (s := queue.of(job, "step")) and s[-1].step >= 3, 20, "a few steps")
    await queue.stop_job(js, job, epoch=1, checkpoint_first=True)
    done = await queue.wait_finished(job, timeout=15)
    assert done.outcome is RunOutcome.STOPPED and done.exit_code == 143, done
    (ckpt,) = queue.of(job, "checkpoint")
    assert ckpt.step == done.last_step and os.path.exists(ckpt.path)


async def test_abandons_before_the_lease_ends_when_the_queue_goes_silent(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "100000", "STEP_SECONDS": "0.05"}), every=100000)
    (started,) = await eventually(lambda: queue.of(job, "started"), 20, "the run to start")
    pid = started.detail["pid"]
    await eventually(lambda: len(queue.renewals) >= 3, 10, "a few renewals")
    queue.answer = "silent"
    last_ok = queue.last_answer_at
    died_at = await eventually(lambda: process_gone(pid) and time.monotonic(), 10, "the process to be killed")
    # It held on through lost renewals (not at the first miss), and was dead before the lease could expire.
    assert settings.lease_seconds - settings.effective_stop_margin - settings.heartbeat_seconds - 0.5 \
        < died_at - last_ok < settings.lease_seconds, died_at - last_ok
    done = await queue.wait_finished(job, timeout=10)
    assert done.outcome is RunOutcome.ABANDONED and "lease - stop margin" in done.error
    assert not queue.of(job, "checkpoint")  # no checkpoint written after losing the lease
    # Back in contact (the server acknowledged the report), it takes work again.
    queue.answer = "ok"
    job2 = _job()
    await queue.grant(js, settings, job2, command({"STEPS": "3"}))
    assert (await queue.wait_finished(job2, timeout=20)).outcome is RunOutcome.SUCCEEDED


async def test_a_refused_lease_drops_the_grant_or_stops_the_run_at_once(stack):
    settings, js, queue = stack
    stale, job = _job(), _job()
    queue.answer = "refuse"
    await queue.grant(js, settings, stale, command({"STEPS": "3"}))
    await eventually(lambda: any(r.job_id == stale for r in queue.renewals), 10, "the renewal of the stale grant")
    queue.answer = "ok"
    await queue.grant(js, settings, job, command({"STEPS": "100000", "STEP_SECONDS": "0.05"}), every=100000)
    await eventually(lambda: queue.of(job, "step"), 20, "the run to train")
    assert not [p for p in queue.progress if p.job_id == stale]  # the stale grant never started
    queue.answer = "refuse"
    refused_at = time.monotonic()
    done = await queue.wait_finished(job, timeout=10)
    assert done.outcome is RunOutcome.ABANDONED and "refused" in done.error
    assert time.monotonic() - refused_at < 2 * settings.heartbeat_seconds + 1


async def test_malformed_directives_are_refused_visibly_and_the_agent_goes_on(stack):
    settings, js, queue = stack
    subjects = settings.subjects
    await bus.publish(js, subjects.agent(settings.executor_id, "run"), b'{"schema": "teto.agent.run/1", "job_id": 5}')
    await bus.publish(js, subjects.agent(settings.executor_id, "dance"), b"{}")
    raw = await eventually(lambda: len(queue.raw.get(subjects.rejected("executor"), [])) >= 2 and
                           queue.raw[subjects.rejected("executor")], 10, "two rejections")
    notes = [RejectedMessage.decode(r) for r in raw]
    assert "epoch" in notes[0].reason and notes[0].service == "executor"
    assert "unknown directive 'dance'" in notes[1].reason
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "2"}))
    assert (await queue.wait_finished(job, timeout=20)).outcome is RunOutcome.SUCCEEDED


@contextlib.asynccontextmanager
async def _agent_process_training(env, base_dir):
    """An agent as its own process (``python -m agents.executor.main``) with the fake queue, training a granted
    command: (the agent's process, the fake queue, the job). Whatever is left is killed at the end."""
    settings = _settings(env, base_dir)
    nc = await bus.connect(settings.nats_url, "test")
    js = nc.jetstream()
    queue = await FakeQueue(nc, settings.subjects, settings.executor_id).start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents.executor.main",
        env=env.env_vars(TETO_EXECUTOR_ID=settings.executor_id, TETO_PROGRESS_INTERVAL_SECONDS="0.3"))
    try:
        await eventually(lambda: queue.heartbeats, 30, "the agent's first heartbeat")
        job = _job()
        await queue.grant(js, settings, job, command({"STEPS": "100000", "STEP_SECONDS": "0.05"}))
        await eventually(lambda: queue.of(job, "step"), 20, "the run to train")
        yield proc, queue, job
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await queue.stop()
        await nc.close()


async def test_the_training_process_dies_with_its_agent(env, base_dir):
    async with _agent_process_training(env, base_dir) as (proc, queue, job):
        pid = queue.of(job, "started")[0].detail["pid"]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await eventually(lambda: process_gone(pid), 3, "the orphaned training process to die")


async def test_an_agent_told_to_stop_says_it_takes_no_more_work_and_reports_its_run_as_leaving(env, base_dir):
    """SIGTERM (Ctrl-C on `teto up`): the agent's last heartbeat says it takes no work, and its run is reported
    abandoned with ``SHUTDOWN_STOP``, so the queue does not grant the requeued job straight back to it. Before, it
    did: the grant then waited for the agent to come back, or for a whole lease if it never did."""
    from libs.contracts.telemetry import SHUTDOWN_STOP

    async with _agent_process_training(env, base_dir) as (proc, queue, job):
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        done = await queue.wait_finished(job, 1, timeout=10)
        assert done.outcome is RunOutcome.ABANDONED and done.stop_reason == SHUTDOWN_STOP, done
        last = queue.heartbeats[-1]
        assert not last.accepting and last.boot_id, last


async def test_a_grant_that_arrives_during_the_node_checks_is_handed_back_at_once(stack):
    """A grant can still meet the node's checks (a check ordered for a ready node while placement picked it).
    The agent must not start the job, and must not leave the grant to expire a whole lease later: it hands it
    back at once, as a hand-back (a free requeue counted as such), never as an abandoned run."""
    from libs.contracts.nodes import CheckTest, RunChecks

    settings, js, queue = stack
    beats = await eventually(lambda: queue.heartbeats, 10, "a heartbeat")
    node = beats[-1].node_id
    await bus.publish(js, settings.subjects.agent(settings.executor_id, "check"),
                      RunChecks(run_id=uuid.uuid4().hex, node_id=node, executor_id=settings.executor_id,
                                tests=[CheckTest.MATMUL, CheckTest.MEMBW, CheckTest.MEMTEST]))
    await eventually(lambda: any(not h.accepting for h in queue.heartbeats[-3:]), 10, "the node to be checking")
    job = _job()
    await queue.grant(js, settings, job, finetune(steps=5))
    done = await queue.wait_finished(job, 1, timeout=settings.lease_seconds - 1)  # well before the lease ends
    assert done.outcome is RunOutcome.HANDED_BACK and "health checks" in (done.error or "")
    assert not queue.of(job, "started")
    # Leave nothing running: the check process finishes and the agent takes work again.
    await eventually(lambda: queue.heartbeats[-1].accepting, 60, "the check to finish")


async def test_a_grant_placed_the_moment_the_checks_final_report_arrives_is_taken(stack):
    """The health service judges the node from the report that completes its tests, and the queue may place a
    job at once: that report must leave the agent only once the check process has ended and the agent takes
    work, or the grant is handed back (before: the attempts showed a transport loss that never happened)."""
    from libs.contracts.nodes import CheckReport, CheckTest, RunChecks

    settings, js, queue = stack
    nc = queue.nc
    beats = await eventually(lambda: queue.heartbeats, 10, "a heartbeat")
    run_id, job = uuid.uuid4().hex, _job()
    tests = [CheckTest.MATMUL, CheckTest.MEMBW]
    reports: list[CheckReport] = []
    granted = asyncio.Event()

    async def on_report(msg) -> None:
        report = CheckReport.decode(msg.data)
        if report.run_id != run_id:
            return
        reports.append(report)
        ended = {r.test for r in reports if r.status not in ("running",)}
        if ended >= set(tests) and not granted.is_set():
            granted.set()  # the verdict is complete: place a job at once, as the queue may
            await queue.grant(js, settings, job, command({"STEPS": "2"}))

    sub = await nc.subscribe(settings.subjects.check_all, cb=on_report)
    try:
        await bus.publish(js, settings.subjects.agent(settings.executor_id, "check"),
                          RunChecks(run_id=run_id, node_id=beats[-1].node_id, executor_id=settings.executor_id,
                                    tests=tests))
        done = await queue.wait_finished(job, 1, timeout=90)
    finally:
        await sub.unsubscribe()
    assert done.outcome is RunOutcome.SUCCEEDED, done
    assert queue.of(job, "started")


async def test_a_grant_whose_environment_cannot_be_used_fails_its_attempt_and_the_agent_goes_on(stack):
    """An env variable name with ``=`` used to kill the agent's grant task silently: no report, and the job
    cycled forever as a transport loss. Now the attempt fails with the reason, and the next grant runs."""
    settings, js, queue = stack
    job = _job()
    valid = command({})
    await queue.grant(js, settings, job, valid.model_copy(update={"env": {"A=B": "1"}}))
    done = await queue.wait_finished(job, timeout=20)
    # Refused by name at launch, or (once the wire contract checks env names) as a grant it cannot read.
    assert done.outcome is RunOutcome.FAILED and ("A=B" in done.error or "cannot read this grant" in done.error), done
    assert not queue.of(job, "started")
    after = _job()
    await queue.grant(js, settings, after, command({"STEPS": "2"}))
    assert (await queue.wait_finished(after, timeout=30)).outcome is RunOutcome.SUCCEEDED


async def test_a_run_whose_working_directory_cannot_be_made_fails_with_the_reason(stack):
    settings, js, queue = stack
    job = _job()
    work = settings.effective_work_dir / "jobs" / job
    work.parent.mkdir(parents=True, exist_ok=True)
    work.write_text("a file where the job's working directory belongs")
    await queue.grant(js, settings, job, command({"STEPS": "2"}))
    done = await queue.wait_finished(job, timeout=20)
    assert done.outcome is RunOutcome.FAILED and done.error.startswith("cannot start"), done
    assert "FileExistsError" in done.error and not queue.of(job, "started")


async def test_a_checkpoint_report_too_large_to_send_is_dropped_and_the_run_still_reports(stack):
    """A checkpoint path of about 1 MiB makes a report over the server's max payload: it used to be retried
    forever, holding every report behind it (the run's end included)."""
    settings, js, queue = stack
    job = _job()
    # Under the agent's 1 MiB line limit, over the payload limit once wrapped in its envelope.
    script = ("import json, os\nfd = int(os.environ['TETO_REPORT_FD'])\n"
              "os.write(fd, (json.dumps({'type': 'checkpoint', 'step': 1, 'path': '/c/' + 'x' * 1048400}) + "
              "'\\n').encode())\n"
              "os.write(fd, (json.dumps({'type': 'step', 'step': 2, 'total_steps': 2}) + '\\n').encode())\n")
    await queue.grant(js, settings, job, command({}, sys.executable, "-c", script))
    done = await queue.wait_finished(job, timeout=30)
    assert done.outcome is RunOutcome.SUCCEEDED and done.last_step == 2, done
    assert not queue.of(job, "checkpoint") and [s.step for s in queue.of(job, "step")] == [2]


async def test_an_agent_fault_while_serving_a_run_stops_the_process_and_fails_the_attempt(stack, monkeypatch):
    """Whatever goes wrong inside the agent while a run is served ends the run visibly (before: the grant task
    died silently, the process ran on unwatched, and the job came back only as a transport loss)."""
    from agents.executor import lease

    async def broken_watch(self):
        raise RuntimeError("lease keeper bug")

    monkeypatch.setattr(lease.LeaseKeeper, "watch", broken_watch)
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "100000", "STEP_SECONDS": "0.05"}))
    done = await queue.wait_finished(job, timeout=30)
    assert done.outcome is RunOutcome.FAILED and "lease keeper bug" in (done.error or ""), done
    # The fault can strike while the run's checkpoint is still being looked at (the lease is watched from the
    # grant on), before any process started; one that did start is stopped.
    for started in queue.of(job, "started"):
        await eventually(lambda: process_gone(started.detail["pid"]), 10, "the training process to be stopped")
    await eventually(lambda: queue.heartbeats[-1].accepting, 10, "the agent to take work again")


async def test_a_grant_the_agent_cannot_read_fails_its_attempt_with_the_reason(stack):
    """A grant refused at decode (another contract version, a spec this agent cannot run) is refused visibly and,
    since it names its job and epoch, fails that attempt: left alone the job would wait out its lease and be
    placed again, the same way, forever."""
    import json

    settings, js, queue = stack
    job = _job()
    grant = await queue.grant(js, settings, _job(), command({"STEPS": "1"}))  # a readable one, as a template
    body = json.loads(grant.encode())
    body.update(job_id=job, id=uuid.uuid4().hex)
    body["spec"]["workload"] = {"kind": "no-such-kind"}
    await js.publish(settings.subjects.agent(settings.executor_id, "run"), json.dumps(body).encode())
    done = await queue.wait_finished(job, timeout=20)
    assert done.outcome is RunOutcome.FAILED and done.epoch == 1, done
    assert done.error.startswith("the executor cannot read this grant:") and "workload" in done.error
    assert not queue.of(job, "started")
    await eventually(lambda: queue.raw.get(settings.subjects.rejected("executor")), 10, "the refusal")


async def test_a_corrupt_file_in_the_newest_checkpoint_directory_is_skipped_for_the_previous(stack):
    settings, js, queue = stack
    job = _job()
    await queue.grant(js, settings, job, command({"STEPS": "12", "CHECKPOINT_KIND": "directory"}), every=4)
    done = await queue.wait_finished(job, timeout=30)
    assert done.outcome is RunOutcome.SUCCEEDED and done.last_step == 12, done
    reports = queue.of(job, "checkpoint")
    assert [(c.step, c.checkpoint_kind, c.files) for c in reports] == [(s, "directory", 2) for s in (4, 8, 12)]
    assert all(c.bytes > 4096 and c.path.endswith(f"checkpoint-{c.step}") for c in reports)
    ckpt_dir = settings.effective_checkpoint_dir / job
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["checkpoint-12", "checkpoint-4", "checkpoint-8"]

    # One byte of the newest checkpoint's optimizer state changes: the next run skips it, naming the file and why,
    # and resumes from the previous directory.
    damaged = ckpt_dir / "checkpoint-12" / "optimizer" / "optimizer.bin"
    damaged.write_bytes(b"\xff" + damaged.read_bytes()[1:])
    await queue.grant(js, settings, job, command({"STEPS": "14", "CHECKPOINT_KIND": "directory"}), epoch=2,
                      every=4, attempt=2)
    done = await queue.wait_finished(job, epoch=2, timeout=30)
    assert done.outcome is RunOutcome.SUCCEEDED and done.last_step == 14, done
    (skipped,) = queue.of(job, "checkpoint_skipped", epoch=2)
    assert skipped.path.endswith("checkpoint-12")
    assert skipped.reason.startswith("optimizer/optimizer.bin: checksum mismatch"), skipped.reason
    (started,) = queue.of(job, "started", epoch=2)
    assert started.resumed_from_step == 8 and started.resumed_from.endswith("checkpoint-8")
    assert queue.of(job, "step", epoch=2)[0].step == 9  # continues after the previous checkpoint
    assert [c.step for c in queue.of(job, "checkpoint", epoch=2)] == [12, 14]
