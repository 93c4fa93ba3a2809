"""``teto secrets``: the files a deployment needs for HTTPS (``tls``) and for sealing job secrets (``key``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def cmd_tls(args: argparse.Namespace) -> int:
    from .tls import make_tls

    files = make_tls(args.out, args.host or ["localhost", "127.0.0.1"], days=args.days)
    shown = {"ca_file": str(files.ca), "tls_cert_file": str(files.cert), "tls_key_file": str(files.key)}
    print(json.dumps(shown, indent=2) if args.json else
          f"gateway: TETO_TLS_CERT_FILE={files.cert} TETO_TLS_KEY_FILE={files.key}\n"
          f"clients: TETO_CA_FILE={files.ca} (or --ca-file)")
    return 0


def cmd_key(args: argparse.Namespace) -> int:
    from libs.runtime.sealing import write_key_file

    existed = args.out.exists()
    write_key_file(args.out)
    print(f"{'kept the existing key in' if existed else 'wrote a new key to'} {args.out}: give it (TETO_SECRETS_KEY)"
          " to the gateway and the executors only")
    return 0


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard: Any) -> None:
    secrets = sub.add_parser("secrets", help="make TLS certificates and the key sealing job secrets")
    ssub = secrets.add_subparsers(dest="secrets_command", required=True)
    from teto.cli_bus import add_secrets_commands

    add_secrets_commands(ssub)  # nats: the bus's users, permissions and credentials
    p = ssub.add_parser("tls", help="a self-signed CA and a gateway certificate (ca.pem, gateway.pem, gateway-key.pem)")
    p.add_argument("--out", type=Path, required=True, help="directory to write into")
    p.add_argument("--host", action="append", help="a name or address of the gateway (repeat); default localhost, "
                   "127.0.0.1")
    p.add_argument("--days", type=int, default=825, help="validity")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=guard(cmd_tls))
    p = ssub.add_parser("key", help="a key file for TETO_SECRETS_KEY (an existing one is kept)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=guard(cmd_key))
