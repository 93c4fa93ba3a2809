"""The pilot job: one Teto agent per Slurm node, as Slurm should see a well-behaved guest.

Pure: what ``sbatch`` is given (``sbatch_args``), the batch script (``batch_script``), the agent's settings file
(``settings_file``, shell-quoted ``NAME=value`` lines, written 0600 by the caller: settings and credentials never
appear on a command line, where ``ps`` and ``squeue`` show them), the ids a pilot's agent takes from Slurm's
environment (``pilot_ids``) and Slurm's time-limit syntax (``time_limit_seconds``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

JOB_NAME = "teto-pilot"  # every pilot's Slurm job name: squeue --name finds them all
SIGNAL = "USR1"  # sent to the agent (the batch shell, exec'd) the lead time before the time limit
SCRIPT = "pilot.sbatch"
SETTINGS = "pilot.env"
REQUEST = "pilot.json"
PILOT_FLAG = "TETO_SLURM_PILOT"  # set to 1 in the pilot's settings file: this agent is a Slurm pilot
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


class PilotError(ValueError):
    pass


@dataclass(frozen=True)
class PilotRequest:
    """What ``teto slurm provision`` asks of Slurm for each pilot (also what a replacement asks again)."""

    partition: str
    gpus_per_node: int = 0
    time_limit: str | None = None  # Slurm's syntax: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
    signal_lead_seconds: int = 120  # --signal lead: the agent checkpoints and stops its run in this time
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    group: str = "slurm"  # the Teto node group the pilots join
    exclude: tuple[str, ...] = ()  # nodes the pilot must not land on (a drained one, for a replacement)
    extra: tuple[str, ...] = field(default_factory=tuple)  # the site's own sbatch options, passed as they are

    def check(self) -> None:
        if not self.partition or not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", self.partition):
            raise PilotError(f"partition {self.partition!r} is not a Slurm partition name")
        if not 0 <= self.gpus_per_node <= 64:
            raise PilotError(f"--gpus-per-node {self.gpus_per_node} is outside 0-64")
        if self.time_limit is not None:
            limit = time_limit_seconds(self.time_limit)
            if limit is not None and limit <= self.signal_lead_seconds:
                raise PilotError(f"the time limit {self.time_limit} ({limit}s) is not longer than the signal lead "
                                 f"{self.signal_lead_seconds}s: the agent would be told to stop as it starts")
        if not 10 <= self.signal_lead_seconds <= 65535:  # Slurm's --signal accepts up to 0xffff seconds
            raise PilotError(f"signal lead {self.signal_lead_seconds}s is outside 10-65535")
        for opt in self.extra:
            if not opt.startswith("--"):
                raise PilotError(f"extra sbatch option {opt!r} must be a long option (--name=value)")

    def as_dict(self) -> dict:
        return {"partition": self.partition, "gpus_per_node": self.gpus_per_node, "time_limit": self.time_limit,
                "signal_lead_seconds": self.signal_lead_seconds, "account": self.account, "qos": self.qos,
                "cpus_per_task": self.cpus_per_task, "group": self.group, "exclude": list(self.exclude),
                "extra": list(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping) -> PilotRequest:
        return cls(partition=data["partition"], gpus_per_node=int(data.get("gpus_per_node") or 0),
                   time_limit=data.get("time_limit"), signal_lead_seconds=int(data.get("signal_lead_seconds", 120)),
                   account=data.get("account"), qos=data.get("qos"), cpus_per_task=data.get("cpus_per_task"),
                   group=data.get("group") or "slurm", exclude=tuple(data.get("exclude") or ()),
                   extra=tuple(data.get("extra") or ()))


def sbatch_args(req: PilotRequest, pilot_dir: Path) -> list[str]:
    """``sbatch`` and its options for one pilot: one task on one node holding the node's GPUs, the signal lead
    wired to the agent, output in the pilot directory, the submitter's environment NOT exported (the settings
    file is the agent's whole configuration). ``--parsable`` prints the job id."""
    req.check()
    args = ["sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--partition={req.partition}", "--nodes=1",
            "--ntasks=1", f"--signal=B:{SIGNAL}@{req.signal_lead_seconds}", "--export=NONE",
            f"--output={pilot_dir / 'pilot-%j.out'}", f"--chdir={pilot_dir}"]
    if req.gpus_per_node:
        args.append(f"--gres=gpu:{req.gpus_per_node}")
    if req.cpus_per_task:
        args.append(f"--cpus-per-task={req.cpus_per_task}")
    if req.time_limit:
        args.append(f"--time={req.time_limit}")
    if req.account:
        args.append(f"--account={req.account}")
    if req.qos:
        args.append(f"--qos={req.qos}")
    if req.exclude:
        args.append(f"--exclude={','.join(sorted(req.exclude))}")
    args.extend(req.extra)
    args.append(str(pilot_dir / SCRIPT))
    return args


def batch_script(python: str, pilot_dir: Path) -> str:
    """The batch script: read the settings file (0600, the submitter's), then become the agent (``exec``: the
    agent is the batch shell, so ``--signal=B:...`` and scancel's SIGTERM reach it, not a shell that ignores
    them while it waits)."""
    return ("#!/bin/bash\n"
            "# A Teto pilot: one agent holding this node's GPUs for Teto's jobs (written by `teto slurm provision`).\n"
            "set -euo pipefail\n"
            f"set -a; . {shlex.quote(str(pilot_dir / SETTINGS))}; set +a\n"
            f"exec {shlex.quote(python)} -m agents.executor.main\n")


def settings_file(settings: Mapping[str, str]) -> str:
    """``NAME='value'`` lines the batch script sources; names are environment names, values shell-quoted."""
    lines = []
    for name, value in sorted(settings.items()):
        if not _NAME.match(name):
            raise PilotError(f"{name!r} is not an environment variable name")
        lines.append(f"{name}={shlex.quote(str(value))}")
    return "".join(f"{line}\n" for line in lines)


def pilot_ids(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(executor id, node id) of the agent of the Slurm job whose environment ``env`` is, or None outside one.

    The executor is the job (``slurm-<cluster>-<job id>``), the node is where it runs (``<node>-<job id>``): a
    pilot requeued by Slurm comes back as the same executor; a pilot on a node Teto replaced is a new node. Only a
    pilot (``TETO_SLURM_PILOT=1``, from its settings file): agents started by hand inside an allocation keep their
    own ids."""
    job_id, node = env.get("SLURM_JOB_ID"), env.get("SLURMD_NODENAME")
    if env.get(PILOT_FLAG) != "1" or not job_id or not node:
        return None
    cluster = _SAFE.sub("-", env.get("SLURM_CLUSTER_NAME") or "slurm").strip("-") or "slurm"
    return f"slurm-{cluster}-{job_id}"[:120], f"{_SAFE.sub('-', node).strip('-')}-{job_id}"[:120]


def time_limit_seconds(text: str) -> int | None:
    """Slurm's time syntax in seconds; None for no limit (``UNLIMITED``, ``INFINITE``, empty)."""
    text = (text or "").strip()
    if text.upper() in ("", "UNLIMITED", "INFINITE", "NOT_SET"):
        return None
    m = _TIME.match(text)
    if not m:
        raise PilotError(f"time limit {text!r} is not Slurm's syntax (minutes, MM:SS, HH:MM:SS, D-HH:MM:SS)")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, s = (nums + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(nums) == 1:  # minutes
        return nums[0] * 60
    if len(nums) == 2:  # MM:SS
        return nums[0] * 60 + nums[1]
    return nums[0] * 3600 + nums[1] * 60 + nums[2]
