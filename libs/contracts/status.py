"""The control plane's own status: every replica of every service answers ``teto.rpc.status`` (core NATS
request, no queue group: all replicas answer) with what it runs, which singleton locks it holds and the lag of
the durables it consumes. The gateway gathers the answers for ``GET /v1/status`` and ``teto status``.
"""

from __future__ import annotations

from pydantic import Field

from .bounds import Big, Label, Reason, Time
from .envelope import Envelope, Model


class StatusRequest(Envelope):
    SCHEMA = "teto.rpc.status.request/1"


class ConsumerLag(Model):
    durable: Label
    stream: Label
    pending: Big = Field(description="JetStream num_pending: stored, not yet delivered to the durable")
    ack_pending: Big = Field(description="Delivered, not yet acknowledged")
    sampled_at: Time


class FailingLoop(Model):
    """A background loop of the replica that raised on its last ticks, none succeeding between."""

    name: Label
    failures: Big = Field(description="Ticks in a row that raised")
    since: Time = Field(description="When the first of them raised")
    error: Reason = Field(description="The last error")


class ReplicaStatus(Envelope):
    SCHEMA = "teto.rpc.status.reply/1"

    service: Label
    instance: Label = Field(description="The replica's name (TETO_INSTANCE, default <host>:<pid>)")
    started_at: Time
    singletons: list[Label] = Field(default_factory=list, max_length=100,
                                    description="The singleton loops this replica runs or waits to run")
    leading: list[Label] = Field(default_factory=list, max_length=100,
                                 description="The singleton locks this replica holds now")
    consumers: list[ConsumerLag] = Field(default_factory=list, max_length=200)
    metrics_port: int | None = Field(None, ge=1, le=65535)
    metrics_error: Reason | None = Field(None, description="Why this replica's /metrics port is not served (another "
                                         "process holds it, say); retried until it is")
    nats_server: Label | None = Field(None, description="The NATS server this replica is connected to")
    failing_loops: list[FailingLoop] = Field(default_factory=list, max_length=100,
                                             description="Background loops raising tick after tick (each a problem)")
