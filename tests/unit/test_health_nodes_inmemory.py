"""Health's registration and check-report handlers on FastStream's in-memory ``TestNatsBroker`` (no server): its
own declarations (services/health/handlers.py) and the edge's rules, with a pool-less double of the node bindings
and executor rows (tests/support/memory_pool.py), a double of ``Checks`` (what the handlers hand a registration and
a report to) and a clock the test moves in the broker's context. What is tested is the handlers' own decisions: a
registration naming another executor than the node's live one is refused visibly and stored nowhere, one from a
node the subject does not name never reaches the store; a report reaches ``Checks`` in the batch's transaction,
the check loop is kicked, ended tests are counted in the metrics, provisioning runs after the commit; a report
sent under another executor's name is refused before ``Checks``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from libs.contracts.nodes import CheckReport, CheckStatus, CheckTest, NodeRegistered
from libs.contracts.subjects import Subjects
from libs.runtime import metrics
from services.health.handlers import consumers
from services.health.settings import HealthSettings
from services.health.store import nodes
from tests.support.inmemory import T0, FakeClock, in_memory
from tests.support.memory_pool import MemoryConn, MemoryPool

pytestmark = pytest.mark.unit

S = Subjects()
SETTINGS = HealthSettings.from_env(env={})


@dataclass
class MemoryNodes:
    """``health.nodes``' bindings (node -> executor, when last heard) and ``health.executors``' rows without
    PostgreSQL, answering the registration handler's queries."""

    bound: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    executors: dict[str, tuple] = field(default_factory=dict)
    asked: list[list[str]] = field(default_factory=list)  # the nodes whose bindings were read

    def answer(self, method: str, query: str, args: tuple) -> Any:
        if method == "fetch" and query == nodes._BOUND:
            (node_ids,) = args
            self.asked.append(list(node_ids))
            return [{"node_id": n, "executor_id": self.bound[n][0], "last_heard": self.bound[n][1]}
                    for n in node_ids if n in self.bound]
        if method == "executemany" and "INSERT INTO health.executors" in query:
            (rows,) = args
            self.executors.update({row[0]: row for row in rows})
            return None
        raise AssertionError(f"a query the handlers do not make: {method} {query}")


@dataclass
class MemoryChecks:
    """What the handlers hand to ``Checks``, kept in the order it happened, with whether the batch's transaction
    was open; ``on_report`` returns the provisioning requests the test gave for the node."""

    settings: HealthSettings = SETTINGS
    requests: dict[str, list[dict]] = field(default_factory=dict)
    happened: list[tuple] = field(default_factory=list)

    async def on_registration(self, conn: MemoryConn, reg: NodeRegistered) -> None:
        self.happened.append(("registered", reg.node_id, reg.executor_id, conn.is_in_transaction()))

    async def on_report(self, conn: MemoryConn, rep: CheckReport) -> list[dict]:
        self.happened.append(("report", rep.node_id, str(rep.status), conn.is_in_transaction()))
        return self.requests.get(rep.node_id, [])

    def kick(self) -> None:
        self.happened.append(("kick",))

    async def provision(self, request: dict) -> None:
        self.happened.append(("provision", request["node_id"]))

    def of(self, kind: str) -> list[tuple]:
        return [h for h in self.happened if h[0] == kind]


def registration(node: str, executor: str) -> NodeRegistered:
    return NodeRegistered(node_id=node, executor_id=executor, group="g", hostname=node, cpu_count=8,
                          agent_version="1")


def health(clock: FakeClock, db: MemoryNodes, checks: MemoryChecks):
    return in_memory("health", S, consumers(S, SETTINGS), pool=MemoryPool(db.answer), clock=clock, checks=checks)


# -- registrations -------------------------------------------------------------------------------------------------

async def test_a_registration_reaches_checks_in_its_transaction_and_its_executor_row_is_stored():
    clock, db, checks = FakeClock(), MemoryNodes(), MemoryChecks()
    async with health(clock, db, checks) as (bus, reporter):
        await bus.publish(registration("n1", "ex1").encode(), S.node("n1", "registered"))
    assert checks.happened == [("registered", "n1", "ex1", True)]  # the node is saved, due for its checks
    assert db.asked == [["n1"]] and db.executors["ex1"][:3] == ("ex1", "n1", "g")
    assert not reporter.rejected


