"""The training-stack callbacks inside real training processes (the libraries as installed, tiny random models):
what reaches the report pipe from ``Trainer``, ``Seq2SeqTrainer`` and TRL's ``SFTTrainer`` with and without
``peft``, and from Lightning: steps with loss and learning rate, each ``checkpoint-N`` directory reported once
written (and a Lightning ``ModelCheckpoint``'s files), and a stop (SIGTERM, the stop file asking for a checkpoint)
that ends the run on a fresh checkpoint of the step it stopped at, from which a resume continues at the next
step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agents.executor import ckpt_dir
from teto import sdk

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "trainers_script.py"
LIGHTNING = ROOT / "examples" / "lightning" / "train.py"


class Run:
    """A training process started as the agent starts one (TETO_* environment, the report pipe), its lines
    collected as they come."""

    def __init__(self, argv: list[str], tmp: Path, *, resume: Path | None = None,
                 extra: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.ck = tmp / "ck"
        (tmp / "work").mkdir(exist_ok=True, parents=True)
        self.stop_file = tmp / "stop.json"
        r, w = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
        env.update(PYTHONPATH=str(ROOT), EXAMPLES=str(ROOT / "examples" / "lightning"), TETO_JOB_ID="j1", TETO_EPOCH="1", TETO_REPORT_FD=str(w),
                   TETO_CHECKPOINT_DIR=str(self.ck), TETO_WORK_DIR=str(tmp / "work"),
                   TETO_STOP_FILE=str(self.stop_file), TETO_PROGRESS_INTERVAL="0.01", TETO_CHECKPOINT_EVERY="2",
                   TETO_RESUME_FROM=str(resume) if resume else "", **(extra or {}))
        self.proc = subprocess.Popen([sys.executable, *argv], env=env, pass_fds=(w,), cwd=tmp / "work",
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        os.close(w)
        self.lines: list[dict] = []
        self.stepped = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(r,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd) as f:
            for line in f:
                record = json.loads(line)
                self.lines.append(record)
                if record["type"] == "step" and record["step"] >= 3:
                    self.stepped.set()

    def wait(self) -> tuple[int, str]:
        out = self.proc.communicate(timeout=240)[0].decode(errors="replace")
        self._reader.join(10)
        return self.proc.returncode, out

    def steps(self) -> list[dict]:
        return [x for x in self.lines if x["type"] == "step"]

    def checkpoints(self) -> list[dict]:
        return [x for x in self.lines if x["type"] == "checkpoint"]

    def stop(self, *, checkpoint_first: bool = True) -> None:
        """As the agent stops a run at its ceiling: the stop file, then SIGTERM, once the run is past step 3."""
        assert self.stepped.wait(180), self.lines
        self.stop_file.write_text(json.dumps({"checkpoint_first": checkpoint_first}))
        os.kill(self.proc.pid, signal.SIGTERM)


def _complete_directory(record: dict, ck: Path) -> None:
    path = Path(record["path"])
    assert record["kind"] == "directory" and path.parent == ck.resolve(), record
    assert path.name == f"checkpoint-{record['step']}"
    found, why = ckpt_dir.verify(path)
    assert found is not None and found.step == record["step"], why


@pytest.mark.parametrize(("kind", "peft"), [("trainer", "peft"), ("trainer", "plain"), ("seq2seq", "peft"),
                                            ("sft", "peft"), ("sft", "plain")], ids=lambda v: v)
def test_a_trainer_reports_steps_loss_learning_rate_and_each_checkpoint_directory_once_written(tmp_path, kind, peft):
    run = Run([str(SCRIPT), kind, peft, "4", "2", "0"], tmp_path)
    rc, out = run.wait()
    assert rc == 0, out[-3000:]
    steps = run.steps()
    assert steps[-1]["step"] == 4 and steps[-1]["total_steps"] == 4, steps
    assert [s["step"] for s in steps] == sorted({s["step"] for s in steps})  # each once, in order
    assert all(s["loss"] is not None and s["metrics"]["learning_rate"] >= 0 for s in steps), steps
    assert all(s["step_seconds"] is not None for s in steps[1:]), steps
    assert [c["step"] for c in run.checkpoints()] == [2, 4]
    for record in run.checkpoints():
        _complete_directory(record, run.ck)
    # Under Teto rank 0 writes in the job's checkpoint directory (Trainer makes the one it was given, empty).
    assert not any((tmp_path / "work" / "out").iterdir())


@pytest.mark.parametrize(("kind", "peft"), [("trainer", "peft"), ("sft", "plain")], ids=lambda v: v)
def test_a_stop_ends_a_trainer_on_a_fresh_checkpoint_and_the_resume_continues_at_the_next_step(tmp_path, kind, peft):
    run = Run([str(SCRIPT), kind, peft, "100000", "100000", "0.05"], tmp_path)
    run.stop()
    rc, out = run.wait()
    assert rc == sdk.EXIT_STOPPED, out[-3000:]
    assert "trained to step" not in out  # nothing after train() runs for a stopped run
    last = run.steps()[-1]["step"]
    (ckpt,) = run.checkpoints()  # no cadence save in 100000 steps: this is the stop's
    assert ckpt["step"] == last >= 3, (ckpt, run.steps()[-3:])
    _complete_directory(ckpt, run.ck)

    again = Run([str(SCRIPT), kind, peft, str(last + 2), "100000", "0"], tmp_path, resume=Path(ckpt["path"]))
    rc, out = again.wait()
    assert rc == 0, out[-3000:]
    assert [s["step"] for s in again.steps()][0] == last + 1 and again.steps()[-1]["step"] == last + 2


def test_a_stop_that_asks_for_no_checkpoint_ends_the_trainer_without_one(tmp_path):
    run = Run([str(SCRIPT), "trainer", "plain", "100000", "100000", "0.05"], tmp_path)
    run.stop(checkpoint_first=False)
    rc, out = run.wait()
    assert rc == sdk.EXIT_STOPPED, out[-3000:]
    assert run.checkpoints() == []


def test_lightning_reports_stops_on_a_fresh_checkpoint_and_resumes_at_the_next_step(tmp_path):
    run = Run([str(LIGHTNING), "--max-steps", "100000", "--step-seconds", "0.05"], tmp_path)
    run.stop()
    rc, out = run.wait()
    assert rc == sdk.EXIT_STOPPED, out[-3000:]
    steps = run.steps()
    assert all(s["loss"] is not None and "learning_rate" in s["metrics"] for s in steps), steps
    checkpoints = run.checkpoints()
    # Every TETO_CHECKPOINT_EVERY (2) steps, and the stop's at the last step: full Lightning checkpoints (files).
    assert [c["step"] for c in checkpoints][:2] == [2, 4]
    last = checkpoints[-1]
    assert last["step"] == steps[-1]["step"] and last["kind"] == "file", (last, steps[-2:])
    assert Path(last["path"]).name == f"step-{last['step']:08d}.pt"

    again = Run([str(LIGHTNING), "--max-steps", str(last["step"] + 2)], tmp_path, resume=Path(last["path"]))
    rc, out = again.wait()
    assert rc == 0, out[-3000:]
    assert again.steps()[0]["step"] == last["step"] + 1 and again.steps()[-1]["step"] == last["step"] + 2


MODEL_CHECKPOINT = """
import os, sys
import lightning.pytorch as L
from lightning.pytorch.callbacks import ModelCheckpoint
sys.path.insert(0, os.environ["EXAMPLES"])
from train import Blocks, ByteLM, CORPUS
import torch
from teto import sdk
from teto.integrations.lightning import TetoCallback
data = torch.utils.data.DataLoader(Blocks(CORPUS.read_bytes(), 32), batch_size=4)
saver = ModelCheckpoint(dirpath=sdk.context().checkpoint_dir, every_n_train_steps=3, save_top_k=-1,
                        filename="{epoch}-{step}")
