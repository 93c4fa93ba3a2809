"""The node lifecycle: one pure transition function, ``decide(node, fact, now, policy)``.

States (DESIGN.md 7): joining -> checking -> ready; a failed check -> failed -> recovering (reboot) and, after
``max_reboots`` failed recoveries, replaced; drained by an operator. A node is schedulable only when ready, not
cordoned (a busy node targeted by a check run keeps its job but takes no new one) and not held (its group has a
systemic-failure alert, see breaker.py: a node that fails meanwhile stays failed, neither rebooted nor replaced).

A fact is something that happened or was asked. The answer is a ``Transition`` (the node after it, the node
events to emit, the effects the edge must carry out: start checks, reboot, call the provisioner) or a
``Refusal`` (not allowed; nothing applied). Facts about a check run the node is no longer in are old news:
``Transition.unchanged`` with the reason, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from libs.contracts.nodes import NodeEventKind, NodeState

S = NodeState
NOT_SCHEDULABLE = {S.JOINING: "waiting for its checks", S.CHECKING: "running its checks",
                   S.FAILED: "failed its checks", S.RECOVERING: "rebooting after failed checks",
                   S.REPLACED: "replaced", S.DRAINED: "drained by an operator",
                   S.GONE: "gone: its agent is silent"}


@dataclass(frozen=True)
class Node:
    node_id: str
    group: str
    executor_id: str | None
    state: NodeState
    reboots: int = 0  # reboots since the node last passed its checks
    run_id: str | None = None  # the check run the node is in (checking, or cordoned waiting for it)
    cordoned: bool = False
    reason: str | None = None
    boot_id: str | None = None
    since: datetime | None = None
    held: str | None = None  # why the group's systemic-failure alert holds it out of scheduling

    @property
    def schedulable(self) -> bool:
        return self.state is S.READY and not self.cordoned and self.held is None

    @property
    def why_not_schedulable(self) -> str | None:
        if self.state is S.READY:
            if self.held is not None:
                return self.held
            return f"cordoned for check run {self.run_id}" if self.cordoned else None
        return self.reason or NOT_SCHEDULABLE[self.state]


@dataclass(frozen=True)
class Policy:
    max_reboots: int = 2


# -- facts ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Registered:
    """The agent (re)started: a new node, a reboot coming back, or an agent restarted on its own."""
    node_id: str
    executor_id: str
    group: str
    boot_id: str | None = None


@dataclass(frozen=True)
class ChecksStarted:
    run_id: str


@dataclass(frozen=True)
class CheckRequested:
    """An on-demand run asks for this node; ``busy``: a job runs on it now (and ``force`` was not given)."""
    run_id: str
    busy: bool


@dataclass(frozen=True)
class ChecksPassed:
    run_id: str


@dataclass(frozen=True)
class ChecksFailed:
    """``hold``: the group's breaker says stop (systemic failure): the node stays failed, no reboot, no
    replacement, with this reason."""
    run_id: str
    reason: str
    hold: str | None = None


@dataclass(frozen=True)
class ChecksDeferred:
    """The agent answered busy (a job landed on it just before its checks): cordon it until the job ends."""
    run_id: str


@dataclass(frozen=True)
class Drain:
    reason: str = "drained by an operator"


@dataclass(frozen=True)
class Undrain:
    pass


@dataclass(frozen=True)
class Hold:
    """The group's systemic-failure alert was raised: out of scheduling until an operator clears it."""
    reason: str


@dataclass(frozen=True)
class Release:
    """The group's alert was cleared."""


@dataclass(frozen=True)
class Unaddressable:
    """A directive to the node cannot even be addressed (an id the bus refuses): it is failed with the reason,
    not rebooted (no directive could reach it), and checked again only when it registers anew."""
    reason: str


@dataclass(frozen=True)
class Silent:
    """Nothing heard from the node's agent (no registration, no heartbeat) for ``seconds``: no agent is there
    to do anything (liveness.silent)."""
    seconds: float


