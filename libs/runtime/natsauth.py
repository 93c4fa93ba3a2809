"""Who may say what on the bus: the NATS permissions of each part, as pure data.

Every part connects as its own NATS user, allowed to publish and subscribe only what its role needs, with the
exact JetStream API subjects of the durables it consumes (consumer info, create with its filter, fetch, ack)
and the streams it checks. Replies travel on a per-user inbox (``_INBOX.<user>``, nats-py's ``inbox_prefix``):
a part subscribes only to its own inbox, and publishes on another's only as the answer to a request it
received (``allow_responses``), so nobody can read or forge another part's replies.

The rules (issue 11): the gateway alone publishes commands; the queue alone grants and stops runs and answers
lease renewals; health alone sends checks and reboots; a command outcome comes only from the service that
decides that kind (the gateway decides refusals at the edge, of any kind); an executor publishes only under its
own id (heartbeats, usage, node registration of its own node, check reports, progress, job output) and
receives only its own directives; the gateway alone reads jobs' output. Only ``admin`` (``teto up``, operators'
maintenance) declares streams.

Nothing here does I/O: ``server_config`` renders the ``authorization`` block that ``teto up`` and
``teto secrets nats`` write, given the password hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.contracts.subjects import Subjects

SERVICES = ("gateway", "queue", "budget", "health", "audit")
ROLES = (*SERVICES, "executor", "admin")

# Which service decides the outcome of which command kind (the gateway also refuses any kind at the edge);
# tests/unit/test_natsauth.py holds these lists equal to libs/contracts/commands.COMMANDS.
QUEUE_COMMANDS = ("submit", "cancel", "requeue", "set_policy", "set_org", "set_project", "set_cohort")
HEALTH_COMMANDS = ("run_health_check", "drain_node", "undrain_node", "clear_group_alert")


@dataclass(frozen=True)
class Durable:
    """A durable pull consumer a part creates or binds: stream base name, durable name, filter subject."""

    stream: str
    name: str
    filter: str


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False  # may answer requests it received (on the requester's inbox), once each

    def as_config(self) -> dict:
        out: dict = {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            out["allow_responses"] = True
        return out


@dataclass(frozen=True)
class User:
    """One NATS user: its name, its role's permissions and the inbox prefix it must connect with."""

    name: str
    role: str
    permissions: Permissions
    inbox_prefix: str = field(default="")


def inbox_prefix(user: str) -> str:
    return f"_INBOX.{user}"


def executor_user(executor_id: str) -> str:
    return f"executor-{executor_id}"


def durables(role: str, s: Subjects, *, executor_id: str | None = None) -> list[Durable]:
    """Every durable each part consumes (read from services/*/handlers.py and agents/executor/agent.py)."""
    if role == "audit":
        return [Durable("CMD", "audit-commands", s.cmd_all), Durable("OUTCOME", "audit-outcomes", s.outcome_all),
                Durable("REJECTED", "audit-rejected", s.rejected_all)]
    if role == "budget":
        return [Durable("USAGE", "budget-usage-reports", s.usage_all), Durable("HB", "budget-usage", s.heartbeat_all),
                Durable("JOB", "budget-job-events", s.job_all), Durable("PROGRESS", "budget-progress", s.progress_all)]
    if role == "health":
        return [Durable("HB", "health-heartbeats", s.heartbeat_all), Durable("NODE", "health-nodes", s.node_all),
                Durable("JOB", "health-job-events", s.job_all),
                Durable("NODE", "health-check-reports", s.check_all),
                *(Durable("CMD", f"health-{k}", s.cmd(k)) for k in HEALTH_COMMANDS)]
    if role == "queue":
        return [*(Durable("CMD", f"queue-{k}", s.cmd(k)) for k in QUEUE_COMMANDS),
                Durable("PROGRESS", "queue-progress", s.progress_all), Durable("BUDGET", "queue-budget", s.budget_all),
                Durable("HB", "queue-heartbeats", s.heartbeat_all), Durable("NODE", "queue-nodes", s.node_all)]
    if role == "executor":
        if not executor_id:
            raise ValueError("an executor's permissions need its executor id")
        return [Durable("AGENT", f"agent-{executor_id}", s.agent_all_of(executor_id))]
    return []


