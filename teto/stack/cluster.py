"""The clustered rehearsal, ``teto up --nats-cluster N --replicas M``: N embedded nats-server processes clustered
on loopback and M processes of each service, on one machine.

Each member is a real nats-server with JetStream and its own store (``<data-dir>/nats/node-<i>/``), the same
users and permissions as a single server (teto/stack/busauth.py writes one config per member, its users plus its
``cluster`` block), and authenticated routes: a route user whose password sits only in the members' 0600 configs,
so nothing on the machine joins the cluster without it. Streams are declared with ``stream_replicas(N)``
replicas (R3 on three members: any one may be lost). A member that dies is started again on the same ports and
store by ``teto up``'s supervisor, and catches up from the others. Every part is given every
member's URL and reconnects to another when its own goes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.ports import free_port_block
from teto.stack.embedded import EmbeddedNats
from teto.stack.supervisor import Part, Supervisor


CLUSTER_NAME = "teto"
ROUTE_USER = "teto-route"
MAX_NODES = 7  # every member holds every stream's R3 group on one machine: more rehearses nothing new


class TopologyError(ValueError):
    """A ``teto up`` topology that cannot do what it promises; the message says why."""


def check_topology(nats_nodes: int, replicas: int) -> None:
    """Refuse topologies that look redundant but are not.

    Two members cannot lose one: JetStream's meta group and every R2 stream need a majority, which is both of
    them. So a cluster has 1 member (no cluster) or 3 or more.
    """
    if nats_nodes < 1 or nats_nodes > MAX_NODES:
        raise TopologyError(f"--nats-cluster {nats_nodes}: between 1 and {MAX_NODES} members")
    if nats_nodes == 2:
        raise TopologyError("--nats-cluster 2 survives no loss (a majority of 2 is 2): use 1 or 3")
    if replicas < 1 or replicas > 5:
        raise TopologyError(f"--replicas {replicas}: between 1 and 5 processes per service")


def stream_replicas(nats_nodes: int) -> int:
    """Replicas of each JetStream stream on a cluster of ``nats_nodes``: R3 from three members on (a majority
    of three survives one loss; more replicas add write latency, not survival of one loss), R1 on one server."""
    return 3 if nats_nodes >= 3 else 1


def replica_names(service: str, replicas: int) -> list[str]:
    """The process names of one service: its plain name when it runs once (the default stack's log files keep
    their names), ``<service>-<i>`` for each of several."""
    return [service] if replicas == 1 else [f"{service}-{i}" for i in range(1, replicas + 1)]


def gateway_ports(http_port: int, replicas: int) -> list[int]:
    """The gateway replicas listen on consecutive ports from ``--http-port`` (a load balancer's pool)."""
    return [http_port + i for i in range(replicas)]


@dataclass(frozen=True)
class Member:
    """One cluster member's identity and ports (fixed for the life of ``teto up``: a restart reuses them)."""

    name: str
    port: int
    monitor_port: int
    cluster_port: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def member_config(member: Member, members: list[Member], route_password: str) -> dict:
    """The part of one member's config that makes it a member: its server name (JetStream's peer identity) and
    its ``cluster`` block, listening for routes on loopback with the route user, and routing to every other."""
    routes = [f"nats-route://{ROUTE_USER}:{route_password}@127.0.0.1:{m.cluster_port}"
              for m in members if m.name != member.name]
    return {"server_name": member.name,
            "cluster": {"name": CLUSTER_NAME, "listen": f"127.0.0.1:{member.cluster_port}",
                        "authorization": {"user": ROUTE_USER, "password": route_password, "timeout": 2},
                        "routes": routes,
                        # Every part is given every member's URL (TETO_NATS_URL): members need not gossip them to
                        # clients, and each gossip is one more INFO that can reach a client mid-connect (see
                        # libs/runtime/bus.connect).
                        "no_advertise": True}}


def plan_members(size: int) -> list[Member]:
    """Each member's client, monitor and route ports: three consecutive ports from below the kernel's ephemeral
    range, because a killed member restarts on the same ones and an ephemeral port released by the kill could be
    handed to any other process in the meantime."""
    members: list[Member] = []
    taken: set[int] = set()
    while len(members) < size:
        first = free_port_block(3)
        if taken.isdisjoint(range(first, first + 3)):  # not yet bound: two blocks could meet
            taken.update(range(first, first + 3))
            members.append(Member(f"node-{len(members) + 1}", first, first + 1, first + 2))
    return members


@dataclass
class NatsCluster:
    """N members run as parts of ``teto up``'s supervisor (``nats-node-<i>``, in processes.json and logs/ like
    every part): one that dies is started again with the supervisor's back-off, on its ports and store, and
    catches up from the others."""

    nats_dir: Path
    members: list[Member]
    sup: Supervisor
    config_path: Callable[[str], Path]  # member name -> its config file (LocalBus.node_config_path)
    servers: dict[str, EmbeddedNats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for m in self.members:
            self.servers[m.name] = EmbeddedNats(self.nats_dir / m.name, port=m.port, monitor_port=m.monitor_port,
                                                config=self.config_path(m.name))

    @property
    def url(self) -> str:
        """Every member's client URL, comma separated (what ``TETO_NATS_URL`` takes)."""
        return ",".join(m.url for m in self.members)

    def part_names(self) -> list[str]:
        return [f"nats-{m.name}" for m in self.members]

    def running(self) -> list[tuple[int | None, str]]:
        """(pid or None while down, monitor URL) per member: what LocalBus.reload signals."""
        out = []
        for part_name, server in zip(self.part_names(), self.servers.values(), strict=True):
            part = self.sup.parts.get(part_name)
            alive = part is not None and part.proc is not None and part.proc.poll() is None
            out.append((part.proc.pid if alive else None, server.monitor_url))
        return out

    def start(self, timeout: float = 60.0) -> NatsCluster:
        """Start every member, then wait until each is healthy with a JetStream meta leader elected."""
        for part_name, server in zip(self.part_names(), self.servers.values(), strict=True):
            server.data_dir.mkdir(parents=True, exist_ok=True)
            self.sup.add(Part(part_name, server.argv(), dict(os.environ)))
        for server in self.servers.values():
            server.wait_healthy(timeout, query="")
        return self

    def stop(self) -> None:
        self.sup.stop(self.part_names())


def start(nats_dir: Path, bus_auth, size: int, sup: Supervisor) -> NatsCluster:
    """A cluster of ``size`` members sharing ``bus_auth``'s users (its configs are written before any starts)."""
    members = plan_members(size)
    route_password = secrets.token_urlsafe(32)
    bus_auth.node_configs = {m.name: member_config(m, members, route_password) for m in members}
    bus_auth.write()
    cluster = NatsCluster(nats_dir, members, sup, bus_auth.node_config_path).start()
    bus_auth.members = cluster.running
    bus_auth.monitor_url = cluster.servers[members[0].name].monitor_url
    return cluster


def note(nats: object, stream_replicas: int) -> str:
    """What ``teto up``'s start-up output adds about the bus's topology."""
    if isinstance(nats, NatsCluster):
        return (f"\n               a cluster of {len(nats.members)} members, streams R{stream_replicas}; "
                f"members: nats-node-<i> in {nats.sup.data_dir / 'processes.json'}")
    return f"  (streams R{stream_replicas})" if stream_replicas > 1 else ""
