"""The session ``teto login`` leaves in the credential file, as every command reads it: the file (0600, under
``~/.config/teto/credentials.json`` unless ``--credentials-file`` or ``TETO_CREDENTIALS_FILE`` says otherwise),
and the session's secret for a gateway, refreshed at the provider and exchanged again at the gateway when it is
about to end. The commands themselves (``login``, ``logout``, ``whoami``) are in cli_login.py.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from .cli_common import CliError, refusal_text, tls_verify

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


def http_client(url: str, args: argparse.Namespace) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=args.timeout, verify=tls_verify(getattr(args, "ca_file", None)))


def json_of(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return {"error": resp.text[:500]}


def exchange_id_token(http: httpx.Client, url: str, provider: str, id_token: str) -> dict[str, Any]:
    resp = http.post(f"{url}/v1/sessions/oidc", json={"provider": provider, "id_token": id_token})
    if resp.status_code != 201:
        raise CliError(refusal_text(resp.status_code, json_of(resp)))
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
    with http_client(url, args) as http:
        doc = json_of(http.get(f"{creds['issuer'].rstrip('/')}/.well-known/openid-configuration"))
        resp = http.post(doc["token_endpoint"], data={"grant_type": "refresh_token", "client_id": creds["client_id"],
                                                      "refresh_token": creds["refresh_token"]})
        body = json_of(resp)
        if resp.status_code != 200 or "id_token" not in body:
            raise CliError(f"the provider refused to refresh the sign-in ({body.get('error')}): run `teto login`")
        made = exchange_id_token(http, url, creds["provider"], body["id_token"])
        # The session it replaces ends now rather than at its expiry (best effort: it may have ended already).
        http.delete(f"{url}/v1/sessions/current", headers={"Authorization": f"Bearer {creds['secret']}"})
    creds.update(secret=made["secret"], expires_at=time.time() + float(made["expires_in_seconds"]),
                 refresh_token=body.get("refresh_token", creds["refresh_token"]), roles=made["roles"])
    write_private(path, creds)
    return creds["secret"]
