"""The control plane's own health in one view (``GET /v1/status``, ``teto status``), as pure functions of what
was gathered: the replicas that answered the status request, the NATS streams' cluster info, the database
probe and the executors' view. Every verdict here names what is wrong in ``problems``; ``ok`` is their absence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from libs.contracts.status import ReplicaStatus


@dataclass(frozen=True)
class Peer:
    """One server holding a stream replica, as the stream's cluster info reports it."""

    name: str
    current: bool = True
    offline: bool = False
    lag: int = 0


@dataclass(frozen=True)
class StreamView:
    name: str
    replicas: int  # configured
    messages: int
    leader: str | None
    peers: tuple[Peer, ...] = ()  # the followers (the leader is not among them)


@dataclass(frozen=True)
class BusView:
    connected_to: str | None
    cluster: str | None
    streams: tuple[StreamView, ...] = ()
    error: str | None = None  # the stream infos could not be read


@dataclass(frozen=True)
class DatabaseView:
    reachable: bool
    latency_ms: float | None = None
    error: str | None = None


@dataclass
class Status:
    services: dict[str, Any] = field(default_factory=dict)
    nats: dict[str, Any] = field(default_factory=dict)
    consumers: list[dict[str, Any]] = field(default_factory=list)
    database: dict[str, Any] = field(default_factory=dict)
    executors: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": not self.problems, "problems": self.problems, "services": self.services, "nats": self.nats,
                "consumers": self.consumers, "database": self.database, "executors": self.executors}


def services_view(replies: Iterable[ReplicaStatus], expected: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Each service's replicas and, for each singleton its replicas run, the replica holding it (None: nobody
    holds it now; two holders would be a broken lock)."""
    by_service: dict[str, list[ReplicaStatus]] = {name: [] for name in expected}
    for reply in replies:
        by_service.setdefault(reply.service, []).append(reply)
    out: dict[str, Any] = {}
    problems: list[str] = []
    for name in sorted(by_service):
        replicas = sorted(by_service[name], key=lambda r: r.instance)
        singletons: dict[str, list[str]] = {s: [] for r in replicas for s in r.singletons}
        for r in replicas:
            for s in r.leading:
                singletons.setdefault(s, []).append(r.instance)
        if not replicas:
            problems.append(f"{name}: no replica answered")
        for lock, holders in sorted(singletons.items()):
            if not holders:
                problems.append(f"{name}: nobody holds singleton {lock}")
            elif len(holders) > 1:
                problems.append(f"{name}: singleton {lock} held by {len(holders)} replicas: {', '.join(holders)}")
        out[name] = {
            "replicas": [{"instance": r.instance, "started_at": r.started_at.isoformat(), "leading": r.leading,
                          "nats_server": r.nats_server, "metrics_port": r.metrics_port} for r in replicas],
            "singletons": {lock: (holders[0] if len(holders) == 1 else holders or None)
                           for lock, holders in sorted(singletons.items())},
        }
    return out, problems


def consumers_view(replies: Iterable[ReplicaStatus]) -> list[dict[str, Any]]:
    """Lag per durable: replicas of one service share a durable, so the freshest sample of it is the figure."""
    newest: dict[tuple[str, str], tuple[Any, str]] = {}
    for reply in replies:
        for lag in reply.consumers:
            key = (reply.service, lag.durable)
            if key not in newest or newest[key][0].sampled_at < lag.sampled_at:
                newest[key] = (lag, reply.instance)
    return [{"service": service, "durable": durable, "stream": lag.stream, "pending": lag.pending,
             "ack_pending": lag.ack_pending, "sampled_at": lag.sampled_at.isoformat(), "sampled_by": instance}
            for (service, durable), (lag, instance) in sorted(newest.items())]


def nats_view(bus: BusView) -> tuple[dict[str, Any], list[str]]:
    """The servers (members) seen through the streams' replicas, whether each is online, and each stream's
    replicas; a stream without a leader, or with a replica offline or behind, is a problem."""
    problems: list[str] = []
    members: dict[str, dict[str, Any]] = {}

    def member(name: str) -> dict[str, Any]:
        return members.setdefault(name, {"name": name, "online": True, "leads": []})

    if bus.connected_to:
        member(bus.connected_to)
    streams = []
    for s in bus.streams:
        if s.leader:
            member(s.leader)["leads"].append(s.name)
        else:
            problems.append(f"stream {s.name}: no leader")
        for p in s.peers:
            m = member(p.name)
            if p.offline:
                m["online"] = False
                problems.append(f"stream {s.name}: replica on {p.name} is offline")
            elif not p.current:
                problems.append(f"stream {s.name}: replica on {p.name} is behind ({p.lag} operations)")
        if len(s.peers) + (1 if s.leader else 0) < s.replicas:
            problems.append(f"stream {s.name}: {len(s.peers) + (1 if s.leader else 0)} of {s.replicas} replicas")
        streams.append({"name": s.name, "replicas": s.replicas, "messages": s.messages, "leader": s.leader,
                        "peers": [{"name": p.name, "current": p.current, "offline": p.offline, "lag": p.lag}
                                  for p in s.peers]})
    # A server that leads a stream is up, whatever an older peer list says of it.
    for m in members.values():
        m["online"] = m["online"] or bool(m["leads"])
    if bus.error:
        problems.append(f"NATS: {bus.error}")
    return ({"connected_to": bus.connected_to, "cluster": bus.cluster,
             "members": sorted(members.values(), key=lambda m: m["name"]), "streams": streams, "error": bus.error},
            problems)


def executor_state(row: Mapping[str, Any]) -> str:
    """One word an operator sorts executors by: silent first (whatever else it claims), then busy, idle, or not
    accepting work (checking, draining, failed)."""
    if row.get("signal") == "no_signal":
        return "no_signal"
    if row.get("job_id"):
        return "busy"
    return "idle" if row.get("accepting") else "not_accepting"


def executors_view(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    rows = list(rows)
    states = Counter(executor_state(r) for r in rows)
    problems = [f"{states['no_signal']} executor(s) without signal"] if states["no_signal"] else []
    return {"total": len(rows), "by_state": dict(sorted(states.items()))}, problems


def database_view(db: DatabaseView) -> tuple[dict[str, Any], list[str]]:
    view = {"reachable": db.reachable, "latency_ms": db.latency_ms, "error": db.error}
    return view, ([] if db.reachable else [f"database unreachable: {db.error}"])


def summarize(replies: Sequence[ReplicaStatus], bus: BusView, db: DatabaseView,
              executors: Iterable[Mapping[str, Any]], *, expected: Sequence[str]) -> Status:
    status = Status()
    status.services, problems = services_view(replies, expected)
    status.nats, more = nats_view(bus)
    problems += more
    status.consumers = consumers_view(replies)
    status.database, more = database_view(db)
    problems += more
    status.executors, more = executors_view(executors)
    status.problems = problems + more
    return status
