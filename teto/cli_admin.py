"""``teto audit``, ``teto audit verify`` and ``teto tokens``: the auditors' and admins' commands (registered in
teto/cli_client.py). ``teto tokens`` asks the gateway (tokens in its database: expiry, last use, description,
revoked at once on every replica) whenever one is known, else writes a tokens file the gateway imports."""

from __future__ import annotations

import argparse

from .cli_common import EXIT_REFUSED, CliError, _print, table
from .cli_http import call, print_page, resolve_target

AUDIT_COLUMNS = [("seq", "seq"), ("time", "time"), ("actor", "actor"), ("kind", "kind"), ("job", "job_id"),
                 ("outcome", "outcome"), ("reason", "reason")]


def cmd_audit(args: argparse.Namespace) -> int:
    return print_page(args, "/v1/audit", {"actor": args.actor, "job_id": args.job, "kind": args.kind,
                                          "since": args.since, "until": args.until, "after_seq": args.after_seq,
                                          "limit": args.limit}, "entries", AUDIT_COLUMNS, "no entries")


def audit_verify_detail(body: dict) -> str:
    """What the audit service checked besides the chain: macs (with its key) and anchors."""
    if "anchors_checked" not in body:
        return ""
    macs = (f"{body.get('macs_checked')} macs checked, {body.get('pre_key_rows')} pre-key rows" if body.get("keyed")
            else "NO KEY: macs not checked")
    last = (f", last anchor seq {body['last_anchor_seq']} at {body.get('last_anchor_time')}"
            if body.get("last_anchor_seq") is not None else ", no anchor yet")
    bad = f"; first bad anchor: #{body['first_bad_anchor']}" if body.get("first_bad_anchor") is not None else ""
    return f"\n  {macs}; {body.get('anchors_checked')} anchors checked{last}{bad}"


def cmd_audit_verify(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", "/v1/audit/verify")
    if body.get("ok"):
        human = f"audit chain intact ({body.get('checked')} rows checked)"
    else:
        human = f"audit chain BROKEN at seq {body.get('first_bad_seq')}: {body.get('reason')}"
    human += audit_verify_detail(body)
    _print(args, body, human)
    return 0 if body.get("ok") else EXIT_REFUSED


def _through_gateway(args: argparse.Namespace) -> bool:
    """Tokens go through the gateway (its database, every replica at once) unless a tokens file is named or no
    gateway is known (then <data-dir>/tokens.json, which the gateway imports)."""
    if args.tokens_file is not None:
        return False
    try:
        resolve_target(args.url, "unused", args.data_dir)
    except CliError:
        return False
    return True


def _create_in_database(args: argparse.Namespace) -> int:
    """The first admin token of a deployment, made on the gateway's own machine or container: written into the
    gateway's database with its own login (TETO_DATABASE_URL or TETO_DATABASE_URL_FILE), so every replica accepts
    it at once; no API, so no token is needed to make it."""
    import asyncio

    import asyncpg

    from services.gateway.identity import DbIdentity
    from services.gateway.settings import GatewaySettings

    from libs.runtime import db
    from libs.runtime.settings import SettingsError

    if not args.actor:
        raise CliError("--actor is needed to write a token into the database", 2)
    try:
        url = GatewaySettings.from_env().database_url
    except SettingsError as exc:
        raise CliError(str(exc), 2) from None

    async def issue():
        pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
        try:
            return await DbIdentity(pool).issue(args.actor, args.role, org=args.org, project=args.project,
                                                description=args.description or "made in the gateway's database",
                                                created_by="teto tokens create --in-database")
        finally:
            await db.close_pool(pool)

    try:
        made = asyncio.run(issue())
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    except (OSError, asyncpg.PostgresError) as exc:
        raise CliError(f"the gateway's database: {exc}") from None
    body = {"id": made.id, "actor": args.actor, "role": args.role, "org": args.org, "secret": made.secret}
    _print(args, body, f"token {made.id} for {args.actor} ({args.role}), in the gateway's database; shown once, "
                       f"keep it:\n{made.secret}")
    return 0


def cmd_tokens_create(args: argparse.Namespace) -> int:
    from services.gateway.auth import issue_token

    if getattr(args, "in_database", False):
        return _create_in_database(args)
    if _through_gateway(args):
        body = {"actor": args.actor, "role": args.role, "org": args.org, "description": args.description,
                "expires_in_days": args.expires_in_days, "project": args.project}
        _, made = call(args, "POST", "/v1/me/tokens" if args.mine else "/v1/tokens",
                       json={k: v for k, v in body.items() if v is not None})
        _print(args, made, f"token {made['id']} for {made['actor']} ({made['role']}); shown once, keep it:\n"
                           f"{made['secret']}")
        return 0
    if not args.actor:
        raise CliError("--actor is needed to write a tokens file", 2)
    path = args.tokens_file or args.data_dir / "tokens.json"
    try:
        token_id, secret = issue_token(path, args.actor, args.role, org=args.org)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    body = {"id": token_id, "actor": args.actor, "role": args.role, "org": args.org, "secret": secret}
    _print(args, body, f"token {token_id} for {args.actor} ({args.role}); shown once, keep it:\n{secret}")
    return 0


def cmd_tokens_list(args: argparse.Namespace) -> int:
    from services.gateway.auth import list_tokens

    if _through_gateway(args):
        _, rows = call(args, "GET", "/v1/me/tokens" if args.mine else "/v1/tokens")
    else:
        rows = list_tokens(args.tokens_file or args.data_dir / "tokens.json")
    cols = [("id", "id"), ("actor", "actor"), ("role", "role"), ("created", "created_at"), ("expires", "expires_at"),
            ("last used", "last_used_at"), ("state", "state"), ("description", "description")]
    if rows and "state" not in rows[0]:
        cols = [c for c in cols if c[1] in rows[0]] + [("revoked", "revoked")]
    _print(args, rows, table(rows, cols) if rows else "no tokens")
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    from services.gateway.auth import revoke_token

    if _through_gateway(args):
        call(args, "DELETE", f"/v1/me/tokens/{args.token_id}" if args.mine else f"/v1/tokens/{args.token_id}")
    elif not revoke_token(args.tokens_file or args.data_dir / "tokens.json", args.token_id):
        raise CliError(f"no such token: {args.token_id}")
    _print(args, {"id": args.token_id, "revoked": True}, f"token {args.token_id} revoked")
    return 0
