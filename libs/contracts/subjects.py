"""The one place Teto's subject and stream names are spelled.

Every part builds subjects through ``Subjects(prefix)``; the prefix (default ``teto``) lets several Teto
installations share one NATS account. Wildcard patterns are what consumers subscribe to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .bounds import ID_PATTERN

DEFAULT_PREFIX = "teto"
_ID = re.compile(ID_PATTERN)


class SubjectTokenError(ValueError):
    """A value that cannot be a subject token: the same value always fails, so retrying is pointless."""

    retryable = False


def _token(value: str) -> str:
    """A subject token must not contain separators or wildcards. The rule is the contracts' id rule
    (bounds.ID_PATTERN), so every id a message decodes to can be put in a subject, and nothing else can."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise SubjectTokenError(f"{value!r} cannot be used as a subject token")
    return value


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_seconds: float | None  # None keeps messages until limits say otherwise
    description: str
    # A cap on the message count on top of the age (oldest dropped first); None: no cap. A count, not bytes:
    # JetStream reserves a stream's max_bytes from the server's storage up front, a count it does not.
    max_msgs: int | None = None
    # The server refuses to delete single messages / purge the stream (audit anchors: evidence, kept forever).
    deny_delete: bool = False
    deny_purge: bool = False
    # A cap on the messages kept per subject (oldest dropped first); None: no cap.
    max_msgs_per_subject: int | None = None


