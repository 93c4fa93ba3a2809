"""``teto logs ID [-f] [--attempt N] [--rank R] [--stream S]``: a job's output, read from ``GET /v1/jobs/{id}/logs``.

Like ``docker logs``: the job's stdout goes to stdout, its stderr to stderr, and Teto's notices (a gap, the log
limit, a run's end) to stderr on lines of their own. Without ``-f`` every page is read until the last; with ``-f``
the output follows until the job ends. On a terminal, control characters other than newline, tab and carriage
return are shown escaped: a job's output must not drive the operator's terminal. ``--json`` prints the API's
objects, one per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

import httpx

from . import cli_http
from .cli_common import EXIT_UNREACHABLE, CliError, refusal_text, tls_verify
from .cli_format import terminal_safe
from .cli_http import call, resolve_target

FOLLOW_READ_TIMEOUT = 60.0  # the gateway sends a keep-alive line every 15 s while a followed job is quiet


def _params(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    given = {"attempt": args.attempt, "rank": args.rank, "stream": args.stream, **extra}
    return {k: v for k, v in given.items() if v is not None}


def write_item(item: Mapping[str, Any], out: TextIO, err: TextIO, *, as_json: bool) -> None:
    """One chunk (or the end) as the person at the terminal sees it."""
    if as_json:
        out.write(json.dumps(item) + "\n")
        return
    if item.get("type") == "end":
        err.write(f"[teto: job ended: {item.get('state')}]\n")
        return
    text = item.get("text") or ""
    target = err if item.get("stream") == "stderr" else out
    if text:
        target.write(terminal_safe(text) if target.isatty() else text)
        target.flush()
    if item.get("notice"):
        err.write(("\n" if text and not text.endswith("\n") else "") + f"{item['notice']}\n")
        err.flush()


def pages(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    after = args.after_seq or 0
    while True:
        _, body = call(args, "GET", f"/v1/jobs/{args.job_id}/logs", params=_params(args, after_seq=after, limit=1000))
        yield from body.get("chunks", [])
        if not body.get("more"):
            return
        after = body["next_after_seq"]


def followed(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    url, token = resolve_target(args.url, args.token, args.data_dir)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(args.timeout, read=max(args.timeout, FOLLOW_READ_TIMEOUT))
    params = _params(args, after_seq=args.after_seq or 0, follow="true")
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=timeout, transport=cli_http.TRANSPORT,
                          verify=tls_verify(getattr(args, "ca_file", None))) as client, \
                client.stream("GET", f"/v1/jobs/{args.job_id}/logs", params=params) as resp:
            if resp.status_code >= 400:
                resp.read()
                try:
                    body: Any = resp.json()
                except ValueError:
                    body = resp.text
                raise CliError(refusal_text(resp.status_code, body))
            for line in resp.iter_lines():
                if line.strip():
                    item = json.loads(line)
                    if item.get("type") != "keepalive":
                        yield item
    except httpx.HTTPError as exc:
        raise CliError(f"lost the gateway at {url}: {exc}", EXIT_UNREACHABLE) from None


def cmd_logs(args: argparse.Namespace) -> int:
    for item in (followed(args) if args.follow else pages(args)):
        write_item(item, sys.stdout, sys.stderr, as_json=args.json)
    return 0


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard: Any) -> None:
    p = sub.add_parser("logs", help="a job's output: stdout and stderr of every rank and attempt", parents=[common])
    p.add_argument("job_id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--attempt", type=int, help="only this attempt (1 is the first run)")
    p.add_argument("--rank", type=int, help="only this rank of a gang (0 is the first worker)")
    p.add_argument("--stream", choices=["stdout", "stderr"], help="only one stream")
    p.add_argument("--after-seq", type=int, help="start after this sequence (a previous read's next_after_seq)")
    p.set_defaults(func=guard(cmd_logs))