trainer = L.Trainer(max_steps=6, callbacks=[TetoCallback(every_n_steps=0), saver], logger=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(ByteLM(32, 1, 32, 1e-3, 6), data)
"""


def test_lightning_reports_what_a_model_checkpoint_writes_in_the_jobs_directory_once_written(tmp_path):
    run = Run(["-c", MODEL_CHECKPOINT], tmp_path)  # the example's module found through EXAMPLES
    rc, out = run.wait()
    assert rc == 0, out[-3000:]
    reported = run.checkpoints()
    assert [c["step"] for c in reported] == [3, 6], reported  # each once, the callback writing none of its own
    for c in reported:
        path = Path(c["path"])
        assert path.parent == run.ck.resolve() and path.name == f"epoch=0-step={c['step']}.ckpt" and path.is_file()


def _gang(tmp: Path, steps: int, step_seconds: float) -> list[Run]:
    """Two workers of a gang, each in its own directory, started with what the agent gives them (distenv.py)."""
    from agents.executor import distenv
    from libs.contracts.agents import RunJob
    from libs.contracts.jobs import JobSpec
    from libs.runtime.ports import free_port_block

    port = free_port_block(1)
    runs = []
    for rank in (0, 1):
        grant = RunJob(job_id="j1", epoch=1, attempt=1, executor_id=f"e{rank}", lease_seconds=6, heartbeat_seconds=1,
                       spec=JobSpec.model_validate({"workload": {"kind": "command", "command": ["x"]}, "workers": 2}),
                       rank=rank, world_size=2, rendezvous=f"127.0.0.1:{port}")
        extra = {**distenv.torch_env(grant), "TETO_RANK": str(rank), "TETO_WORLD_SIZE": "2",
                 "TETO_RENDEZVOUS": grant.rendezvous}
        runs.append(Run([str(SCRIPT), "trainer", "plain", str(steps), "100000", str(step_seconds)], tmp / f"r{rank}",
                        extra=extra))
    return runs


def test_a_gang_stops_every_worker_at_the_same_step_when_one_is_asked_and_only_rank_zero_reports_the_checkpoint(
        tmp_path):
    zero, one = _gang(tmp_path, 100000, 0.05)
    # Only rank 1's agent asked (and only its stop file asks for a checkpoint): the flags all-reduced each step stop
    # rank 0 at the same step, and both save (rank 0 writes the directory).
    one.stop()
    (rc1, out1), (rc0, out0) = one.wait(), zero.wait()
    assert (rc0, rc1) == (sdk.EXIT_STOPPED, sdk.EXIT_STOPPED), (out0[-2000:], out1[-2000:])
    assert zero.steps()[-1]["step"] == one.steps()[-1]["step"]
    assert [x["type"] for x in zero.lines].count("ready") == 1 and [x["type"] for x in one.lines].count("ready") == 1
    (ckpt,) = zero.checkpoints()
    assert ckpt["step"] == zero.steps()[-1]["step"] and one.checkpoints() == []
    _complete_directory(ckpt, zero.ck)


def test_a_worker_whose_peer_died_ends_as_peer_lost_not_as_a_training_error(tmp_path):
    zero, one = _gang(tmp_path, 100000, 0.05)
    assert zero.stepped.wait(180) and one.stepped.wait(180), (zero.lines[-3:], one.lines[-3:])
    os.kill(zero.proc.pid, signal.SIGKILL)  # rank 0's node is gone, and with it the gang's store
    rc, out = one.wait()
    zero.wait()
    assert rc == sdk.EXIT_PEER_LOST, out[-3000:]
    assert "a peer of this gang was lost" in out
