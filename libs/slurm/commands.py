"""Slurm's commands as Teto uses them: the argument lists (pure), the parsing of their output (pure), and one
runner each for synchronous (CLI) and asynchronous (health service) callers. Arguments are passed as a list,
never through a shell: a reason with spaces or quotes reaches Slurm as it is.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from .pilot import JOB_NAME

SQUEUE_FORMAT = "%i|%T|%N|%l|%L|%P|%j"  # id, state, node, time limit, time left, partition, name
TIMEOUT_SECONDS = 60.0


class SlurmError(RuntimeError):
    def __init__(self, argv: list[str], returncode: int | None, output: str) -> None:
        super().__init__(f"{' '.join(argv[:3])} ... exited {returncode}: {output.strip()[-500:]}")
        self.argv = argv
        self.returncode = returncode
        self.output = output


@dataclass(frozen=True)
class PilotJob:
    job_id: str
    state: str
    node: str | None
    time_limit: str
    time_left: str
    partition: str


def squeue_pilots() -> list[str]:
    return ["squeue", "-h", f"--name={JOB_NAME}", "-o", SQUEUE_FORMAT]


def parse_squeue(text: str) -> list[PilotJob]:
    out = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 6 or not fields[0]:
            continue
        out.append(PilotJob(job_id=fields[0], state=fields[1], node=fields[2] or None, time_limit=fields[3],
                            time_left=fields[4], partition=fields[5]))
    return out


def show_node(node: str) -> list[str]:
    return ["scontrol", "show", "node", node, "--oneliner"]


def parse_node(text: str) -> dict[str, str]:
    """``scontrol show node --oneliner``: ``State`` and ``Reason`` (which keeps its spaces; Slurm appends
    ``[user@time]``, dropped here) and the other ``Key=value`` fields."""
    text = text.strip()
    head, sep, reason = text.partition(" Reason=")
    out: dict[str, str] = {}
    for item in head.split():
        key, eq, value = item.partition("=")
        if eq:
            out[key] = value
    if sep:
        out["Reason"] = reason.rsplit(" [", 1)[0].strip() if reason.rstrip().endswith("]") else reason.strip()
    return out


def drain(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def resume(node: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=RESUME"]


def reboot(node: str, reason: str) -> list[str]:
    """Reboot once the node is idle (ASAP drains it meanwhile: its pilot ends first), and leave it DOWN with the
    reason afterwards: a node Teto found broken returns to service only after a check passes (``resume``, which
    cancels a reboot still pending) or by its administrator's hand."""
    return ["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", node]


def cancel_reboot(node: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=CANCEL_REBOOT"]


def cancel(job_id: str) -> list[str]:
    return ["scancel", job_id]


def cancel_all_pilots(user: str, partition: str | None = None) -> list[str]:
    """Every pilot of ``user`` (an operator's scancel must not end another user's pilots)."""
    argv = ["scancel", f"--name={JOB_NAME}", f"--user={user}"]
    return [*argv, f"--partition={partition}"] if partition else argv


def show_config() -> list[str]:
    return ["scontrol", "show", "config"]


def cluster_name(config_text: str) -> str | None:
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip() or None
    return None


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


def run(argv: list[str], env: Mapping[str, str] | None = None, *, timeout: float = TIMEOUT_SECONDS) -> str:
    """Run one Slurm command; its standard output, or SlurmError with what it said."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(argv, None, str(exc)) from None
    if out.returncode != 0:
        raise SlurmError(argv, out.returncode, out.stderr or out.stdout)
    return out.stdout


async def arun(argv: list[str], env: Mapping[str, str] | None = None, *, timeout: float = TIMEOUT_SECONDS) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=_env(env))
    except OSError as exc:
        raise SlurmError(argv, None, str(exc)) from None
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SlurmError(argv, None, f"no answer within {timeout:g}s") from None
    if proc.returncode != 0:
        raise SlurmError(argv, proc.returncode, (stderr or stdout).decode(errors="replace"))
    return stdout.decode(errors="replace")
