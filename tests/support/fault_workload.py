"""The training script of the fault tests: a ``command`` workload that leaves evidence of how it ran.

It trains nothing (a counter), but behaves like a real script through ``teto.sdk``: it resumes from the
checkpoint it is given, reports every step, checkpoints every ``TETO_CHECKPOINT_EVERY`` steps and stops when
asked. Its evidence goes to ``$RUNS_DIR``:

- ``<job>.jsonl``: one JSON line per start, checkpoint (``saving`` before the write, ``checkpoint`` after), stop
  and end (wall time, pid, epoch, executor), so a test can prove nothing was written after a lease ended;
- ``<job>.lock``: held with ``flock`` for the whole run. The kernel drops it when the process dies however it
  dies, so a second process of the same job finding it held is running the job twice at once: it records an
  ``overlap`` line and exits with 4.

Environment: ``STEPS``, ``STEP_SECONDS``, ``HANG_AT_STEP`` (report that step, then sleep forever: heartbeats
go on, steps do not), ``RAISE_AT_STEP`` (raise an exception at that step: a training error).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from teto import sdk

CTX = sdk.context()
RUNS = Path(os.environ.get("RUNS_DIR", "."))


def note(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), "epoch": CTX.epoch,
                       "executor": os.environ.get("TETO_EXECUTOR_ID"), **fields})
    with open(RUNS / f"{CTX.job_id}.jsonl", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    steps = int(os.environ.get("STEPS", "20"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "0.1"))
    hang_at = int(os.environ.get("HANG_AT_STEP", "0"))
    raise_at = int(os.environ.get("RAISE_AT_STEP", "0"))
    every = CTX.checkpoint_every or 10
    RUNS.mkdir(parents=True, exist_ok=True)
    lock = open(RUNS / f"{CTX.job_id}.lock", "w")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note("overlap")
        return 4
    resumed = sdk.resume_checkpoint()
    step = resumed[0] if resumed else 0
    note("start", resumed_from=step)
    while step < steps:
        if sdk.stop_requested():
            note("stop", step=step)
            return sdk.EXIT_STOPPED
        step += 1
        if step == raise_at:
            raise RuntimeError(f"loss diverged at step {step}")
        sdk.report_step(step, total_steps=steps, loss=1.0 / step)
        if step == hang_at:
            note("hang", step=step)
            while True:  # a deadlock: alive, heartbeating through its agent, no steps
                time.sleep(1)
        if step % every == 0 or step == steps:
            note("saving", step=step)  # a kill between the save and the next line leaves this one
            sdk.save_checkpoint(json.dumps({"step": step}).encode(), step)
            note("checkpoint", step=step)
        sdk.sleep(step_seconds)
    note("end", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
