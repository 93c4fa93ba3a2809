"""Typed settings read from ``TETO_*`` environment variables, one class per concern, with bounds.

``CommonSettings`` is what every part needs (where NATS and PostgreSQL are, the subject prefix, the lease
contract). Services extend it. ``check()`` refuses a configuration that cannot be safe, with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from libs.contracts.envelope import describe
from libs.contracts.subjects import Subjects


class SettingsError(ValueError):
    """Configuration refused at start-up; the message names the variable and the reason."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Self:
        """Fields are read from TETO_<FIELD_NAME_UPPER>, or from the file TETO_<FIELD_NAME_UPPER>_FILE names (a
        secret mounted into one container, like a database URL with its password); explicit overrides win."""
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = f"TETO_{name.upper()}"
            if key in env and env[key] != "":
                values[name] = env[key]
            elif env.get(f"{key}_FILE") and f"{name}_file" not in cls.model_fields:
                values[name] = _read_secret(Path(env[f"{key}_FILE"]), f"{key}_FILE")
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsError(f"invalid configuration: {describe(exc)} (set through TETO_<FIELD>)") from None
        settings.check()
        return settings

    def check(self) -> None:
        """Cross-field rules; raise SettingsError with the reason."""


def _read_secret(path: Path, variable: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{variable}: cannot read {path}: {exc.strerror}") from None


class CommonSettings(Settings):
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL(s), comma separated")
    database_url: str = Field("postgresql://teto@127.0.0.1:5432/teto", description="PostgreSQL DSN")
    subject_prefix: str = Field("teto", pattern=r"^[a-z][a-z0-9_-]*$", description="Prefix of every subject")
    lease_seconds: float = Field(180.0, gt=0, le=86400, description="Lease duration without a renewal")
    heartbeat_seconds: float = Field(30.0, gt=0, le=3600, description="Executor heartbeat interval")
    stop_margin_seconds: float | None = Field(
        None, gt=0, description="The executor stops this long before the lease ends (default: one heartbeat)"
    )
    nats_credentials_file: Path | None = Field(
        None, description="This part's NATS credentials, a 0600 JSON file {user, password, inbox_prefix, ca_file} "
        "(docs/security/bus.md); unset: connect without credentials, and declare the streams")
    stream_replicas: int = Field(
        1, ge=1, le=5, description="Replicas of each JetStream stream a part declares: 1 on a single server, 3 on "
        "a NATS cluster of three or more (teto up --nats-cluster sets it; docs/reliability.md)")
    data_dir: Path = Field(Path(".teto"), description="Local state: embedded servers, tokens, checkpoints")
    checkpoint_dir: Path | None = Field(None, description="Checkpoint storage, a directory (a shared filesystem in a deployment); default data_dir/checkpoints")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus metrics of this process on this HTTP port "
                              "(/metrics); 0: off. `teto up` gives each process a free one (docs/observability.md)")
    metrics_host: str = Field("127.0.0.1", max_length=255, description="Address the metrics endpoint listens on "
                              "(0.0.0.0 in a container)")
    instance: str = Field("", max_length=200, description="This process's `instance` label and its name in "
                          "`teto status`; default <host>:<pid>")
    log_format: Literal["text", "json"] = Field("text", description="Log lines as text, or one JSON object a line "
                                                "with job_id, executor_id, command_id, trace_id when known")
    metrics_sample_seconds: float = Field(5.0, gt=0, le=3600, description="How often consumer lag (JetStream "
                                          "num_pending) is sampled for metrics and `teto status`")

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.subject_prefix)

    @property
    def effective_stop_margin(self) -> float:
        return self.stop_margin_seconds if self.stop_margin_seconds is not None else self.heartbeat_seconds

    @property
    def effective_checkpoint_dir(self) -> Path:
        return self.checkpoint_dir or (self.data_dir / "checkpoints")

    def check(self) -> None:
        check_lease_contract(self.lease_seconds, self.heartbeat_seconds, self.effective_stop_margin)


def batch_linger_field(which: str) -> Any:
    """``TETO_BATCH_LINGER_SECONDS`` of a service (libs/runtime/edge.py, ``Consumer.linger_seconds``): its
    consumers nobody waits on (``which``) fetch again this long after a batch that came short."""
    return Field(0.1, ge=0, le=5, description=(
        f"After a batch that came short, {which} wait this long before fetching the next, so what arrives "
        "meanwhile is one transaction instead of many small ones (each costs about as much for one message as "
        "for hundreds); nobody waits on these, and a full batch (a backlog) is followed at once; 0: fetch at once"))


def check_lease_contract(lease: float, heartbeat: float, stop_margin: float) -> None:
    """The executor must be able to miss one heartbeat and still stop before the queue redelivers.

    Renewals happen every heartbeat; the executor gives up after ``lease - stop_margin`` without an
    acknowledged renewal. That window must hold at least two heartbeats, or one lost renewal would make a
    healthy executor abandon its job.
    """
    if stop_margin >= lease:
        raise SettingsError(f"stop margin {stop_margin:g}s must be shorter than the lease {lease:g}s")
    if lease < 2 * heartbeat + stop_margin:
        raise SettingsError(
            f"lease {lease:g}s is shorter than two heartbeats ({2 * heartbeat:g}s) plus the stop margin "
            f"({stop_margin:g}s): one lost renewal would make a healthy executor abandon its job"
        )
