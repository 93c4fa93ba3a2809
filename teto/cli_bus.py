"""``teto secrets nats`` and ``teto bus declare``: the bus's users and streams for a deployment.

``teto secrets nats --out DIR`` writes what a deployment mounts: ``DIR/nats.conf`` (every part's user with its
bcrypt hash and permissions, TLS, JetStream) for the server, and ``DIR/creds/<user>.json`` (0600) for each
part; executors need fixed ids there (``--executor ID[=NODE]``), since each is its own user. It uses the same
table as ``teto up`` (libs/runtime/natsauth.py). ``teto bus declare`` creates or updates the streams as the
admin user: under least privilege no service may (deploy/compose.yml runs it once before the services).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from libs.runtime import natsauth

SERVER_TLS_DIR = "/etc/nats/tls"  # where deploy/compose.yml mounts the server's certificate and key
CLIENT_CA = "/run/teto/nats-ca.pem"  # where the parts find the CA that signed it


def parse_executor(value: str) -> tuple[str, str]:
    executor_id, _, node_id = value.partition("=")
    return executor_id, node_id or executor_id


def deployment_users(prefix: str, executors: list[tuple[str, str]]) -> list[natsauth.User]:
    users = [natsauth.user(role, prefix) for role in (*natsauth.SERVICES, "admin")]
    users += [natsauth.user("executor", prefix, executor_id=e, node_id=n) for e, n in executors]
    return users


def server_settings(*, tls: bool, tls_dir: str = SERVER_TLS_DIR) -> tuple[dict, dict | None]:
    """Everything in the deployment's server config but the users: where it listens, and TLS. JetStream and
    monitoring stay on the server's command line (deploy/compose.yml: ``-c nats.conf -js -sd /data -m 8222``)."""
    extra = {"listen": "0.0.0.0:4222"}
    tls_block = ({"cert_file": f"{tls_dir}/server.pem", "key_file": f"{tls_dir}/server-key.pem", "timeout": 5}
                 if tls else None)
    return extra, tls_block


def write_deployment(out: Path, *, prefix: str, executors: list[tuple[str, str]], tls: bool = True,
                     client_ca: str = CLIENT_CA, tls_dir: str = SERVER_TLS_DIR,
                     rounds: int | None = None) -> list[Path]:
    """Write nats.conf and every part's credentials file under ``out``; returns the files written."""
    from teto.stack.busauth import BCRYPT_ROUNDS, credentials, hash_password, new_password, server_config, write_private

    out.mkdir(parents=True, exist_ok=True)
    creds_dir = out / "creds"
    creds_dir.mkdir(exist_ok=True)
    os.chmod(creds_dir, 0o700)
    pairs, written = [], []
    for user in deployment_users(prefix, executors):
        password = new_password()
        pairs.append((user, hash_password(password, rounds or BCRYPT_ROUNDS)))
        path = creds_dir / f"{user.name}.json"
        write_private(path, json.dumps(credentials(user, password, client_ca if tls else None), indent=2) + "\n")
        written.append(path)
    extra, tls_block = server_settings(tls=tls, tls_dir=tls_dir)
    # The server's config holds only hashes; readable by the server's user, so 0600 like the rest.
    write_private(out / "nats.conf", server_config(pairs, tls=tls_block, extra=extra))
    return [out / "nats.conf", *written]


def template(prefix: str = "teto", executors: list[tuple[str, str]] | None = None) -> str:
    """deploy/nats/nats.conf.template: the generated config with placeholders instead of hashes."""
    from teto.stack.busauth import server_config

    users = deployment_users(prefix, executors or [("executor-1", "node-1"), ("executor-2", "node-2")])
    extra, tls_block = server_settings(tls=True)
    return server_config([(u, f"<bcrypt hash of {u.name}'s password: teto secrets nats writes it>") for u in users],
                         tls=tls_block, extra=extra)


def _secrets_nats(args: argparse.Namespace) -> int:
    executors = [parse_executor(v) for v in args.executor]
    files = write_deployment(args.out, prefix=args.prefix, executors=executors, tls=not args.no_tls,
                             client_ca=args.client_ca)
    print(f"wrote {files[0]} (mount it as the NATS server's config) and {len(files) - 1} credentials files under "
          f"{args.out / 'creds'}: give each part only its own file, as TETO_NATS_CREDENTIALS_FILE")
    if not args.no_tls:
        print(f"TLS: the server expects {SERVER_TLS_DIR}/server.pem and server-key.pem; parts use "
              f"tls://<host>:4222 and the CA at {args.client_ca} (docs/security/bus.md)")
    return 0


def _bus_declare(args: argparse.Namespace) -> int:
    from libs.contracts.subjects import Subjects
    from libs.runtime import bus
    from libs.runtime.settings import CommonSettings

    settings = CommonSettings.from_env()

    async def go() -> None:
        nc = await bus.connect(settings.nats_url, "teto-bus-declare", credentials_file=settings.nats_credentials_file)
        deadline = time.monotonic() + args.wait
        try:
            while True:
                try:
                    await bus.ensure_streams(nc.jetstream(), Subjects(settings.subject_prefix),
                                             replicas=args.replicas or settings.stream_replicas)
                    return
                except Exception as exc:  # noqa: BLE001 - a cluster still electing its leader: asked again
                    if time.monotonic() >= deadline:
                        raise
                    print(f"teto bus declare: JetStream not ready ({exc!r}); trying again", file=sys.stderr)
                    await asyncio.sleep(1.0)
        finally:
            await nc.close()

    try:
        asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - said plainly, with a status
        print(f"teto bus declare: {exc!r}", file=sys.stderr)
        return 3
    print(f"streams of prefix {settings.subject_prefix!r} declared on {settings.nats_url} "
          f"(R{args.replicas or settings.stream_replicas})")
    return 0


def add_secrets_commands(ssub: argparse._SubParsersAction) -> None:
    """``teto secrets nats`` (the ``secrets`` command itself is made in teto/cli_secrets.py)."""
    p = ssub.add_parser("nats", help="the NATS server config (users, permissions, TLS) and each part's credentials")
    p.add_argument("--out", type=Path, required=True, help="directory to write nats.conf and creds/ into")
    p.add_argument("--prefix", default=os.environ.get("TETO_SUBJECT_PREFIX", "teto"))
    p.add_argument("--executor", action="append", default=[], metavar="ID[=NODE]",
                   help="an executor agent's fixed id (and node id; default the same), repeatable")
    p.add_argument("--no-tls", action="store_true", help="no TLS block (only behind a TLS-terminating network)")
    p.add_argument("--client-ca", default=CLIENT_CA, help="path of the CA file as the parts see it")
    p.set_defaults(func=_secrets_nats)


def register(sub: argparse._SubParsersAction) -> None:
    bus_cmd = sub.add_parser("bus", help="the bus itself")
    bsub = bus_cmd.add_subparsers(dest="bus_command", required=True)
    d = bsub.add_parser("declare", help="create or update the streams (as the NATS admin: TETO_NATS_CREDENTIALS_FILE)")
    d.add_argument("--replicas", type=int, default=None, choices=(1, 3, 5),
                   help="copies of each stream on a NATS cluster (3: survives the loss of any one node; default TETO_STREAM_REPLICAS)")
    d.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="keep asking this long while JetStream is not ready (a cluster electing its leader)")
    d.set_defaults(func=_bus_declare)
