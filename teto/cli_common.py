"""What every ``teto`` command that talks to the gateway shares, below all of them: the exit codes, the error a
command raises to exit with one, the server's refusal in words, the CA an HTTPS gateway is verified against, a
plain text table and printing (``--json`` or the human form).

Nothing here imports another ``cli_*`` module: the commands (cli_client.py, cli_jobs.py, cli_login.py, ...)
import this, the HTTP exchange (cli_http.py) and the formatting of a job (cli_format.py).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EXIT_REFUSED = 1  # the server said no (4xx/5xx)
EXIT_UNREACHABLE = 3  # no gateway, or no way to know where it is


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


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


def gib_to_bytes(flag: str, gib: float) -> int:
    """A size given in GiB on the command line, in whole bytes (at least one)."""
    if not gib > 0:
        raise CliError(f"{flag} {gib:g}: must be more than 0", 2)
    return max(1, int(gib * 2**30))


def _print(args: argparse.Namespace, body: Any, human: str) -> None:
    print(json.dumps(body, indent=2) if args.json else human)
