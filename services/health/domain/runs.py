"""Check runs as pure rules: when a join run starts, whether a report still counts, when a node's report is
overdue, and what a finished wave means for each of its nodes.

A run has members (nodes); the members started together are a wave. Each member has one result per test, and
a service-side deadline: the agent's own timeout kills a hung suite, but a report that can never arrive (the
agent died, its report was refused as malformed, a figure the contract refuses) would otherwise leave the node
``checking`` forever. Decisions take ``(state, fact, now)`` and return the new state and what to do; the edge
(checks.py) loads rows, calls these and writes the answer in one transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from libs.contracts.nodes import CheckStatus, NodeState

from . import breaker
from .nodes import ChecksFailed, Node
from .verdicts import FINAL, Verdict, node_outcome

GROUP_TESTS = frozenset({"allreduce"})  # tests the nodes of a wave run together: a re-run is the whole wave's
NO_REPORT = "no report within {seconds:g}s of the check directive (agent gone, or its report was refused)"


class MemberStatus(StrEnum):
    WAITING = "waiting"  # busy (cordoned) or not started yet
    PENDING = "pending"  # directive sent, no report yet
    RUNNING = "running"  # a test reported it started
    PASSED = "passed"
    FAILED = "failed"


DONE = frozenset({MemberStatus.PASSED, MemberStatus.FAILED})
STARTED = frozenset({MemberStatus.PENDING, MemberStatus.RUNNING})


@dataclass(frozen=True)
class Result:
    """One test on one node: the attempt the service waits for, and where it stands."""
    test: str
    status: CheckStatus
    attempt: int = 1
    reason: str | None = None

    @property
    def final(self) -> bool:
        return self.status in FINAL


@dataclass(frozen=True)
class Member:
    run_id: str
    node_id: str
    status: MemberStatus
    wave: int | None = None
    deadline: datetime | None = None  # set when a directive goes out; None while waiting


@dataclass(frozen=True)
class Outcome:
    """A node's run once every test of its wave is final."""
    status: CheckStatus  # passed or failed
    reason: str | None = None
    failed_tests: frozenset[str] = frozenset()


# -- starting -------------------------------------------------------------------------------------------------

def join_run_due(joined: Sequence[datetime], now: datetime, batch_seconds: float) -> bool:
    """Nodes joining together are checked together: start once the youngest joiner has waited the batch time."""
    return bool(joined) and max(joined) <= now - timedelta(seconds=batch_seconds)


def run_kind(reboots: Sequence[int]) -> str:
    """A run with a node back from a reboot is a recovery run (shown as such); otherwise a join run."""
    return "recovery" if any(reboots) else "join"


def due_groups(joining: Iterable[tuple[str, datetime]], now: datetime, batch_seconds: float) -> list[str]:
    """The groups whose join run is due (``join_run_due`` over each group's joining nodes), in name order:
    ``joining`` holds each joining node's (group, since)."""
    since: dict[str, list[datetime]] = defaultdict(list)
    for group, at in joining:
        since[group].append(at)
    return sorted(g for g, at in since.items() if join_run_due(at, now, batch_seconds))


def rendezvous(rank0_address: str | None, collective_port: int | None, world_size: int) -> str | None:
    """Where a wave's all-reduce meets: rank 0's host at its collective port; None for a wave of one (nothing to
    reduce with) or a rank 0 without a collective port."""
    if not collective_port or world_size <= 1:
        return None
    host = (rank0_address or "127.0.0.1:0").rpartition(":")[0]
    return f"{host}:{collective_port}"


def deadline_of(now: datetime, deadline_seconds: float) -> datetime:
    """When a directive sent now must have been answered."""
    return now + timedelta(seconds=deadline_seconds)


def on_demand_targets(nodes: Iterable[Node]) -> tuple[list[Node], dict[str, str]]:
    """The nodes an on-demand run checks (ready and not cordoned already), and why each other one is skipped."""
    targets, skipped = [], {}
    for n in nodes:
        if n.state is NodeState.READY and not n.cordoned:
            targets.append(n)
        else:
            skipped[n.node_id] = f"cordoned for run {n.run_id}" if n.cordoned else n.state.value
    return targets, skipped


def waits_for_job(executor_id: str | None, busy_executors: Container[str | None], *, force: bool) -> bool:
    """A target whose executor runs a job is cordoned until the job ends, unless the run is forced (the agent
    checkpoints and stops the job first)."""
    return executor_id in busy_executors and not force


