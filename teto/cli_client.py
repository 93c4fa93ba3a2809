"""Operator commands that talk to the gateway: ``submit``, ``jobs``, ``job``, ``cancel``, ``requeue``,
``executors``, ``audit [verify]``, ``logs`` (cli_logs.py); ``tokens`` (cli_admin.py), ``login``/``whoami`` (cli_login.py), ``budget reconcile`` (reads
the budget service's database) and ``contracts export``.

Where the gateway is and which token to use: ``--url``/``--token``, else ``TETO_URL``/``TETO_TOKEN``, else
``<data-dir>/stack.json`` as ``teto up`` wrote it. Output is a human table unless ``--json``. A refusal prints
the server's reason (and the numbers behind it) and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

TRANSPORT: httpx.BaseTransport | None = None  # tests put a mock transport here
EXIT_REFUSED = 1  # the server said no (4xx/5xx)
EXIT_UNREACHABLE = 3  # no gateway, or no way to know where it is


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


# -- where and who ---------------------------------------------------------------------------------------


def resolve_target(url: str | None, token: str | None, data_dir: Path,
                   environ: Mapping[str, str] | None = None, *, login: Any = None) -> tuple[str, str | None]:
    """(gateway URL, token): flags win, then TETO_URL/TETO_TOKEN, then the session of `teto login` for that
    gateway (``login``: a function of the URL, cli_login.session_for), then <data-dir>/stack.json."""
    environ = os.environ if environ is None else environ
    url = url or environ.get("TETO_URL") or None
    token = token or environ.get("TETO_TOKEN") or None
    if url is not None and token is None and login is not None:
        token = login(url.rstrip("/"))
    if url is None or token is None:
        stack = data_dir / "stack.json"
        if stack.exists():
            info = json.loads(stack.read_text())
            url = url or info.get("gateway_url")
            token = token or info.get("admin_token")
    if not url:
        raise CliError(f"no gateway: pass --url, set TETO_URL, or run `teto up` (no {data_dir / 'stack.json'})",
                       EXIT_UNREACHABLE)
    return url.rstrip("/"), token


def _login_session(args: argparse.Namespace) -> Any:
    from .cli_login import credentials_path, session_for

    path = credentials_path(getattr(args, "credentials_file", None))
    return lambda url: session_for(url, path, args)


def tls_verify(ca_file: Path | None, environ: Mapping[str, str] | None = None) -> Any:
    """What httpx verifies an HTTPS gateway against: --ca-file, else TETO_CA_FILE, else the system's CAs."""
    environ = os.environ if environ is None else environ
    ca = ca_file or (Path(environ["TETO_CA_FILE"]) if environ.get("TETO_CA_FILE") else None)
    if ca is None:
        return True
    if not ca.is_file():
        raise CliError(f"no CA certificate at {ca} (--ca-file / TETO_CA_FILE)", EXIT_UNREACHABLE)
    import ssl

    return ssl.create_default_context(cafile=str(ca))


def call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    resp, body = exchange(args, method, path, **kw)
    return resp.status_code, body


def exchange(args: argparse.Namespace, method: str, path: str, **kw: Any) -> tuple[httpx.Response, Any]:
    """One request to the gateway: the response (for its headers) and its decoded body; a refusal raises."""
    url, token = resolve_target(args.url, args.token, args.data_dir, login=_login_session(args))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=args.timeout, transport=TRANSPORT,
                          verify=tls_verify(getattr(args, "ca_file", None))) as client:
            resp = client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the gateway at {url}: {exc}", EXIT_UNREACHABLE) from None
    try:
        body = resp.json() if resp.content else None
    except ValueError:
        body = resp.text
    if resp.status_code >= 400:
        raise CliError(refusal_text(resp.status_code, body))
    return resp, body


def refusal_text(status: int, body: Any) -> str:
    if not isinstance(body, Mapping):
        return f"error {status}: {body}"
    text = f"error {status}: {body.get('reason') or body.get('error') or body}"
    if body.get("permission"):
        text += f" (needs {body['permission']})"
    detail = body.get("detail")
    if isinstance(detail, Mapping) and detail:
        text += "\n  " + ", ".join(f"{k}={_cell(v)}" for k, v in detail.items())
    return text


# -- formatting -----------------------------------------------------------------------------------------


