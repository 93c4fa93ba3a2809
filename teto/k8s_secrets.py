"""``teto secrets k8s``: the Kubernetes Secrets deploy/k8s/ mounts, made from the files ``teto secrets deploy`` and
``teto db provision`` wrote (one directory, e.g. deploy/secrets/).

One Secret per part and purpose, so each pod mounts only its own (as in deploy/compose.yml): ``teto-nats-<part>``
(that part's NATS credentials), ``teto-db-<service>`` (its own database URL), ``teto-gateway-tls`` and
``teto-secrets-key`` (gateway; the key also executors), ``teto-audit-key`` (audit only), ``teto-nats-executors``
(every executor's credentials file, by executor id), and for the NATS servers ``teto-nats-server-tls`` and
``teto-nats-auth`` (the users, permissions and password hashes), ``teto-oidc`` (the gateway's: each identity
provider's client secret, a file of ``<src>/oidc/`` named after the provider; empty with none), and
``teto-checkpoint-store`` (the executors' checkpoint store keys) when ``<src>/checkpoint-store/`` holds them. Written as one JSON ``List`` (``kubectl apply
-f``), 0600: it holds every secret of the deployment, so delete it once applied.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from libs.runtime import natsauth

CREDS_FILE = "nats.json"
DB_FILE = "database.url"
EXECUTORS_SECRET = "teto-nats-executors"
STORE_SECRET = "teto-checkpoint-store"
OIDC_SECRET = "teto-oidc"


class MissingSecret(FileNotFoundError):
    """A file the Secrets are made from is not there; the message says which command writes it."""


def _read(path: Path, made_by: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise MissingSecret(f"{path} is missing: {made_by} writes it") from None


def secret(name: str, namespace: str, data: dict[str, bytes], *, kind: str = "Opaque") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "teto"}},
            "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}}


def secrets_from(src: Path, namespace: str = "teto") -> list[dict[str, Any]]:
    """Every Secret deploy/k8s/ names, from ``src`` (raises MissingSecret naming the step that was skipped)."""
    deploy = f"teto secrets deploy --out {src}"
    nats = src / "nats"
    out = [secret(f"teto-nats-{role}", namespace, {CREDS_FILE: _read(nats / "creds" / f"{role}.json", deploy)})
           for role in (*natsauth.SERVICES, "admin")]
    executors = {p.name: p.read_bytes() for p in sorted((nats / "creds").glob("executor-*.json"))}
    if not executors:
        raise MissingSecret(f"no executor credentials under {nats / 'creds'}: {deploy} --executor ID=NODE writes them")
    out.append(secret(EXECUTORS_SECRET, namespace, executors))
    ca = _read(nats / "tls" / "ca.pem", deploy)
    out.append(secret("teto-nats-ca", namespace, {"ca.pem": ca}))
    out.append(secret("teto-nats-server-tls", namespace, {
        "tls.crt": _read(nats / "tls" / "server.pem", deploy), "tls.key": _read(nats / "tls" / "server-key.pem", deploy),
        "ca.crt": ca}, kind="kubernetes.io/tls"))
    conf = json.loads(_read(nats / "nats.conf", deploy))
    out.append(secret("teto-nats-auth", namespace,
                      {"auth.conf": json.dumps({"authorization": conf["authorization"]}, indent=2).encode()}))
    out.append(secret("teto-gateway-tls", namespace, {
        "tls.crt": _read(src / "gateway" / "gateway.pem", deploy),
        "tls.key": _read(src / "gateway" / "gateway-key.pem", deploy)}, kind="kubernetes.io/tls"))
    out.append(secret("teto-secrets-key", namespace, {"secrets.key": _read(src / "secrets.key", deploy)}))
    provision = f"teto db provision --admin-url ... --out {src / 'db'}"
    for service in natsauth.SERVICES:
        out.append(secret(f"teto-db-{service}", namespace, {DB_FILE: _read(src / "db" / service / DB_FILE, provision)}))
    out.append(secret("teto-audit-key", namespace, {"audit.key": _audit_key(src / "audit.key")}))
    out.append(oidc_secret(src, namespace))
    if (store := store_secret(src, namespace)) is not None:
        out.append(store)
    return out


def store_secret(src: Path, namespace: str) -> dict[str, Any] | None:
    """The executors' checkpoint store keys (docs/checkpoint-store.md), when ``<src>/checkpoint-store/`` holds
    them; None without a store."""
    store = src / "checkpoint-store"
    if not store.is_dir():
        return None
    keys = {name: _read(store / name, f"the store's operator (put its keys in {store}/)")
            for name in ("access_key_id", "secret_access_key")}
    return secret(STORE_SECRET, namespace, {k: v.strip() for k, v in keys.items()})


def oidc_secret(src: Path, namespace: str) -> dict[str, Any]:
    """The identity providers' client secrets (docs/security/identity.md), one key per file of ``<src>/oidc/``
    (named after its provider, read by the gateway as ``/run/teto/oidc/<provider>``); empty without any, so the
    gateway's mount is there before the first provider is configured."""
    folder = src / "oidc"
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else []
    return secret(OIDC_SECRET, namespace, {p.name: p.read_bytes().strip() for p in files})


def _audit_key(path: Path) -> bytes:
    """Made here once (kept on later runs, so the audit log's macs stay verifiable)."""
    from services.audit.keyfile import create_key_file

    create_key_file(path)
    return path.read_bytes()


def cmd_k8s(args: argparse.Namespace) -> int:
    from teto.stack.busauth import write_private

    try:
        items = secrets_from(args.source, args.namespace)
    except MissingSecret as exc:
        print(f"teto secrets k8s: {exc}", file=sys.stderr)
        return 2
    write_private(args.out, json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n")
    print(f"wrote {len(items)} Secrets to {args.out}: kubectl apply -f {args.out}, then delete the file")
    return 0


def add_parser(ssub: argparse._SubParsersAction, guard: Any) -> None:
    p = ssub.add_parser("k8s", help="the Kubernetes Secrets deploy/k8s/ mounts, from teto secrets deploy's and teto "
                        "db provision's files")
    p.add_argument("--from", dest="source", type=Path, required=True, help="what teto secrets deploy --out wrote "
                   "(with the database URLs of teto db provision --out <dir>/db)")
    p.add_argument("--out", type=Path, required=True, help="the JSON List of Secrets to write (0600)")
    p.add_argument("--namespace", default="teto")
    p.set_defaults(func=guard(cmd_k8s))
