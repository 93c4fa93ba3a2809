"""Nodes and executors: registration by the agent (``teto.node.<node_id>.registered``), signals, the node
lifecycle (``teto.node.<node_id>.<event>``) and deep health checks (``teto.agent.<executor_id>.check|reboot``
directives, ``teto.check.<run_id>.<event>.<executor_id>`` progress and results).

Signals (``no_signal``, ``stuck``) are derived by the health service and published as job events
(``teto.job.<job_id>.signal``) so that the job badge and the executor list always agree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from .bounds import (INT32_MAX, Address, Count, Figures, Finite, Id, JsonObject, Label,
                     QuotedOutput, Reason, Rendezvous, Seconds, Seq, Time)
from .envelope import Envelope, Model
from .telemetry import GpuInfo


class NodeRegistered(Envelope):
    SCHEMA = "teto.node.registered/1"

    node_id: Id
    executor_id: Id
    group: Id
    hostname: Label
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=1024)
    cpu_count: int = Field(ge=1, le=INT32_MAX)
    torch_version: Label | None = None
    agent_version: Label
    address: Address | None = Field(None, description="host:port of the agent's reachability (echo) listener")
    collective_port: int | None = Field(None, ge=1, le=65535,
                                        description="Port this node offers as rank 0 of a check collective")
    boot_id: Id | None = Field(None, description="Changes on every agent start: a re-registration after a reboot")
    slurm_job_id: Id | None = Field(None, description="The Slurm job this agent runs in as a pilot (then "
                                       "hostname is the node's Slurm name, which the Slurm provisioner drains)")


class Signal(StrEnum):
    OK = "ok"  # heartbeats fresh and (when training) steps advancing
    NO_SIGNAL = "no_signal"  # heartbeats stopped for longer than signal_timeout
    STUCK = "stuck"  # heartbeats fresh, training, step not advancing past the threshold


class SignalChanged(Envelope):
    SCHEMA = "teto.job.signal/1"

    job_id: Id
    executor_id: Id | None
    signal: Signal | None
    previous: Signal | None
    since: Time
    # Derived by health from reported times (a clock may be ahead): finite, not otherwise bounded.
    seconds_since_heartbeat: Finite | None = None
    seconds_since_step_change: Finite | None = None
    no_signal_after_seconds: Finite
    stuck_after_seconds: Finite


# -- node lifecycle -------------------------------------------------------------------------------------------

class NodeState(StrEnum):
    JOINING = "joining"  # registered; its checks are about to start (not schedulable)
    CHECKING = "checking"  # running the check suite (not schedulable)
    READY = "ready"  # passed its checks: schedulable unless cordoned
    FAILED = "failed"  # failed its checks (passes on to recovering or replaced at once)
    RECOVERING = "recovering"  # told to reboot; re-checked when it registers again
    REPLACED = "replaced"  # failed after max_reboots recoveries; the provisioner was asked for a new node
    DRAINED = "drained"  # taken out by an operator
    GONE = "gone"  # its agent silent for node_gone_seconds (dead, frozen, powered off; or a bare registration)


# A node in one of these states lost the work it ran: a gang on it applies its node-failure strategy at once.
NODE_LOST_STATES = frozenset({NodeState.FAILED, NodeState.RECOVERING, NodeState.REPLACED, NodeState.GONE})
# A node in one of these states takes no work, whatever the check requirement says.
RULED_OUT_STATES = NODE_LOST_STATES | {NodeState.DRAINED}


class NodeEventKind(StrEnum):
    JOINING = "joining"
    CHECKING = "checking"
    READY = "ready"
    FAILED = "failed"
    RECOVERING = "recovering"
    REPLACED = "replaced"
    DRAINED = "drained"
    CORDONED = "cordoned"  # busy node targeted by a check run: no new work, checked when its job ends
    UNCORDONED = "uncordoned"
    HELD = "held"  # the group's systemic-failure alert holds it out of scheduling (reason says why)
    RELEASED = "released"  # the alert was cleared by an operator
    GONE = "gone"  # its agent is silent: not there (registering again brings it back)


class NodeEvent(Envelope):
    """A node's state change, ordered per node by ``seq``; ``schedulable`` is what placement must obey."""

    SCHEMA = "teto.node.event/1"

    node_id: Id
    seq: Seq
    event: NodeEventKind
    state: NodeState
    previous_state: NodeState | None = None
    executor_id: Id | None = None
    group: Id
    schedulable: bool
    reason: Reason | None = None
    run_id: Id | None = None
    reboots: Count = 0
    detail: JsonObject = Field(default_factory=dict)
    boot_id: Id | None = Field(None, description="The agent start (NodeRegistered.boot_id) this state is about: "
                               "placement trusts a ready node only for the executor's heartbeats of that start")


