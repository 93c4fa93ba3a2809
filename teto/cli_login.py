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
import sys
import time
from typing import Any

from services.gateway.domain import oidc as rules

from .cli_common import EXIT_REFUSED, CliError, _print
from .cli_http import call, resolve_target
from .cli_session import credentials_path, exchange_id_token, http_client, json_of, read_credentials, write_private


def cmd_login(args: argparse.Namespace) -> int:
    url, _ = resolve_target(args.url, "unused", args.data_dir)
    path = credentials_path(args.credentials_file)
    with http_client(url, args) as http:
        providers = [p for p in json_of(http.get(f"{url}/v1/identity/providers")) if p.get("cli_client_id")]
        if args.provider:
            providers = [p for p in providers if p["name"] == args.provider]
        if len(providers) != 1:
            names = ", ".join(p["name"] for p in providers) or "none with a CLI client"
            raise CliError(f"choose a provider with --provider ({names})" if providers
                           else f"the gateway trusts no such provider ({names})")
        provider = providers[0]
        doc = json_of(http.get(f"{provider['issuer'].rstrip('/')}/.well-known/openid-configuration"))
        if "device_authorization_endpoint" not in doc:
            raise CliError(f"provider {provider['name']} offers no device authorization grant")
        scopes = " ".join(dict.fromkeys([*provider.get("scopes", ["openid"]), "offline_access"]))
        start = http.post(doc["device_authorization_endpoint"],
                          data={"client_id": provider["cli_client_id"], "scope": scopes})
        grant = json_of(start)
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
            body = json_of(resp)
            poll = rules.on_poll(resp.status_code, body)
            if poll is rules.Poll.DONE:
                break
            if poll in (rules.Poll.DENIED, rules.Poll.EXPIRED, rules.Poll.FAILED) or time.monotonic() > deadline:
                raise CliError(f"sign-in not completed: {body.get('error')} {body.get('error_description', '')}")
            interval = rules.next_interval(poll, interval)
        made = exchange_id_token(http, url, provider["name"], body["id_token"])
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
