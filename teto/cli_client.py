"""Operator commands that talk to the gateway: ``submit``, ``job``, ``cancel``, ``requeue``, ``executors`` and
``contracts export``/``asyncapi`` here, and the registration of every other one: ``jobs`` (cli_jobs.py),
``audit [verify]``, ``tokens`` (cli_admin.py), ``logs`` (cli_logs.py), ``login``/``whoami`` (cli_login.py),
``budget reconcile`` (cli_budget.py, reads the budget service's database), ...

Where the gateway is and which token to use: ``--url``/``--token``, else ``TETO_URL``/``TETO_TOKEN``, else
``<data-dir>/stack.json`` as ``teto up`` wrote it (cli_http.py). Output is a human table unless ``--json``
(cli_common.py, cli_format.py). A refusal prints the server's reason (and the numbers behind it) and exits
non-zero. This module is the top of the CLI: it imports the other ``cli_*`` modules and none imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .cli_common import CliError, _print, gib_to_bytes, table
from .cli_format import EVENTS_READ, EXECUTOR_COLUMNS, format_job
from .cli_http import call


def build_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec body from --file and the flags (flags win); argv after `--` makes a command workload."""
    spec: dict[str, Any] = json.loads(Path(args.file).read_text()) if args.file else {}
    argv = list(args.argv or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv:
        env: dict[str, Any] = dict(args.env or [])
        for name in getattr(args, "secret_env", None) or []:
            if name not in os.environ:
                raise CliError(f"--secret-env {name}: set {name} in this shell's environment (its value is sent "
                               "as a secret, never on the command line)", 2)
            env[name] = {"secret": os.environ[name]}
        spec["workload"] = {"kind": "command", "command": argv, **({"env": env} if env else {})}
    spec.setdefault("workload", {"kind": "finetune"})
    if args.steps is not None:
        if spec["workload"].get("kind") != "finetune":
            raise CliError("--steps applies to the built-in finetune workload only", 2)
        spec["workload"].setdefault("params", {})["steps"] = args.steps
    for flag, field in (("name", "name"), ("ceiling", "gpu_ceiling_seconds"),
                        ("checkpoint_every", "checkpoint_every_steps"), ("checkpoints_kept", "checkpoints_kept"),
                        ("workers", "workers"),
                        ("gpus", "gpus_per_worker"), ("max_attempts", "max_attempts"),
                        ("environment", "environment")):
        value = getattr(args, flag, None)
        if value is not None:
            spec[field] = value
    if getattr(args, "checkpoint_quota_gib", None) is not None:
        spec["checkpoint_quota_bytes"] = gib_to_bytes("--checkpoint-quota-gib", args.checkpoint_quota_gib)
    for flag, field in (("memory_mb", "memory_mb"), ("pids", "pids"), ("disk_mb", "disk_mb")):
        value = getattr(args, flag, None)
        if value is not None:
            spec.setdefault("limits", {})[field] = value
    return spec


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


# -- commands -------------------------------------------------------------------------------------------


def _job_or_pending(args: argparse.Namespace, status: int, body: Any) -> None:
    if status == 202:
        _print(args, body, f"{body.get('job_id')}: sent (command {body.get('command_id')}), outcome still pending; "
                           f"see: teto command {body.get('command_id')}")
    else:
        _print(args, body, format_job(body))


def cmd_submit(args: argparse.Namespace) -> int:
    # --no-wait: answered once the command is durable (Prefer: respond-async); its decision comes later.
    headers = {"Prefer": "respond-async"} if args.no_wait else None
    status, body = call(args, "POST", "/v1/jobs", json=build_spec(args), headers=headers)
    _job_or_pending(args, status, body)
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    # The latest EVENTS_READ events for the folded timeline; --json keeps the API's default.
    _, body = call(args, "GET", f"/v1/jobs/{args.job_id}", params=None if args.json else {"events": EVENTS_READ})
    _print(args, body, format_job(body))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    status, body = call(args, "POST", f"/v1/jobs/{args.job_id}/cancel", json={"reason": args.reason})
    _job_or_pending(args, status, body)
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    status, body = call(args, "POST", f"/v1/jobs/{args.job_id}/requeue",
                        json={"gpu_ceiling_seconds": args.gpu_ceiling})
    _job_or_pending(args, status, body)
    return 0


def cmd_executors(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", "/v1/executors")
    _print(args, body, table(body, EXECUTOR_COLUMNS) if body else "no executors")
    return 0


def cmd_contracts_export(args: argparse.Namespace) -> int:
    from libs.contracts.export import export

    written = export(args.out, args.events_md)
    _print(args, [str(p) for p in written], f"wrote {len(written)} files under {args.out} and {args.events_md}")
    return 0


def cmd_contracts_asyncapi(args: argparse.Namespace) -> int:
    from .asyncapi import write

    written = write(args.out)
    _print(args, [str(p) for p in written], "wrote " + " and ".join(str(p) for p in written))
    return 0


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except CliError as exc:
            print(str(exc), file=sys.stderr)
            return exc.code

    return run


def register(sub: argparse._SubParsersAction) -> None:
    from .cli_admin import cmd_audit, cmd_audit_verify, cmd_tokens_create, cmd_tokens_list, cmd_tokens_revoke

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="gateway URL (TETO_URL; default from <data-dir>/stack.json)")
    common.add_argument("--token", help="API token (TETO_TOKEN; default: the local admin token of `teto up`)")
    common.add_argument("--data-dir", type=Path, default=Path(os.environ.get("TETO_DATA_DIR", ".teto")))
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the gateway")
    common.add_argument("--ca-file", type=Path, help="CA certificate an HTTPS gateway is verified against "
                        "(TETO_CA_FILE; `teto secrets tls` makes one)")
    common.add_argument("--credentials-file", type=Path, help="the session of `teto login` (TETO_CREDENTIALS_FILE; "
                        "default ~/.config/teto/credentials.json)")

    def add(name: str, fn: Any, help_: str, parents: list[argparse.ArgumentParser] | None = None, **kw: Any):
        p = sub.add_parser(name, help=help_, parents=[common] if parents is None else parents, **kw)
        p.set_defaults(func=_guard(fn))
        return p

    p = add("submit", cmd_submit, "submit a job (built-in fine-tune, or your command after --)")
    p.add_argument("--name")
    p.add_argument("--steps", type=int, help="fine-tune steps")
    p.add_argument("--ceiling", type=float, help="GPU-second ceiling")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    p.add_argument("--checkpoints-kept", type=int, help="complete checkpoints kept on disk, the newest "
                   "(0: every one; default: the executor's, 3)")
    p.add_argument("--checkpoint-quota-gib", type=float, help="most GiB one checkpoint may have (default 64; "
                   "the organisation's quota caps it); a larger one is refused when written")
    p.add_argument("--workers", type=int)
    p.add_argument("--gpus", type=int, help="GPUs per worker")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--memory-mb", type=int, help="memory (MiB) each run may use (limits.memory_mb)")
    p.add_argument("--pids", type=int, help="processes and threads each run may have at once (limits.pids)")
    p.add_argument("--disk-mb", type=int, help="disk (MiB) each run may write (limits.disk_mb)")
    p.add_argument("--env", type=_env_pair, action="append", metavar="KEY=VALUE", help="for a command workload")
    p.add_argument("--secret-env", action="append", metavar="NAME", help="a command workload's secret: the value "
                   "of NAME in this shell's environment, encrypted by the gateway and shown to no one")
    p.add_argument("--environment", metavar="PATH", help="the Python environment a command workload runs in (an "
                   "interpreter or venv the nodes offer: teto env create, TETO_ENVIRONMENTS)")
    p.add_argument("--file", help="a JobSpec JSON file (flags override it)")
    p.add_argument("--no-wait", action="store_true", help="answer once the submit is durable, before the queue "
                   "decides it (Prefer: respond-async); read the decision with teto command ID")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- program args... (a command workload)")

    from .cli_jobs import add_command_parser, add_jobs_parser

    add_jobs_parser(add)
    add_command_parser(add)

    add("job", cmd_job, "show one job").add_argument("job_id")
    p = add("cancel", cmd_cancel, "cancel a job")
    p.add_argument("job_id")
    p.add_argument("--reason", default="cancelled by operator")
    p = add("requeue", cmd_requeue, "requeue an interrupted job with a new TOTAL GPU-second ceiling")
    p.add_argument("job_id")
    p.add_argument("--gpu-ceiling", type=float, required=True)
    add("executors", cmd_executors, "list executors")

    from .cli_nodes import add_parsers as add_node_commands

    add_node_commands(add)

    audit = sub.add_parser("audit", help="the audit log (needs audit:read)", parents=[common])
    audit.add_argument("--actor")
    audit.add_argument("--job")
    audit.add_argument("--kind", help="command kind: submit, cancel, requeue, ...")
    audit.add_argument("--since", help="ISO time (inclusive)")
    audit.add_argument("--until", help="ISO time (exclusive)")
    audit.add_argument("--after-seq", type=int)
    audit.add_argument("--limit", type=int)
    audit.set_defaults(func=_guard(cmd_audit))
    asub = audit.add_subparsers(dest="audit_command")
    asub.add_parser("verify", help="recompute the hash chain; exits 1 naming the first bad row",
                    parents=[common]).set_defaults(func=_guard(cmd_audit_verify))

    from .cli_dead import add_parser as add_dead_letters

    add_dead_letters(sub, common, _guard)

    from .cli_logs import add_parser as add_logs

    add_logs(sub, common, _guard)

    from .cli_status import add_parser as add_status

    add_status(sub, common, _guard)

    from .cli_env import add_parser as add_env

    add_env(sub)

    tokens = sub.add_parser(
        "tokens", help="API tokens, kept by the gateway in PostgreSQL (list, create, revoke through its API)",
        description="API tokens live in the gateway's PostgreSQL schema and are managed through the gateway "
                    "(--url, TETO_URL or stack.json). --tokens-file writes a local tokens file instead, for a "
                    "machine with no gateway; the gateway imports that file on its next request "
                    "(docs/security/identity.md).")
    tsub = tokens.add_subparsers(dest="tokens_command", required=True)
    tcommon = argparse.ArgumentParser(add_help=False, parents=[common])
    tcommon.add_argument("--tokens-file", type=Path, help="write this tokens file instead of asking the gateway "
                         "(default, with no gateway known: <data-dir>/tokens.json)")
    tcommon.add_argument("--mine", action="store_true", help="one's own tokens (/v1/me/tokens), for non-admins")
    p = tsub.add_parser("create", help="create a token; prints the secret once", parents=[tcommon])
    p.add_argument("--actor", help="who the token acts as (through the gateway, default: oneself)")
    p.add_argument("--role", required=True, choices=["viewer", "submitter", "operator", "auditor", "admin"])
    p.add_argument("--org", help="organisation the token acts in (default: fleet-wide for operator, auditor, admin; "
                   "'default' for the others)")
    p.add_argument("--description", default="", help="what the token is for")
    p.add_argument("--expires-in-days", type=float, help="expiry (default: never)")
    p.add_argument("--project", help="project the token is limited to")
    p.add_argument("--in-database", action="store_true", help="write it into the gateway's database directly "
                   "(TETO_DATABASE_URL[_FILE]; in the gateway's container): the first admin token of a deployment")
    p.set_defaults(func=_guard(cmd_tokens_create))
    tsub.add_parser("list", help="list tokens", parents=[tcommon]).set_defaults(func=_guard(cmd_tokens_list))
    p = tsub.add_parser("revoke", help="revoke a token", parents=[tcommon])
    p.add_argument("token_id")
    p.set_defaults(func=_guard(cmd_tokens_revoke))

    from .cli_login import add_parser as add_login

    add_login(sub, common, _guard)

    from .cli_budget import add_parser as add_budget
    from .cli_secrets import add_parser as add_secrets

    add_secrets(sub, common, _guard)

    add_budget(sub, common, _guard)

    from .cli_orgs import add_parser as add_orgs

    add_orgs(sub, common, _guard)

    contracts = sub.add_parser("contracts", help="wire contracts for downstream consumers")
    csub = contracts.add_subparsers(dest="contracts_command", required=True)
    p = csub.add_parser("export", help="write the JSON Schema of every message and regenerate docs/events.md")
    p.add_argument("--out", type=Path, default=Path("docs/schemas"))
    p.add_argument("--events-md", type=Path, default=Path("docs/events.md"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_guard(cmd_contracts_export))
    p = csub.add_parser("asyncapi", help="write the AsyncAPI 3 document FastStream generates from the services' "
                                         "declarations (docs/asyncapi.json; the gateway serves it)")
    p.add_argument("--out", type=Path, default=Path("docs/asyncapi.json"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_guard(cmd_contracts_asyncapi))