# -- deep checks ----------------------------------------------------------------------------------------------

class CheckTest(StrEnum):
    MATMUL = "matmul"  # matrix products per precision vs a float64 reference, and throughput
    MEMBW = "membw"  # device memory bandwidth from large copies
    MEMTEST = "memtest"  # pattern write/read over a fraction of free memory
    NVML = "nvml"  # ECC, retired pages / remapped rows, XID, temperature, power, clocks, throttle reasons
    CONNECTIVITY = "connectivity"  # every other node of the group answers on its reachability address
    ALLREDUCE = "allreduce"  # torch.distributed all-reduce across the nodes of the run (bus bandwidth)


ALL_TESTS: tuple[CheckTest, ...] = tuple(CheckTest)


class CheckStatus(StrEnum):
    WAITING = "waiting"  # the node is busy: cordoned, checked when its job ends
    PENDING = "pending"  # asked, not started
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"  # e.g. NVML on a CPU-only node: said, never a silent pass


class CheckPeer(Model):
    node_id: Id
    address: Address


class RunChecks(Envelope):
    """Directive to one agent: run these tests now (``teto.agent.<executor_id>.check``)."""

    SCHEMA = "teto.agent.check/1"

    run_id: Id
    node_id: Id
    executor_id: Id
    tests: list[CheckTest] = Field(min_length=1, max_length=100)
    attempt: int = Field(1, ge=1, le=INT32_MAX, description="2 for the single re-run of a failed test")
    force: bool = Field(False, description="Stop a running job first (checkpoint, requeue without an attempt)")
    peers: list[CheckPeer] = Field(default_factory=list, max_length=10_000,
                                   description="Other nodes of the group to reach")
    rank: Count = 0
    world_size: int = Field(1, ge=1, le=INT32_MAX)
    rendezvous: Rendezvous | None = Field(None, description="host:port of rank 0 for the all-reduce")


class RebootNode(Envelope):
    """Directive to one agent: reboot (restart the agent process, or the configured reboot hook)."""

    SCHEMA = "teto.agent.reboot/1"

    node_id: Id
    executor_id: Id
    reason: Reason
    reboots: int = Field(ge=1, le=INT32_MAX, description="This node's reboots so far, this one included")


class CheckReport(Envelope):
    """Progress or result of one test on one node (``teto.check.<run_id>.<event>.<executor_id>``; event is the status)."""

    SCHEMA = "teto.check.report/1"

    run_id: Id
    node_id: Id
    executor_id: Id
    test: CheckTest | None = Field(None, description="None: about the node's whole run (e.g. busy)")
    attempt: int = Field(1, ge=1, le=INT32_MAX)
    status: CheckStatus | Literal["busy"]
    figures: Figures = Field(default_factory=dict, description="Measured numbers (finite), units in their names")
    detail: JsonObject = Field(default_factory=dict)
    error: QuotedOutput | None = Field(None, description="What the test said (NULs shown as U+FFFD)")
    seconds: Seconds | None = Field(None, description="Wall time of the test")
    suite_version: str | None = Field(
        None, pattern=r"^[A-Za-z0-9._-]{1,40}$", description="The check suite's version: figures are compared only "
        "with figures of the same version (None: an agent from before versions were reported)")
