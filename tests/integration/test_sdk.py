"""teto.sdk from inside a real training process: JSON lines on the report pipe, exit when the agent is gone,
stop handling, and the same script running outside Teto."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libs.contracts.telemetry import EXIT_PEER_LOST

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _spawn(code: str, tmp_path: Path, *, fd: int | None = None, **env: str) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
    full.update(PYTHONPATH=str(ROOT), TETO_CHECKPOINT_DIR=str(tmp_path / "ck"), **env)
    if fd is not None:
        full["TETO_REPORT_FD"] = str(fd)
    return subprocess.Popen([sys.executable, "-c", code], env=full, pass_fds=(fd,) if fd is not None else (),
                            stderr=subprocess.PIPE, cwd=tmp_path)


def test_steps_and_checkpoints_arrive_as_json_lines(tmp_path):
    r, w = os.pipe()
    proc = _spawn("from teto import sdk\n"
                  "sdk.report_step(1, total_steps=2, loss=2.5, lr=0.1, note='x')\n"
                  "sdk.report_step(2, total_steps=2, loss=float('nan'))\n"
                  "print(sdk.save_checkpoint(b'abc', 2))\n", tmp_path, fd=w, TETO_JOB_ID="j")
    os.close(w)
    with os.fdopen(r) as f:
        lines = [json.loads(line) for line in f]
    assert proc.wait(10) == 0
    steps = [x for x in lines if x["type"] == "step"]
    assert steps[0] == {"type": "step", "step": 1, "total_steps": 2, "loss": 2.5, "step_seconds": None,
                        "metrics": {"lr": 0.1}}
    assert steps[1]["loss"] is None and steps[1]["step_seconds"] >= 0  # NaN is not a loss
    (ckpt,) = [x for x in lines if x["type"] == "checkpoint"]
    assert ckpt["step"] == 2 and ckpt["bytes"] == 3 and Path(ckpt["path"]).read_bytes() == b"abc"
    assert [x["phase"] for x in lines if x["type"] == "phase"] == ["checkpointing", "training"]


def test_the_process_exits_when_its_agent_is_gone(tmp_path):
    r, w = os.pipe()
    os.close(r)  # nobody reads any more
    proc = _spawn("from teto import sdk\nsdk.report_step(1)\nimport time; time.sleep(30)", tmp_path, fd=w,
                  TETO_JOB_ID="j")
    os.close(w)
    assert proc.wait(10) == 75


def test_a_lost_peer_ends_the_worker_with_its_own_status_even_when_teardown_would_abort(tmp_path):
    # A gang's process group whose peer vanished can abort in the interpreter's teardown (gloo's threads:
    # "terminate called without an active exception"): an atexit abort stands in for it. The worker still
    # ends with EXIT_PEER_LOST (not a training failure), its held step and in-flight checkpoint delivered.
    r, w = os.pipe()
    proc = _spawn("import atexit, os\nfrom teto import sdk\n"
                  "atexit.register(os.abort)\n"
                  "sdk.report_step(1)\nsdk.report_step(2)\n"
                  "sdk.save_checkpoint(b'w' * 100000, 2, background=True)\n"
                  "sdk.exit_peer_lost(RuntimeError('Connection closed by peer'))\n", tmp_path, fd=w,
                  TETO_JOB_ID="j")
    os.close(w)
    with os.fdopen(r) as f:
        lines = [json.loads(line) for line in f]
    err = proc.stderr.read().decode()
    assert proc.wait(10) == EXIT_PEER_LOST, err
    assert "a peer of this gang was lost: Connection closed by peer" in err
    assert [x["step"] for x in lines if x["type"] == "step"][-1] == 2
    (ckpt,) = [x for x in lines if x["type"] == "checkpoint"]
    assert ckpt["step"] == 2 and Path(ckpt["path"]).stat().st_size == 100000


def test_a_script_that_never_polls_stops_at_its_next_step_report(tmp_path):
    proc = _spawn("from teto import sdk\nimport time\n"
                  "for i in range(1000):\n    sdk.report_step(i)\n    print('step', flush=True)\n"
                  "    time.sleep(0.02)\n", tmp_path, TETO_JOB_ID="j")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 143


def test_outside_teto_checkpoints_are_saved_and_found_again(tmp_path):
    code = ("from teto import sdk\nr = sdk.resume_checkpoint()\nstart = r[0] if r else 0\n"
            "sdk.report_step(start + 1)\nsdk.save_checkpoint(b'w', start + 1)\nprint(start + 1)\n")
    for expected in (1, 2):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                             cwd=tmp_path, capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(expected)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == ["step-00000001.pt",
                                                                               "step-00000002.pt"]


def test_the_sdk_imports_nothing_heavy(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import sys, teto.sdk; print('torch' in sys.modules)"],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "False"


def _lines_until(r: int, want, timeout: float = 20.0) -> list[dict]:
    """JSON lines read from the pipe until ``want(lines)`` holds (or the timeout; the test then fails on them)."""
    import select

    lines: list[dict] = []
    buf = b""
    deadline = time.monotonic() + timeout
    while not want(lines) and time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], 0.2)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b"\n")
            lines += [json.loads(x) for x in done]
    return lines


def test_steps_reported_at_once_then_a_hang_reach_the_agent_as_the_first_and_the_latest(tmp_path):
    """At most 4 step lines a second (agents/executor/sdk_steps.py): steps 2-10 are held, and the timer thread
    writes step 10, for all nine, while the script hangs."""
    r, w = os.pipe()
    proc = _spawn("from teto import sdk\nimport time\n"
                  "for i in range(1, 11):\n    sdk.report_step(i, total_steps=100)\n"
                  "time.sleep(60)\n", tmp_path, fd=w, TETO_JOB_ID="j")
    os.close(w)
    try:
        lines = _lines_until(r, lambda got: any(x["step"] == 10 for x in got))
        assert [x["step"] for x in lines] == [1, 10]
        assert lines[1]["step_seconds_n"] == 9 and lines[1]["step_seconds"] >= 0
    finally:
        proc.kill()
        proc.wait(10)
        os.close(r)


def test_a_held_step_is_written_before_a_checkpoint_and_at_exit(tmp_path):
    r, w = os.pipe()
    proc = _spawn("from teto import sdk\n"
                  "sdk.report_step(1)\nsdk.report_step(2)\nsdk.save_checkpoint(b'x', 2)\n"
                  "sdk.report_step(3)\nsdk.report_step(4)\n", tmp_path, fd=w, TETO_JOB_ID="j")
    os.close(w)
    with os.fdopen(r) as f:
        lines = [json.loads(line) for line in f]
    assert proc.wait(10) == 0
    order = [(x["type"], x.get("step")) for x in lines if x["type"] != "phase"]
    assert order == [("step", 1), ("step", 2), ("checkpoint", 2), ("step", 4)]


def test_a_stopped_gang_worker_ends_with_its_own_status_even_when_teardown_would_abort(tmp_path):
    # As for a lost peer: a stopped gang worker's process group can abort in the interpreter's teardown (an atexit
    # abort stands in for it); sdk.exit_stopped ends it with 143, its held step delivered.
    r, w = os.pipe()
    proc = _spawn("import atexit, os\nfrom teto import sdk\n"
                  "atexit.register(os.abort)\n"
                  "sdk.report_step(1)\nsdk.report_step(2)\n"
                  "sdk.exit_stopped()\n", tmp_path, fd=w, TETO_JOB_ID="j")
    os.close(w)
    with os.fdopen(r) as f:
        lines = [json.loads(line) for line in f]
    assert proc.wait(10) == 143, proc.stderr.read().decode()
    assert [x["step"] for x in lines if x["type"] == "step"][-1] == 2
