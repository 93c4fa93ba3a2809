"""An example ``command`` workload: a user's own training script that Teto runs, resumes and stops.

Submit it with
    {"workload": {"kind": "command", "command": ["python", "examples/train_script.py"],
                  "env": {"STEPS": "100", "STEP_SECONDS": "0.1"}},
     "checkpoint_every_steps": 10}
(the command runs in the executor's working directory; use an absolute path in a deployment).

What Teto gives the script, through the environment and ``teto.sdk``:
- ``sdk.resume_checkpoint()``: (step, path) of the latest valid checkpoint of this job, or None (TETO_RESUME_FROM);
- ``sdk.save_checkpoint(obj_or_bytes, step, background=True)``: writes TETO_CHECKPOINT_DIR/step-NNNNNNNN.pt
  atomically with a checksummed sidecar and reports it (rank 0 only); ``background=True`` returns once the state
  is copied, the write goes on in a background thread (``sdk.wait_checkpoints()`` waits for it);
- ``sdk.report_checkpoint(step, directory)``: a checkpoint directory written the way a training library writes one
  (``CHECKPOINT_KIND=directory`` here: ``checkpoint-N/`` holding ``state.json`` and ``optimizer.bin``) is sealed
  with a manifest of its files and reported as one checkpoint; ``resume_checkpoint()`` then returns the directory;
- ``sdk.report_step(step, loss=..., **metrics)``: progress, step time and metrics for the job's page;
- ``sdk.stop_requested()`` / ``sdk.checkpoint_on_stop()``: a stop (cancel, GPU ceiling) arrived as SIGTERM;
  finish the step, save if asked, exit.
Run outside Teto (``python examples/train_script.py``) it trains the same way and saves to ./checkpoints.

It "trains" a single number towards 3.0 with gradient descent, so it needs nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import sys

from teto import sdk


def main() -> int:
    steps = int(os.environ.get("STEPS", "50"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "0"))
    every = sdk.context().checkpoint_every or 10
    fail_at = int(os.environ.get("FAIL_AT_STEP", "0"))  # to try the failure path

    directories = os.environ.get("CHECKPOINT_KIND") == "directory"

    def save(step: int, weight: float, *, background: bool) -> None:
        if not directories:
            sdk.save_checkpoint(json.dumps({"weight": weight}).encode(), step, background=background)
        elif sdk.context().is_writer:
            where = sdk.context().checkpoint_dir / f"checkpoint-{step}"
            (where / "optimizer").mkdir(parents=True, exist_ok=True)
            (where / "state.json").write_text(json.dumps({"weight": weight, "global_step": step}))
            (where / "optimizer" / "optimizer.bin").write_bytes(bytes(step % 256 for _ in range(4096)))
            sdk.report_checkpoint(step, where)

    weight, step = 0.0, 0
    resumed = sdk.resume_checkpoint()
    if resumed is not None:
        step, path = resumed
        weight = json.loads((path / "state.json" if path.is_dir() else path).read_bytes())["weight"]
        print(f"resuming after step {step} from {path}", flush=True)

    while step < steps:
        if sdk.stop_requested():
            if sdk.checkpoint_on_stop():
                save(step, weight, background=False)
            return sdk.EXIT_STOPPED
        step += 1
        if step == fail_at:
            print(f"diverged at step {step}: loss is nan", file=sys.stderr)
            return 3
        loss = (weight - 3.0) ** 2
        weight -= 0.1 * 2 * (weight - 3.0)
        sdk.report_step(step, total_steps=steps, loss=loss, weight=weight, learning_rate=0.1)
        if step % every == 0 or step == steps:
            save(step, weight, background=True)
        if step_seconds:
            sdk.sleep(step_seconds)
    sdk.wait_checkpoints()  # the last checkpoint is durable before the script says it succeeded
    return 0


if __name__ == "__main__":
    sys.exit(main())
