"""Bringing the whole stack up as a user does (``teto up`` in a subprocess) and talking to it over HTTP."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from libs.runtime.ports import free_port_block
from teto.stack.isolation import workload_python
from tests.support.services import eventually_blocking as eventually


# The interpreter a `command` job names: under `teto up` as root jobs run as their own uid, which cannot enter
# /root where this venv's interpreter may live (teto up then runs workloads with the system one and this
# installation's packages on PYTHONPATH, and so must a job's own command).
JOB_PYTHON = workload_python()[0] or sys.executable

_SHARED_BASE: list[Path] = []


def shared_base_dir() -> Path:
    """The fine-tune's base checkpoint directory every stack of this process uses (``TETO_BASE_MODEL_DIR``, as an
    operator keeps one across restarts): the first agent that needs it builds it, under the builders' lock
    (``model.ensure_base``), instead of every stack spending the same 5 s of CPU on it. Removed at exit (a process
    killed first leaves its 2 MB; not ``teto-test-*``, which the next session's reaping takes for its own kind)."""
    if not _SHARED_BASE:
        root = Path(tempfile.mkdtemp(prefix="teto-stack-base-"))
        os.chmod(root, 0o755)  # the workloads' uids read the base through it
        atexit.register(shutil.rmtree, root, True)
        _SHARED_BASE.append(root / "base")
    return _SHARED_BASE[0]


@dataclass
class Stack:
    proc: subprocess.Popen
    data_dir: Path
    url: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers, timeout=15, **kw)

    def post(self, path: str, body: Any = None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=self.headers, timeout=30, **kw)

    def job(self, job_id: str) -> dict:
        r = self.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def events(self, job_id: str) -> list[dict]:
        """Every event of the job, in order: the route pages them (500 at most a page, ``after_seq`` for the
        next), and a run that checkpoints every few steps on a fast machine fills a page before it ends."""
        out: list[dict] = []
        while True:
            r = self.get(f"/v1/jobs/{job_id}/events", params={"after_seq": out[-1]["seq"] if out else 0,
                                                               "limit": 500})
            assert r.status_code == 200, r.text
            page = r.json()
            out.extend(page)
            if len(page) < 500:
                return out

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> dict:
        return eventually(lambda: (j := self.job(job_id))["state"] in states and j, timeout,
                          f"job {job_id} to reach {states}")

    def processes(self) -> list[dict]:
        return json.loads((self.data_dir / "processes.json").read_text())

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "teto.cli", *args, "--data-dir", str(self.data_dir)],
                              capture_output=True, text=True, timeout=60, env=_clean_env())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode

    def log_tail(self, n: int = 4000) -> str:
        out = []
        for f in sorted((self.data_dir / "logs").glob("*.log")):
            out.append(f"== {f.name}\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(out)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_stack(data_dir: Path, *, executors: int = 2, lease: float = 6, heartbeat: float = 1,
                extra_env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                ready_timeout: float = 120, code: Path | None = None) -> Stack:
    """``code``: the source tree of another release to run instead of this checkout (an upgrade's starting
    point): every part imports it first (it is the working directory and on PYTHONPATH), with this
    environment's installed dependencies."""
    port = free_port_block(3)  # the gateway replicas take --http-port and the ports after it
    env = _clean_env()
    env["TETO_BASE_MODEL_DIR"] = str(shared_base_dir())
    if code is not None:
        env["PYTHONPATH"] = str(code)
    env.update(extra_env or {})
    log = open(data_dir.parent / f"up-{port}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "teto.cli", "up", "--data-dir", str(data_dir), "--http-port", str(port),
         "--executors", str(executors), "--lease-seconds", str(lease), "--heartbeat-seconds", str(heartbeat), *args],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=code)
    stack_file = data_dir / "stack.json"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"teto up exited with {proc.returncode}: "
                                 f"{(data_dir.parent / f'up-{port}.log').read_text()[-3000:]}")
        if not stack_file.exists():
            return False
        info = json.loads(stack_file.read_text())
        return info["gateway_url"].endswith(f":{port}")

    eventually(ready, ready_timeout, "teto up to write stack.json")
    info = json.loads(stack_file.read_text())
    stack = Stack(proc, data_dir, info["gateway_url"], info["admin_token"])
    eventually(lambda: len(stack.get("/v1/executors").json()) >= executors, 60, "executors to register")
    return stack