def _consume(s: Subjects, d: Durable) -> list[str]:
    """The JetStream API a pull consumer uses: info, create (bound to its filter: the server refuses a body whose
    filter differs from the subject's), fetch, ack. Never the legacy DURABLE.CREATE, which takes any filter."""
    stream = s.stream_name(d.stream)
    return [f"$JS.API.CONSUMER.INFO.{stream}.{d.name}", f"$JS.API.CONSUMER.CREATE.{stream}.{d.name}.{d.filter}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{d.name}", f"$JS.ACK.{stream}.{d.name}.>"]


# Streams the gateway watches for the panel's live feed and step history (libs/runtime/tail.py).
WATCHED_BY_GATEWAY = ("JOB", "PROGRESS", "HB", "BUDGET", "NODE")


def _watch(s: Subjects, bases: tuple[str, ...]) -> list[str]:
    """Read-only looks at streams: create an *ephemeral* consumer (the API subject without a consumer name, so
    no durable can be created or changed), read its info, answer flow control. No pull, no ack, no delete."""
    out: list[str] = []
    for base in bases:
        stream = s.stream_name(base)
        out += [f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.INFO.{stream}.*", f"$JS.FC.{stream}.>"]
    return out


def _stream_info(s: Subjects, bases: list[str]) -> list[str]:
    return [f"$JS.API.STREAM.INFO.{s.stream_name(b)}" for b in sorted(set(bases))]


def _service(s: Subjects, name: str, publish: list[str], *, streams: list[str], extra_sub: list[str] = ()
             ) -> Permissions:
    """Every service answers requests: at least the status request every replica answers (``teto status``)."""
    consumed = durables(name, s)
    pub = [*publish, s.rejected(name), s.dead(name),
           *(subject for d in consumed for subject in _consume(s, d)),
           *_stream_info(s, [*streams, *(d.stream for d in consumed), "REJECTED", "DEAD"])]
    return Permissions(tuple(pub), (inbox_prefix(name) + ".>", *extra_sub, s.rpc_status), allow_responses=True)


def permissions(role: str, prefix: str = "teto", *, executor_id: str | None = None,
                node_id: str | None = None) -> Permissions:
    """The allow lists of one role; an executor's are for ONE executor id and its node id."""
    s = Subjects(prefix)
    p = s.prefix
    if role == "admin":
        return Permissions((">",), (">",), allow_responses=True)
    if role == "gateway":
        # Commands of every kind; refusals decided at the edge (any kind); reads the dead-letter stream and jobs'
        # output (LOGS), one message at a time, never consuming; asks every replica's status and reads every
        # stream's info (replicas, leader) for ``GET /v1/status``; tails the panel's watched subjects.
        dead, logs = s.stream_name("DEAD"), s.stream_name("LOGS")
        return _service(s, "gateway", [f"{p}.cmd.*", f"{p}.outcome.*.*", f"$JS.API.STREAM.MSG.GET.{dead}",
                                       f"$JS.API.STREAM.MSG.GET.{logs}", s.rpc_audit_verify, s.rpc_status,
                                       *_watch(s, WATCHED_BY_GATEWAY)],
                        streams=[base_name(spec.name, s) for spec in s.streams()], extra_sub=[s.outcome_all])
    if role == "queue":
        return _service(s, "queue", [f"{p}.agent.*.run", f"{p}.agent.*.stop", f"{p}.lease.*.*", f"{p}.job.*.*",
                                     *(f"{p}.outcome.{k}.*" for k in QUEUE_COMMANDS), s.rpc_budget_status,
                                     s.rpc_budget_orgs],
                        streams=["AGENT", "LEASE", "JOB", "OUTCOME"], extra_sub=[s.rpc_lease_renew])
    if role == "budget":
        return _service(s, "budget", [f"{p}.budget.*.*"], streams=["BUDGET"],
                        extra_sub=[s.rpc_budget_status, s.rpc_budget_orgs])
    if role == "health":
        return _service(s, "health", [f"{p}.agent.*.check", f"{p}.agent.*.reboot", f"{p}.node.*.*",
                                      f"{p}.job.*.signal", *(f"{p}.outcome.{k}.*" for k in HEALTH_COMMANDS),
                                      f"{p}.outcome.provision.*"],  # its provisioner's actions, audited
                        streams=["AGENT", "NODE", "JOB", "OUTCOME"])
    if role == "audit":
        # Anchors the chain head in its no-delete stream and answers verify: it reads the anchors back (the last
        # one, and all of them through an ordered, ephemeral, read-only consumer).
        anchors = s.stream_name("AUDIT_ANCHOR")
        return _service(s, "audit", [s.audit_anchor, f"$JS.API.STREAM.MSG.GET.{anchors}",
                                     f"$JS.API.CONSUMER.CREATE.{anchors}", f"$JS.API.CONSUMER.CREATE.{anchors}.>",
                                     f"$JS.API.CONSUMER.DELETE.{anchors}.>", f"$JS.FC.{anchors}.>",
                                     f"$JS.ACK.{anchors}.>"],
                        streams=["AUDIT_ANCHOR"], extra_sub=[s.rpc_audit_verify])
    if role == "executor":
        if not executor_id or not node_id:
            raise ValueError("an executor's permissions need its executor id and node id")
        me = executor_user(executor_id)
        (agent,) = durables("executor", s, executor_id=executor_id)
        pub = [s.heartbeat(executor_id), s.usage(executor_id), s.node(node_id, "registered"),
               # A check report's run id is the health service's; the report is bound to the sender by its
               # last token, which the health service compares with the body.
               f"{p}.check.*.*.{executor_id}",
               f"{p}.progress.*.{executor_id}",  # any job, but only as itself: the queue checks it holds the lease
               # Output of any job, only as itself: the gateway shows a job only the chunks of executors the
               # queue granted it (the job's events name them)
               f"{p}.logs.*.*.*.{executor_id}",
               s.rejected("executor"), s.rpc_lease_renew_of(executor_id),
               *_consume(s, agent),
               *_stream_info(s, ["AGENT", "HB", "USAGE", "NODE", "PROGRESS", "REJECTED", "LOGS"])]
        return Permissions(tuple(pub), (inbox_prefix(me) + ".>",))
    raise ValueError(f"unknown role {role!r} (one of {', '.join(ROLES)})")


def base_name(stream: str, s: Subjects) -> str:
    """``TETO_CMD`` -> ``CMD`` (the inverse of ``Subjects.stream_name``)."""
    return stream[len(s.stream_name("")):]


def checked_streams(perms: Permissions) -> list[str]:
    """The streams a part checks at start: those whose info its permissions allow."""
    mark = "$JS.API.STREAM.INFO."
    return [subject[len(mark):] for subject in perms.publish if subject.startswith(mark)]


def user(role: str, prefix: str = "teto", *, executor_id: str | None = None, node_id: str | None = None) -> User:
    name = executor_user(executor_id or "") if role == "executor" else role
    perms = permissions(role, prefix, executor_id=executor_id, node_id=node_id)
    return User(name, role, perms, inbox_prefix(name))


def authorization(users: list[User], password_hashes: dict[str, str]) -> dict:
    """The server's ``authorization`` block: every user with its (bcrypt) password hash and permissions. There is
    no ``no_auth_user``: a connection without credentials is refused."""
    return {"users": [{"user": u.name, "password": password_hashes[u.name], "permissions": u.permissions.as_config()}
                      for u in users]}


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more (what the server applies to allow lists)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def allows(patterns: tuple[str, ...], subject: str) -> bool:
    return any(matches(p, subject) for p in patterns)