def started(member: Member, wave: int, now: datetime, deadline_seconds: float) -> Member:
    """A directive went out: the report is due before the deadline (re-armed by every re-run)."""
    return replace(member, status=MemberStatus.PENDING, wave=wave, deadline=deadline_of(now, deadline_seconds))


# -- reports --------------------------------------------------------------------------------------------------

def stale_member(member: Member | None) -> str | None:
    """Why a report about the node's whole run (``busy``) is old news; None: apply it."""
    if member is None:
        return "not a member of this run"
    if member.status in DONE or member.status is MemberStatus.WAITING:
        return f"node is {member.status} in this run"
    return None


def stale_report(member: Member | None, result: Result | None, attempt: int) -> str | None:
    """Why a test's report is old news (None: apply it). A report about a finished node, an older attempt or
    a test already final is a redelivery or a straggler: counted, never applied twice."""
    if (why := stale_member(member)) is not None:
        return why
    if result is None:
        return "test not asked in this run"
    if result.attempt != attempt:
        return f"attempt {attempt} is not the current attempt {result.attempt}"
    if result.final:
        return f"test already {result.status}"
    return None


# -- one member's facts: (member, result, fact, now) -> Step -----------------------------------------------

def unjudged_fact(status: str, test: str | None, attempt: int) -> Progress | Busy | None:
    """A report's fact where no verdict is needed: ``busy`` (the whole run), or a test started or still pending;
    None for a final result (passed, failed, error), which is judged against the group first."""
    if status == "busy":
        return Busy()
    if status in (CheckStatus.RUNNING, CheckStatus.PENDING):
        return Progress(test or "", attempt, CheckStatus(status))
    return None


def judged_verdict(verdict: Verdict, attempt: int) -> dict[str, Any]:
    """What a result keeps of its attempt's verdict (kept even when the test re-runs)."""
    return {**verdict.detail(), "attempt": attempt, "rerun": verdict.rerun}


def overdue_verdict(result: Result) -> dict[str, Any]:
    """What a result failed at its deadline keeps as its verdict."""
    return {"reason": result.reason, "attempt": result.attempt, "rerun": False, "overdue": True}


@dataclass(frozen=True)
class Progress:
    """A test reported it started (or is still pending) on the node."""
    test: str
    attempt: int
    status: CheckStatus


@dataclass(frozen=True)
class Judged:
    """A test's final result, judged against the group (verdicts.judge)."""
    test: str
    attempt: int
    verdict: Verdict


@dataclass(frozen=True)
class Busy:
    """The agent answered busy (a job landed just before): back to waiting until the job ends."""


@dataclass(frozen=True)
class DeadlinePassed:
    seconds: float


Fact = Progress | Judged | Busy | DeadlinePassed


@dataclass(frozen=True)
class Rerun:
    """Send the test again (attempt ``attempt``); ``whole_wave``: to every node of the wave."""
    test: str
    attempt: int
    whole_wave: bool


@dataclass(frozen=True)
class FinishWave:
    """A result became final: the wave may be complete (the edge loads the wave and asks wave_outcomes)."""


@dataclass(frozen=True)
class Deferred:
    """The node goes back to waiting; its lifecycle gets ChecksDeferred (cordoned until its job ends)."""


Effect = Rerun | FinishWave | Deferred


@dataclass(frozen=True)
class Step:
    member: Member
    results: tuple[Result, ...] = ()  # the results this fact changed, as they are now
    effects: tuple[Effect, ...] = ()
    ignored: str | None = None  # old news (counted by the edge), nothing changed


