"""Issue 27's "what must be shown" for the training stacks, under ``teto up`` (CPU): the Hugging Face LoRA example
(``Trainer`` + ``peft``, examples/hf_lora/) and the Lightning example run as ``command`` jobs with their callbacks,
report a loss curve, checkpoint (directories for HF), stop at their GPU ceiling on a checkpoint written at the
stop (``interrupted``), resume after a requeue with a new total ceiling from that checkpoint at the next step (the
adapter's weights after resume those saved) and succeed; a run hanging inside a training step shows ``stuck`` on
the job and its executor, only because the callback's reports stopped."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.support.environments import shared_environment
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import Stack, start_stack

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HF = str(REPO / "examples" / "hf_lora" / "train.py")
LIGHTNING = str(REPO / "examples" / "lightning" / "train.py")
CEILING = 25.0  # GPU-seconds of the first run: imports (a few seconds, more on a loaded machine), then steps
# The steps alone (STEPS x STEP_SECONDS = 32 s) outlast the ceiling, so the first run can never finish inside it,
# however fast the machine imports and trains (70 steps did, on a quiet machine: 14 s of steps + imports < 25 s).
STEPS = 160
STEP_SECONDS = 0.2
PROGRESS = 1.0  # the executors' progress interval: a point of the loss curve a second
STUCK_AFTER = 4.0


@pytest.fixture(scope="module")
def environment() -> Path:
    """The jobs' Python environment, made as an operator makes one on each node: ``teto env create --extras
    hf,lightning`` (the libraries reachable by the jobs' own uids)."""
    return shared_environment(["hf", "lightning"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, environment: Path) -> Stack:
    root = tmp_path_factory.mktemp("stacks")
    os.chmod(root, 0o755)
    s = start_stack(root / "teto", executors=3, lease=10, heartbeat=1,
                    extra_env={"TETO_PROGRESS_INTERVAL_SECONDS": str(PROGRESS), "TETO_ENVIRONMENTS": str(environment),
                               "TETO_STUCK_AFTER_SECONDS": str(STUCK_AFTER), "TETO_STOP_GRACE_SECONDS": "20"})
    s.environment = str(environment)
    yield s
    assert s.stop() == 0


def _submit(stack: Stack, name: str, command: list[str], **spec) -> str:
    r = stack.post("/v1/jobs", {"name": name, "checkpoint_every_steps": 20, **spec, "environment": stack.environment,
                                "workload": {"kind": "command", "command": ["python", *command]}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _points(stack: Stack, job_id: str) -> list[dict]:
    r = stack.get(f"/v1/jobs/{job_id}/steps")
    assert r.status_code == 200, r.text
    return r.json()["points"]


def _why(stack: Stack, job_id: str) -> tuple:
    return ([(e["event"], e.get("epoch"), e.get("reason"), e.get("error"), e.get("detail"))
             for e in stack.events(job_id) if e["event"] not in ("progress", "checkpointed")][-12:],
            stack.log_tail(1500))


def _interrupted_at_ceiling(stack: Stack, job_id: str) -> dict:
    job = stack.wait_state(job_id, {"interrupted", "failed", "succeeded", "cancelled"}, 240)
    assert job["state"] == "interrupted" and job["reason"] == "gpu_ceiling", (job, _why(stack, job_id))
    return job


def _requeue(stack: Stack, job_id: str) -> None:
    """Requeued with a new total ceiling that leaves room to finish."""
    consumed = stack.job(job_id)["budget"]["consumed_seconds"]
    r = stack.post(f"/v1/jobs/{job_id}/requeue", {"gpu_ceiling_seconds": round(consumed + 240, 3)})
    assert r.status_code in (200, 202), r.text


def _resumed_at(stack: Stack, job_id: str, step: int) -> list[dict]:
    """The second run started from the checkpoint of ``step`` and its first step is the next one: nothing between
    the checkpoint and the stop is trained twice (the checkpoint was written at the stop)."""
    started = [e for e in stack.events(job_id) if e["event"] == "started"]
    assert len(started) == 2 and started[-1]["detail"]["resumed_from_step"] == step, started
    points = _points(stack, job_id)
    epochs = sorted({p["epoch"] for p in points})
    second = [p for p in points if p["epoch"] == epochs[-1]]
    assert second[0]["step"] == step + 1 and second[-1]["step"] == STEPS, second[:3]
    return points


def _began_at(path: Path) -> str | None:
    """The step a run's adapter-at-start file says the run began at."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get("global_step")


def _files(root: Path, name: str) -> list[Path]:
    return [Path(d) / name for d, _, files in os.walk(root, followlinks=True) if name in files]


def _timeline(stack: Stack, job_id: str) -> str:
    return " ".join(f"{e['event']}@{e['time'][11:19]}" for e in stack.events(job_id)
                    if e["event"] not in ("progress", "checkpointed"))


def test_hf_lora_and_lightning_stop_at_their_ceilings_on_a_fresh_checkpoint_and_resume_exactly(stack, tmp_path):
    """Both examples at once, each on its own executor: the HF run's checkpoints are directories; the resumed HF
    run's adapter is the one saved at the stop, tensor for tensor."""
    from safetensors.torch import load_file

    hf = _submit(stack, "hf-lora", [HF, "--max-steps", str(STEPS), "--save-steps", "20", "--step-seconds",
                                    str(STEP_SECONDS), "--adapter-at-start", "adapter-at-start.safetensors"],
                 gpu_ceiling_seconds=CEILING)
    lit = _submit(stack, "lightning", [LIGHTNING, "--max-steps", str(STEPS), "--step-seconds", str(STEP_SECONDS)],
                  gpu_ceiling_seconds=CEILING)

    job = _interrupted_at_ceiling(stack, hf)
    ckpt = job["last_checkpoint"]
    n = ckpt["step"]
    path = stack.data_dir / "checkpoints" / hf / f"checkpoint-{n}"
    assert ckpt.get("kind") == "directory" and (path / "teto-manifest.json").is_file(), ckpt
    assert (path / "adapter_model.safetensors").is_file() and (path / "optimizer.pt").is_file()
    points = _points(stack, hf)
    # The loss curve: points with a loss and the learning rate. The last step trained is the checkpoint's: it was
    # written at the stop, not at the last multiple of --save-steps.
    assert len([p for p in points if p["loss"] is not None]) >= 3, points
    assert all("learning_rate" in p["metrics"] for p in points), points[:3]
    assert points[-1]["step"] == n, (n, points[-3:])
    saved = tmp_path / "saved.safetensors"
    shutil.copyfile(path / "adapter_model.safetensors", saved)  # retention may delete it once the run goes on
    _requeue(stack, hf)

    job = _interrupted_at_ceiling(stack, lit)
    m = job["last_checkpoint"]["step"]
    assert (stack.data_dir / "checkpoints" / lit / f"step-{m:08d}.pt").is_file()
    points = _points(stack, lit)
    assert points[-1]["step"] == m and all(p["loss"] is not None for p in points), (m, points[-3:])
    _requeue(stack, lit)

    for job_id, step in ((hf, n), (lit, m)):
        job = stack.wait_state(job_id, {"succeeded", "failed", "cancelled"}, 300)
        assert job["state"] == "succeeded", (job, _why(stack, job_id))
        _resumed_at(stack, job_id, step)
        print(f"\n{job['name']}: stopped at step {step}; {_timeline(stack, job_id)}")
    # The adapter the resumed run trained from is the one saved at the stop, tensor for tensor. Each run wrote its
    # own in its work directory (on whichever executor ran it); the resumed one's says it began at step n.
    written = {f: _began_at(f) for f in _files(stack.data_dir / "executors", "adapter-at-start.safetensors")}
    resumed_runs = [f for f, began in written.items() if began == str(n)]
    assert len(resumed_runs) == 1, written
    resumed, expected = load_file(resumed_runs[0]), load_file(saved)
    assert resumed.keys() == expected.keys() and expected
    assert all((resumed[k] == expected[k]).all() for k in expected)


def test_a_run_hanging_inside_a_training_step_shows_stuck_on_the_job_and_its_executor(stack):
    job_id = _submit(stack, "hangs", [HF, "--max-steps", "100", "--hang-at-step", "20", "--step-seconds", "0.1"])

    def stuck() -> dict | None:
        job = stack.job(job_id)
        return job if (job.get("signal") or {}).get("signal") == "stuck" else None

    job = eventually(stuck, 120, "the job to show stuck")
    # Steps were reported (at the progress interval) until the hang; step 20 never ended.
    assert job["state"] == "running" and 1 <= job["last_step"] < 20, job
    (executor,) = [e for e in stack.get("/v1/executors").json() if e.get("job_id") == job_id]
    assert executor["signal"] == "stuck" and 1 <= executor["step"] < 20, executor
    r = stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "hung"})
    assert r.status_code in (200, 202), r.text
    assert stack.wait_state(job_id, {"cancelled"}, 60)["state"] == "cancelled"


def test_a_two_worker_gang_trains_the_hf_example_with_ddp_and_resumes_after_a_workers_agent_is_killed(stack):
    """The unchanged HF example as a gang of two: each worker gets torchrun's variables, Trainer forms a gloo
    group through them, only rank 0's checkpoint directories are reported. Rank 0's agent is SIGKILLed after a
    checkpoint (its worker dies with it, the peer leaves as peer-lost): the gang is requeued and resumes from
    that checkpoint on the live nodes, every rank, and succeeds without a training error."""
    job_id = _submit(stack, "hf-ddp", [HF, "--max-steps", "60", "--save-steps", "10", "--step-seconds", "0.2"],
                     workers=2, checkpoint_every_steps=10)
    job = eventually(lambda: (j := stack.job(job_id))["state"] in ("failed", "succeeded", "cancelled") and j
                     or (j["last_checkpoint"] or {}).get("step", 0) >= 10 and j, 240, "a first checkpoint")
    assert job["state"] == "running" and len(job["gang"]) == 2, (job, _why(stack, job_id))
    checkpointed = job["last_checkpoint"]["step"]
    assert job["last_checkpoint"].get("kind") == "directory"
    victim = next(w["executor_id"] for w in job["gang"] if w["rank"] == 0)
    (agent,) = [p for p in stack.processes() if p["executor_id"] == victim]
    os.kill(agent["pid"], signal.SIGKILL)

    done = stack.wait_state(job_id, {"succeeded", "failed", "cancelled"}, 300)
    if done["state"] != "succeeded":
        for e in stack.events(job_id):
            if e["event"] not in ("progress", "checkpointed"):
                print(e["event"], e.get("epoch"), e.get("reason"), (e.get("error") or "")[-600:])
    assert done["state"] == "succeeded", (done, _why(stack, job_id))
    if done["attempts"]["training_error"]:  # printed whole (an assertion's message is cut)
        for e in stack.events(job_id):
            if e["event"] not in ("progress", "checkpointed", "step"):
                print(e["event"], e.get("epoch"), e.get("executor_id"), e.get("reason"), (e.get("error") or "")[-400:],
                      {k: v for k, v in (e.get("detail") or {}).items() if k != "spec"})
        print(stack.log_tail(6000))
    assert done["attempts"]["training_error"] == 0, (done["attempts"], _why(stack, job_id))
    events = stack.events(job_id)
    epochs = sorted({e["epoch"] for e in events if e["event"] == "started"})
    assert len(epochs) >= 2, _why(stack, job_id)
    restarted = [e for e in events if e["event"] == "started" and e["epoch"] == epochs[-1]]
    assert len(restarted) == 2 and {e["detail"]["resumed_from_step"] for e in restarted} >= {checkpointed}, restarted
    # Only rank 0 reports checkpoints: one report per step, every one a directory of the job's.
    reported = [e for e in events if e["event"] == "checkpointed"]
    steps = [e["detail"]["step"] for e in reported]
    assert steps and len(steps) == len(set(steps)) and done["last_checkpoint"]["step"] == 60, reported[-3:]
    print(f"\nhf-ddp: killed rank 0's agent after step {checkpointed}; {_timeline(stack, job_id)}")