Fact = (Registered | ChecksStarted | CheckRequested | ChecksPassed | ChecksFailed | ChecksDeferred | Drain
        | Undrain | Hold | Release | Unaddressable | Silent)


# -- results ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    kind: NodeEventKind
    state: NodeState
    previous: NodeState | None
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reboot:
    reboots: int
    reason: str


@dataclass(frozen=True)
class Provision:
    """Ask the provisioner for a fresh node in the group (the replaced one is left out of scheduling)."""
    reason: str


@dataclass(frozen=True)
class ScheduleChecks:
    """The node needs a check run (joining, back from a reboot, undrained)."""


Effect = Reboot | Provision | ScheduleChecks


@dataclass(frozen=True)
class Transition:
    node: Node
    events: tuple[Event, ...] = ()
    effects: tuple[Effect, ...] = ()
    ignored: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.events)

    @property
    def schedules_checks(self) -> bool:
        """The node is due for checks (its row's ``needs_check``: the check loop starts them)."""
        return any(isinstance(e, ScheduleChecks) for e in self.effects)

    @classmethod
    def unchanged(cls, node: Node, why: str | None = None) -> Transition:
        return cls(node, ignored=why)


@dataclass(frozen=True)
class Refusal:
    reason: str


# -- the transition function -------------------------------------------------------------------------------

def decide(node: Node | None, fact: Fact, now: datetime, policy: Policy = Policy()) -> Transition | Refusal:
    if isinstance(fact, Registered):
        return on_registered(node, fact, now)
    if node is None:
        return Refusal("node not found")
    if isinstance(fact, ChecksStarted):
        return on_checks_started(node, fact, now)
    if isinstance(fact, CheckRequested):
        return on_check_requested(node, fact, now)
    if isinstance(fact, ChecksPassed):
        return on_passed(node, fact, now)
    if isinstance(fact, ChecksFailed):
        return on_failed(node, fact, now, policy)
    if isinstance(fact, ChecksDeferred):
        return on_deferred(node, fact, now)
    if isinstance(fact, Drain):
        return on_drain(node, fact, now)
    if isinstance(fact, Undrain):
        return on_undrain(node, now)
    if isinstance(fact, Hold):
        return on_hold(node, fact, now)
    if isinstance(fact, Release):
        return on_release(node, now)
    if isinstance(fact, Unaddressable):
        return on_unaddressable(node, fact, now)
    if isinstance(fact, Silent):
        return on_silent(node, fact, now)
    raise TypeError(f"not a node fact: {fact!r}")


def _to(node: Node, state: NodeState, kind: NodeEventKind, now: datetime, reason: str | None = None,
        **changes: Any) -> tuple[Node, Event]:
    new = replace(node, state=state, since=now, reason=reason, **changes)
    return new, Event(kind, state, node.state, reason)


def on_registered(node: Node | None, fact: Registered, now: datetime) -> Transition:
    """A node that registers proves itself before it gets work: joining, then a check run.

    A replaced node stays replaced (its successor is on the way; the old one must not come back by restarting);
    a drained one stays drained. The same boot registering twice (a redelivered message) changes nothing.
    """
    if node is None:
        new = Node(fact.node_id, fact.group, fact.executor_id, S.JOINING, boot_id=fact.boot_id, since=now)
        return Transition(new, (Event(NodeEventKind.JOINING, S.JOINING, None, "registered"),), (ScheduleChecks(),))
    if fact.boot_id is not None and fact.boot_id == node.boot_id and node.executor_id == fact.executor_id:
        return Transition.unchanged(node, "registration already seen")
    if node.state in (S.REPLACED, S.DRAINED):
        kept = replace(node, executor_id=fact.executor_id, boot_id=fact.boot_id)
        return Transition(kept, ignored=f"node is {node.state}: registration noted, state kept")
    why = "back after a reboot" if node.state is S.RECOVERING else "agent restarted"
    new, ev = _to(node, S.JOINING, NodeEventKind.JOINING, now, why, executor_id=fact.executor_id,
                  group=fact.group, boot_id=fact.boot_id, run_id=None, cordoned=False)
    return Transition(new, (ev,), (ScheduleChecks(),))