def decide(member: Member | None, result: Result | None, fact: Fact, now: datetime, *, deadline_seconds: float,
           results: Sequence[Result] = ()) -> Step | None:
    """Apply one fact to one member of a run. ``result``: the fact's test's current result (Progress, Judged);
    ``results``: all the member's results (DeadlinePassed). None only for a fact about no member at all."""
    if member is None:
        return None
    if isinstance(fact, DeadlinePassed):
        if not overdue(member, now):
            return Step(member, ignored="not overdue")
        # Disarmed either way: the wave may still wait on other nodes, and this one is failed once.
        failed = on_deadline(member, results, now, fact.seconds)
        return Step(replace(member, deadline=None), failed, (FinishWave(),) if failed else ())
    if isinstance(fact, Busy):
        if (why := stale_member(member)) is not None:
            return Step(member, ignored=why)
        return Step(replace(member, status=MemberStatus.WAITING, wave=None, deadline=None), (), (Deferred(),))
    if (why := stale_report(member, result, fact.attempt)) is not None:
        return Step(member, ignored=why)
    assert result is not None
    if isinstance(fact, Progress):
        running = MemberStatus.RUNNING if member.status is MemberStatus.PENDING else member.status
        return Step(replace(member, status=running), (replace(result, status=fact.status),))
    verdict = fact.verdict
    if verdict.rerun:
        # One noisy run does not fail a node: the test runs once more, its deadline re-armed.
        again = Result(result.test, CheckStatus.PENDING, fact.attempt + 1)
        return Step(replace(member, deadline=deadline_of(now, deadline_seconds)), (again,),
                    (Rerun(result.test, fact.attempt + 1, result.test in GROUP_TESTS),))
    return Step(member, (Result(result.test, verdict.status, fact.attempt, verdict.reason),), (FinishWave(),))


# -- the deadline ---------------------------------------------------------------------------------------------

def overdue(member: Member, now: datetime) -> bool:
    return member.status in STARTED and member.deadline is not None and now >= member.deadline


def on_deadline(member: Member, results: Sequence[Result], now: datetime,
                deadline_seconds: float) -> tuple[Result, ...]:
    """The results to write when a member's report is overdue: each unfinished test fails for good (no re-run:
    the agent that did not answer once will not answer a re-run either). Empty when nothing is overdue."""
    if not overdue(member, now):
        return ()
    why = NO_REPORT.format(seconds=deadline_seconds)
    return tuple(replace(r, status=CheckStatus.FAILED, reason=why) for r in results if not r.final)


# -- a finished wave ------------------------------------------------------------------------------------------

def wave_outcomes(results: Mapping[str, Sequence[Result]]) -> dict[str, Outcome] | None:
    """Each node's outcome once every test of every node of the wave is final; None while any is not."""
    if not results or any(not r.final for rs in results.values() for r in rs):
        return None
    out: dict[str, Outcome] = {}
    for node_id, rs in results.items():
        status = node_outcome(r.status for r in rs)
        if status is CheckStatus.FAILED:
            failed = [r for r in rs if r.status is CheckStatus.FAILED]
            reason = "; ".join(f"{r.test}: {r.reason or 'failed'}" for r in failed)[:1500]
            out[node_id] = Outcome(CheckStatus.FAILED, reason, frozenset(r.test for r in failed))
        else:
            out[node_id] = Outcome(CheckStatus.PASSED)
    return out


def by_node(rows: Iterable[tuple[str, Result]]) -> dict[str, list[Result]]:
    """A wave's results (node id, result) grouped per node, in the order given."""
    out: dict[str, list[Result]] = defaultdict(list)
    for node_id, result in rows:
        out[node_id].append(result)
    return out


def failed_verdicts(rows: Iterable[tuple[str, Result, Mapping[str, Any]]]) -> dict[str, list[tuple[str, Any]]]:
    """Each node's failed tests with their verdicts (the figures against the bar: what a drain's reason says)."""
    out: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for node_id, result, verdict in rows:
        if result.status is CheckStatus.FAILED:
            out[node_id].append((result.test, verdict))
    return out


def run_finished(statuses: Iterable[MemberStatus]) -> bool:
    """A run is done once every member passed or failed (a run whose last nodes could not start, too)."""
    return all(s in DONE for s in statuses)


# -- a node failed for good: the group's breaker first (breaker.py) -------------------------------------------

def breaker_applies(node: Node | None, run_id: str) -> bool:
    """Whether a failed outcome is news for the node: it is checking in this run (otherwise the lifecycle ignores
    the failure, and the breaker must not count it)."""
    return node is not None and node.state is NodeState.CHECKING and node.run_id == run_id


def failed_fact(run_id: str, reason: str, decision: breaker.Decision | None) -> ChecksFailed:
    """The lifecycle's fact for a node that failed for good, after its group's breaker (None: not asked): held
    when the breaker holds the group (tripped now, or already), else the usual reboot/replace path."""
    if decision is None or decision.verdict is breaker.Verdict.PROCEED:
        return ChecksFailed(run_id, reason)
    assert decision.guard.alert is not None
    return ChecksFailed(run_id, reason, hold=decision.guard.alert.reason)