@dataclass(frozen=True)
class Subjects:
    prefix: str = DEFAULT_PREFIX

    # -- commands: teto.cmd.<kind>
    def cmd(self, kind: str) -> str:
        return f"{self.prefix}.cmd.{_token(kind)}"

    @property
    def cmd_all(self) -> str:
        return f"{self.prefix}.cmd.>"

    # -- command outcomes: teto.outcome.<kind>.<command_id> (accepted or refused, with the reason)
    def outcome(self, kind: str, command_id: str) -> str:
        return f"{self.prefix}.outcome.{_token(kind)}.{_token(command_id)}"

    def outcome_of(self, command_id: str) -> str:
        return f"{self.prefix}.outcome.*.{_token(command_id)}"

    @property
    def outcome_all(self) -> str:
        return f"{self.prefix}.outcome.>"

    # -- job events: teto.job.<job_id>.<event>
    def job_event(self, job_id: str, event: str) -> str:
        return f"{self.prefix}.job.{_token(job_id)}.{_token(event)}"

    def job_events_of(self, job_id: str) -> str:
        return f"{self.prefix}.job.{_token(job_id)}.>"

    @property
    def job_all(self) -> str:
        return f"{self.prefix}.job.>"

    # -- heartbeats: teto.hb.<executor_id>
    def heartbeat(self, executor_id: str) -> str:
        return f"{self.prefix}.hb.{_token(executor_id)}"

    @property
    def heartbeat_all(self) -> str:
        return f"{self.prefix}.hb.*"

    # -- progress: teto.progress.<job_id>.<executor_id> (steps, checkpoints, run outcome). The last token names
    # the sender: the bus lets an executor publish only its own id there, and consumers refuse a report whose
    # body names another executor (see ``sender_token``). The stream keeps per-job order.
    def progress(self, job_id: str, executor_id: str) -> str:
        return f"{self.prefix}.progress.{_token(job_id)}.{_token(executor_id)}"

    def progress_of(self, job_id: str) -> str:
        return f"{self.prefix}.progress.{_token(job_id)}.*"

    @property
    def progress_all(self) -> str:
        return f"{self.prefix}.progress.*.*"

    # -- job output: teto.logs.<job_id>.<attempt>.<rank>.<executor_id> (chunks of stdout/stderr; the sender last,
    # as for progress: the bus lets an executor publish only its own id there)
    def logs(self, job_id: str, attempt: int, rank: int, executor_id: str) -> str:
        return f"{self.prefix}.logs.{_token(job_id)}.{int(attempt)}.{int(rank)}.{_token(executor_id)}"

    def logs_of(self, job_id: str, attempt: int | None = None, rank: int | None = None) -> str:
        """The chunks of one job, of one attempt and/or rank when given (a stream filter subject)."""
        a = "*" if attempt is None else str(int(attempt))
        r = "*" if rank is None else str(int(rank))
        return f"{self.prefix}.logs.{_token(job_id)}.{a}.{r}.*"

    @property
    def logs_all(self) -> str:
        return f"{self.prefix}.logs.*.*.*.*"

    # -- leases: teto.lease.<job_id>.<event> (granted, renewed, expired, released)
    def lease(self, job_id: str, event: str) -> str:
        return f"{self.prefix}.lease.{_token(job_id)}.{_token(event)}"

    @property
    def lease_all(self) -> str:
        return f"{self.prefix}.lease.>"

    # -- lease renewal RPC (core NATS request/reply, answered by a queue replica; not stored in a stream):
    # teto.rpc.lease.renew.<executor_id>, the sender's id last (the queue refuses a request naming another)
    def rpc_lease_renew_of(self, executor_id: str) -> str:
        return f"{self.prefix}.rpc.lease.renew.{_token(executor_id)}"

    @property
    def rpc_lease_renew(self) -> str:
        return f"{self.prefix}.rpc.lease.renew.*"

    @property
    def rpc_budget_status(self) -> str:
        return f"{self.prefix}.rpc.budget.status"

    @property
    def rpc_budget_orgs(self) -> str:
        return f"{self.prefix}.rpc.budget.orgs"

    # -- directives to one executor agent: teto.agent.<executor_id>.<kind> (run, stop, check, reboot)
    def agent(self, executor_id: str, kind: str) -> str:
        return f"{self.prefix}.agent.{_token(executor_id)}.{_token(kind)}"

    def agent_all_of(self, executor_id: str) -> str:
        return f"{self.prefix}.agent.{_token(executor_id)}.>"

    @property
    def agent_all(self) -> str:
        return f"{self.prefix}.agent.>"

    # -- nodes and deep checks
    def node(self, node_id: str, event: str) -> str:
        return f"{self.prefix}.node.{_token(node_id)}.{_token(event)}"

    @property
    def node_all(self) -> str:
        return f"{self.prefix}.node.>"

    def check(self, run_id: str, event: str, executor_id: str) -> str:
        """``teto.check.<run_id>.<event>.<executor_id>``: the last token names the reporting executor."""
        return f"{self.prefix}.check.{_token(run_id)}.{_token(event)}.{_token(executor_id)}"

    @property
    def check_all(self) -> str:
        return f"{self.prefix}.check.>"

    # -- budget events: teto.budget.<job_id>.<event> (warning, exhausted)
    def budget(self, job_id: str, event: str) -> str:
        return f"{self.prefix}.budget.{_token(job_id)}.{_token(event)}"

    @property
    def budget_all(self) -> str:
        return f"{self.prefix}.budget.>"

    # -- messages a consumer refused as malformed or hostile: teto.rejected.<service> (audited, visible)
    def rejected(self, service: str) -> str:
        return f"{self.prefix}.rejected.{_token(service)}"

    @property
    def rejected_all(self) -> str:
        return f"{self.prefix}.rejected.*"

    # -- messages a consumer gave up on (permanent failure or redelivery exhausted): teto.dead.<service>
    def dead(self, service: str) -> str:
        return f"{self.prefix}.dead.{_token(service)}"

    @property
    def dead_all(self) -> str:
        return f"{self.prefix}.dead.*"

    # -- GPU usage samples: teto.usage.<executor_id> (durable for days: no GPU-second is lost to an outage)
    def usage(self, executor_id: str) -> str:
        return f"{self.prefix}.usage.{_token(executor_id)}"

    @property
    def usage_all(self) -> str:
        return f"{self.prefix}.usage.*"

    # -- audit anchors: teto.audit.anchor (the chain head, in a stream that refuses deletes and purges)
    @property
    def audit_anchor(self) -> str:
        return f"{self.prefix}.audit.anchor"

    @property
    def rpc_audit_verify(self) -> str:
        return f"{self.prefix}.rpc.audit.verify"

    # -- the control plane's status: every replica of every service answers (no queue group)
    @property
    def rpc_status(self) -> str:
        return f"{self.prefix}.rpc.status"

    # -- who sent it: subjects an executor publishes end with its id (the bus allows it no other)
    @staticmethod
    def sender_token(subject: str) -> str:
        """The last token of an executor's subject (heartbeat, usage, progress, check report): its executor id.
        Consumers compare it with the id the body claims (libs/contracts/senders.py)."""
        return subject.rsplit(".", 1)[-1]

    # -- streams
    def stream_name(self, base: str) -> str:
        return f"{self.prefix.upper().replace('.', '_').replace('-', '_')}_{base}"

    def streams(self) -> list[StreamSpec]:
        day = 86400.0
        return [
            StreamSpec(self.stream_name("CMD"), (self.cmd_all,), 90 * day, "Commands (audited)"),
            StreamSpec(self.stream_name("OUTCOME"), (self.outcome_all,), 90 * day, "Command outcomes"),
            StreamSpec(self.stream_name("JOB"), (self.job_all,), 90 * day, "Job-state events for consumers"),
            StreamSpec(self.stream_name("HB"), (self.heartbeat_all,), 3600.0, "Executor heartbeats (short-lived)"),
            StreamSpec(self.stream_name("PROGRESS"), (self.progress_all,), 7 * day, "Step, checkpoint, run outcome"),
            StreamSpec(self.stream_name("LEASE"), (self.lease_all,), 7 * day, "Lease facts"),
            StreamSpec(self.stream_name("AGENT"), (self.agent_all,), 1 * day, "Directives to executor agents"),
            StreamSpec(self.stream_name("NODE"), (self.node_all, self.check_all), 30 * day, "Nodes and checks"),
            StreamSpec(self.stream_name("BUDGET"), (self.budget_all,), 90 * day, "Budget events"),
            StreamSpec(self.stream_name("REJECTED"), (self.rejected_all,), 30 * day, "Refused malformed messages"),
            StreamSpec(self.stream_name("DEAD"), (self.dead_all,), 30 * day,
                       "Dead letters: messages a consumer gave up on, with the reason", max_msgs=1_000_000),
            StreamSpec(self.stream_name("USAGE"), (self.usage_all,), 14 * day,
                       "GPU usage samples, kept through a budget-service outage", max_msgs=50_000_000),
            StreamSpec(self.stream_name("LOGS"), (self.logs_all,), 7 * day,
                       "Jobs' output (stdout/stderr chunks per run), bounded per run by the agent",
                       max_msgs=20_000_000, max_msgs_per_subject=200_000),
            StreamSpec(self.stream_name("AUDIT_ANCHOR"), (self.audit_anchor,), None,
                       "Audit chain heads: evidence against a rewrite of the log, never deleted nor purged",
                       deny_delete=True, deny_purge=True),
        ]

    def stream_for(self, base: str) -> str:
        return self.stream_name(base)
