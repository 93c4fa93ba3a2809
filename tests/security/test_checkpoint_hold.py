"""A checkpoint cannot hold an executor, unbounded and uncharged (issue 26 item 3), on the real stack.

``teto up`` with one executor runs ``tests/security/ckpt_hog.py``: a ``command`` job whose first attempt leaves a
sparse, huge ``step-00000005.pt`` with a sidecar claiming its size and fails, so its next attempt's start must
verify it.

1. Over the quota (its organisation's, 1 MiB): the checkpoint the job reports is refused when written (a
   ``checkpoint_skipped`` event of epoch 1 saying so, no ``checkpointed``); never accepted, the next attempt
   deletes the file unread and runs: the job succeeds.
2. Within the quota (the job's own, 1 TiB, a file hashing for many minutes here), reported and so accepted: the
   next attempt's verification is charged to the job while it lasts, and cancelling the job frees the executor
   at once: a job submitted after it runs on the same (only) executor.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import JOB_PYTHON, start_stack
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

pytestmark = pytest.mark.e2e

HOG = str(Path(__file__).resolve().parent / "ckpt_hog.py")
MIB, GIB, TIB = 2**20, 2**30, 2**40


def _hog(size: int, mode: str, **spec) -> dict:
    return {"name": f"ckpt-hog-{mode}", "max_attempts": 3, **spec,
            "workload": {"kind": "command", "command": [JOB_PYTHON, HOG, str(size), mode]}}


def _put_org(stack, body: dict) -> None:  # noqa: ANN001
    r = httpx.put(stack.url + "/v1/orgs/default", json=body, headers=stack.headers, timeout=30)
    assert r.status_code == 200, r.text


def _submit(stack, body: dict) -> str:  # noqa: ANN001
    r = stack.post("/v1/jobs", body)
    assert r.status_code in (200, 201, 202), r.text
    return r.json()["id"]


@pytest.mark.timeout(600)
def test_a_huge_lying_checkpoint_neither_holds_the_executor_nor_goes_uncharged(stack_dir: Path) -> None:
    stack = start_stack(stack_dir, executors=1)
    try:
        # 1. The organisation's quota caps the job's own (64 GiB by default): refused when written, skipped unread.
        _put_org(stack, {"checkpoint_quota_bytes": MIB})
        over = _submit(stack, _hog(24 * GIB, "report"))
        assert stack.wait_state(over, {"succeeded", "failed"}, 180)["state"] == "succeeded", stack.log_tail()
        events = stack.events(over)
        skipped = [(e["epoch"], e["reason"]) for e in events if e["event"] == "checkpoint_skipped"]
        assert skipped == [
            (1, f"over the checkpoint quota: the checkpoint has {24 * GIB} bytes, the job's quota is {MIB} bytes"),
            # Refused when written, so never accepted: the next attempt deletes it unread (ckpt_fence.py).
            (2, "the queue accepted no checkpoint of this job"),
        ], events
        assert not [e for e in events if e["event"] == "checkpointed"], events

        # 2. Within the job's own quota: the verification runs, is charged, and a cancel ends it.
        _put_org(stack, {})
        # Reported and accepted (within the quota): the next attempt must verify it before resuming from it.
        held = _submit(stack, _hog(TIB, "report", checkpoint_quota_bytes=TIB))

        def verifying() -> float | None:
            events = stack.events(held)
            if not any(e["event"] == "leased" and e["epoch"] == 2 for e in events):
                return None
            assert not any(e["event"] == "started" and e["epoch"] == 2 for e in events), "a TiB hashed already?"
            return stack.job(held)["budget"]["consumed_seconds"]

        at_second_lease = eventually(verifying, 120, "the second attempt to be leased")
        # Attempt 1's time is charged at least every heartbeat (1 s): more than that since is the verification's.
        charged = eventually(lambda: (c := verifying()) is not None and c >= at_second_lease + 3 and c, 60,
                             "the verification's time to be charged to the job")
        r = stack.post(f"/v1/jobs/{held}/cancel", {"reason": "holding an executor"})
        assert r.status_code in (200, 202), r.text
        assert stack.wait_state(held, {"cancelled"}, 30)["state"] == "cancelled"
        # The only executor is free again: the next job runs on it (hashing the TiB would take many minutes).
        after = _submit(stack, {"name": "after", "workload": {"kind": "command", "command": [JOB_PYTHON, "-c", "0"]}})
        assert stack.wait_state(after, {"succeeded", "failed"}, 90)["state"] == "succeeded", stack.log_tail()
        finished = eventually(lambda: next((e for e in stack.events(held) if e["event"] == "cancelled"), None), 30,
                              "the cancelled event")
        assert finished is not None
        assert stack.job(held)["budget"]["consumed_seconds"] >= charged  # never taken back
    finally:
        stack.stop()
