"""``teto up --demo``: submit a short fine-tune through the gateway and print its progress (state, step, last
checkpoint, executor) until it ends, as a person watching the stack would."""

from __future__ import annotations

import sys
import time

import httpx

from teto.stack.supervisor import Supervisor


def follow_demo(url: str, token: str, sup: Supervisor, demo_spec: dict | None = None) -> int:
    """Submit the demo job (``demo_spec``, else a short built-in fine-tune) and print its progress until it ends;
    0 when it succeeded."""
    # About a minute on 2 CPU cores (0.06-0.07 s a step), a checkpoint every 100 steps.
    spec = demo_spec or {"name": "demo-finetune", "workload": {"kind": "finetune", "params": {"steps": 900}},
                              "checkpoint_every_steps": 100}
    headers = {"Authorization": f"Bearer {token}"}
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/jobs", json=spec, headers=headers, timeout=30)
    if r.status_code not in (201, 202):
        print(f"demo submit refused: {r.status_code} {r.text}", file=sys.stderr)
        return 1
    job_id = r.json().get("id") or r.json().get("job_id")
    print(f"demo job {job_id} submitted; following it (GET {url}/v1/jobs/{job_id})", flush=True)
    last = None
    while True:
        sup.check()
        try:
            job = httpx.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        except httpx.HTTPError:
            time.sleep(1)
            continue
        ckpt = (job.get("last_checkpoint") or {}).get("step")
        line = (job.get("state"), job.get("last_step"), ckpt)
        if line != last:
            total = job.get("total_steps") or "?"
            print(f"  [{time.monotonic() - t0:6.1f}s] {job.get('state'):<11} step {job.get('last_step') or 0}/"
                  f"{total}  last checkpoint: step {ckpt if ckpt is not None else '-'}  "
                  f"executor: {job.get('executor_id') or '-'}", flush=True)
            last = line
        if job.get("state") in ("succeeded", "failed", "cancelled", "interrupted"):
            print(f"demo job {job['state']} in {time.monotonic() - t0:.1f}s"
                  + (f": {job.get('reason') or job.get('error')}" if job["state"] != "succeeded" else ""), flush=True)
            return 0 if job["state"] == "succeeded" else 1
        time.sleep(1.0)
