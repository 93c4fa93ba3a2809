"""``teto secrets``: the files a deployment needs: HTTPS (``tls``), the key sealing job secrets (``key``), the bus's
users and credentials (``nats``, teto/cli_bus.py), and all of them at once for deploy/compose.yml (``deploy``)."""

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


def cmd_deploy(args: argparse.Namespace) -> int:
    """Every secret ``deploy/compose.yml`` mounts, in one directory (made once, before the first ``up``): the NATS
    server's config with every part's user and its TLS certificate, each part's credentials file, the gateway's
    HTTPS certificate, the key sealing job secrets. The database passwords and the audit key are made inside the
    deployment (db-secret, the audit service's own volume), so they never sit on the operator's disk."""
    from teto.cli_bus import SERVER_TLS_DIR, parse_executor, write_deployment
    from teto.natscluster import compose_nodes, write_cluster

    from .tls import make_tls
    from libs.runtime.sealing import write_key_file

    out: Path = args.out
    named = args.executor or ["executor-1=node-1", "executor-2=node-2"]
    executors = [parse_executor(v) for v in named]
    write_deployment(out / "nats", prefix=args.prefix, executors=executors, tls=True)
    nodes = compose_nodes(args.nats_cluster)
    nats_tls = make_tls(out / "nats" / "tls", ["nats", *(n.host for n in nodes), *(args.nats_host or []), "localhost"],
                        days=args.days, client_auth=True)
    nats_tls.cert.replace(out / "nats" / "tls" / "server.pem")
    nats_tls.key.replace(out / "nats" / "tls" / "server-key.pem")
    write_cluster(out / "nats", nodes, tls_dir=SERVER_TLS_DIR)  # nats/nodes/nats-<i>.conf (teto/natscluster.py)
    make_tls(out / "gateway", [*(args.host or []), "gateway", "localhost", "127.0.0.1"], days=args.days)
    write_key_file(out / "secrets.key")
    (out / "oidc").mkdir(mode=0o700, exist_ok=True)  # identity providers' client secrets, one file each (the operator's)
    print(f"wrote {out}: nats/nats.conf, nats/nodes/<node>.conf, nats/creds/<part>.json, nats/tls/, gateway/ (HTTPS; "
          "clients use "
          f"--ca-file {out / 'gateway' / 'ca.pem'}), secrets.key; executors: {', '.join(named)}")
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
    p = ssub.add_parser("deploy", help="every secret deploy/compose.yml mounts: NATS config, credentials and TLS, "
                        "the gateway's HTTPS certificate, the job-secrets key")
    p.add_argument("--out", type=Path, required=True, help="e.g. deploy/secrets (keep it private)")
    p.add_argument("--executor", action="append", default=[], metavar="ID[=NODE]",
                   help="each executor's fixed id (and node id), repeatable; default executor-1=node-1, executor-2=node-2")
    p.add_argument("--host", action="append", help="another name the gateway is reached by (repeat)")
    p.add_argument("--prefix", default="teto", help="subject prefix")
    p.add_argument("--days", type=int, default=825, help="certificates' validity")
    p.add_argument("--nats-host", action="append", help="another name the NATS servers are reached by (repeat; on "
                   "Kubernetes their service names: docs/deploy.md)")
    p.add_argument("--nats-cluster", type=int, default=3, metavar="N",
                   help="NATS nodes (nats-1..N): a config per node under nats/nodes/ (deploy/compose.yml runs 3)")
    p.set_defaults(func=guard(cmd_deploy))
    p = ssub.add_parser("key", help="a key file for TETO_SECRETS_KEY (an existing one is kept)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=guard(cmd_key))
    from teto import k8s_secrets

    k8s_secrets.add_parser(ssub, guard)  # k8s: the Secrets deploy/k8s/ mounts
