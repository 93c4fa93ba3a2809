"""A real Slurm cluster on this one machine for the Slurm tests: Debian's ``slurm-wlm`` and ``munge``.

When the daemons are missing and this is a Debian-like system (apt-get) running as root, they are installed once
with ``apt-get install -y --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge`` (as the panel
tests install Chromium, tests/panel/browser.py); anywhere else the tests stop with the one line to run.

``slurm_cluster(root, nodes=5)`` starts munged on a private socket, slurmctld and one ``slurmd -N nK`` per node
(each with its own port, spool and log), every path under ``root``; each node has two fake GPUs (plain files in
gres.conf) and the CPUs of this machine. ``RebootProgram`` is ``/bin/true``: a reboot request is accepted and
shown as Slurm shows it (``REBOOT_REQUESTED``, then ``REBOOT_ISSUED``), and nothing reboots. The cluster's ``env`` (``SLURM_CONF``) is what every Slurm client
command needs. Everything is stopped when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.ports import free_port_block
from libs.slurm.commands import parse_node, show_node
from tests.support.services import eventually_blocking

PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge")
INSTALL = f"apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
PARTITION = "gpu"
GPUS_PER_NODE = 2
KILL_WAIT_SECONDS = 30  # SIGTERM to SIGKILL at scancel or the time limit (Slurm's default too)


class SlurmMissing(RuntimeError):
    pass


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def ensure_slurm() -> None:
    """Slurm's daemons and clients and munge, installing them with apt-get when that is possible here."""
    if all(_which(d) for d in DAEMONS):
        return
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        print(f"tests: Slurm is not installed; running `{INSTALL}` (once)", file=sys.stderr, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
        result = subprocess.run(INSTALL.split(), env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SlurmMissing(f"`{INSTALL}` failed ({result.returncode}): {result.stderr[-2000:]}"
                               f"{update.stderr[-500:]}")
        if all(_which(d) for d in DAEMONS):
            return
    raise SlurmMissing("the Slurm tests need Slurm and munge from the system's package manager; on Debian or Ubuntu "
                       f"run as root: {INSTALL}")


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[str]
    partition: str = PARTITION
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client command needs to reach this cluster (on top of the caller's environment)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                             env={**os.environ, **self.env})
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr or out.stdout}")
        return out

    def node(self, name: str) -> dict[str, str]:
        """``scontrol show node`` as a dict (State, Reason, ...); Reason keeps its spaces."""
        return parse_node(self.run(*show_node(name)).stdout)

    def jobs(self) -> list[dict[str, str]]:
        """squeue's view of every job: id, name, state, node."""
        lines = self.run("squeue", "-h", "-o", "%i|%j|%T|%N").stdout.splitlines()
        return [dict(zip(("job_id", "name", "state", "node"), line.split("|"))) for line in lines if line.strip()]

    def job_state(self, job_id: str) -> str:
        """A job's state, finished ones too (scontrol keeps them MinJobAge seconds)."""
        out = self.run("scontrol", "show", "job", job_id, "--oneliner", check=False).stdout
        for item in out.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
        return "UNKNOWN"

    def log(self, n: int = 3000) -> str:
        parts = []
        for f in sorted(self.root.glob("*.log")):
            parts.append(f"== {f.name}\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for pid in self.leftovers():  # a job step whose slurmd went first (slurmstepd outlives it)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftovers(self) -> list[int]:
        """Processes this cluster started that still run: those whose environment names its slurm.conf (Slurm
        sets SLURM_CONF in every step it starts), this test process and its ancestors left out."""
        mark = f"SLURM_CONF={self.conf}".encode()
        spared = {os.getpid(), os.getppid()}
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in spared:
                continue
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
            except OSError:
                continue
        return out


def write_config(root: Path, nodes: list[str], ports: list[int], ctld_port: int, cluster: str) -> None:
    host = socket.gethostname()
    (root / "ctld").mkdir(parents=True, exist_ok=True)
    for i in range(GPUS_PER_NODE):
        (root / f"gpu{i}").touch()  # the fake devices gres.conf names
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={os.cpu_count() or 1} "
        f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN" for n, p in zip(nodes, ports))
    (root / "slurm.conf").write_text(f"""\
ClusterName={cluster}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
KillWait={KILL_WAIT_SECONDS}
RebootProgram=/bin/true
ResumeTimeout=600
MinJobAge=600
SlurmdTimeout=300
InactiveLimit=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{node_lines}
PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP
""")
    (root / "gres.conf").write_text(
        f"NodeName={','.join(nodes)} Name=gpu File={root}/gpu[0-{GPUS_PER_NODE - 1}]\n")
    for n in nodes:
        (root / f"spool-{n}").mkdir(exist_ok=True)


@contextlib.contextmanager
def slurm_cluster(root: Path, nodes: int = 5) -> Iterator[SlurmCluster]:
    """munged, slurmctld and ``nodes`` slurmd daemons on this machine, all of them stopped afterwards."""
    ensure_slurm()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # slurmd reads its config as root, jobs run as the submitting user (root here)
    names = [f"n{i}" for i in range(1, nodes + 1)]
    ports = free_port_block(nodes + 1)
    ctld_port, node_ports = ports, [ports + i for i in range(1, nodes + 1)]
    write_config(root, names, node_ports, ctld_port, f"t{uuid.uuid4().hex[:8]}")
    cluster = SlurmCluster(root, names)
    env = {**os.environ, **cluster.env}
    try:
        key = root / "munge.key"
        subprocess.run([_which("mungekey") or "mungekey", "--create", f"--keyfile={key}"], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        cluster.procs.append(subprocess.Popen(
            [_which("munged"), "--foreground", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
             f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"],
            stdout=subprocess.DEVNULL, stderr=open(root / "munged.err.log", "ab"), start_new_session=True))
        eventually_blocking(lambda: (root / "munge.sock").exists(), 20, "munged's socket")
        cluster.procs.append(subprocess.Popen([_which("slurmctld"), "-D", "-i", "-f", str(cluster.conf)],
                                              stdout=subprocess.DEVNULL, stderr=open(root / "ctld.err.log", "ab"),
                                              env=env, start_new_session=True))
        for name in names:
            cluster.procs.append(subprocess.Popen([_which("slurmd"), "-D", "-N", name, "-f", str(cluster.conf)],
                                                  stdout=subprocess.DEVNULL,
                                                  stderr=open(root / f"slurmd-{name}.err.log", "ab"), env=env,
                                                  start_new_session=True))

        def all_idle() -> bool:
            for p in cluster.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a Slurm daemon exited {p.returncode}: {p.args}\n{cluster.log()}")
            out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            states = dict(zip(out[::2], out[1::2]))
            return len(states) == nodes and all(s == "idle" for s in states.values())

        eventually_blocking(all_idle, 60, "every slurmd to register idle")
        yield cluster
    finally:
        cluster.stop()