@pytest.mark.parametrize(("heard_ago", "refused"), [(10.0, True), (SETTINGS.node_gone_seconds, False)],
                         ids=["bound executor alive: refused", "bound executor gone: the new one takes the node"])
async def test_a_registration_naming_another_executor_than_the_nodes_live_one_is_refused_and_stored_nowhere(
        heard_ago, refused):
    clock = FakeClock()
    db, checks = MemoryNodes(bound={"n1": ("ex1", clock.at - timedelta(seconds=heard_ago))}), MemoryChecks()
    async with health(clock, db, checks) as (bus, reporter):
        await bus.publish(registration("n1", "ex2").encode(), S.node("n1", "registered"))
    if refused:
        assert checks.happened == [] and db.executors == {}
        ((subject, body, reason),) = reporter.rejected
        assert subject == S.node("n1", "registered") and NodeRegistered.decode(body).executor_id == "ex2"
        assert "'ex1'" in reason and "alive" in reason
    else:
        assert checks.happened == [("registered", "n1", "ex2", True)] and "ex2" in db.executors
        assert not reporter.rejected


async def test_a_registration_for_another_node_than_its_subjects_is_refused_before_the_store():
    clock, db, checks = FakeClock(), MemoryNodes(), MemoryChecks()
    async with health(clock, db, checks) as (bus, reporter):
        await bus.publish(registration("n1", "ex1").encode(), S.node("n2", "registered"))
    assert checks.happened == [] and db.executors == {} and not any(db.asked)
    assert [subject for subject, _, _ in reporter.rejected] == [S.node("n2", "registered")]


# -- check reports -------------------------------------------------------------------------------------------------

def check_report(node: str, status: str, executor: str = "ex1", test: CheckTest | None = CheckTest.MATMUL,
                 figures: dict | None = None) -> CheckReport:
    return CheckReport(run_id="r1", node_id=node, executor_id=executor, test=test, status=status,
                       figures=figures or {}, time=T0)


def results(node: str, status: str) -> float:
    return metrics.REGISTRY.get_sample_value(
        "teto_check_results_total", {"node": node, "test": "matmul", "status": status}) or 0.0


async def test_a_check_report_reaches_checks_in_its_transaction_then_kicks_counts_and_provisions_after_commit():
    node = "n-report-1"
    clock, db = FakeClock(), MemoryNodes()
    checks = MemoryChecks(requests={node: [{"node_id": node, "reason": "failed matmul"}]})
    before = results(node, "failed")
    async with health(clock, db, checks) as (bus, reporter):
        await bus.publish(check_report(node, "failed", figures={"tflops": 12.5}).encode(),
                          S.check("r1", "failed", "ex1"))
    assert checks.happened == [("report", node, "failed", True), ("kick",), ("provision", node)]
    assert results(node, "failed") == before + 1
    assert metrics.REGISTRY.get_sample_value(
        "teto_check_figure", {"node": node, "test": "matmul", "figure": "tflops"}) == 12.5
    assert not reporter.rejected


@pytest.mark.parametrize(("status", "test"), [("running", CheckTest.MATMUL), ("busy", None)],
                         ids=["a test still running", "about the whole run (busy)"])
async def test_a_report_of_no_ended_test_reaches_checks_but_counts_no_result(status, test):
    node = f"n-progress-{status}"
    clock, db, checks = FakeClock(), MemoryNodes(), MemoryChecks()
    async with health(clock, db, checks) as (bus, _):
        await bus.publish(check_report(node, status, test=test).encode(), S.check("r1", status, "ex1"))
    assert checks.happened == [("report", node, status, True), ("kick",)]
    assert results(node, status) == 0.0


async def test_a_check_report_sent_as_another_executor_is_refused_before_checks_and_counts_nothing():
    node = "n-forged"
    clock, db, checks = FakeClock(), MemoryNodes(), MemoryChecks()
    async with health(clock, db, checks) as (bus, reporter):
        await bus.publish(check_report(node, "passed", executor="ex1").encode(), S.check("r1", "passed", "ex9"))
    assert checks.of("report") == [] and results(node, str(CheckStatus.PASSED)) == 0.0
    ((subject, _, reason),) = reporter.rejected
    assert subject == S.check("r1", "passed", "ex9") and "ex1" in reason