def on_checks_started(node: Node, fact: ChecksStarted, now: datetime) -> Transition | Refusal:
    """Checks start on an idle node that is joining, ready (on demand) or cordoned for this run."""
    if node.state not in (S.JOINING, S.READY, S.CHECKING):
        return Refusal(f"a {node.state} node is not checked")
    if node.state is S.CHECKING and node.run_id == fact.run_id:
        return Transition.unchanged(node, "checks already running")
    new, ev = _to(node, S.CHECKING, NodeEventKind.CHECKING, now, None, run_id=fact.run_id, cordoned=False)
    return Transition(new, (replace(ev, detail={"run_id": fact.run_id}),))


def on_check_requested(node: Node, fact: CheckRequested, now: datetime) -> Transition | Refusal:
    """An on-demand run: a busy ready node is cordoned (keeps its job, takes no new one) until its job ends;
    an idle one is checked at once (the edge then says ChecksStarted)."""
    if node.state is not S.READY:
        return Refusal(f"node is {node.state}")
    if not fact.busy:
        return Transition(node, effects=(ScheduleChecks(),))
    if node.cordoned and node.run_id == fact.run_id:
        return Transition.unchanged(node, "already cordoned for this run")
    new = replace(node, cordoned=True, run_id=fact.run_id)
    return Transition(new, (Event(NodeEventKind.CORDONED, S.READY, S.READY, f"cordoned for check run {fact.run_id}",
                                  {"run_id": fact.run_id}),))


def on_passed(node: Node, fact: ChecksPassed, now: datetime) -> Transition:
    if node.state is not S.CHECKING or node.run_id != fact.run_id:
        return Transition.unchanged(node, f"not checking under run {fact.run_id}")
    new, ev = _to(node, S.READY, NodeEventKind.READY, now, None, run_id=None, reboots=0)
    return Transition(new, (replace(ev, detail={"run_id": fact.run_id}),))


def on_failed(node: Node, fact: ChecksFailed, now: datetime, policy: Policy) -> Transition:
    """failed, then at once recovering (a reboot) or, after max_reboots failed recoveries, replaced."""
    if node.state is not S.CHECKING or node.run_id != fact.run_id:
        return Transition.unchanged(node, f"not checking under run {fact.run_id}")
    if fact.hold is not None:
        held, ev = _to(node, S.FAILED, NodeEventKind.FAILED, now, f"{fact.reason} [{fact.hold}]", run_id=None,
                       held=fact.hold)
        return Transition(held, (replace(ev, detail={"run_id": fact.run_id, "held": True}),))
    failed, ev1 = _to(node, S.FAILED, NodeEventKind.FAILED, now, fact.reason, run_id=None)
    ev1 = replace(ev1, detail={"run_id": fact.run_id})
    if node.reboots >= policy.max_reboots:
        why = f"failed after {node.reboots} reboot(s) (max_reboots {policy.max_reboots}): {fact.reason}"
        new, ev2 = _to(failed, S.REPLACED, NodeEventKind.REPLACED, now, why)
        return Transition(new, (ev1, ev2), (Provision(why),))
    reboots = node.reboots + 1
    why = f"reboot {reboots} of {policy.max_reboots}: {fact.reason}"
    new, ev2 = _to(failed, S.RECOVERING, NodeEventKind.RECOVERING, now, why, reboots=reboots)
    return Transition(new, (ev1, ev2), (Reboot(reboots, fact.reason),))


