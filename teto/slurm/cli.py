"""``teto slurm``: provision pilots (one agent per node, as a Slurm job holding the node's GPUs), show them
beside their Teto nodes, release them. Slurm's own commands do the work (libs/slurm/commands.py); the agents'
settings travel in a 0600 file of the pilot directory, never on a command line (libs/slurm/pilot.py).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from libs.slurm import commands, pilotdir
from libs.slurm.pilot import PILOT_FLAG, PilotError, PilotRequest
from teto.slurm import view

# What an agent must not be given: the services' secrets and ids of its own (a pilot takes its job's).
NOT_FOR_AGENTS = ("TETO_DATABASE_URL", "TETO_DATABASE_ADMIN_URL", "TETO_TOKENS_FILE", "TETO_EXECUTOR_ID",
                  "TETO_NODE_ID", "TETO_HTTP_PORT", "TETO_INSTANCE", "TETO_URL", "TETO_TOKEN", "TETO_SLURM_PILOT_DIR",
                  "TETO_AUDIT_KEY", "TETO_METRICS_PORT")
PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")  # the pilot runs with --export=NONE: the little it needs


def agent_settings(environ: Mapping[str, str], group: str, lead: int, overrides: Mapping[str, str]) -> dict[str, str]:
    """The pilot's settings file: this shell's TETO_* settings an agent may hold, the few basics, the pilot's
    own, then ``--set`` (pure)."""
    def for_agents(name: str) -> bool:
        base = name.removesuffix("_FILE")  # TETO_X_FILE names the file holding TETO_X
        return (name.startswith("TETO_") and not name.startswith(("TETO_PROVISIONER", "TETO_SLURM_"))
                and name not in NOT_FOR_AGENTS and base not in NOT_FOR_AGENTS)

    out = {k: v for k, v in environ.items() if for_agents(k)}
    out.update({k: environ[k] for k in PASSED if k in environ})
    out.update({PILOT_FLAG: "1", "TETO_GROUP": group, "TETO_SLURM_SIGNAL_LEAD_SECONDS": str(lead)})
    out.update(overrides)
    return out


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        if not eq:
            raise PilotError(f"--set {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def provision(pilot_dir: Path, request: PilotRequest, nodes: int, settings: Mapping[str, str],
              python: str = sys.executable, env: Mapping[str, str] | None = None) -> list[str]:
    """Write the pilot directory and submit ``nodes`` pilots; their Slurm job ids."""
    pilotdir.write(pilot_dir, request, settings, python)
    return [pilotdir.submit(pilot_dir, request, env) for _ in range(nodes)]


def cluster_name(env: Mapping[str, str] | None = None) -> str | None:
    return commands.cluster_name(commands.run(commands.show_config(), env))


def slurm_nodes(env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    out = {}
    for line in commands.run(["scontrol", "show", "node", "--oneliner"], env).splitlines():
        info = commands.parse_node(line)
        if info.get("NodeName"):
            out[info["NodeName"]] = info
    return out


def status(teto_nodes: list[Mapping[str, Any]], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    jobs = commands.parse_squeue(commands.run(commands.squeue_pilots(), env))
    nodes = slurm_nodes(env)
    return {"pilots": view.rows(jobs, cluster_name(env), teto_nodes, nodes),
            "drained_by_teto": view.drained_without_pilot(nodes, [j.node for j in jobs])}


def release(job_ids: list[str], partition: str | None = None, env: Mapping[str, str] | None = None) -> None:
    """scancel: each pilot gets SIGTERM, checkpoints and stops its run, and leaves (KillWait bounds it)."""
    if job_ids:
        for job_id in job_ids:
            commands.run(commands.cancel(job_id), env)
    else:
        commands.run(commands.cancel_all_pilots(getpass.getuser(), partition), env)


# -- the commands --------------------------------------------------------------------------------------------

def _pilot_dir(args: argparse.Namespace) -> Path:
    path = args.pilot_dir or os.environ.get("TETO_SLURM_PILOT_DIR")
    if not path:
        raise PilotError("pass --pilot-dir or set TETO_SLURM_PILOT_DIR (a directory on a filesystem the compute "
                         "nodes share; the health service's Slurm provisioner submits replacements from it)")
    return Path(path).resolve()


def cmd_provision(args: argparse.Namespace) -> int:
    request = PilotRequest(partition=args.partition, gpus_per_node=args.gpus_per_node, time_limit=args.time,
                           signal_lead_seconds=args.signal_lead, account=args.account, qos=args.qos,
                           cpus_per_task=args.cpus_per_task, group=args.group, extra=tuple(args.sbatch_option or ()))
    settings = agent_settings(os.environ, args.group, args.signal_lead, _pairs(args.set))
    pilot_dir = _pilot_dir(args)
    jobs = provision(pilot_dir, request, args.nodes, settings, args.python or sys.executable)
    print(f"submitted {len(jobs)} pilot(s) to partition {args.partition}: {' '.join(jobs)}\n"
          f"  pilot directory: {pilot_dir} (settings 0600; Slurm output pilot-<job>.out)\n"
          f"  see them: teto slurm status    end them: teto slurm release")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from teto.cli_common import CliError, table
    from teto.cli_http import call

    try:
        _, teto_nodes = call(args, "GET", "/v1/nodes")
    except CliError as exc:
        print(f"(Teto's node states unavailable: {exc})", file=sys.stderr)
        teto_nodes = []
    out = status(teto_nodes if isinstance(teto_nodes, list) else [])
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(table(out["pilots"], [("slurm job", "job_id"), ("slurm state", "slurm_state"), ("node", "slurm_node"),
                                ("node state", "node_state"), ("time left", "time_left"),
                                ("teto node", "teto_node"), ("teto state", "teto_state"),
                                ("schedulable", "schedulable")]))
    if out["drained_by_teto"]:
        print("\nnodes Teto drained (no pilot on them):")
        print(table(out["drained_by_teto"], [("node", "slurm_node"), ("state", "node_state"),
                                             ("reason", "node_reason")]))
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    release(args.job_ids, args.partition)
    print(f"released {' '.join(args.job_ids) if args.job_ids else 'every pilot'}: each checkpoints and stops its run")
    return 0


def _guarded(fn):
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (PilotError, commands.SlurmError) as exc:
            print(f"teto slurm: {exc}", file=sys.stderr)
            return 2
    return run


def register(sub: argparse._SubParsersAction) -> None:
    slurm = sub.add_parser("slurm", help="Teto's agents as Slurm pilot jobs (provision, status, release)")
    ssub = slurm.add_subparsers(dest="slurm_command", required=True)
    p = ssub.add_parser("provision", help="submit one agent per node as a Slurm job holding the node's GPUs")
    p.add_argument("--partition", required=True)
    p.add_argument("--nodes", type=int, default=1, help="pilots to submit (one node each)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs each pilot holds (--gres=gpu:G)")
    p.add_argument("--time", help="Slurm time limit of each pilot (e.g. 8:00:00; default: the partition's)")
    p.add_argument("--signal-lead", type=int, default=120, help="seconds before the time limit the agent is "
                   "told to checkpoint and stop its run (--signal=B:USR1@N)")
    p.add_argument("--account")
    p.add_argument("--qos")
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--group", default="slurm", help="the Teto node group the pilots join")
    p.add_argument("--pilot-dir", help="where the pilots' script and 0600 settings live (TETO_SLURM_PILOT_DIR)")
    p.add_argument("--python", help="the interpreter of the agents on the compute nodes (default: this one)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="an agent setting (TETO_*), repeatable")
    p.add_argument("--sbatch-option", action="append", metavar="--OPT=VALUE", help="passed to sbatch as is")
    p.set_defaults(func=_guarded(cmd_provision))
    p = ssub.add_parser("status", help="each pilot's Slurm state beside its Teto node's")
    p.add_argument("--url", help="gateway URL (TETO_URL; default from <data-dir>/stack.json)")
    p.add_argument("--token", help="API token (TETO_TOKEN)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("TETO_DATA_DIR", ".teto")))
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the gateway")
    p.add_argument("--ca-file", type=Path, help="CA certificate an HTTPS gateway is verified against")
    p.set_defaults(func=_guarded(cmd_status))
    p = ssub.add_parser("release", help="end pilots (scancel): each checkpoints and stops its run first")
    p.add_argument("job_ids", nargs="*", help="Slurm job ids (default: every pilot of yours)")
    p.add_argument("--partition")
    p.set_defaults(func=_guarded(cmd_release))
