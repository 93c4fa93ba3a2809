"""The per-node configs of a NATS cluster for a deployment (deploy/compose.yml, ``teto secrets deploy``).

Each node's config is the deployment's ``nats.conf`` (every part's user, permissions, client TLS) plus what only
that node has: its ``server_name`` (JetStream's cluster needs every server named apart) and a ``cluster`` block
with routes to every other node. Routes are authenticated (a route user and password only the servers know) and
use mutual TLS with the deployment's NATS CA, so nothing on the network can join the cluster or read its traffic.
The configs are JSON (valid NATS config syntax, as ``nats.conf`` is).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CLUSTER_NAME = "teto"
ROUTE_USER = "route"
NODES_DIR = "nodes"  # under the deployment's nats directory: nodes/<name>.conf


@dataclass(frozen=True)
class Node:
    """One nats-server of the cluster: its name, the host the other nodes reach it by, its ports."""

    name: str
    host: str
    client_port: int = 4222
    route_port: int = 6222


def compose_nodes(count: int) -> list[Node]:
    """The nodes of deploy/compose.yml: ``nats-1`` .. ``nats-N``, each reached by its service name."""
    if count < 1:
        raise ValueError("a cluster has at least one node")
    return [Node(f"nats-{i}", f"nats-{i}") for i in range(1, count + 1)]


def route_url(node: Node, password: str) -> str:
    return f"nats-route://{ROUTE_USER}:{password}@{node.host}:{node.route_port}"


def node_config(base: dict, me: Node, nodes: list[Node], *, route_password: str, tls_dir: str | None) -> dict:
    """``base`` (the deployment's nats.conf) with ``me``'s name, client port and cluster block."""
    cluster: dict = {
        "name": CLUSTER_NAME,
        "listen": f"0.0.0.0:{me.route_port}",
        "authorization": {"user": ROUTE_USER, "password": route_password, "timeout": 5},
        "routes": [route_url(n, route_password) for n in nodes if n.name != me.name],
    }
    if tls_dir is not None:
        # Routes verify each other both ways (the server forces it for clusters): one CA signs every node.
        cluster["tls"] = {"cert_file": f"{tls_dir}/server.pem", "key_file": f"{tls_dir}/server-key.pem",
                          "ca_file": f"{tls_dir}/ca.pem", "timeout": 5}
    return {**base, "server_name": me.name, "listen": f"0.0.0.0:{me.client_port}", "cluster": cluster}


def write_cluster(nats_dir: Path, nodes: list[Node], *, tls_dir: str | None) -> list[Path]:
    """Write ``nats_dir/nodes/<name>.conf`` for every node from ``nats_dir/nats.conf`` (0600: they hold the route
    password). Returns the files written."""
    from teto.stack.busauth import new_password, write_private

    base = json.loads((nats_dir / "nats.conf").read_text())
    password = new_password()
    written = []
    for node in nodes:
        path = nats_dir / NODES_DIR / f"{node.name}.conf"
        conf = node_config(base, node, nodes, route_password=password, tls_dir=tls_dir)
        write_private(path, json.dumps(conf, indent=2) + "\n")
        written.append(path)
    return written
