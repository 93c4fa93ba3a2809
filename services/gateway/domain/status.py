"""The control plane's own health in one view (``GET /v1/status``, ``teto status``), as pure functions of what
was gathered: the replicas that answered the status request, each NATS member's probe, the NATS streams' cluster
info, the database probe and the executors' view. Every verdict here names what is wrong in ``problems``; ``ok``
is their absence.

Each part is asked on its own with a short timeout (services/gateway/status.py): a part that failed or did not
answer in time arrives here as that failure, named among the problems, while every other part is reported. So
the answer degrades during a loss (a member killed, connections moving to the others) instead of failing whole:
the loss is what an operator must see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
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
class StreamFailure:
    """A stream whose info did not come back (timed out, no responder, JetStream unavailable)."""

    name: str
    error: str


@dataclass(frozen=True)
class MemberProbe:
    """One NATS member as its client port answered (the INFO a server sends first): its server name, or why
    not. ``name`` may be known from an earlier answer when this one failed."""

    url: str
    name: str | None = None
    error: str | None = None  # None: it answered

    @property
    def label(self) -> str:
        return f"{self.name} ({self.url})" if self.name else f"at {self.url}"


@dataclass(frozen=True)
class BusView:
    connected_to: str | None
    cluster: str | None
    streams: tuple[StreamView, ...] = ()
    error: str | None = None  # the bus itself could not be asked (the gateway's connection is down)
    failed: tuple[StreamFailure, ...] = ()
    probes: tuple[MemberProbe, ...] = ()


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
        problems += [f"{name}: replica {r.instance} serves no metrics: {r.metrics_error}"
                     for r in replicas if r.metrics_error]
        problems += [f"{name}: loop {f.name} of replica {r.instance} failing since {f.since.isoformat()} "
                     f"({f.failures} ticks in a row): {f.error}" for r in replicas for f in r.failing_loops]
        out[name] = {
            "replicas": [{"instance": r.instance, "started_at": r.started_at.isoformat(), "leading": r.leading,
                          "nats_server": r.nats_server, "metrics_port": r.metrics_port,
                          "metrics_error": r.metrics_error,
                          "failing_loops": [f.model_dump(mode="json") for f in r.failing_loops]} for r in replicas],
            "singletons": {lock: (holders[0] if len(holders) == 1 else holders or None)
                           for lock, holders in sorted(singletons.items())},
        }
    return out, problems


@dataclass(frozen=True)
class Seen:
    """A replica an earlier status answer included: a later answer without it names it missing."""

    service: str
    instance: str
    started_at: datetime
    last_seen: datetime


def remember(seen: Mapping[tuple[str, str], Seen], replies: Iterable[ReplicaStatus], now: datetime,
             forget_after: float) -> dict[tuple[str, str], Seen]:
    """The replicas seen so far, updated with those that answered ``now``; one not seen for ``forget_after``
    seconds is forgotten (scaled down, or replaced under a new name long ago)."""
    out = {key: s for key, s in seen.items() if (now - s.last_seen).total_seconds() <= forget_after}
    for r in replies:
        out[(r.service, r.instance)] = Seen(r.service, r.instance, r.started_at, now)
    return out


def missing_replicas(seen: Mapping[tuple[str, str], Seen], replies: Iterable[ReplicaStatus],
                     now: datetime) -> list[str]:
    """Replicas an earlier answer included that did not answer now: each a problem, unless a replica of the same
    service that did answer started after the missing one was last seen (it replaced it under a new name: the
    default instance name is ``<host>:<pid>``)."""
    replies = list(replies)
    answered = {(r.service, r.instance) for r in replies}
    problems = []
    for (service, instance), s in sorted(seen.items()):
        if (service, instance) in answered:
            continue
        if any(r.service == service and r.started_at > s.last_seen for r in replies):
            continue
        problems.append(f"{service}: replica {instance} did not answer "
                        f"(last seen {(now - s.last_seen).total_seconds():.0f} s ago)")
    return problems


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


def name_probes(bus: BusView) -> tuple[MemberProbe, ...]:
    """The probes, a failed one whose member's name is not known (it never answered this gateway) named after
    all when that is certain: it is the one member the streams list that no answering probe is."""
    listed = {n for s in bus.streams for n in (s.leader, *(p.name for p in s.peers)) if n}
    unnamed = [p for p in bus.probes if p.error is not None and not p.name]
    left = listed - {p.name for p in bus.probes if p.name}
    if len(unnamed) == 1 and len(left) == 1:
        return tuple(replace(p, name=next(iter(left))) if p is unnamed[0] else p for p in bus.probes)
    return bus.probes


def nats_view(bus: BusView) -> tuple[dict[str, Any], list[str]]:
    """The servers (members) probed and seen through the streams' replicas, whether each is online, and each
    stream's replicas; a member not answering its probe, a stream without a leader, with a replica offline or
    behind or whose info failed, and the bus itself unreachable, are problems."""
    problems: list[str] = []
    members: dict[str, dict[str, Any]] = {}

    def member(name: str) -> dict[str, Any]:
        return members.setdefault(name, {"name": name, "online": True, "leads": []})

    for probe in name_probes(bus):
        if probe.error is None and probe.name:
            member(probe.name)["url"] = probe.url
        elif probe.error is not None:
            problems.append(f"nats member {probe.label} did not answer: {probe.error}")
            if probe.name:
                member(probe.name).update(url=probe.url, answered=False)
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
    for f in bus.failed:
        problems.append(f"stream {f.name}: info failed: {f.error}")
        streams.append({"name": f.name, "error": f.error})
    # A server that leads a stream is up, whatever an older peer list says of it; one whose client port did not
    # answer its probe is down, whatever a stream info (read from the survivors, maybe before they noticed) says.
    for m in members.values():
        m["online"] = (m["online"] or bool(m["leads"])) and m.pop("answered", True)
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


def executors_view(rows: Iterable[Mapping[str, Any]] | str) -> tuple[dict[str, Any], list[str]]:
    """Executors by state; ``rows`` is the reason when they could not be read."""
    if isinstance(rows, str):
        return {"total": None, "by_state": {}, "error": rows}, [f"executors: unreadable: {rows}"]
    rows = list(rows)
    states = Counter(executor_state(r) for r in rows)
    problems = [f"{states['no_signal']} executor(s) without signal"] if states["no_signal"] else []
    return {"total": len(rows), "by_state": dict(sorted(states.items()))}, problems


def database_view(db: DatabaseView) -> tuple[dict[str, Any], list[str]]:
    view = {"reachable": db.reachable, "latency_ms": db.latency_ms, "error": db.error}
    return view, ([] if db.reachable else [f"database unreachable: {db.error}"])


def summarize(replies: Sequence[ReplicaStatus] | None, bus: BusView, db: DatabaseView,
              executors: Iterable[Mapping[str, Any]] | str, *, expected: Sequence[str],
              seen: Mapping[tuple[str, str], Seen] | None = None, now: datetime | None = None) -> Status:
    """The whole view. ``replies`` is None when the replicas could not be asked (the bus itself is down: its
    problem says so, and no service is called missing for it); ``seen`` (with ``now``) the replicas earlier
    answers included, each missing one a problem; ``executors`` the reason when they could not be read."""
    status = Status()
    if replies is None:
        status.services, problems = {}, []
    else:
        status.services, problems = services_view(replies, expected)
        if seen:
            problems += missing_replicas(seen, replies, now or max(s.last_seen for s in seen.values()))
    status.nats, more = nats_view(bus)
    problems += more
    status.consumers = consumers_view(replies or ())
    status.database, more = database_view(db)
    problems += more
    status.executors, more = executors_view(executors)
    status.problems = problems + more
    return status


def unanswered(reason: str) -> Status:
    """The answer when gathering itself failed: not ok, and why (never a 500 for the operator's one view)."""
    return Status(problems=[f"status: {reason}"])
