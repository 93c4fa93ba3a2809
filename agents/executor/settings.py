"""Settings of one executor agent (``TETO_*`` variables), on top of the lease contract every part shares."""

from __future__ import annotations

import re
import secrets
import socket
from pathlib import Path

from pydantic import Field, model_validator

from libs.runtime.settings import CommonSettings, SettingsError

from .logship import LogLimits

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def safe_token(value: str) -> str:
    """Executor and node ids become subject tokens and consumer names: only [A-Za-z0-9_-] survive."""
    return _UNSAFE.sub("-", value).strip("-") or "host"


def _hostname() -> str:
    return safe_token(socket.gethostname().split(".")[0])


class ExecutorSettings(CommonSettings):
    group: str = Field("default", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Node group this node joins")
    executor_id: str = Field("", pattern=r"^[A-Za-z0-9_-]{0,120}$",
                             description="This agent's id (default: hostname plus 6 random hex digits)")
    node_id: str = Field("", pattern=r"^[A-Za-z0-9_-]{0,120}$",
                         description="This node's id (default: hostname plus the executor id's random suffix)")
    work_dir: Path | None = Field(None, description="Logs and scratch space (default data_dir/executors/<id>)")
    base_model_dir: Path | None = Field(
        None, description="Where the built-in fine-tune caches its base checkpoint (default data_dir/base)")
    checkpoints_kept: int = Field(
        3, ge=0, le=100_000, description="Complete checkpoints a job keeps in its checkpoint directory when its spec "
        "does not say (checkpoints_kept): older ones are deleted once a newer one is complete; 0 keeps every one")
    progress_interval_seconds: float = Field(
        5.0, gt=0, le=3600, description="Most frequent StepReport; also the interval the stuck rule measures")
    stop_grace_seconds: float = Field(10.0, gt=0, le=3600, description="SIGTERM to SIGKILL when stopping a job")
    torch_threads: int | None = Field(
        None, ge=1, le=1024, description="CPU threads of the built-in fine-tune (default: the CPU count)")
    advertise_host: str | None = Field(
        None, max_length=255, description="Host other nodes reach this one at for checks (default: this host's "
        "address)")
    check_bind_host: str | None = Field(
        None, max_length=255, description="Address this node's check listeners bind (default: advertise_host); "
        "set it to a local address when the advertised one is not on this host (behind NAT)")
    check_timeout_seconds: float = Field(300.0, gt=0, le=7200, description="A check run longer than this fails")
    check_memtest_fraction: float = Field(
        0.05, gt=0, le=0.95, description="Fraction of free device memory the memory pattern test covers (CPU: at "
        "most 32 MB)")
    reboot_command: str | None = Field(
        None, max_length=4000, description="Run (shell) on a reboot directive instead of restarting the agent "
        "process, e.g. 'sudo systemctl reboot'")
    secrets_key: str | None = Field(
        None, max_length=4096, description="Key opening the secret env values the gateway sealed (a key file path "
        "or 32 bytes in base64; the gateway's key); unset: a job with a secret value cannot start here")
    workload_uid_range: str = Field(
        "", max_length=40, description="When the agent is root: run each workload as its "
        "own uid from FIRST-LAST (no passwd entry needed, e.g. 200000-200999), so tenants cannot read or signal each "
        "other; empty: TETO_WORKLOAD_USER, else the agent's own user (teto up sets a range when root)")
    workload_user: str = Field(
        "", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$", description="When the agent is root and no uid range is "
        "set: one user name or uid every workload runs as (separates runs from the agent, not from each other)")
    workload_uid_lock_dir: Path = Field(
        Path("/run/teto/workload-uids"), description="Lock files that keep a per-run uid unique across the agents "
        "of one machine (every agent of the machine must use the same directory)")
    workload_cgroup: bool = Field(
        True, description="Hold each run in its own cgroup v2 (where one can be created) and kill it whole when the "
        "run ends; otherwise the process group, plus every process of a per-run uid")
    workload_python: str = Field(
        "", max_length=4000, description="Interpreter of the built-in fine-tune and of the guard around commands "
        "(default: the agent's); one other users can run when the agent's lives under /root")
    environments: str = Field(
        "", max_length=16000, description="Comma-separated Python environments prepared on this node (interpreters "
        "or venv/conda directories, e.g. made by teto env create) that a job may name (its spec's environment); "
        "reported with every heartbeat, so a job naming one no node offers is refused at submit")
    workload_env_allow: str = Field(
        "", max_length=4000, description="Comma-separated names (NAME or PREFIX_*) of the agent's environment a run "
        "inherits on top of PATH, LANG, LC_*, TZ (never TETO_*)")
    log_chunk_bytes: int = Field(
        64000, ge=256, le=65000, description="A job's output is shipped in chunks of at most this many bytes...")
    log_flush_seconds: float = Field(
        1.0, gt=0, le=60, description="...or sooner: no output waits longer than this before it is shipped")
    log_max_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, le=2**40, description="Output shipped per run (attempt and rank), stdout and "
        "stderr together; past it the run's log is marked truncated (the local log file keeps everything)")
    log_buffer_bytes: int = Field(
        1024 * 1024, ge=65536, le=2**32, description="Output waiting for the bus, at most; past it output is "
        "dropped (and the gap marked), never the training process held up")
    test_fault: str = Field(
        "", max_length=200, description="TEST ONLY: '<test>:fail' or '<test>:slow', comma separated, makes the "
        "named checks fail or run slow (never set on a real node)")

    @model_validator(mode="after")
    def _fill_ids(self) -> ExecutorSettings:
        # Defaults that depend on each other are filled once, here, so every reader sees the same ids.
        host = _hostname()
        executor_id = self.executor_id or f"{host}-{secrets.token_hex(3)}"
        node_id = self.node_id or f"{host}-{executor_id.rsplit('-', 1)[-1]}"
        object.__setattr__(self, "executor_id", executor_id)
        object.__setattr__(self, "node_id", node_id)
        return self

    @property
    def effective_work_dir(self) -> Path:
        return self.work_dir or (self.data_dir / "executors" / self.executor_id)

    @property
    def effective_base_model_dir(self) -> Path:
        return self.base_model_dir or (self.data_dir / "base")

    @property
    def environment_list(self) -> list[str]:
        from .pyenv import parse as parse_environments

        return parse_environments(self.environments)

    @property
    def log_limits(self) -> LogLimits:
        return LogLimits(chunk_bytes=self.log_chunk_bytes, flush_seconds=self.log_flush_seconds,
                         max_bytes=self.log_max_bytes, buffer_bytes=self.log_buffer_bytes)

    @property
    def abandon_grace_seconds(self) -> float:
        """SIGTERM to SIGKILL when abandoning: half the stop margin, so the process is dead before the lease ends."""
        return max(0.1, min(self.stop_grace_seconds, self.effective_stop_margin / 2))

    def check(self) -> None:
        super().check()
        from .checks.faults import parse

        try:
            parse(self.test_fault)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        from .isolation import IsolationError, parse_uid_range

        try:
            parse_uid_range(self.workload_uid_range)
        except IsolationError as exc:
            raise SettingsError(str(exc)) from None
        from .pyenv import parse as parse_environments

        try:
            parse_environments(self.environments)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if self.progress_interval_seconds > self.lease_seconds:
            raise SettingsError(f"progress interval {self.progress_interval_seconds:g}s is longer than the lease "
                                f"{self.lease_seconds:g}s: a healthy job would look stuck")
