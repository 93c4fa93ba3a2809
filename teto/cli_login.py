"""``teto login``, ``teto logout`` and ``teto whoami``: a person signs in on the command line through the
organisation's identity provider with the OAuth device authorization grant (RFC 8628), as ``gh`` and ``az`` do.

``teto login`` asks the gateway which providers it trusts (``GET /v1/identity/providers``), starts the grant at
the provider with its public CLI client, prints the address and code to confirm in a browser, polls for the
tokens, and exchanges the ID token at the gateway for a session (``POST /v1/sessions/oidc``), whose secret is
then the CLI's bearer token. The credential file (``--credentials-file``, ``TETO_CREDENTIALS_FILE``, default
``~/.config/teto/credentials.json``) is written 0600 and holds the session and the provider's refresh token: when
the session is about to end, the next command refreshes the ID token at the provider and exchanges it again,
so a person signs in once per refresh token's life, and a person removed from the provider's groups loses the
role at the next refresh. ``teto whoami`` shows who the gateway takes the caller for, each role and the
organisation, and the claim, binding or token each came from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from services.gateway.domain import oidc as rules

from .cli_client import EXIT_REFUSED, CliError, _print, call, refusal_text, tls_verify

REFRESH_BEFORE = 300.0  # seconds: a session ending sooner than this is refreshed before it is used


def credentials_path(given: Path | None = None) -> Path:
    if given is not None:
        return given
    if os.environ.get("TETO_CREDENTIALS_FILE"):
        return Path(os.environ["TETO_CREDENTIALS_FILE"])
    return Path.home() / ".config" / "teto" / "credentials.json"


def write_private(path: Path, data: dict[str, Any]) -> None:
    """Written 0600 from its first byte (the secret is never readable by others, even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_credentials(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def needs_refresh(creds: dict[str, Any], now: float) -> bool:
    return float(creds.get("expires_at", 0)) - now < REFRESH_BEFORE


def _client(url: str, args: argparse.Namespace) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=args.timeout, verify=tls_verify(getattr(args, "ca_file", None)))


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return {"error": resp.text[:500]}


def _exchange(http: httpx.Client, url: str, provider: str, id_token: str) -> dict[str, Any]:
    resp = http.post(f"{url}/v1/sessions/oidc", json={"provider": provider, "id_token": id_token})
    if resp.status_code != 201:
        raise CliError(refusal_text(resp.status_code, _json(resp)))
    return resp.json()


def session_for(url: str, path: Path, args: argparse.Namespace) -> str | None:
    """The saved session's secret for this gateway, refreshed first when it is about to end; None if none."""
    creds = read_credentials(path)
    if not creds or creds.get("gateway_url") != url:
        return None
    if not needs_refresh(creds, time.time()):
        return creds["secret"]
    if not creds.get("refresh_token"):
        raise CliError("the session from `teto login` has ended: run `teto login` again")
    with _client(url, args) as http:
        doc = _json(http.get(f"{creds['issuer'].rstrip('/')}/.well-known/openid-configuration"))
        resp = http.post(doc["token_endpoint"], data={"grant_type": "refresh_token", "client_id": creds["client_id"],
                                                      "refresh_token": creds["refresh_token"]})
        body = _json(resp)
        if resp.status_code != 200 or "id_token" not in body:
            raise CliError(f"the provider refused to refresh the sign-in ({body.get('error')}): run `teto login`")
        made = _exchange(http, url, creds["provider"], body["id_token"])
        # The session it replaces ends now rather than at its expiry (best effort: it may have ended already).
        http.delete(f"{url}/v1/sessions/current", headers={"Authorization": f"Bearer {creds['secret']}"})
    creds.update(secret=made["secret"], expires_at=time.time() + float(made["expires_in_seconds"]),
                 refresh_token=body.get("refresh_token", creds["refresh_token"]), roles=made["roles"])
    write_private(path, creds)
    return creds["secret"]


def cmd_login(args: argparse.Namespace) -> int:
    from .cli_client import resolve_target

    url, _ = resolve_target(args.url, "unused", args.data_dir)
    path = credentials_path(args.credentials_file)
    with _client(url, args) as http:
        providers = [p for p in _json(http.get(f"{url}/v1/identity/providers")) if p.get("cli_client_id")]
        if args.provider:
            providers = [p for p in providers if p["name"] == args.provider]
        if len(providers) != 1:
            names = ", ".join(p["name"] for p in providers) or "none with a CLI client"
            raise CliError(f"choose a provider with --provider ({names})" if providers
                           else f"the gateway trusts no such provider ({names})")
        provider = providers[0]
        doc = _json(http.get(f"{provider['issuer'].rstrip('/')}/.well-known/openid-configuration"))
        if "device_authorization_endpoint" not in doc:
            raise CliError(f"provider {provider['name']} offers no device authorization grant")
        scopes = " ".join(dict.fromkeys([*provider.get("scopes", ["openid"]), "offline_access"]))
        start = http.post(doc["device_authorization_endpoint"],
                          data={"client_id": provider["cli_client_id"], "scope": scopes})
        grant = _json(start)
        if start.status_code != 200:
            raise CliError(f"the provider refused to start the sign-in: {grant.get('error_description') or grant}")
        where = grant.get("verification_uri_complete") or grant["verification_uri"]
        print(f"To sign in, open {where}\nand confirm the code {grant['user_code']}", flush=True)
        interval, deadline = float(grant.get("interval", 5)), time.monotonic() + float(grant.get("expires_in", 600))
        while True:
            time.sleep(interval)
            resp = http.post(doc["token_endpoint"], data={
                "grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": grant["device_code"],
                "client_id": provider["cli_client_id"]})
            body = _json(resp)
            poll = rules.on_poll(resp.status_code, body)
            if poll is rules.Poll.DONE:
                break
            if poll in (rules.Poll.DENIED, rules.Poll.EXPIRED, rules.Poll.FAILED) or time.monotonic() > deadline:
                raise CliError(f"sign-in not completed: {body.get('error')} {body.get('error_description', '')}")
            interval = rules.next_interval(poll, interval)
        made = _exchange(http, url, provider["name"], body["id_token"])
    write_private(path, {"gateway_url": url, "provider": provider["name"], "issuer": provider["issuer"],
                         "client_id": provider["cli_client_id"], "secret": made["secret"],
                         "expires_at": time.time() + float(made["expires_in_seconds"]),
                         "refresh_token": body.get("refresh_token"), "actor": made["actor"], "roles": made["roles"]})
    _print(args, {k: made[k] for k in ("actor", "roles", "org", "grants")},
           f"signed in as {made['actor']} ({', '.join(made['roles'])}); credentials in {path}\n"
           + explain(made.get("grants", [])))
    return 0


def explain(grants: list[dict[str, Any]]) -> str:
    return "\n".join(f"  {g['kind']} {g['value']}: {g['because']}" for g in grants)


def cmd_whoami(args: argparse.Namespace) -> int:
    _, body = call(args, "GET", "/v1/whoami")
    org = body.get("org") if body.get("org") is not None else "fleet-wide"
    human = (f"{body['actor']} ({', '.join(body.get('roles') or [body['role']])}) in {org}, "
             f"by {'a sign-in session' if body.get('kind') == 'session' else 'API token ' + body['token_id']}\n"
             f"why:\n{explain(body.get('grants', []))}\npermissions: {', '.join(body['permissions'])}")
    _print(args, body, human)
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    path = credentials_path(args.credentials_file)
    if read_credentials(path) is None:
        print("not signed in", file=sys.stderr)
        return EXIT_REFUSED
    try:
        call(args, "DELETE", "/v1/sessions/current")
    finally:
        path.unlink(missing_ok=True)
    print(f"signed out; {path} removed")
    return 0


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard: Any) -> None:
    p = sub.add_parser("login", help="sign in through the organisation's identity provider (device grant)",
                       parents=[common])
    p.add_argument("--provider", help="the provider's name (when the gateway trusts several)")
    p.set_defaults(func=guard(cmd_login))
    sub.add_parser("logout", help="end the session of `teto login`", parents=[common]).set_defaults(
        func=guard(cmd_logout))
    sub.add_parser("whoami", help="who the gateway takes you for: roles, organisation, and why",
                   parents=[common]).set_defaults(func=guard(cmd_whoami))
