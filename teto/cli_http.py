"""One request to the gateway, as every command makes it: where the gateway is and which token to use
(``--url``/``--token``, else ``TETO_URL``/``TETO_TOKEN``, else the session of ``teto login``, else
``<data-dir>/stack.json`` as ``teto up`` wrote it), the exchange itself (a refusal raises ``CliError``) and a
sequence-paged list printed as a table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from .cli_common import EXIT_UNREACHABLE, CliError, _print, refusal_text, table, tls_verify
from .cli_session import credentials_path, session_for

TRANSPORT: httpx.BaseTransport | None = None  # tests put a mock transport here


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
    path = credentials_path(getattr(args, "credentials_file", None))
    return lambda url: session_for(url, path, args)


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