def on_deferred(node: Node, fact: ChecksDeferred, now: datetime) -> Transition:
    """Only a node that was ready before its checks can be busy; it goes back to ready, cordoned, and its
    checks start again when its job ends. A joining node cannot have a job (it was never schedulable)."""
    if node.state is not S.CHECKING or node.run_id != fact.run_id:
        return Transition.unchanged(node, f"not checking under run {fact.run_id}")
    new = replace(node, state=S.READY, cordoned=True, since=now, reason=None)
    return Transition(new, (Event(NodeEventKind.CORDONED, S.READY, S.CHECKING,
                                  f"busy: checked when its job ends (run {fact.run_id})", {"run_id": fact.run_id}),))


def on_drain(node: Node, fact: Drain, now: datetime) -> Transition | Refusal:
    if node.state is S.REPLACED:
        return Refusal("a replaced node cannot be drained")
    if node.state is S.DRAINED:
        return Transition.unchanged(node, "already drained")
    new, ev = _to(node, S.DRAINED, NodeEventKind.DRAINED, now, fact.reason, run_id=None, cordoned=False)
    return Transition(new, (ev,))


def on_undrain(node: Node, now: datetime) -> Transition | Refusal:
    """An undrained node proves itself again before it gets work (it may have been serviced meanwhile)."""
    if node.state is not S.DRAINED:
        return Refusal(f"node is {node.state}, not drained")
    new, ev = _to(node, S.JOINING, NodeEventKind.JOINING, now, "undrained", reboots=0)
    return Transition(new, (ev,), (ScheduleChecks(),))


def uncordon(node: Node, now: datetime) -> Transition:
    """A cordoned node's run ended without checking it (run cancelled): back to work."""
    if not node.cordoned:
        return Transition.unchanged(node, "not cordoned")
    new = replace(node, cordoned=False, run_id=None)
    return Transition(new, (Event(NodeEventKind.UNCORDONED, node.state, node.state, None),))


def on_hold(node: Node, fact: Hold, now: datetime) -> Transition:
    """Every node of the group leaves scheduling (a replaced or drained node is out already)."""
    if node.state in (S.REPLACED, S.DRAINED):
        return Transition.unchanged(node, f"node is {node.state}")
    if node.held is not None:
        return Transition.unchanged(node, "already held")
    new = replace(node, held=fact.reason)
    return Transition(new, (Event(NodeEventKind.HELD, node.state, node.state, fact.reason),))


def on_release(node: Node, now: datetime) -> Transition:
    """Back to the usual path: a ready node is schedulable again; a node the breaker kept failed is checked
    again (and, failing again, rebooted or replaced with a fresh budget)."""
    if node.held is None:
        return Transition.unchanged(node, "not held")
    if node.state is S.FAILED:
        new, ev = _to(node, S.JOINING, NodeEventKind.JOINING, now, "group alert cleared: checked again", held=None)
        return Transition(new, (ev,), (ScheduleChecks(),))
    new = replace(node, held=None)
    return Transition(new, (Event(NodeEventKind.RELEASED, node.state, node.state, "group alert cleared"),))


def on_unaddressable(node: Node, fact: Unaddressable, now: datetime) -> Transition:
    if node.state in (S.REPLACED, S.DRAINED, S.FAILED):
        return Transition.unchanged(node, f"node is {node.state}")
    new, ev = _to(node, S.FAILED, NodeEventKind.FAILED, now, fact.reason, run_id=None, cordoned=False)
    return Transition(new, (ev,))


def on_silent(node: Node, fact: Silent, now: datetime) -> Transition:
    """Out of every list of live nodes and never schedulable; registering again (a real agent) brings it back.

    Whatever it was doing: a ready node whose agent died (a restarted ``teto up``, a machine powered off without
    deregistering) must not stay schedulable, nor be given to joining nodes as a peer.
    """
    if node.state in (S.REPLACED, S.DRAINED, S.GONE):
        return Transition.unchanged(node, f"node is {node.state}")
    why = f"gone: no heartbeat for {fact.seconds:g}s"
    new, ev = _to(node, S.GONE, NodeEventKind.GONE, now, why, run_id=None, cordoned=False)
    return Transition(new, (ev,))