def _eta(ckpt: dict[str, Any]) -> str:
    """The checkpoint ETA, or why there is none (the API's next_eta_status: standing, not_running, ...)."""
    if ckpt.get("next_eta_seconds") is not None:
        return f"{_cell(ckpt['next_eta_seconds'])} s"
    return f"- ({ckpt['next_eta_status'].replace('_', ' ')})" if ckpt.get("next_eta_status") else "- s"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A plain text table; ``columns`` are (heading, key) pairs, dotted keys reach into nested dicts."""
    def get(row: Mapping[str, Any], key: str) -> Any:
        value: Any = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    cells = [[h.upper() for h, _ in columns]] + [[_cell(get(r, k)) for _, k in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells)


JOB_COLUMNS = [("id", "id"), ("name", "name"), ("owner", "owner"), ("state", "state"), ("step", "last_step"),
               ("of", "total_steps"), ("executor", "executor_id"), ("signal", "signal.signal"),
               ("gpu-s", "budget.consumed_seconds"), ("ceiling", "spec.gpu_ceiling_seconds")]
EXECUTOR_COLUMNS = [("executor", "executor_id"), ("node", "node_id"), ("group", "group_name"),
                    ("accepting", "accepting"), ("phase", "phase"), ("job", "job_id"), ("from", "job_source"),
                    ("step", "step"),
                    ("signal", "signal"), ("last heartbeat", "last_heartbeat")]
EVENT_COLUMNS = [("seq", "seq"), ("time", "time"), ("event", "event"), ("state", "state"), ("reason", "reason"),
                 ("executor", "executor_id"), ("epoch", "epoch")]
EVENTS_READ = 200  # the latest events `teto job` asks for: enough that a run of checkpoints hides nothing else
EVENT_ROWS_SHOWN = 20  # rows of its timeline, once runs of checkpoints are folded


def timeline_rows(events: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The events as ``teto job`` prints them, oldest first, the last ``EVENT_ROWS_SHOWN`` rows: a run of
    checkpoints of one run is one row (``libs/timeline.py``, the panel's fold): its sequence numbers, its count,
    its steps and when the last was. True when earlier events exist than those printed."""
    from libs.timeline import timeline

    folded = timeline(list(events))
    rows = folded["rows"][::-1]
    out = []
    for r in rows[-EVENT_ROWS_SHOWN:]:
        row, steps = dict(r), (r["first_step"], r["last_step"])
        if r["count"] > 1:
            row["seq"], row["event"] = f"{r['seq']}-{r['last_seq']}", f"{r['event']} x{r['count']}"
            row["reason"] = ", ".join(([f"steps {steps[0]}-{steps[1]}"] if None not in steps else [])
                                      + [f"until {r['last_time']}"])
        elif steps[0] is not None and not r["reason"]:
            row["reason"] = f"step {steps[0]}"
        out.append(row)
    return out, folded["earlier"] or len(rows) > EVENT_ROWS_SHOWN


def _kept(kept: Any) -> str:
    """How many checkpoints the job keeps on disk (JobSpec.checkpoints_kept)."""
    if kept is None:
        return "the executor's default kept on disk"
    return "every one kept on disk" if kept == 0 else f"the newest {kept} kept on disk"


def format_job(job: Mapping[str, Any]) -> str:
    attempts = job.get("attempts") or {}
    ckpt = job.get("checkpoint") or {}
    lines = [
        f"job       {job.get('id')}  {job.get('name') or ''}".rstrip(),
        f"state     {job.get('state')}" + (f"  ({job['reason']})" if job.get("reason") else ""),
        f"owner     {_cell(job.get('owner'))}",
        f"executor  {_cell(job.get('executor_id'))}  epoch {_cell(job.get('lease_epoch'))}",
        f"progress  step {_cell(job.get('last_step'))} of {_cell(job.get('total_steps'))}",
        f"attempts  {', '.join(f'{k}={v}' for k, v in attempts.items()) or '-'}",
        f"checkpoint last step {_cell(ckpt.get('last_step'))}, every {_cell(ckpt.get('every_steps'))}, "
        f"next at {_cell(ckpt.get('next_step'))} in {_eta(ckpt)}, "
        f"{_kept((job.get('spec') or {}).get('checkpoints_kept'))}",
    ]
    if job.get("signal"):
        sig = job["signal"]
        lines.append(f"signal    {sig.get('signal')} since {_cell(sig.get('signal_since'))}")
    if job.get("budget"):
        b = job["budget"]
        lines.append(f"budget    {_cell(b.get('consumed_seconds'))} of {_cell(b.get('ceiling_seconds'))} GPU-s, "
                     f"{_cell(b.get('remaining_seconds'))} left, overshoot {_cell(b.get('overshoot_seconds'))}")
        for h in b.get("ceiling_history") or []:
            was = h.get("previous_ceiling_seconds")
            lines.append(f"ceiling   {_cell(h.get('ceiling_seconds'))} GPU-s set by {_cell(h.get('actor'))} at "
                         f"{_cell(h.get('at'))} ({_cell(h.get('consumed_seconds'))} consumed then"
                         + (f"; from {_cell(was)})" if was is not None else ")"))
        if b.get("warning"):
            w = b["warning"]
            lines.append(f"warning   {w.get('reason') if isinstance(w, Mapping) and w.get('reason') else _cell(w)}")
    from .cli_jobs import live_lines

    lines += live_lines(job)
    if job.get("error"):
        lines.append(f"error     {job['error']}")
    if job.get("log_tail"):
        from .cli_logs import tail_lines

        lines += tail_lines(job["log_tail"])
    if job.get("events"):
        rows, earlier = timeline_rows(job["events"])
        lines += ["", table(rows, EVENT_COLUMNS)]
        if earlier:
            lines.append(f"(earlier events: GET /v1/jobs/{job.get('id')}/events)")
    return "\n".join(lines)


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


def gib_to_bytes(flag: str, gib: float) -> int:
    """A size given in GiB on the command line, in whole bytes (at least one)."""
    if not gib > 0:
        raise CliError(f"{flag} {gib:g}: must be more than 0", 2)
    return max(1, int(gib * 2**30))


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


# -- commands -------------------------------------------------------------------------------------------


def _print(args: argparse.Namespace, body: Any, human: str) -> None:
    print(json.dumps(body, indent=2) if args.json else human)


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


def print_page(args: argparse.Namespace, path: str, params: Mapping[str, Any], key: str,
               columns: Sequence[tuple[str, str]], empty: str) -> int:
    """GET a page of a sequence-paged list (``next_after_seq``) and print it as a table."""
    _, body = call(args, "GET", path, params={k: v for k, v in params.items() if v})
    rows = body.get(key, [])
    human = table(rows, columns) if rows else empty
    if body.get("next_after_seq"):
        human += f"\n(more: --after-seq {body['next_after_seq']})"
    _print(args, body, human)
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
